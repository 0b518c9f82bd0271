"""An AMT relay (RFC 7450) beside the carousel's sender: ``pressrun serve amt-relay``.

Gateways without a multicast route reach it over UDP (port 2268): Relay Discovery
is answered with an Advertisement, a Request with a Membership Query carrying a
response MAC (HMAC of the gateway's address, port and request nonce under a secret
drawn at start), and a Membership Update whose MAC matches makes or refreshes the
gateway's tunnel and joins the (source, group) channels its IGMPv3 report asks for.
Every datagram of a joined channel is then sent to each tunnel that asked for it,
whole, in a Multicast Data message. A Teardown (with the MAC of the gateway's former
address) ends a tunnel; a tunnel not refreshed within ``tunnel_timeout_s`` ends too.

`RelayCore` keeps the decisions and the state, and is pure (``now`` given, no socket):
nothing is kept for a Discovery, a Request or a refused Update, so a flood of them from
many source ports makes no state; tunnels are at most ``max_tunnels`` (past it the
Query carries the L flag and Updates of new gateways are refused) with at most
``max_channels`` channels each. `AmtRelay` is the adapter: the UDP socket of the
tunnels, a raw UDP socket that reads the joined channels' datagrams whole (it needs
root or CAP_NET_RAW), and plain sockets that hold the (S, G) memberships.

Only source-specific joins (INCLUDE-mode records, RFC 4607 SSM, the carousel's 232/8
channels) are taken; an any-source (EXCLUDE-mode) record is refused and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pressrun.multicast import amt
from pressrun.multicast.net import IP_ADD_SOURCE_MEMBERSHIP, source_membership

log = logging.getLogger("pressrun.multicast.relay")

Address = tuple[str, int]
Channel = tuple[str, str]  # (source, group)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """relay_address: the address the Advertisement names (where gateways send);
    max_tunnels: gateways served at once (past it: the L flag); max_channels: (S, G)
    channels per tunnel; query_interval_s: how often a gateway is told to send its
    report again (the QQIC of the query; short enough for NAT bindings, which often
    forget a UDP mapping after 30-120 s); tunnel_timeout_s: a tunnel not refreshed for
    this long ends."""

    relay_address: str = "127.0.0.1"
    max_tunnels: int = 1000
    max_channels: int = 64
    query_interval_s: int = 20
    tunnel_timeout_s: float = 65.0

    def __post_init__(self) -> None:
        if self.max_tunnels < 1 or self.max_channels < 1:
            raise ValueError("max_tunnels and max_channels must be at least 1")
        if not 1 <= self.query_interval_s <= 3600:
            raise ValueError("query_interval_s must be 1..3600")
        if not self.tunnel_timeout_s > self.query_interval_s:
            raise ValueError("tunnel_timeout_s must be longer than query_interval_s")


@dataclass(frozen=True, slots=True)
class Reply:
    """Effect: send ``data`` to ``to``."""

    data: bytes
    to: Address


@dataclass(frozen=True, slots=True)
class Join:
    """Effect: hold a membership of the (source, group) channel."""

    channel: Channel


@dataclass(frozen=True, slots=True)
class Leave:
    """Effect: drop the membership of the (source, group) channel."""

    channel: Channel


Effect = Reply | Join | Leave


@dataclass(slots=True)
class _Tunnel:
    channels: set[Channel] = field(default_factory=set)
    refreshed: float = 0.0


class RelayCore:
    """The relay's decisions: messages in, effects out (see the module docstring)."""

    def __init__(self, config: RelayConfig, secret: bytes) -> None:
        self.config = config
        self.secret = secret
        self.tunnels: dict[Address, _Tunnel] = {}
        self.members: dict[Channel, set[Address]] = {}
        #: what was refused or ignored, by reason (bounded: a fixed set of keys)
        self.counts: Counter[str] = Counter()
        self._query = amt.igmpv3_general_query(
            config.relay_address, query_interval_s=config.query_interval_s
        )

    @property
    def full(self) -> bool:
        return len(self.tunnels) >= self.config.max_tunnels

    def handle(self, data: bytes, source: Address, *, now: float) -> list[Effect]:
        """One datagram from a gateway at ``source``."""
        try:
            message = amt.decode(data)
        except amt.AmtError:
            self.counts["malformed"] += 1
            return []
        match message:
            case amt.RelayDiscovery(nonce):
                advert = amt.RelayAdvertisement(nonce, self.config.relay_address)
                return [Reply(amt.encode(advert), source)]
            case amt.Request(nonce, mld):
                if mld:
                    self.counts["mld request"] += 1  # IPv4 groups only
                    return []
                mac = amt.response_mac(self.secret, source, nonce)
                loaded = self.full and source not in self.tunnels
                query = amt.MembershipQuery(mac, nonce, self._query, loaded=loaded, gateway=source)
                return [Reply(amt.encode(query), source)]
            case amt.MembershipUpdate(mac, nonce, report):
                if not self._mac_ok(mac, source, nonce):
                    self.counts["bad mac"] += 1
                    return []
                return self._update(source, report, now)
            case amt.Teardown(mac, nonce, gateway):
                if not self._mac_ok(mac, gateway, nonce):
                    self.counts["bad mac"] += 1
                    return []
                return self._drop(gateway)
        self.counts[f"unexpected type {type(message).__name__}"] += 1
        return []

    def _mac_ok(self, mac: int, gateway: Address, nonce: int) -> bool:
        expected = amt.response_mac(self.secret, gateway, nonce)
        return hmac.compare_digest(mac.to_bytes(6, "big"), expected.to_bytes(6, "big"))

    def _update(self, gateway: Address, report: bytes, now: float) -> list[Effect]:
        try:
            records = amt.read_report(report, max_sources=self.config.max_channels)
        except amt.AmtError:
            self.counts["malformed report"] += 1
            return []
        tunnel = self.tunnels.get(gateway)
        if tunnel is None:
            if self.full:
                self.counts["refused: full"] += 1
                return []
            tunnel = self.tunnels[gateway] = _Tunnel()
        tunnel.refreshed = now
        wanted = set(tunnel.channels)
        for record in records:
            channels = {(s, record.group) for s in record.sources}
            if record.kind in (amt.MODE_IS_EXCLUDE, amt.CHANGE_TO_EXCLUDE):
                self.counts["any-source join refused"] += 1
            elif record.kind in (amt.MODE_IS_INCLUDE, amt.CHANGE_TO_INCLUDE):
                # the whole set of sources of this group
                wanted = {c for c in wanted if c[1] != record.group} | channels
            elif record.kind == amt.ALLOW_NEW_SOURCES:
                wanted |= channels
            elif record.kind == amt.BLOCK_OLD_SOURCES:
                wanted -= channels
        if len(wanted) > self.config.max_channels:
            self.counts["refused: too many channels"] += 1
            wanted = set(sorted(wanted)[: self.config.max_channels])
        return self._set_channels(gateway, tunnel, wanted)

    def _set_channels(
        self, gateway: Address, tunnel: _Tunnel, wanted: set[Channel]
    ) -> list[Effect]:
        effects: list[Effect] = []
        for channel in sorted(wanted - tunnel.channels):
            members = self.members.setdefault(channel, set())
            if not members:
                effects.append(Join(channel))
            members.add(gateway)
        for channel in sorted(tunnel.channels - wanted):
            members = self.members.get(channel, set())
            members.discard(gateway)
            if not members:
                self.members.pop(channel, None)
                effects.append(Leave(channel))
        tunnel.channels = wanted
        return effects

    def _drop(self, gateway: Address) -> list[Effect]:
        tunnel = self.tunnels.get(gateway)
        if tunnel is None:
            return []
        effects = self._set_channels(gateway, tunnel, set())
        del self.tunnels[gateway]
        return effects

    def next_deadline(self) -> float | None:
        """When the oldest tunnel expires, if any."""
        if not self.tunnels:
            return None
        oldest = min(t.refreshed for t in self.tunnels.values())
        return oldest + self.config.tunnel_timeout_s

    def handle_timer(self, *, now: float) -> list[Effect]:
        """End the tunnels not refreshed within ``tunnel_timeout_s``."""
        effects: list[Effect] = []
        for gateway, tunnel in list(self.tunnels.items()):
            if now - tunnel.refreshed >= self.config.tunnel_timeout_s:
                self.counts["expired"] += 1
                effects += self._drop(gateway)
        return effects

    def destinations(self, source: str, group: str) -> Iterable[Address]:
        """The tunnels a datagram of (source, group) goes to."""
        return self.members.get((source, group), ())


