"""Prefetch pacing: the ciphertext of an embargoed issue, spread over the window before
its release (issue 35), pure.

A subscriber's client that pre-positions an issue (``pressrun get --prefetch``) asks
``GET /v1/issues/<id>/prefetch`` instead of a directive. It is not a reader waiting:
it does not count in the demand estimate (which decides swarm and multicast for the
readers) nor in the scoring's picks, and it is paced so that the origins' prefetch
load stays under a configured share of their capacity:

    budget      = min(share x C, C - R)           C: capacity of the origins in rotation
                                                   R: their outbound rate less what the
                                                      live grants account for (readers)
    issue share = budget / I                       I: issues being prefetched now
    fair rate   = issue share / N_i                N_i: prefetchers of the issue, granted
                                                        or waiting, with the asker

A prefetcher is granted ``min(max(fair rate, min_rate_bytes_per_s), budget - the
other live grants)``; below ``min_rate_bytes_per_s`` it waits (``PrefetchDeferred``,
ask again in ``renew_s``) and counts among the waiting, so that every granted
prefetcher, which asks again every ``renew_s`` (its grant lasts ``hold_s``), is cut
to the fair rate that includes it: within one renewal the waiting one finds room.
The sum of the live grants never passes the budget when a grant is made, and a grant
made before readers came (or more prefetchers) is cut back at its renewal: readers
always come first.

State: one grant or wait per (issue, client), at most ``max_clients`` of them,
forgotten ``hold_s`` after the client last asked (`handle_timer`). Pure: no clock (``now`` is
monotonic seconds from the adapter), no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from pressrun.balancer.events import OriginStatus

__all__ = [
    "PrefetchConfig",
    "PrefetchDeferred",
    "PrefetchGrant",
    "PrefetchPacer",
    "client_id",
    "origins_capacity",
    "prefetch_answer",
]


@dataclass(frozen=True)
class PrefetchConfig:
    """The prefetch pacing's settings (docs/subscriptions.md, "Embargo")."""

    #: the largest share of the origins' capacity prefetch may use (0..1)
    share: float = 0.2
    #: a grant below this rate is not made: the prefetcher comes back later
    min_rate_bytes_per_s: float = 64_000.0
    #: how long a grant lasts (and a waiting prefetcher is remembered)
    hold_s: float = 60.0
    #: how often a prefetcher asks again (granted: to renew; waiting: for room)
    renew_s: float = 20.0
    #: grants kept at most (one per issue and client)
    max_clients: int = 100_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError("prefetch share must be between 0 and 1")
        if self.hold_s <= 0 or self.min_rate_bytes_per_s <= 0 or self.max_clients < 1:
            raise ValueError("prefetch hold_s, min_rate_bytes_per_s, max_clients must be > 0")
        if not 0 < self.renew_s < self.hold_s:
            raise ValueError("prefetch renew_s must be above 0 and below hold_s")


@dataclass(frozen=True)
class PrefetchGrant:
    """Fetch at most ``rate_bytes_per_s``; ask again in ``renew_s`` (the grant lasts
    ``hold_s``)."""

    issue_id: str
    rate_bytes_per_s: float
    hold_s: float
    renew_s: float
    prefetchers: int  # of this issue, granted or waiting, with this one


@dataclass(frozen=True)
class PrefetchDeferred:
    """No room for another prefetcher now: ask again in ``retry_after_s``."""

    issue_id: str
    retry_after_s: float
    reason: str


@dataclass
class _Grant:
    rate_bytes_per_s: float
    expires_at: float


def origins_capacity(statuses: Iterable[OriginStatus]) -> tuple[float, float]:
    """``(capacity, outbound rate)`` in bytes/s summed over these origins' statuses."""
    capacity = 0.0
    out = 0.0
    for s in statuses:
        capacity += max(0.0, s.capacity_bytes_per_s)
        out += max(0.0, s.out_bytes_per_s)
    return capacity, out


