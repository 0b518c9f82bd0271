"""The balancer's configuration, with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """How the balancer core polls origins and shapes its answers.

    poll_interval_s: how often each origin's /stats is polled (the paper's agent
        refreshes every second; MistServer's shipped balancer polls every 5 s).
    stale_after_s: an origin with no good status for this long is out of rotation,
        even if no poll has failed outright (a hung poll).
    directive_origins: how many origins a directive lists (the first is the pick, the
        rest are fallbacks in preference order).
    expires_in_s: how long a client may act on a directive before asking again.
    retry_after_s: what a refusal tells the client to wait before asking again.
    algorithm: the scoring algorithm's registered name (default `headroom`: the only
        one meeting issue 10's targets over the simulator's 200-scenario tournament,
        docs/tournament.md; docs/balancer.md says why; `alg2` is the paper's).
    """

    poll_interval_s: float = 1.0
    stale_after_s: float = 3.5
    directive_origins: int = 3
    expires_in_s: float = 5.0
    retry_after_s: float = 2.0
    algorithm: str = "headroom"

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be positive")
        if self.stale_after_s <= self.poll_interval_s:
            raise ValueError("stale_after_s must be longer than poll_interval_s")
        if self.directive_origins < 1:
            raise ValueError("directive_origins must be at least 1")
