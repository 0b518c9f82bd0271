"""Which directive requests count as demand: once per client address and window.

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
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict

from pressrun.balancer.demand_config import DemandConfig


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


class ClientCounter:
    """The (issue, client) pairs counted within ``client_window_s``, bounded by
    ``max_clients_tracked`` (`DemandPolicy.counts`)."""

    def __init__(self, config: DemandConfig) -> None:
        self.config = config
        #: (issue, client key) -> when it last counted, oldest first (``now`` only grows)
        self._counted: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._every_request_from = config.networks()
        #: requests answered but not counted (the same client within its window)
        self.requests_not_counted = 0

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
