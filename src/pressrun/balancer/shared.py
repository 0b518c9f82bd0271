"""Several balancers, one view of demand: the Redis exchange (issue 30).

Each balancer instance started with ``--redis URL`` runs `SharedDemand.run`: every
``interval_s`` (half the poll interval: what one instance counted reaches the others
within one poll) it

1. writes its own per-issue request rates (`DemandPolicy.local_rates`) with its wall
   time under ``<prefix>demand:<instance>`` (expiring after ``keep_s``: a balancer
   that died stops counting once its demand has faded) and lists itself in the
   ``<prefix>instances`` sorted set (score: wall time);
2. reads the other instances' rates, decays each by its age at ``tau_s`` (the age
   from wall clocks of different hosts, never below 0: a clock ahead cannot add
   demand) and hands their sum to the policy (`DemandPolicy.set_remote_rates`);
3. holds or takes the carousel lease ``<prefix>carousel-leader`` (``SET NX PX``,
   renewed by its holder only, ``lease_s`` long): only the holder orders the
   multicast sender to start or stop carousels, so a carousel is started and
   stopped once whatever the number of balancers (the others still read the
   sender's list to answer ``multicast``). A holder that stops deletes the lease;
   one that dies loses it after ``lease_s``.

Each instance keeps polling the origins itself: only demand is shared. The mode
follows: every instance applies the same thresholds to the same total, so they take
the same mode within one exchange. The loop survives any error (logged; the lease is
given up until Redis answers again, so no two instances order carousels at once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable

from pressrun.balancer.demand import MAX_REMOTE_ISSUES, DemandPolicy

log = logging.getLogger("pressrun.balancer.shared")

DEFAULT_PREFIX = "pressrun:balancer:"

# Renew the lease only if we hold it; delete it only if we hold it.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _wall_clock() -> float:
    return time.time()  # noqa: TID251 (rates read by balancers on other hosts)


def instance_id() -> str:
    """A name for this balancer process: host, pid and a random tail."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"


def sum_remote(
    docs: list[bytes | str | None], *, wall_now: float, tau_s: float
) -> dict[str, float]:
    """The other instances' rates summed per issue, each decayed by its age (pure).
    A malformed document is skipped (logged)."""
    total: dict[str, float] = {}
    for raw in docs:
        if raw is None:
            continue
        try:
            doc = json.loads(raw)
            at = float(doc["at"])
            rates = doc["rates"]
            if not isinstance(rates, dict) or not math.isfinite(at):
                raise ValueError("rates is not an object")
        except (ValueError, KeyError, TypeError) as err:
            log.warning("another balancer's demand is unreadable (%s); left out", err)
            continue
        decay = math.exp(-max(0.0, wall_now - at) / tau_s)
        for issue, rate in list(rates.items())[:MAX_REMOTE_ISSUES]:
            if not isinstance(rate, int | float) or not (rate >= 0 and math.isfinite(rate)):
                continue
            total[str(issue)] = total.get(str(issue), 0.0) + float(rate) * decay
    return total


class SharedDemand:
    """One balancer's side of the exchange (see the module docstring).

    redis_url: e.g. ``redis://127.0.0.1:6379/0``.
    policy: this balancer's demand policy.
    interval_s: how often to exchange (the service uses half the poll interval).
    now: the policy's clock (the loop's monotonic time).
    wall: the wall clock written beside the rates (default: time.time).
    """

    def __init__(
        self,
        redis_url: str,
        policy: DemandPolicy,
        *,
        interval_s: float,
        now: Callable[[], float],
        wall: Callable[[], float] | None = None,
        prefix: str = DEFAULT_PREFIX,
        name: str | None = None,
    ) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(redis_url)
        self.policy = policy
        self.interval_s = interval_s
        self.now = now
        self.wall = wall or _wall_clock
        self.prefix = prefix
        self.name = name or instance_id()
        tau = policy.config.tau_s
        #: how long an instance's last rates are kept (then under e^-5 of what they were)
        self.keep_s = max(5.0 * tau, 3.0 * interval_s)
        self.lease_s = max(3.0 * interval_s, 0.3)
        #: whether this instance holds the carousel lease now
        self.leader = False
        self.rounds = 0
        self.failures = 0

    def is_leader(self) -> bool:
        """Whether this instance may order carousels now."""
        return self.leader

    @property
    def _lease_key(self) -> str:
        return f"{self.prefix}carousel-leader"

    async def exchange(self) -> None:
        """One round: write ours, read the others', hold or take the lease."""
        r = self.redis
        wall = self.wall()
        mono = self.now()
        doc = json.dumps({"at": wall, "rates": self.policy.local_rates(now=mono)})
        instances = f"{self.prefix}instances"
        keep_ms = int(self.keep_s * 1000)
        async with r.pipeline(transaction=False) as pipe:
            pipe.set(f"{self.prefix}demand:{self.name}", doc, px=keep_ms)
            pipe.zadd(instances, {self.name: wall})
            pipe.zremrangebyscore(instances, "-inf", wall - self.keep_s)
            pipe.zrange(instances, 0, -1)
            results = await pipe.execute()
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in results[-1]]
        others = [n for n in names if n != self.name]
        docs: list[bytes | str | None] = []
        if others:
            docs = await r.mget([f"{self.prefix}demand:{n}" for n in others])
        remote = sum_remote(docs, wall_now=wall, tau_s=self.policy.config.tau_s)
        self.policy.set_remote_rates(remote, now=self.now())
        lease_ms = int(self.lease_s * 1000)
        if self.leader:
            self.leader = bool(await r.eval(_RENEW, 1, self._lease_key, self.name, lease_ms))
            if not self.leader:
                log.warning("lost the carousel lease; another balancer orders carousels")
        if not self.leader:
            took = await r.set(self._lease_key, self.name, nx=True, px=lease_ms)
            if took:
                self.leader = True
                log.info("this balancer (%s) now orders the carousels", self.name)
        self.rounds += 1

    async def run(self) -> None:
        """Forever: one exchange every ``interval_s``; errors are logged, the lease
        given up until Redis answers again."""
        while True:
            try:
                await self.exchange()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.failures += 1
                if self.leader:
                    log.warning("Redis did not answer (%s): this balancer stops ordering", err)
                self.leader = False
                log.warning("demand exchange with Redis failed: %s", err)
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        """Give the lease up (another instance takes it at its next round) and
        disconnect; the rates written fade on their own."""
        try:
            if self.leader:
                await self.redis.eval(_RELEASE, 1, self._lease_key, self.name)
            self.leader = False
        except Exception as err:
            log.warning("could not give the carousel lease up: %s", err)
        finally:
            await self.redis.aclose()
