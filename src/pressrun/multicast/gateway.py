"""The AMT gateway (RFC 7450 section 5.2): `GatewayCore`, its decisions, pure (``now``
given, no socket), and `AmtGateway`, the adapter around its one UDP socket.

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

import contextlib
import ipaddress
import logging
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pressrun.multicast import amt
from pressrun.multicast.net import (
    RECEIVE_BUFFER_BYTES,
    big_receive_buffer,
    enable_drop_counts,
)

log = logging.getLogger("pressrun.multicast.gateway")

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


# --- the adapter: the gateway's UDP socket ----------------------------------------------

#: the gateway socket's receive buffer: the carousel's datagrams queue here while the
#: receive loop decodes, as large as the native channel sockets' (SO_RCVBUFFORCE as
#: root: plain SO_RCVBUF is capped at net.core.rmem_max, 208 KiB by default, about
#: 0.2 s of a 12 Mb/s carousel for a reader starved of CPU)
TUNNEL_BUFFER_BYTES = RECEIVE_BUFFER_BYTES
#: an unanswered relay is given up after this long and the next one named is tried
RELAY_ANSWER_S = 7.0


def parse_relay(text: str) -> Address:
    """``"HOST"`` or ``"HOST:PORT"`` (IPv4, port 2268 by default) -> (host, port);
    ValueError otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = text, str(amt.AMT_PORT)
    try:
        address = str(ipaddress.IPv4Address(host))
    except ipaddress.AddressValueError:
        raise ValueError(f"{text!r} is not an AMT relay (IPv4 HOST or HOST:PORT)") from None
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be 1..65535")
    return address, int(port_text)


class AmtGateway:
    """One UDP socket to an AMT relay around a `GatewayCore` (no root, no TUN device).

    The receive loop hands this socket to the binding (``Receiver.receive(tunnel_fd=)``),
    which unwraps the channels' Multicast Data itself; what it does not take (the
    relay's queries, the control channel's datagrams) comes back through `handle`.
    Before the binding reads it (no plan yet), `read` reads the socket here.
    ``relays``: tried in order; the next one when one is loaded or does not answer
    within `RELAY_ANSWER_S`. ``listen``: the (source, group, port) channels whose
    datagrams `handle` and `read` return (the control channel)."""

    def __init__(
        self,
        relays: Sequence[Address],
        *,
        keepalive_s: float = 20.0,
        bind: Address = ("0.0.0.0", 0),
        discovery: bool = False,
    ) -> None:
        if not relays:
            raise ValueError("an AMT gateway needs at least one relay")
        self.relays = list(relays)
        self.keepalive_s = keepalive_s
        self.discovery = discovery
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                big_receive_buffer(self.sock, TUNNEL_BUFFER_BYTES)  # as the channels'
            # the binding reads the socket's drop count (SO_RXQ_OVFL) with each
            # datagram and reports it as the base channel's own socket drops: the
            # carousel's datagrams all queue here, so a full queue loses them here
            enable_drop_counts(self.sock)
            self.sock.bind(bind)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.listening: set[tuple[str, int]] = set()
        #: the address the socket is connected to: the kernel then drops datagrams
        #: from anyone else (a stranger cannot inject "Multicast Data")
        self._peer: Address | None = None
        self.index = 0
        self.core = self._core(0)
        self.asked_at = 0.0
        #: why the gateway gave up (every relay loaded or silent); None while it goes on
        self.failed: str | None = None
        self.queries = 0

    def _core(self, index: int) -> GatewayCore:
        relay = self.relays[index]
        nonces: Callable[[], int] = lambda: secrets.randbits(32)  # noqa: E731
        if self.discovery:
            return GatewayCore(nonces=nonces, discovery=relay, keepalive_s=self.keepalive_s)
        return GatewayCore(nonces=nonces, relay=relay, keepalive_s=self.keepalive_s)

    @property
    def relay(self) -> Address | None:
        """The relay in use (after discovery: the advertised one)."""
        return self.core.relay

    def fileno(self) -> int:
        return self.sock.fileno()

    def start(self, *, now: float) -> None:
        """Ask the first relay (Discovery or Request)."""
        self.asked_at = now
        self._apply(self.core.start(now=now))

    def listen(self, source: str, group: str, port: int) -> None:
        """Join (source, group) and hand its datagrams to port ``port`` to the caller."""
        self.listening.add((group, port))
        self.join(source, group)

    def join(self, source: str, group: str) -> None:
        self._apply(self.core.join((source, group)))

    def leave(self, source: str, group: str) -> None:
        self._apply(self.core.leave((source, group)))

    def _apply(self, effects: list[GatewayEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                try:
                    if effect.to != self._peer:
                        self.sock.connect(effect.to)
                        self._peer = effect.to
                    self.sock.send(effect.data)
                except OSError as err:  # unreachable relay: the retries go on
                    log.debug("AMT send to %s:%d: %s", *effect.to, err)
            else:
                self._next_relay(f"relay {effect.relay[0]}:{effect.relay[1]} is loaded")

    def _next_relay(self, why: str) -> None:
        log.warning("AMT: %s", why)
        if self.index + 1 >= len(self.relays):
            self.failed = why
            return
        channels = self.core.channels
        self.index += 1
        self.core = self._core(self.index)
        for channel in sorted(channels):
            self.core.join(channel)
        self.asked_at = -1.0  # started by the next poll

    def handle(self, data: bytes, *, now: float) -> list[bytes]:
        """One message from the tunnel the binding did not take: the payloads of the
        listened channels' datagrams in it (none for a relay message, which goes to
        the core)."""
        if amt.message_type(data) == amt.MULTICAST_DATA:
            try:
                message = amt.decode(data)
                assert isinstance(message, amt.MulticastData)
                _, destination, payload = amt.read_udp_datagram(message.datagram)
            except amt.AmtError:
                return []
            return [payload] if destination in self.listening else []
        was_ready = self.core.ready
        self._apply(self.core.handle(data, now=now))
        if self.core.ready and not was_ready:
            self.queries += 1
            log.info("AMT tunnel to %s:%d up", *(self.core.relay or ("?", 0)))
        return []

    def read(self, *, now: float) -> list[bytes]:
        """Read the socket until empty (when the binding does not): the listened
        channels' payloads."""
        out: list[bytes] = []
        for _ in range(1024):
            try:
                data = self.sock.recv(65535)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # an ICMP error of an earlier send
                log.debug("AMT socket: %s", err)
                continue
            out += self.handle(data, now=now)
        return out

    def next_deadline(self) -> float | None:
        """When `poll` has something to do."""
        if self.failed is not None:
            return None
        if self.asked_at < 0:
            return 0.0
        deadline = self.core.next_deadline()
        if not self.core.ready:
            give_up = self.asked_at + RELAY_ANSWER_S
            return give_up if deadline is None else min(deadline, give_up)
        return deadline

    def poll(self, *, now: float) -> None:
        """Retries, keep-alives, and the next relay when this one stays silent."""
        if self.failed is not None:
            return
        if self.asked_at < 0:
            self.start(now=now)
            return
        if not self.core.ready and now >= self.asked_at + RELAY_ANSWER_S:
            relay = self.relays[self.index]
            self._next_relay(f"relay {relay[0]}:{relay[1]} did not answer in {RELAY_ANSWER_S:g} s")
            return
        self._apply(self.core.handle_timer(now=now))

    def close(self) -> None:
        """Leave every channel (the relay stops sending at once rather than at the
        tunnel's timeout) and close the socket."""
        with contextlib.suppress(Exception):
            for channel in sorted(self.core.channels):
                self._apply(self.core.leave(channel))
        self.sock.close()
