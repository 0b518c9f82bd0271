"""Demand per issue and the mode it calls for: the balancer moving crowds onto the swarm.

A pure `ModePolicy` (pressrun.balancer.core): `DemandPolicy.decide(issue_id, now=,
address=)` is called once per directive request; it counts the request (once per client
address and window: `demand_clients`), updates the issue's demand estimate and answers `origin`
or `swarm` (with the issue's `SwarmInfo`).

Who counts is `pressrun.balancer.demand_clients` (once per client address and window);
the estimate D, from this balancer's request rate, the other balancers' and the burst
term, is `pressrun.balancer.demand_rates`; the thresholds are
`pressrun.balancer.demand_config.DemandConfig`. This module holds the mode D calls for.

The mode, with hysteresis so it does not flap: an issue enters `swarm` when
D >= ``enter_downloaders`` (T_hi) and goes back to `origin` when D < ``leave_downloaders``
(T_lo < T_hi); and a mode is left *downward* (multicast to swarm or origin, swarm to
origin) only ``min_dwell_s`` after the issue's last change, whatever D does. A step
*up* is taken as soon as D reaches its level, dwell or not: a crowd that rises is
served worse by the lower mode, and the peak the multicast level is for lasts less
than a dwell. Held back by the swarm's dwell, a peak that crossed the multicast
threshold and fell under it again before the dwell ended never got its carousel, so
whether it did hung on when the swarm had been entered, a few seconds of timing
(flash-crowd-50, 28 Nov 12:30: no carousel; 09:57: one; issue 28). So a step down
comes at least ``min_dwell_s`` after the change before it, and crossing the band
upward again takes real demand (Hypothesis tests check both).

**The third level, multicast** (peak demand, paper 004 section III.B: the same bytes
sent once for every reader). With ``multicast_enter_downloaders`` set (T_mc_hi, above
T_hi), an issue whose D reaches it goes to `multicast`, and comes back down when D
falls below ``multicast_leave_downloaders`` (T_mc_lo < T_mc_hi): to `swarm` while
D >= T_lo, else to `origin`; the same dwell applies. The policy only *wants* a
carousel then (`carousels_wanted`): the balancer service asks the multicast sender
to start it, and answers `multicast` once the carousel runs (``carousels`` has the
issue); until then the issue is answered as `swarm` (or `origin`). Demand decays
between requests, so the service calls `review` on a timer: an issue nobody asks for
any more leaves multicast and its carousel is stopped.

An issue with no `SwarmInfo` (no torrent known: `swarms` has no entry for it) stays
`origin` below the multicast level. `swarm_info_for` builds the `SwarmInfo` from the
protocol's URLs: torrent at ``<origin>/content/<issue>/<issue>.torrent`` (docs/protocols.md).
An `origin` answer names the issue's swarm too when one is known: the origin reader's
copy seeds it (`pressrun.clients.origin_seed`).


Wiring (the balancer service owner): ``BalancerCore(..., mode_policy=DemandPolicy(
DemandConfig(...), swarms))`` where ``swarms`` maps issue id -> SwarmInfo (a dict the
service may update as issues are published; the policy reads it at each request).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pressrun.balancer import demand_rates
from pressrun.balancer.core import ModeDecision
from pressrun.balancer.demand_clients import ClientCounter, client_key
from pressrun.balancer.demand_config import DemandConfig
from pressrun.balancer.demand_rates import (
    FADED_RATE_PER_S,
    MAX_REMOTE_ISSUES,
    IssueDemand,
    count_request,
    downloaders_at,
    rate_at,
    total_rate_at,
)
from pressrun.balancer.events import DeliveryMode, MulticastInfo, SwarmInfo

#: re-exported: callers import them from here
__all__ = [
    "FADED_RATE_PER_S",
    "MAX_REMOTE_ISSUES",
    "DemandConfig",
    "DemandEstimate",
    "DemandPolicy",
    "IssueDemandView",
    "client_key",
    "swarm_info_for",
]

_ORIGIN = ModeDecision(DeliveryMode.ORIGIN)
#: the modes' order: from one to a higher one is a step up (taken without the dwell)
_LEVEL = {DeliveryMode.ORIGIN: 0, DeliveryMode.SWARM: 1, DeliveryMode.MULTICAST: 2}


@dataclass(frozen=True, slots=True)
class DemandEstimate:
    """An issue's demand and mode at some time (for logs, metrics, tests)."""

    issue_id: str
    request_rate_per_s: float
    downloaders: float
    mode: DeliveryMode
    mode_since: float | None


