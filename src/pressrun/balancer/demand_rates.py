"""An issue's demand state: its request rate, the other balancers' rate, and D.

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
- **The burst term** (issue 28, `pressrun.balancer.demand_burst`): the n requests
  counted in the last ``burst_window_s`` by the same law at their rate's lower bound,
  max(0, n - ``burst_z`` sqrt(n)) / window x ``typical_download_s``; D is the larger
  of the two. A steady rate reads what it did, a crowd's start reads its level
  sooner (9 requests in 3 s read 45, where the EWMA needs about 15), and D is never
  under the EWMA's.


publishes its own per-issue rates (`local_rates`) and hears the sum of the others'
(`set_remote_rates`, `pressrun.balancer.shared`); D is then computed from this
instance's rate plus the others' (decayed from when they were heard at the same
``tau_s``), so the thresholds hold whatever the number of instances, and each
instance, applying the same thresholds to the same total, takes the same mode within
one exchange. The burst term counts the others' requests from the rise of their rate
between two hearings (each request adds 1 / tau_s to it); a first hearing, or one
more than ``burst_window_s`` after the last, adds none. Without it (no Redis) the
remote part is zero: a balancer alone.

The mode kept with the rates (`IssueDemand.mode`) is `pressrun.balancer.demand`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pressrun.balancer.demand_burst import RecentRequests, burst_downloaders
from pressrun.balancer.demand_config import DemandConfig
from pressrun.balancer.events import DeliveryMode

#: requests/s under which an issue's demand has faded: not shared with the other
#: balancers (`DemandPolicy.local_rates`), and forgotten once no origin holds it
FADED_RATE_PER_S = 1e-4

#: no issue heard of only from other balancers is added past this many issues with
#: state (their rates come from our own instances, but the bound holds whatever
#: Redis holds)
MAX_REMOTE_ISSUES = 10_000


@dataclass(slots=True)
class IssueDemand:
    rate_per_s: float = 0.0
    last_request_at: float | None = None
    #: the other balancers' rate for the issue when heard, and when (``now``)
    remote_rate_per_s: float = 0.0
    remote_at: float = 0.0
    #: whether the other balancers' rate has been heard (a first hearing adds nothing
    #: to the burst term: what it holds came at no known time)
    remote_heard: bool = False
    #: the requests of the last burst window, here and (their increments) at the others
    recent: RecentRequests | None = None
    mode: DeliveryMode = DeliveryMode.ORIGIN
    mode_since: float | None = None
    changes: int = 0


def rate_at(state: IssueDemand, now: float, tau_s: float) -> float:
    """This balancer's own rate for the issue now."""
    if state.last_request_at is None:
        return 0.0
    elapsed = max(0.0, now - state.last_request_at)
    return state.rate_per_s * math.exp(-elapsed / tau_s)


def total_rate_at(state: IssueDemand, now: float, tau_s: float) -> float:
    """This balancer's rate plus the other balancers' (decayed since heard)."""
    rate = rate_at(state, now, tau_s)
    if state.remote_rate_per_s > 0.0:
        elapsed = max(0.0, now - state.remote_at)
        rate += state.remote_rate_per_s * math.exp(-elapsed / tau_s)
    return rate


def count_recent(state: IssueDemand, now: float, count: float, window_s: float) -> None:
    """Add ``count`` requests at ``now`` to the burst window (if there is one)."""
    if window_s <= 0.0:
        return
    if state.recent is None:
        state.recent = RecentRequests(window_s)
    state.recent.add(now, count)


def downloaders_at(state: IssueDemand, now: float, cfg: DemandConfig) -> float:
    """D: the EWMA's downloaders (this balancer's and the others'), or the burst
    term's if larger (module docstring)."""
    steady = total_rate_at(state, now, cfg.tau_s) * cfg.typical_download_s
    if state.recent is None:
        return steady
    burst = burst_downloaders(
        state.recent.count(now),
        window_s=cfg.burst_window_s,
        z=cfg.burst_z,
        typical_download_s=cfg.typical_download_s,
    )
    return max(steady, burst)


def count_request(state: IssueDemand, now: float, cfg: DemandConfig) -> None:
    """Count one request for the issue at ``now`` (its rate and the burst window)."""
    state.rate_per_s = rate_at(state, now, cfg.tau_s) + 1.0 / cfg.tau_s
    state.last_request_at = (
        now if state.last_request_at is None else max(now, state.last_request_at)
    )
    count_recent(state, now, 1.0, cfg.burst_window_s)


def local_rates(
    issues: Mapping[str, IssueDemand], *, now: float, tau_s: float, floor: float
) -> dict[str, float]:
    """This balancer's own request rate per issue now (what it shares with the
    others); rates below ``floor`` (requests/s) are left out."""
    out: dict[str, float] = {}
    for issue_id, state in issues.items():
        rate = rate_at(state, now, tau_s)
        if rate >= floor:
            out[issue_id] = rate
    return out


def set_remote_rates(
    issues: dict[str, IssueDemand], rates: Mapping[str, float], *, now: float, cfg: DemandConfig
) -> None:
    """The other balancers' summed rate per issue, as of ``now``: replaces what
    was heard before (an issue not named has no remote demand any more). An issue
    known only from them gets a state (up to `MAX_REMOTE_ISSUES`), so its mode
    (and carousel) follows the total even here."""
    for issue_id, state in list(issues.items()):
        if issue_id not in rates:
            state.remote_rate_per_s = 0.0
            state.remote_at = now
            state.remote_heard = True
            if state.last_request_at is None and state.mode is DeliveryMode.ORIGIN:
                del issues[issue_id]  # heard only from others, and gone there
    tau = cfg.tau_s
    for issue_id, rate in rates.items():
        if not (rate >= 0.0 and math.isfinite(rate)):
            continue
        known = issues.get(issue_id)
        if known is None:
            if len(issues) >= MAX_REMOTE_ISSUES:
                continue
            known = issues[issue_id] = IssueDemand()
        # the others' requests since the last hearing, for the burst term: their
        # rate's rise over its decay, times tau (each request adds 1 / tau to it).
        # Only from a hearing within the window: after a gap (Redis not answering)
        # the rise holds requests of unknown times, not a burst
        since = now - known.remote_at
        if known.remote_heard and 0.0 <= since <= cfg.burst_window_s:
            before = known.remote_rate_per_s * math.exp(-since / tau)
            count_recent(known, now, (rate - before) * tau, cfg.burst_window_s)
        known.remote_rate_per_s = rate
        known.remote_at = now
        known.remote_heard = True
