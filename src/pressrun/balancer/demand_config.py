"""The demand policy's thresholds (`DemandConfig`), with their defaults and checks.

`pressrun.balancer.demand` says what each does; ``pressrun serve balancer`` builds one
from its flags (`pressrun.balancer.cli`).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass


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
        change (seconds); a step up is never held (`pressrun.balancer.demand`). 30.
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