@dataclass(frozen=True, slots=True)
class IssueDemandView:
    """One issue's demand as the policy sees it (`DemandPolicy.demand_view`): this
    balancer's own request rate, the other balancers' (decayed since heard), the
    downloaders D from both, the mode, since when, and how many changes so far."""

    issue_id: str
    local_rate_per_s: float
    remote_rate_per_s: float
    downloaders: float
    mode: DeliveryMode
    mode_since: float | None
    changes: int
    #: the requests counted in the burst window (here and at the others)
    recent_requests: float = 0.0


#: how often `DemandPolicy.decide` looks for faded issues no origin holds (seconds)
_SWEEP_EVERY_S = 1.0


def swarm_info_for(
    origin_url: str,
    tracker_url: str,
    issue_id: str,
    info_hash: str,
    file_name: str | None = None,
) -> SwarmInfo:
    """The `SwarmInfo` of an issue published on ``origin_url`` (docs/protocols.md);
    ``file_name`` (the manifest's) lets a browser's directive name web seeds."""
    base = origin_url.rstrip("/")
    return SwarmInfo(
        torrent_url=f"{base}/content/{issue_id}/{issue_id}.torrent",
        tracker_url=tracker_url,
        info_hash=info_hash,
        file_name=file_name,
    )


class DemandPolicy:
    """A `ModePolicy`: origin, swarm or multicast per issue from its estimated demand."""

    def __init__(
        self,
        config: DemandConfig,
        swarms: Mapping[str, SwarmInfo],
        carousels: Mapping[str, MulticastInfo] | None = None,
    ) -> None:
        self.config = config
        self.swarms = swarms
        #: issue id -> its running carousel (the service keeps it up to date)
        self.carousels: Mapping[str, MulticastInfo] = carousels if carousels is not None else {}
        self._issues: dict[str, IssueDemand] = {}
        self._clients = ClientCounter(config)
        #: issues no origin in rotation holds (`forget_issue`) whose demand is kept
        #: until it has faded (insertion order; bounded by the issues held before)
        self._unheld: dict[str, None] = {}
        self._swept_at = -math.inf
        #: how many times an issue went to multicast here (the carousel loop wakes on
        #: a change: `pressrun.balancer.carousels.keep_carousels`)
        self.multicast_entries = 0

    @property
    def requests_not_counted(self) -> int:
        """Requests answered but not counted (the same client within its window)."""
        return self._clients.requests_not_counted

    def counts(self, issue_id: str, address: str | None, *, now: float) -> bool:
        """Whether a request for the issue from ``address`` counts as demand now, and
        remember it if so (once per client and issue within ``client_window_s``:
        `pressrun.balancer.demand_clients`)."""
        return self._clients.counts(issue_id, address, now=now)

    def clients_tracked(self) -> int:
        """How many (issue, client) pairs are remembered (bounded)."""
        return self._clients.clients_tracked()

    def _downloaders(self, state: IssueDemand, now: float) -> float:
        """D for the issue now (`pressrun.balancer.demand_rates.downloaders_at`)."""
        return downloaders_at(state, now, self.config)

    def local_rates(self, *, now: float, floor: float = FADED_RATE_PER_S) -> dict[str, float]:
        """This balancer's own request rate per issue now (what it shares with the
        others); rates below ``floor`` (requests/s) are left out."""
        return demand_rates.local_rates(self._issues, now=now, tau_s=self.config.tau_s, floor=floor)

    def set_remote_rates(self, rates: Mapping[str, float], *, now: float) -> None:
        """The other balancers' summed rate per issue, as of ``now``
        (`pressrun.balancer.demand_rates.set_remote_rates`)."""
        demand_rates.set_remote_rates(self._issues, rates, now=now, cfg=self.config)

    def handle_request(self, issue_id: str, *, now: float) -> None:
        """Count one directive request for the issue (decide() does this itself)."""
        count_request(self._issues.setdefault(issue_id, IssueDemand()), now, self.config)

    def estimate(self, issue_id: str, *, now: float) -> DemandEstimate:
        """The issue's demand now, without counting a request."""
        state = self._issues.get(issue_id, IssueDemand())
        rate = total_rate_at(state, now, self.config.tau_s)
        return DemandEstimate(
            issue_id, rate, self._downloaders(state, now), state.mode, state.mode_since
        )

    def demand_view(self, *, now: float) -> list[IssueDemandView]:
        """Every issue with state, as the policy sees it now (for ``/metrics``: what an
        operator needs to tell why a mode came or did not). Bounded by the issues the
        policy keeps (those held by an origin, and at most `MAX_REMOTE_ISSUES` others)."""
        out = []
        for issue_id, state in self._issues.items():
            local = rate_at(state, now, self.config.tau_s)
            total = total_rate_at(state, now, self.config.tau_s)
            out.append(
                IssueDemandView(
                    issue_id,
                    local,
                    total - local,
                    self._downloaders(state, now),
                    state.mode,
                    state.mode_since,
                    state.changes,
                    0.0 if state.recent is None else state.recent.count(now),
                )
            )
        return out

    def _target(self, state: IssueDemand, downloaders: float, has_swarm: bool) -> DeliveryMode:
        """The mode D calls for from the current one (the hysteresis bands)."""
        cfg = self.config
        mc_enter = cfg.multicast_enter_downloaders
        current = state.mode
        if mc_enter is not None:
            if current is not DeliveryMode.MULTICAST and downloaders >= mc_enter:
                return DeliveryMode.MULTICAST
            if current is DeliveryMode.MULTICAST and downloaders >= cfg.multicast_leave_downloaders:
                return DeliveryMode.MULTICAST
        if not has_swarm:
            return DeliveryMode.ORIGIN
        if current is DeliveryMode.ORIGIN:
            return DeliveryMode.SWARM if downloaders >= cfg.enter_downloaders else current
        return DeliveryMode.ORIGIN if downloaders < cfg.leave_downloaders else DeliveryMode.SWARM

    def _update(self, issue_id: str, state: IssueDemand, now: float) -> None:
        downloaders = self._downloaders(state, now)
        target = self._target(state, downloaders, issue_id in self.swarms)
        # the dwell holds a step down only (the module docstring): a step up is taken
        # at the first request or review that sees D at its level
        up = _LEVEL[target] > _LEVEL[state.mode]
        dwelt = state.mode_since is None or now - state.mode_since >= self.config.min_dwell_s
        if target is not state.mode and (up or dwelt):
            state.mode = target
            state.mode_since = now
            state.changes += 1
            if target is DeliveryMode.MULTICAST:
                self.multicast_entries += 1

    def decide(self, issue_id: str, *, now: float, address: str | None = None) -> ModeDecision:
        """Count this request (once per client address and window: `counts`) and answer
        the issue's mode (with hysteresis and dwell)."""
        if self._unheld:
            # asked for, so some origin holds it again (the core refuses the others)
            self._unheld.pop(issue_id, None)
            if now - self._swept_at >= _SWEEP_EVERY_S:
                self._sweep_unheld(now)
        if self.counts(issue_id, address, now=now):
            self.handle_request(issue_id, now=now)
        state = self._issues.setdefault(issue_id, IssueDemand())
        self._update(issue_id, state, now)
        swarm = self.swarms.get(issue_id)
        if state.mode is DeliveryMode.MULTICAST:
            carousel = self.carousels.get(issue_id)
            if carousel is not None:
                return ModeDecision(DeliveryMode.MULTICAST, swarm, carousel)
        if state.mode is not DeliveryMode.ORIGIN and swarm is not None:
            return ModeDecision(DeliveryMode.SWARM, swarm)
        # an origin reader's copy seeds the issue's swarm afterwards (and offers its
        # pieces while it downloads: clients/origin_seed.py), so the swarm is named
        return _ORIGIN if swarm is None else ModeDecision(DeliveryMode.ORIGIN, swarm)

    def review(self, *, now: float) -> None:
        """Re-evaluate every issue's mode without counting a request (demand decays
        between requests: an issue nobody asks for any more leaves multicast), and
        forget the issues no origin holds whose demand has faded."""
        for issue_id, state in self._issues.items():
            self._update(issue_id, state, now)
        self._sweep_unheld(now)

    def _sweep_unheld(self, now: float) -> None:
        """Forget each issue no origin holds once its mode is back to origin and its
        demand (with the other balancers') under `FADED_RATE_PER_S`."""
        self._swept_at = now
        for issue_id in list(self._unheld):
            state = self._issues.get(issue_id)
            if state is not None:
                self._update(issue_id, state, now)
                if state.mode is not DeliveryMode.ORIGIN:
                    continue
                if total_rate_at(state, now, self.config.tau_s) >= FADED_RATE_PER_S:
                    continue
                del self._issues[issue_id]
            del self._unheld[issue_id]

    def adopt_carousels(self, running: Collection[str], *, now: float) -> None:
        """The sender runs carousels for ``running``: an issue of them whose total
        demand is at or above the leave threshold (``multicast_leave_downloaders``)
        counts as in multicast here too, whatever this balancer's own path to it. The
        hysteresis holds for the carousel, not for one instance's memory: a balancer
        that joined (or restarted) after the total crossed the enter threshold never
        saw it cross, and as the lease holder it would stop the carousel of a crowd
        still above the leave threshold (and tell its clients swarm meanwhile)."""
        if self.config.multicast_enter_downloaders is None:
            return
        for issue_id in running:
            state = self._issues.get(issue_id)
            if state is None or state.mode is DeliveryMode.MULTICAST:
                continue
            downloaders = self._downloaders(state, now)
            if downloaders >= self.config.multicast_leave_downloaders:
                state.mode = DeliveryMode.MULTICAST
                state.mode_since = now
                state.changes += 1

    def leave_stopped_carousels(
        self, answered: Collection[str], running: Collection[str], *, now: float
    ) -> None:
        """For a balancer that does not order the carousels (another holds the lease):
        an issue in multicast whose carousel it answered (``answered``: last round's
        wanted issues the sender ran) and which the sender no longer runs was stopped
        by the balancer that orders them. It leaves multicast now, to the mode below
        (swarm if it has a swarm and the total is at or above ``leave_downloaders``,
        else origin), dwell or not: the carousel is gone whatever this instance's
        demand says. Kept in multicast, it went on wanting a carousel for nobody,
        which it would start if it took the lease: flash crowd at 28 Nov 23:07, the
        holder stopped the carousel at 301 s (its total under the leave threshold)
        and the other balancer, its own unshared residue of a rate and then the
        stopped carousel's readers asking again keeping its total above it, stayed
        in multicast until 701 s (398 s with no carousel). An issue wanted and never
        answered (its start still coming) is left alone. The step up is not held:
        a total at the enter threshold puts it back in multicast at the next
        `review` or request, as ever."""
        for issue_id in answered:
            if issue_id in running:
                continue
            state = self._issues.get(issue_id)
            if state is None or state.mode is not DeliveryMode.MULTICAST:
                continue
            downloaders = self._downloaders(state, now)
            below = (
                DeliveryMode.SWARM
                if issue_id in self.swarms and downloaders >= self.config.leave_downloaders
                else DeliveryMode.ORIGIN
            )
            state.mode = below
            state.mode_since = now
            state.changes += 1

    def carousels_wanted(self) -> frozenset[str]:
        """The issues in multicast mode: their carousels should run."""
        return frozenset(
            issue for issue, state in self._issues.items() if state.mode is DeliveryMode.MULTICAST
        )

    def forget_issue(self, issue_id: str) -> None:
        """No origin in rotation holds the issue any more. Its demand, mode and dwell
        are kept until the demand has faded (`review`, `decide`), then forgotten: every
        origin missing its polls for a few seconds at a peak (as under load in the
        emulated flash crowd) must not reset a crowd's multicast mode to origin, which
        stopped its carousel 3 s after it started and left the crowd's next clients
        to build the demand up again. Clients are refused meanwhile (the core), so the
        demand only fades; an issue retracted from every origin keeps its mode (and
        carousel) until then, as it would had the requests simply stopped."""
        if issue_id in self._issues:
            self._unheld[issue_id] = None

    def mode_changes(self, issue_id: str) -> int:
        """How many times the issue changed mode (for metrics and tests)."""
        state = self._issues.get(issue_id)
        return 0 if state is None else state.changes
