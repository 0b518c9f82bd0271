"""Demand per issue and the mode it calls for: the balancer moving crowds onto the swarm.

A pure `ModePolicy` (pressrun.balancer.core): `DemandPolicy.decide(issue_id, now=,
address=)` is called once per directive request; it counts the request (once per client
address and window, below), updates the issue's demand estimate and answers `origin`
or `swarm` (with the issue's `SwarmInfo`).

**Who counts** (issue 25, finding 7). Directive requests are anonymous and cost nothing
to send: 40 in 2 s from one address pushed an issue past the multicast threshold and 2
a second kept it there for 10 minutes, a carousel at full rate for nobody. So a
request counts only as *one client that may be downloading*: an address (IPv4, or an
IPv6 /64, what one subscriber line gets) counts at most once per issue within
``client_window_s`` (30 s, the typical download); its other requests in the window
(retries, re-asks, a script) are answered but add nothing. A client that asks again and
again is thus one downloader (rate 1/window x window = 1), which is what it is. The
pairs remembered are bounded (``max_clients_tracked``, the oldest forgotten first) and
forgotten after the window. Requests from ``count_every_request_from`` (loopback by
default: the operator's own host, the demo and the tests, whose clients share
127.0.0.1) and requests without an address (the simulator) count each, as before.
What this does not stop: a stranger with many addresses (a botnet) still looks like
many readers; demand from directives cannot tell them apart. Behind a reverse proxy on
the balancer's own host every client is 127.0.0.1: take loopback out of
``count_every_request_from`` there, or each request counts again (docs/balancer.md).

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

**Several balancers** (issue 30). Balancer instances on one Redis share demand: each
publishes its own per-issue rates (`local_rates`) and hears the sum of the others'
(`set_remote_rates`, `pressrun.balancer.shared`); D is then computed from this
instance's rate plus the others' (decayed from when they were heard at the same
``tau_s``), so the thresholds hold whatever the number of instances, and each
instance, applying the same thresholds to the same total, takes the same mode within
one exchange. The burst term counts the others' requests from the rise of their rate
between two hearings (each request adds 1 / tau_s to it); a first hearing, or one
more than ``burst_window_s`` after the last, adds none. Without it (no Redis) the
remote part is zero: a balancer alone.

Wiring (the balancer service owner): ``BalancerCore(..., mode_policy=DemandPolicy(
DemandConfig(...), swarms))`` where ``swarms`` maps issue id -> SwarmInfo (a dict the
service may update as issues are published; the policy reads it at each request).
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pressrun.balancer.core import ModeDecision
from pressrun.balancer.demand_burst import RecentRequests, burst_downloaders
from pressrun.balancer.events import DeliveryMode, MulticastInfo, SwarmInfo

_ORIGIN = ModeDecision(DeliveryMode.ORIGIN)
#: the modes' order: from one to a higher one is a step up (taken without the dwell)
_LEVEL = {DeliveryMode.ORIGIN: 0, DeliveryMode.SWARM: 1, DeliveryMode.MULTICAST: 2}


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
    min_dwell_s: a mode is left downward only this long after the issue's last
        change (seconds); a step up is never held (the module docstring). 30.
    multicast_enter_downloaders: T_mc_hi, D at or above which an issue moves to
        multicast (None: no multicast level). 100 in ``pressrun serve balancer`` when a
        multicast sender is given: above the swarm's threshold by the factor the
        loopback runs show a swarm's origins' share rising again (docs/multicast.md).
    multicast_leave_downloaders: T_mc_lo, D below which it leaves multicast. 50.
    client_window_s: a client address (an IPv4 address, an IPv6 /64) counts at most
        once per issue within this many seconds; 0 counts every request (the rule
        before issue 25). 30: ``typical_download_s``, so a client that keeps asking
        counts as the one downloader it is.
    max_clients_tracked: the most (issue, address) pairs remembered for the window;
        past it the oldest are forgotten (and may count again). 100,000: about 20 MB.
    count_every_request_from: networks whose every request counts (CIDR strings).
        Loopback by default: the operator's host (the demo's and the tests' clients
        all come from 127.0.0.1). Empty behind a reverse proxy on the same host.
    burst_window_s: the burst term's window (seconds; 0: none, D is the EWMA's). 3
        and burst_z 1.5 (the standard deviations of a Poisson count taken off it):
        docs/results/2026-11-29-demand-burst.md says why.
    burst_z: see burst_window_s.
    """

    tau_s: float = 10.0
    typical_download_s: float = 30.0
    enter_downloaders: float = 20.0
    leave_downloaders: float = 8.0
    min_dwell_s: float = 30.0
    multicast_enter_downloaders: float | None = None
    multicast_leave_downloaders: float = 50.0
    client_window_s: float = 30.0
    max_clients_tracked: int = 100_000
    burst_window_s: float = 3.0
    burst_z: float = 1.5
    count_every_request_from: tuple[str, ...] = ("127.0.0.0/8", "::1/128")

    def __post_init__(self) -> None:
        if self.multicast_enter_downloaders is not None and not (
            self.leave_downloaders
            <= self.multicast_leave_downloaders
            < self.multicast_enter_downloaders
        ):
            raise ValueError(
                "need leave_downloaders <= multicast_leave_downloaders < "
                f"multicast_enter_downloaders, got {self.leave_downloaders}, "
                f"{self.multicast_leave_downloaders} and {self.multicast_enter_downloaders}"
            )
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
        if not (self.client_window_s >= 0 and math.isfinite(self.client_window_s)):
            raise ValueError("client_window_s must be >= 0 (0: every request counts)")
        if self.max_clients_tracked < 1:
            raise ValueError("max_clients_tracked must be at least 1")
        if not (self.burst_window_s >= 0 and math.isfinite(self.burst_window_s)):
            raise ValueError("burst_window_s must be >= 0 (0: no burst term)")
        if not (self.burst_z >= 0 and math.isfinite(self.burst_z)):
            raise ValueError("burst_z must be >= 0")
        for net in self.count_every_request_from:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(
                    f"count_every_request_from: {net!r} is not a network (e.g. 10.0.0.0/8)"
                ) from None

    def networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """`count_every_request_from` parsed."""
        return tuple(ipaddress.ip_network(n, strict=False) for n in self.count_every_request_from)


