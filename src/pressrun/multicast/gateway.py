"""The AMT gateway's decisions (RFC 7450 section 5.2), pure: ``now`` given, no socket.

The binding's receive loop carries the data (`Receiver.receive(tunnel_fd=...)` unwraps
Multicast Data); this core says what to send to the relay and when:

- with only a discovery address (``relay`` unknown), a Relay Discovery with a fresh
  nonce, then a Request to the relay the matching Advertisement names;
- a Request with a fresh nonce; a Membership Query that echoes it gives the response
  MAC, the relay's query interval (QQIC) and its L flag (a loaded relay takes no new
  tunnel: `RelayRefused`, the caller falls back);
- on each query, a Membership Update carrying the whole state (MODE_IS_INCLUDE of each
  group with its sources), so a relay that forgot the tunnel (restart, NAT rebinding)
  gets it back;
- a new Request every query interval (at most ``keepalive_s``: NAT bindings often
  last 30-120 s, the kernel relay's default interval is 125 s), which keeps the NAT
  binding alive and refreshes the tunnel;
- joins and leaves at once as ALLOW_NEW_SOURCES / BLOCK_OLD_SOURCES reports (the
  receiver-driven layering);
- a Request not answered is sent again after 1, 2, 4 ... up to 30 s.

Nonces come from the caller's ``nonces`` (a random source), so tests are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pressrun.multicast import amt

Address = tuple[str, int]
Channel = tuple[str, str]  # (source, group)


@dataclass(frozen=True, slots=True)
class Send:
    """Effect: send ``data`` to the relay at ``to``."""

    data: bytes
    to: Address


@dataclass(frozen=True, slots=True)
class RelayRefused:
    """Effect: the relay is loaded (L flag) and takes no tunnel of ours."""

    relay: Address


GatewayEffect = Send | RelayRefused


class GatewayCore:
    """One gateway's conversation with its relay (see the module docstring)."""

    def __init__(
        self,
        *,
        nonces: Callable[[], int],
        relay: Address | None = None,
        discovery: Address | None = None,
        report_source: str = "0.0.0.0",
        keepalive_s: float = 20.0,
    ) -> None:
        if (relay is None) == (discovery is None):
            raise ValueError("give the relay's address or a discovery address, one of them")
        self.nonces = nonces
        self.relay = relay
        self.discovery = discovery
        self.report_source = report_source
        self.keepalive_s = keepalive_s
        self.channels: set[Channel] = set()
        self.mac: int | None = None
        #: the request nonce the MAC belongs to (Updates carry both)
        self.mac_nonce = 0
        #: the nonce of our latest Request
        self.nonce = 0
        self.discovery_nonce: int | None = None
        self.interval_s = keepalive_s
        self.loaded = False
        self._next: float = 0.0
        self._keepalive_at: float = 0.0
        self._retry_s = 1.0

    @property
    def ready(self) -> bool:
        """A query was answered: joins and leaves go out at once."""
        return self.mac is not None and not self.loaded

    def start(self, *, now: float) -> list[GatewayEffect]:
        """The first message: a Discovery or a Request."""
        return self._ask(now)

    def _ask(self, now: float) -> list[GatewayEffect]:
        self._next = now + self._retry_s
        self._retry_s = min(30.0, self._retry_s * 2)
        if self.relay is None:
            assert self.discovery is not None
            self.discovery_nonce = self.nonces() & 0xFFFFFFFF
            return [Send(amt.encode(amt.RelayDiscovery(self.discovery_nonce)), self.discovery)]
        self.nonce = self.nonces() & 0xFFFFFFFF
        return [Send(amt.encode(amt.Request(self.nonce)), self.relay)]

    def handle(self, data: bytes, *, now: float) -> list[GatewayEffect]:
        """A message from the relay (what the receive loop handed over); anything that
        does not answer our latest nonce is ignored."""
        try:
            message = amt.decode(data)
        except amt.AmtError:
            return []
        if isinstance(message, amt.RelayAdvertisement):
            if message.nonce != self.discovery_nonce or self.relay is not None:
                return []
            self.relay = (message.relay, amt.AMT_PORT)
            self._retry_s = 1.0
            return self._ask(now)
        if isinstance(message, amt.MembershipQuery) and self.relay is not None:
            if message.nonce != self.nonce:
                return []
            if message.loaded and self.mac is None:
                self.loaded = True
                return [RelayRefused(self.relay)]
            self.mac, self.mac_nonce = message.response_mac, message.nonce
            try:
                qqi = amt.read_general_query(message.query).query_interval_s
            except amt.AmtError:
                qqi = 0
            self.interval_s = min(self.keepalive_s, qqi) if qqi > 0 else self.keepalive_s
            self._retry_s = 1.0
            self._next = self._keepalive_at = now + self.interval_s
            return [self._update(self._state())]
        return []

    def _state(self) -> list[amt.GroupRecord]:
        groups: dict[str, list[str]] = {}
        for source, group in sorted(self.channels):
            groups.setdefault(group, []).append(source)
        return [amt.GroupRecord(amt.MODE_IS_INCLUDE, g, tuple(s)) for g, s in groups.items()]

    def _update(self, records: list[amt.GroupRecord]) -> Send:
        assert self.mac is not None and self.relay is not None
        report = amt.igmpv3_report(self.report_source, records)
        update = amt.MembershipUpdate(self.mac, self.mac_nonce, report)
        return Send(amt.encode(update), self.relay)

    def join(self, channel: Channel) -> list[GatewayEffect]:
        """Join (source, group) through the relay (at once when ready, else with the
        state report that follows the query)."""
        if channel in self.channels:
            return []
        self.channels.add(channel)
        if not self.ready:
            return []
        return [self._update([amt.GroupRecord(amt.ALLOW_NEW_SOURCES, channel[1], (channel[0],))])]

    def leave(self, channel: Channel) -> list[GatewayEffect]:
        """Leave (source, group)."""
        if channel not in self.channels:
            return []
        self.channels.discard(channel)
        if not self.ready:
            return []
        return [self._update([amt.GroupRecord(amt.BLOCK_OLD_SOURCES, channel[1], (channel[0],))])]

    def next_deadline(self) -> float | None:
        return None if self.loaded else self._next

    def handle_timer(self, *, now: float) -> list[GatewayEffect]:
        """A Request again: the keep-alive once ready, a retry before."""
        if self.loaded or now < self._next:
            return []
        if self.ready and now >= self._keepalive_at:
            self._retry_s = 1.0  # a keep-alive: its own retries start at 1 s
            self._keepalive_at = now + self.interval_s
        return self._ask(now)