class AmtRelay:
    """The relay's sockets around a `RelayCore` (see the module docstring)."""

    def __init__(
        self, config: RelayConfig, *, listen: Address, interface: str, secret: bytes | None = None
    ) -> None:
        self.core = RelayCore(config, secret or os.urandom(32))
        self.listen = listen
        self.interface = interface
        self.sock: socket.socket | None = None
        self.raw: socket.socket | None = None
        self.memberships: dict[Channel, socket.socket] = {}
        self.forwarded = 0
        self._timer: asyncio.TimerHandle | None = None

    async def start(self) -> Address:
        """Bind the sockets; the address gateways talk to."""
        loop = asyncio.get_running_loop()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(self.listen)
        self.sock.setblocking(False)
        # the joined channels' datagrams, whole (IP header included)
        self.raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        self.raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.raw.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._on_tunnel)
        loop.add_reader(self.raw.fileno(), self._on_multicast)
        self._arm()
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadline = self.core.next_deadline()
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(max(deadline, loop.time()), self._on_timer)

    def _on_timer(self) -> None:
        self._apply(self.core.handle_timer(now=self._now()))
        self._arm()

    def _on_tunnel(self) -> None:
        assert self.sock is not None
        for _ in range(64):  # a batch, then the loop's other work
            try:
                data, source = self.sock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # an ICMP error of an earlier send: go on
                log.debug("tunnel socket: %s", err)
                continue
            try:
                self._apply(self.core.handle(data, (source[0], source[1]), now=self._now()))
            except Exception:
                log.exception("AMT datagram from %s:%d", *source[:2])
        self._arm()

    def _apply(self, effects: list[Effect]) -> None:
        assert self.sock is not None
        for effect in effects:
            if isinstance(effect, Reply):
                with contextlib.suppress(OSError):
                    self.sock.sendto(effect.data, effect.to)
            elif isinstance(effect, Join):
                self._join(effect.channel)
            else:
                held = self.memberships.pop(effect.channel, None)
                if held is not None:
                    held.close()  # closing drops the membership
                    log.info("left (%s, %s)", *effect.channel)

    def _join(self, channel: Channel) -> None:
        source, group = channel
        member = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            membership = source_membership(group, self.interface, source)
            member.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, membership)
        except OSError as err:
            member.close()
            log.warning("cannot join (%s, %s): %s", source, group, err)
            return
        self.memberships[channel] = member
        log.info("joined (%s, %s)", source, group)

    def _on_multicast(self) -> None:
        assert self.raw is not None and self.sock is not None
        for _ in range(256):
            try:
                datagram = self.raw.recv(65535)
            except (BlockingIOError, InterruptedError):
                return
            if len(datagram) < 20:
                continue
            group = socket.inet_ntoa(datagram[16:20])
            source = socket.inet_ntoa(datagram[12:16])
            targets = self.core.destinations(source, group)
            if not targets:
                continue
            message = amt.encode(amt.MulticastData(datagram))
            for gateway in targets:
                with contextlib.suppress(OSError):
                    self.sock.sendto(message, gateway)
                    self.forwarded += 1

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
        for sock in (self.sock, self.raw):
            if sock is not None:
                loop.remove_reader(sock.fileno())
                sock.close()
        for member in self.memberships.values():
            member.close()
        self.memberships.clear()