def client_key(address: str) -> str:
    """What one client is for counting: an IPv4 address, an IPv6 /64 (one subscriber
    line's prefix: an attacker has 2^64 addresses in it), or, for anything that does
    not parse, its first 64 characters."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


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


#: requests/s under which an issue's demand has faded: not shared with the other
#: balancers (`DemandPolicy.local_rates`), and forgotten once no origin holds it
FADED_RATE_PER_S = 1e-4

#: how often `DemandPolicy.decide` looks for faded issues no origin holds (seconds)
_SWEEP_EVERY_S = 1.0

#: no issue heard of only from other balancers is added past this many issues with
#: state (their rates come from our own instances, but the bound holds whatever
#: Redis holds)
MAX_REMOTE_ISSUES = 10_000


@dataclass(slots=True)
class _IssueDemand:
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
        self._issues: dict[str, _IssueDemand] = {}
        #: (issue, client key) -> when it last counted, oldest first (``now`` only grows)
        self._counted: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._every_request_from = config.networks()
        #: requests answered but not counted (the same client within its window)
        self.requests_not_counted = 0
        #: issues no origin in rotation holds (`forget_issue`) whose demand is kept
        #: until it has faded (insertion order; bounded by the issues held before)
        self._unheld: dict[str, None] = {}
        self._swept_at = -math.inf
        #: how many times an issue went to multicast here (the carousel loop wakes on
        #: a change: `pressrun.balancer.carousels.keep_carousels`)
        self.multicast_entries = 0

    def counts(self, issue_id: str, address: str | None, *, now: float) -> bool:
        """Whether a request for the issue from ``address`` counts as demand now, and
        remember it if so (once per client and issue within ``client_window_s``)."""
        window = self.config.client_window_s
        if address is None or window == 0:
            return True
        if self._every_request_from:
            try:
                ip = ipaddress.ip_address(address.split("%", 1)[0])
            except ValueError:
                ip = None
            if ip is not None and any(ip in net for net in self._every_request_from):
                return True
        counted = self._counted
        horizon = now - window
        while counted:
            oldest_key, oldest_at = next(iter(counted.items()))
            if oldest_at > horizon:
                break
            del counted[oldest_key]
        pair = (issue_id, client_key(address))
        if pair in counted:
            self.requests_not_counted += 1
            return False
        counted[pair] = now
        if len(counted) > self.config.max_clients_tracked:
            counted.popitem(last=False)
        return True

    def clients_tracked(self) -> int:
        """How many (issue, client) pairs are remembered (bounded)."""
        return len(self._counted)

    def _rate_at(self, state: _IssueDemand, now: float) -> float:
        """This balancer's own rate for the issue now."""
        if state.last_request_at is None:
            return 0.0
        elapsed = max(0.0, now - state.last_request_at)
        return state.rate_per_s * math.exp(-elapsed / self.config.tau_s)

    def _total_rate_at(self, state: _IssueDemand, now: float) -> float:
        """This balancer's rate plus the other balancers' (decayed since heard)."""
        rate = self._rate_at(state, now)
        if state.remote_rate_per_s > 0.0:
            elapsed = max(0.0, now - state.remote_at)
            rate += state.remote_rate_per_s * math.exp(-elapsed / self.config.tau_s)
        return rate

    def _count_recent(self, state: _IssueDemand, now: float, count: float) -> None:
        """Add ``count`` requests at ``now`` to the burst window (if there is one)."""
        window = self.config.burst_window_s
        if window <= 0.0:
            return
        if state.recent is None:
            state.recent = RecentRequests(window)
        state.recent.add(now, count)

    def _downloaders(self, state: _IssueDemand, now: float) -> float:
        """D: the EWMA's downloaders (this balancer's and the others'), or the burst
        term's if larger (module docstring)."""
        cfg = self.config
        steady = self._total_rate_at(state, now) * cfg.typical_download_s
        if state.recent is None:
            return steady
        burst = burst_downloaders(
            state.recent.count(now),
            window_s=cfg.burst_window_s,
            z=cfg.burst_z,
            typical_download_s=cfg.typical_download_s,
        )
        return max(steady, burst)

    def local_rates(self, *, now: float, floor: float = FADED_RATE_PER_S) -> dict[str, float]:
        """This balancer's own request rate per issue now (what it shares with the
        others); rates below ``floor`` (requests/s) are left out."""
        out: dict[str, float] = {}
        for issue_id, state in self._issues.items():
            rate = self._rate_at(state, now)
            if rate >= floor:
                out[issue_id] = rate
        return out

    def set_remote_rates(self, rates: Mapping[str, float], *, now: float) -> None:
        """The other balancers' summed rate per issue, as of ``now``: replaces what
        was heard before (an issue not named has no remote demand any more). An issue
        known only from them gets a state (up to `MAX_REMOTE_ISSUES`), so its mode
        (and carousel) follows the total even here."""
        for issue_id, state in list(self._issues.items()):
            if issue_id not in rates:
                state.remote_rate_per_s = 0.0
                state.remote_at = now
                state.remote_heard = True
                if state.last_request_at is None and state.mode is DeliveryMode.ORIGIN:
                    del self._issues[issue_id]  # heard only from others, and gone there
        tau = self.config.tau_s
        for issue_id, rate in rates.items():
            if not (rate >= 0.0 and math.isfinite(rate)):
                continue
            known = self._issues.get(issue_id)
            if known is None:
                if len(self._issues) >= MAX_REMOTE_ISSUES:
                    continue
                known = self._issues[issue_id] = _IssueDemand()
            # the others' requests since the last hearing, for the burst term: their
            # rate's rise over its decay, times tau (each request adds 1 / tau to it).
            # Only from a hearing within the window: after a gap (Redis not answering)
            # the rise holds requests of unknown times, not a burst
            since = now - known.remote_at
            if known.remote_heard and 0.0 <= since <= self.config.burst_window_s:
                before = known.remote_rate_per_s * math.exp(-since / tau)
                self._count_recent(known, now, (rate - before) * tau)
            known.remote_rate_per_s = rate
            known.remote_at = now
            known.remote_heard = True

    def handle_request(self, issue_id: str, *, now: float) -> None:
        """Count one directive request for the issue (decide() does this itself)."""
        state = self._issues.setdefault(issue_id, _IssueDemand())
        state.rate_per_s = self._rate_at(state, now) + 1.0 / self.config.tau_s
        state.last_request_at = (
            now if state.last_request_at is None else max(now, state.last_request_at)
        )
        self._count_recent(state, now, 1.0)

    def estimate(self, issue_id: str, *, now: float) -> DemandEstimate:
        """The issue's demand now, without counting a request."""
        state = self._issues.get(issue_id, _IssueDemand())
        rate = self._total_rate_at(state, now)
        return DemandEstimate(
            issue_id, rate, self._downloaders(state, now), state.mode, state.mode_since
        )

    def demand_view(self, *, now: float) -> list[IssueDemandView]:
        """Every issue with state, as the policy sees it now (for ``/metrics``: what an
        operator needs to tell why a mode came or did not). Bounded by the issues the
        policy keeps (those held by an origin, and at most `MAX_REMOTE_ISSUES` others)."""
        out = []
        for issue_id, state in self._issues.items():
            local = self._rate_at(state, now)
            total = self._total_rate_at(state, now)
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

    def _target(self, state: _IssueDemand, downloaders: float, has_swarm: bool) -> DeliveryMode:
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

    def _update(self, issue_id: str, state: _IssueDemand, now: float) -> None:
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
        state = self._issues.setdefault(issue_id, _IssueDemand())
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
                if self._total_rate_at(state, now) >= FADED_RATE_PER_S:
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