class PrefetchPacer:
    """The grants and waits of every issue being prefetched (module docstring)."""

    def __init__(self, config: PrefetchConfig | None = None) -> None:
        self.config = config or PrefetchConfig()
        #: issue -> client -> its grant; rate 0: waiting for room
        self._clients: dict[str, dict[str, _Grant]] = {}
        self._count = 0
        #: grants made (renewals included) and deferrals, for metrics
        self.granted_total = 0
        self.deferred_total = 0

    # -- what it holds

    def prefetchers(self, issue_id: str | None = None, *, waiting: bool = False) -> int:
        """Granted (or, with ``waiting``, waiting) prefetchers of one issue, or of all."""
        issues = self._clients.values() if issue_id is None else [self._clients.get(issue_id, {})]
        return sum(1 for c in issues for g in c.values() if (g.rate_bytes_per_s == 0) == waiting)

    def granted_bytes_per_s(self) -> float:
        """The sum of the live grants' rates."""
        return sum(g.rate_bytes_per_s for c in self._clients.values() for g in c.values())

    def next_deadline(self) -> float | None:
        """When the earliest grant or wait ends (for `handle_timer`)."""
        return min((g.expires_at for c in self._clients.values() for g in c.values()), default=None)

    def handle_timer(self, *, now: float) -> None:
        """Forget the grants and waits that ended (their client stopped asking)."""
        for issue_id in list(self._clients):
            clients = self._clients[issue_id]
            for client in [c for c, g in clients.items() if g.expires_at <= now]:
                del clients[client]
                self._count -= 1
            if not clients:
                del self._clients[issue_id]

    # -- the decision

    def handle_request(
        self,
        issue_id: str,
        client: str,
        *,
        capacity_bytes_per_s: float,
        out_bytes_per_s: float,
        now: float,
    ) -> PrefetchGrant | PrefetchDeferred:
        """A prefetcher of ``issue_id`` asks; the origins in rotation holding it have
        this capacity and outbound rate now (`origins_capacity`)."""
        cfg = self.config
        self.handle_timer(now=now)
        clients = self._clients.get(issue_id, {})
        own = clients.get(client)
        if own is None and self._count >= cfg.max_clients:
            self.deferred_total += 1
            return PrefetchDeferred(issue_id, cfg.renew_s, "too many prefetchers tracked")
        granted = self.granted_bytes_per_s()
        # what the readers use: the origins' outbound rate less the live grants
        readers = max(0.0, out_bytes_per_s - granted)
        budget = max(0.0, min(cfg.share * capacity_bytes_per_s, capacity_bytes_per_s - readers))
        issues = len(self._clients) + (0 if issue_id in self._clients else 1)
        prefetchers = len(clients) + (0 if own is not None else 1)
        # the fair rate, but never below the least worth granting: with more
        # prefetchers than the budget holds at that rate, the first come fetch at it
        # and the others wait (all waiting below it would be a livelock)
        fair = max(budget / issues / prefetchers, cfg.min_rate_bytes_per_s)
        mine = 0.0 if own is None else own.rate_bytes_per_s
        rate = min(fair, max(0.0, budget - granted + mine))
        if own is None:
            own = _Grant(0.0, now + cfg.hold_s)
            self._clients.setdefault(issue_id, clients)[client] = own
            self._count += 1
        own.expires_at = now + cfg.hold_s
        if rate < cfg.min_rate_bytes_per_s:
            own.rate_bytes_per_s = 0.0  # waiting: counted in the fair rate of the others
            self.deferred_total += 1
            why = (
                "the origins are busy with readers"
                if budget < cfg.min_rate_bytes_per_s
                else f"{prefetchers} prefetchers share the prefetch budget of {issue_id}"
            )
            return PrefetchDeferred(issue_id, cfg.renew_s, why)
        own.rate_bytes_per_s = rate
        self.granted_total += 1
        return PrefetchGrant(issue_id, rate, cfg.hold_s, cfg.renew_s, prefetchers)


#: what a client may call itself in ``?client=`` (a random id per run)
_CLIENT_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


def prefetch_answer(
    pacer: PrefetchPacer,
    statuses: Iterable[tuple[str, str, OriginStatus]],
    issue_id: str,
    client: str,
    *,
    now: float,
) -> tuple[int, dict[str, object], dict[str, str]]:
    """The answer of ``GET /v1/issues/<id>/prefetch``: ``(HTTP status, JSON, headers)``.

    ``statuses``: ``(name, base URL, status)`` of the origins in rotation; those that
    hold the issue are the ones named and whose capacity is shared. 200 with the grant
    and the origins (most spare capacity first); 429 with ``Retry-After`` (and the
    origins, for the manifest) when deferred;
    404 when no origin in rotation holds the issue.
    """
    holders = [(name, url, s) for name, url, s in statuses if issue_id in s.issues]
    if not holders:
        return 404, {"error": f"no origin in rotation holds {issue_id}"}, {}
    capacity, out = origins_capacity(s for _, _, s in holders)
    decision = pacer.handle_request(
        issue_id, client, capacity_bytes_per_s=capacity, out_bytes_per_s=out, now=now
    )
    spare = sorted(holders, key=lambda h: (h[2].out_bytes_per_s - h[2].capacity_bytes_per_s, h[0]))
    if isinstance(decision, PrefetchDeferred):
        wait = max(1, math.ceil(decision.retry_after_s))
        return (
            429,
            {
                "error": f"prefetch of {issue_id} deferred: {decision.reason}",
                "code": "prefetch_deferred",
                "retry_after_s": wait,
                # the origins all the same: the client reads the (small) manifest and
                # learns the release time while it waits for room
                "origins": [{"name": name, "url": url} for name, url, _ in spare],
            },
            {"Retry-After": str(wait)},
        )
    return (
        200,
        {
            "issue_id": issue_id,
            "rate_bytes_per_s": round(decision.rate_bytes_per_s),
            "hold_s": decision.hold_s,
            "renew_s": decision.renew_s,
            "prefetchers": decision.prefetchers,
            "origins": [{"name": name, "url": url} for name, url, _ in spare],
        },
        {},
    )


def client_id(address: str | None, declared: str | None) -> str:
    """Who a prefetcher is: its address and the id it declares (``?client=``, up to 64
    characters of ``[a-z0-9_-]``; several clients share one address behind a NAT or on
    loopback). ValueError for an id that is not one."""
    if declared is not None and (
        not 1 <= len(declared) <= 64 or not set(declared) <= _CLIENT_ID_CHARS
    ):
        raise ValueError("client must be 1-64 characters of a-z, 0-9, '-', '_'")
    return f"{address or '-'}/{declared or '-'}"
