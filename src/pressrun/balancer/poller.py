"""The balancer's origin poller: the core's one timer and its ``/stats`` polls.

The aioquic shape: one timer armed with ``loop.call_at(core.next_deadline())``; when it
fires, ``core.handle_timer(now=loop.time())`` returns `PollOrigin` effects, each
performed as a GET of ``<origin>/stats`` with the service's shared
``aiohttp.ClientSession`` and a timeout shorter than the poll interval; the answer is
decoded by :func:`pressrun.balancer.codec.decode_status` and fed back as
`StatusReceived`, any failure (refused, timeout, HTTP error, malformed JSON, a body over
`MAX_STATS_BYTES`) as `PollFailed`. `OriginWentDown` is logged at WARNING and
`OriginCameBack` at INFO.

The HTTP service (`pressrun.balancer.aio`) owns the core and the client session and
hands both to an `OriginPoller`; it asks the poller only to start, to stop and to wait
until enough origins are in rotation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram

from pressrun.balancer.codec import StatusFormatError, decode_status
from pressrun.balancer.core import BalancerCore, OriginState
from pressrun.balancer.events import (
    Effect,
    OriginCameBack,
    OriginWentDown,
    PollFailed,
    PollOrigin,
    StatusReceived,
)
from pressrun.security import BodyTooLarge, read_body_limited

log = logging.getLogger(__name__)
decisions_log = logging.getLogger("pressrun.balancer.decisions")

#: a /stats answer larger than this is malformed (it is a few hundred bytes per issue)
MAX_STATS_BYTES = 4 * 1024 * 1024


class OriginPoller:
    """Keeps the core's timer armed and performs the polls it asks for.

    core: the decision core (its `next_deadline`, `handle_timer`, `handle_status_received`,
        `handle_poll_failed`).
    http: the client session the polls use (owned by the caller).
    loop: the running loop; its ``time()`` is the core's ``now``.
    poll_timeout_s: timeout of one /stats poll.
    registry: where ``pressrun_balancer_poll_seconds`` and
        ``pressrun_balancer_poll_failures`` are registered.
    spawn: starts a task the caller tracks (and cancels when it closes).
    """

    def __init__(
        self,
        core: BalancerCore,
        http: aiohttp.ClientSession,
        loop: asyncio.AbstractEventLoop,
        *,
        poll_timeout_s: float,
        registry: CollectorRegistry,
        spawn: Callable[[Any], None],
    ) -> None:
        self.core = core
        self._http = http
        self._loop = loop
        self._poll_timeout_s = poll_timeout_s
        self._poll_timeout = aiohttp.ClientTimeout(total=poll_timeout_s)
        self._spawn = spawn
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None
        self._rearm_pending = False
        self._closed = False
        self._up_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.poll_seconds = Histogram(
            "pressrun_balancer_poll_seconds",
            "Time to poll an origin's /stats, by outcome",
            ["outcome"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.poll_failures = Counter(
            "pressrun_balancer_poll_failures",
            "Failed /stats polls, by origin",
            ["origin"],
            registry=registry,
        )

    def start(self) -> None:
        """Arm the timer (the first polls are due at once)."""
        self._rearm()

    def close(self) -> None:
        """Stop the timer; no new poll starts. Waiters are cancelled."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, waiter in self._up_waiters:
            if not waiter.done():
                waiter.cancel()

    async def wait_until_up(self, count: int, timeout_s: float) -> None:
        """Until `count` origins are in rotation; TimeoutError if not within `timeout_s`."""
        if self.count_up() >= count:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._up_waiters.append((count, waiter))
        await asyncio.wait_for(waiter, timeout_s)

    def count_up(self) -> int:
        """How many origins are in rotation."""
        return sum(1 for rec in self.core.origins.values() if rec.state is OriginState.UP)

    # -- timer and effects -------------------------------------------------------

    def _schedule_rearm(self) -> None:
        # Several poll answers in one loop iteration re-arm once (next_deadline is
        # O(origins)).
        if not self._rearm_pending:
            self._rearm_pending = True
            self._loop.call_soon(self._rearm)

    def _rearm(self) -> None:
        self._rearm_pending = False
        if self._closed:
            return
        deadline = self.core.next_deadline()
        if deadline == self._armed_for:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_for = deadline
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        armed = self._armed_for
        self._timer = None
        self._armed_for = None
        # asyncio may run a timer up to one clock resolution early; the core must see
        # the deadline as reached or it would answer nothing and be re-armed at once.
        now = self._loop.time()
        if armed is not None and now < armed:
            now = armed
        self._apply(self.core.handle_timer(now=now))
        self._rearm()

    def _apply(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, PollOrigin):
                if not self._closed:
                    self._spawn(self._poll(effect.name, effect.url))
            elif isinstance(effect, OriginWentDown):
                url = self.core.origins[effect.name].spec.url
                log.warning(
                    "origin %s did not answer /stats: %s; it is out of rotation until it does",
                    url,
                    effect.reason,
                )
            elif isinstance(effect, OriginCameBack):
                spec = self.core.origins[effect.name].spec
                log.info("origin %s (%s) answers /stats; it is in rotation", spec.name, spec.url)
                self._wake_up_waiters()

    def _wake_up_waiters(self) -> None:
        if not self._up_waiters:
            return
        up = self.count_up()
        for want, waiter in list(self._up_waiters):
            if up >= want and not waiter.done():
                waiter.set_result(None)
        self._up_waiters = [(w, f) for w, f in self._up_waiters if not f.done()]

    async def _poll(self, name: str, url: str) -> None:
        """Perform one `PollOrigin`: GET /stats, feed the answer or the failure."""
        started = time.perf_counter()
        reason: str | None = None
        try:
            async with self._http.get(url + "/stats", timeout=self._poll_timeout) as resp:
                if resp.status != 200:
                    raise StatusFormatError("", f"HTTP {resp.status} instead of 200")
                body = await read_body_limited(resp, MAX_STATS_BYTES, f"{url}/stats")
            status = decode_status(body, origin_name=name)
        except TimeoutError:
            reason = f"no answer within {self._poll_timeout_s:g} s"
        except aiohttp.ClientError as err:
            reason = str(err) or type(err).__name__
        except StatusFormatError as err:
            reason = str(err)
        except BodyTooLarge as err:
            reason = str(StatusFormatError("", str(err)))
        except OSError as err:
            reason = str(err) or type(err).__name__
        except Exception as err:
            # Whatever happened, the core must hear back: an origin whose poll never
            # ends would stay "polling" and never be polled again.
            log.exception("polling %s/stats failed unexpectedly", url)
            reason = f"{type(err).__name__}: {err}"
        elapsed = time.perf_counter() - started
        core = self.core
        now = self._loop.time()
        if reason is None:
            self.poll_seconds.labels("ok").observe(elapsed)
            if decisions_log.isEnabledFor(logging.DEBUG):
                decisions_log.debug(
                    "t=%.3f status %s (asked %.3f s before): out %.2f MB/s, active %s, started %s",
                    now,
                    name,
                    elapsed,
                    status.out_bytes_per_s / 1e6,
                    dict(status.active_transfers_by_issue),
                    dict(status.transfers_total_by_issue),
                )
            self._apply(core.handle_status_received(StatusReceived(status), now=now))
        else:
            self.poll_seconds.labels("failed").observe(elapsed)
            self.poll_failures.labels(name).inc()
            rec = core.origins[name]
            first_failure = rec.state is OriginState.UNKNOWN
            self._apply(core.handle_poll_failed(PollFailed(name, reason), now=now))
            if first_failure:
                # The core reports only UP -> DOWN; an origin down from the start is
                # worth the same warning, once.
                log.warning(
                    "origin %s did not answer /stats: %s; it is out of rotation until it does",
                    url,
                    reason,
                )
        self._schedule_rearm()
