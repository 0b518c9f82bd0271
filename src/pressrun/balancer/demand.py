"""Demand per issue and the mode it calls for: the balancer moving crowds onto the swarm.

A pure `ModePolicy` (pressrun.balancer.core): `DemandPolicy.decide(issue_id, now=)` is
called once per directive request; it counts the request, updates the issue's demand
estimate and answers `origin` or `swarm` (with the issue's `SwarmInfo`).

The estimate (per issue):

- **Request rate** r (requests/s), an exponentially weighted moving average with time
  constant ``tau_s`` over the request arrivals: at each request,
  ``r <- r * exp(-(t - t_prev) / tau_s) + 1 / tau_s``; read at time t it is decayed the
  same way. A steady arrival rate lambda gives r -> lambda; a burst of k requests
  raises r by k / tau_s at once and fades over a few tau_s.
- **Concurrent downloaders** D, by Little's law: D = r x ``typical_download_s`` (the
  mean time one client spends downloading an issue over the origin path). We use
  arrivals x typical download time rather than counting requests in the last
  directive-expiry window because a client asks once per download (plus a retry on
  failure), not once per expiry window: requests in a window would count arrivals,
  not the clients still downloading.

The mode, with hysteresis so it does not flap: an issue enters `swarm` when
D >= ``enter_downloaders`` (T_hi) and goes back to `origin` when D < ``leave_downloaders``
(T_lo < T_hi); and a mode, once entered, is kept for at least ``min_dwell_s`` whatever
D does. So between two mode changes of an issue at least ``min_dwell_s`` passes (a
Hypothesis test checks it).

An issue with no `SwarmInfo` (no torrent known: `swarms` has no entry for it) always
stays `origin`. `swarm_info_for` builds the `SwarmInfo` from the protocol's URLs:
torrent at ``<origin>/content/<issue>/<issue>.torrent`` (docs/protocols.md).

Wiring (the balancer service owner): ``BalancerCore(..., mode_policy=DemandPolicy(
DemandConfig(...), swarms))`` where ``swarms`` maps issue id -> SwarmInfo (a dict the
service may update as issues are published; the policy reads it at each request).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pressrun.balancer.core import ModeDecision
from pressrun.balancer.events import DeliveryMode, SwarmInfo

_ORIGIN = ModeDecision(DeliveryMode.ORIGIN)


@dataclass(frozen=True, slots=True)
class DemandConfig:
    """Thresholds of the demand policy, with documented defaults.

    tau_s: time constant of the request-rate EWMA (seconds). 10 s follows a crowd
        within seconds and forgets it within about a minute.
    typical_download_s: mean time a client downloads over the origin path (seconds);
        D = rate x this (Little's law). 30 s: a 100 MB issue at about 27 Mbit/s.
    enter_downloaders: T_hi, D at or above which an issue moves to the swarm. 20: the
        size from which the loopback swarm bench shows the swarm beating the origins'
        capacity (docs/swarm.md).
    leave_downloaders: T_lo, D below which it goes back to the origins. 8.
    min_dwell_s: a mode is kept at least this long once entered (seconds). 30.
    """

    tau_s: float = 10.0
    typical_download_s: float = 30.0
    enter_downloaders: float = 20.0
    leave_downloaders: float = 8.0
    min_dwell_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("tau_s", "typical_download_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number")
        if not 0 <= self.leave_downloaders < self.enter_downloaders:
            raise ValueError(
                "need 0 <= leave_downloaders < enter_downloaders (the hysteresis band), "
                f"got {self.leave_downloaders} and {self.enter_downloaders}"
            )
        if not (self.min_dwell_s >= 0 and math.isfinite(self.min_dwell_s)):
            raise ValueError("min_dwell_s must be >= 0")


@dataclass(frozen=True, slots=True)
class DemandEstimate:
    """An issue's demand and mode at some time (for logs, metrics, tests)."""

    issue_id: str
    request_rate_per_s: float
    downloaders: float
    mode: DeliveryMode
    mode_since: float | None


@dataclass(slots=True)
class _IssueDemand:
    rate_per_s: float = 0.0
    last_request_at: float | None = None
    mode: DeliveryMode = DeliveryMode.ORIGIN
    mode_since: float | None = None
    changes: int = 0


def swarm_info_for(origin_url: str, tracker_url: str, issue_id: str, info_hash: str) -> SwarmInfo:
    """The `SwarmInfo` of an issue published on ``origin_url`` (docs/protocols.md)."""
    base = origin_url.rstrip("/")
    return SwarmInfo(
        torrent_url=f"{base}/content/{issue_id}/{issue_id}.torrent",
        tracker_url=tracker_url,
        info_hash=info_hash,
    )


class DemandPolicy:
    """A `ModePolicy`: origin or swarm per issue from its estimated demand."""

    def __init__(self, config: DemandConfig, swarms: Mapping[str, SwarmInfo]) -> None:
        self.config = config
        self.swarms = swarms
        self._issues: dict[str, _IssueDemand] = {}

    def _rate_at(self, state: _IssueDemand, now: float) -> float:
        if state.last_request_at is None:
            return 0.0
        elapsed = max(0.0, now - state.last_request_at)
        return state.rate_per_s * math.exp(-elapsed / self.config.tau_s)

    def handle_request(self, issue_id: str, *, now: float) -> None:
        """Count one directive request for the issue (decide() does this itself)."""
        state = self._issues.setdefault(issue_id, _IssueDemand())
        state.rate_per_s = self._rate_at(state, now) + 1.0 / self.config.tau_s
        state.last_request_at = (
            now if state.last_request_at is None else max(now, state.last_request_at)
        )

    def estimate(self, issue_id: str, *, now: float) -> DemandEstimate:
        """The issue's demand now, without counting a request."""
        state = self._issues.get(issue_id, _IssueDemand())
        rate = self._rate_at(state, now)
        return DemandEstimate(
            issue_id, rate, rate * self.config.typical_download_s, state.mode, state.mode_since
        )

    def decide(self, issue_id: str, *, now: float) -> ModeDecision:
        """Count this request and answer the issue's mode (with hysteresis and dwell)."""
        self.handle_request(issue_id, now=now)
        state = self._issues[issue_id]
        swarm = self.swarms.get(issue_id)
        cfg = self.config
        downloaders = self._rate_at(state, now) * cfg.typical_download_s
        dwelt = state.mode_since is None or now - state.mode_since >= cfg.min_dwell_s
        if swarm is None:
            target = DeliveryMode.ORIGIN
        elif state.mode is DeliveryMode.ORIGIN:
            enter = downloaders >= cfg.enter_downloaders
            target = DeliveryMode.SWARM if enter else DeliveryMode.ORIGIN
        else:
            leave = downloaders < cfg.leave_downloaders
            target = DeliveryMode.ORIGIN if leave else DeliveryMode.SWARM
        if target is not state.mode and dwelt:
            state.mode = target
            state.mode_since = now
            state.changes += 1
        if state.mode is DeliveryMode.SWARM and swarm is not None:
            return ModeDecision(DeliveryMode.SWARM, swarm)
        return _ORIGIN

    def mode_changes(self, issue_id: str) -> int:
        """How many times the issue changed mode (for metrics and tests)."""
        state = self._issues.get(issue_id)
        return 0 if state is None else state.changes
