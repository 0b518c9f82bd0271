"""Automatic Multicast Tunneling (AMT, RFC 7450): the messages between a gateway (the
reader's side, no multicast route) and a relay (the multicast side), IPv4 only.

A pure codec: bytes in, dataclasses out, and back; no socket, no clock. What goes over
UDP port 2268:

- Relay Discovery (gateway -> relay, a discovery nonce) and Relay Advertisement
  (relay -> gateway, the nonce and the relay's address);
- Request (a request nonce; P set asks for an MLD query, clear for IGMP);
- Membership Query (relay -> gateway: the nonce, the response MAC the gateway must
  echo, the L "loaded" flag of a relay that takes no more tunnels, and an encapsulated
  IGMPv3 General Query; with G, the gateway's address and port as the relay saw them);
- Membership Update (gateway -> relay: the MAC, the nonce and an encapsulated IGMPv3
  Membership Report: which (source, group) channels to join or leave);
- Multicast Data (relay -> gateway: a whole IP datagram of a group);
- Teardown (gateway -> relay after its address changed: the old tunnel goes).

Section numbers below are RFC 7450's (5.1.x: the message formats) and RFC 3376's
(IGMPv3). The encapsulated IP packets are built and checked here too (IPv4 header with
the Router Alert option, RFC 2113; IGMPv3 query and report), so a gateway needs no raw
socket and a relay reads a report without the kernel's help.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import struct
from dataclasses import dataclass, field

#: the IANA port of AMT (RFC 7450 section 7)
AMT_PORT = 2268

RELAY_DISCOVERY = 1
RELAY_ADVERTISEMENT = 2
REQUEST = 3
MEMBERSHIP_QUERY = 4
MEMBERSHIP_UPDATE = 5
MULTICAST_DATA = 6
TEARDOWN = 7

#: bytes AMT adds in front of a multicast datagram on the tunnel: the outer IPv4 and
#: UDP headers and the Multicast Data header (RFC 7450 section 5.1.6)
TUNNEL_OVERHEAD_BYTES = 20 + 8 + 2

#: IGMPv3 (RFC 3376 section 4): message types and group record types
IGMP_QUERY = 0x11
IGMPV3_REPORT = 0x22
MODE_IS_INCLUDE = 1
MODE_IS_EXCLUDE = 2
CHANGE_TO_INCLUDE = 3
CHANGE_TO_EXCLUDE = 4
ALLOW_NEW_SOURCES = 5
BLOCK_OLD_SOURCES = 6

ALL_SYSTEMS = "224.0.0.1"  # General Queries go here (RFC 3376 section 4.1.12)
IGMPV3_ROUTERS = "224.0.0.22"  # reports go here (section 4.2.14)
ROUTER_ALERT = b"\x94\x04\x00\x00"  # RFC 2113


class AmtError(ValueError):
    """Bytes that are not a well-formed AMT message (or encapsulated IGMP packet)."""


# --- the messages -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelayDiscovery:
    nonce: int


@dataclass(frozen=True, slots=True)
class RelayAdvertisement:
    nonce: int
    relay: str  # IPv4


@dataclass(frozen=True, slots=True)
class Request:
    nonce: int
    mld: bool = False  # P: an MLDv2 query asked for (IPv6 groups) instead of IGMPv3


@dataclass(frozen=True, slots=True)
class MembershipQuery:
    response_mac: int  # 48 bits
    nonce: int
    query: bytes  # the encapsulated IGMPv3 General Query (a whole IPv4 packet)
    loaded: bool = False  # L: the relay takes no new tunnel
    gateway: tuple[str, int] | None = None  # G: the gateway's address and port seen


@dataclass(frozen=True, slots=True)
class MembershipUpdate:
    response_mac: int
    nonce: int
    report: bytes  # the encapsulated IGMPv3 Membership Report (a whole IPv4 packet)


@dataclass(frozen=True, slots=True)
class MulticastData:
    datagram: bytes  # a whole IPv4 datagram of a group


@dataclass(frozen=True, slots=True)
class Teardown:
    response_mac: int
    nonce: int
    gateway: tuple[str, int]  # the gateway's former address and port


Message = (
    RelayDiscovery
    | RelayAdvertisement
    | Request
    | MembershipQuery
    | MembershipUpdate
    | MulticastData
    | Teardown
)

_MAC_MAX = (1 << 48) - 1
_U32_MAX = (1 << 32) - 1


def _check_u32(name: str, value: int) -> None:
    if not 0 <= value <= _U32_MAX:
        raise AmtError(f"{name} must be a 32-bit number, not {value}")


def _check_mac(value: int) -> None:
    if not 0 <= value <= _MAC_MAX:
        raise AmtError(f"the response MAC must be a 48-bit number, not {value}")


def _mac_bytes(value: int) -> bytes:
    _check_mac(value)
    return value.to_bytes(6, "big")


def _ipv4(text: str) -> bytes:
    try:
        return ipaddress.IPv4Address(text).packed
    except ipaddress.AddressValueError:
        raise AmtError(f"{text!r} is not an IPv4 address") from None


def _gateway_field(gateway: tuple[str, int]) -> bytes:
    """Gateway Port Number then the 16-byte Gateway IP Address: an IPv4 address as an
    IPv4-compatible IPv6 address (::a.b.c.d, RFC 7450 section 5.1.4)."""
    host, port = gateway
    if not 0 <= port <= 65535:
        raise AmtError(f"port {port} is out of range")
    return struct.pack("!H", port) + bytes(12) + _ipv4(host)


def _read_gateway(data: bytes) -> tuple[str, int]:
    port = struct.unpack_from("!H", data)[0]
    address = data[2:18]
    if address[:12] == bytes(12) or address[:12] == bytes(10) + b"\xff\xff":
        host = str(ipaddress.IPv4Address(address[12:]))
    else:
        host = str(ipaddress.IPv6Address(address))
    return host, port


def encode(message: Message) -> bytes:
    """The UDP payload of ``message`` (RFC 7450 section 5.1)."""
    match message:
        case RelayDiscovery(nonce):
            _check_u32("the discovery nonce", nonce)
            return struct.pack("!B3xI", RELAY_DISCOVERY, nonce)
        case RelayAdvertisement(nonce, relay):
            _check_u32("the discovery nonce", nonce)
            return struct.pack("!B3xI", RELAY_ADVERTISEMENT, nonce) + _ipv4(relay)
        case Request(nonce, mld):
            _check_u32("the request nonce", nonce)
            return struct.pack("!BBxxI", REQUEST, 1 if mld else 0, nonce)
        case MembershipQuery(mac, nonce, query, loaded, gateway):
            _check_u32("the request nonce", nonce)
            flags = (2 if loaded else 0) | (1 if gateway is not None else 0)
            out = bytes([MEMBERSHIP_QUERY, flags]) + _mac_bytes(mac) + struct.pack("!I", nonce)
            out += query
            if gateway is not None:
                out += _gateway_field(gateway)
            return out
        case MembershipUpdate(mac, nonce, report):
            _check_u32("the request nonce", nonce)
            return (
                bytes([MEMBERSHIP_UPDATE, 0]) + _mac_bytes(mac) + struct.pack("!I", nonce) + report
            )
        case MulticastData(datagram):
            return bytes([MULTICAST_DATA, 0]) + datagram
        case Teardown(mac, nonce, gateway):
            _check_u32("the request nonce", nonce)
            head = bytes([TEARDOWN, 0]) + _mac_bytes(mac) + struct.pack("!I", nonce)
            return head + _gateway_field(gateway)
    raise AmtError(f"not an AMT message: {message!r}")


def message_type(data: bytes) -> int:
    """The type of the AMT message in ``data`` (AmtError when not version 0)."""
    if not data:
        raise AmtError("an empty datagram")
    if data[0] >> 4 != 0:
        raise AmtError(f"AMT version {data[0] >> 4} (only 0 exists)")
    return data[0] & 0x0F


def decode(data: bytes) -> Message:
    """The AMT message in a UDP payload; AmtError says what is wrong."""
    kind = message_type(data)
    n = len(data)
    if kind == RELAY_DISCOVERY:
        if n != 8:
            raise AmtError(f"a Relay Discovery is 8 bytes, not {n}")
        return RelayDiscovery(struct.unpack_from("!I", data, 4)[0])
    if kind == RELAY_ADVERTISEMENT:
        if n == 12:
            relay = str(ipaddress.IPv4Address(data[8:12]))
        elif n == 24:
            relay = str(ipaddress.IPv6Address(data[8:24]))
        else:
            raise AmtError(f"a Relay Advertisement is 12 or 24 bytes, not {n}")
        return RelayAdvertisement(struct.unpack_from("!I", data, 4)[0], relay)
    if kind == REQUEST:
        if n != 8:
            raise AmtError(f"a Request is 8 bytes, not {n}")
        return Request(struct.unpack_from("!I", data, 4)[0], mld=bool(data[1] & 1))
    if kind in (MEMBERSHIP_QUERY, MEMBERSHIP_UPDATE, TEARDOWN):
        if n < 12:
            raise AmtError(f"message type {kind} is at least 12 bytes, not {n}")
        mac = int.from_bytes(data[2:8], "big")
        nonce = struct.unpack_from("!I", data, 8)[0]
        body = data[12:]
        if kind == MEMBERSHIP_QUERY:
            loaded, has_gateway = bool(data[1] & 2), bool(data[1] & 1)
            gateway = None
            if has_gateway:
                if len(body) < 18:
                    raise AmtError("a Membership Query with G set lacks the gateway fields")
                gateway = _read_gateway(body[-18:])
                body = body[:-18]
            _ip_packet(body)  # the encapsulated query must be a whole IPv4 packet
            return MembershipQuery(mac, nonce, body, loaded=loaded, gateway=gateway)
        if kind == MEMBERSHIP_UPDATE:
            _ip_packet(body)
            return MembershipUpdate(mac, nonce, body)
        if len(body) != 18:
            raise AmtError(f"a Teardown is 30 bytes, not {n}")
        return Teardown(mac, nonce, _read_gateway(body))
    if kind == MULTICAST_DATA:
        if n < 2 + 20:
            raise AmtError("a Multicast Data message without an IP datagram")
        return MulticastData(data[2:])
    raise AmtError(f"unknown AMT message type {kind}")


# --- the response MAC ---------------------------------------------------------------------


def response_mac(secret: bytes, gateway: tuple[str, int], nonce: int) -> int:
    """The relay's 48-bit response MAC for a gateway's (address, port, request nonce)
    (RFC 7450 section 5.1.4: computed from them with a secret only the relay knows, so
    a Membership Update carrying it comes from the address that sent the Request):
    HMAC-SHA-256 truncated to 48 bits."""
    host, port = gateway
    message = _ipv4(host) + struct.pack("!HI", port, nonce)
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:6], "big")


# --- the encapsulated IPv4 / IGMPv3 packets ------------------------------------------------


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071); 0 over data that includes its checksum."""
    if len(data) % 2:
        data += b"\x00"
    total: int = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_packet(
    source: str,
    destination: str,
    protocol: int,
    payload: bytes,
    *,
    ttl: int = 1,
    router_alert: bool = True,
) -> bytes:
    """A whole IPv4 packet (header checksum set); IGMP packets carry the Router Alert
    option (RFC 3376 section 4)."""
    options = ROUTER_ALERT if router_alert else b""
    ihl = (20 + len(options)) // 4
    header = (
        struct.pack(
            "!BBHHHBBH4s4s",
            0x40 | ihl,
            0xC0 if protocol == 2 else 0,  # IGMP goes as Internetwork Control
            ihl * 4 + len(payload),
            0,
            0,
            ttl,
            protocol,
            0,
            _ipv4(source),
            _ipv4(destination),
        )
        + options
    )
    header = header[:10] + struct.pack("!H", _checksum(header)) + header[12:]
    return header + payload


@dataclass(frozen=True, slots=True)
class IpPacket:
    source: str
    destination: str
    protocol: int
    ttl: int
    payload: bytes


def _ip_packet(data: bytes) -> IpPacket:
    """An IPv4 packet read and checked (version, lengths, header checksum)."""
    if len(data) < 20 or data[0] >> 4 != 4:
        raise AmtError("the encapsulated packet is not IPv4")
    ihl = (data[0] & 0x0F) * 4
    total = struct.unpack_from("!H", data, 2)[0]
    if ihl < 20 or total < ihl or total > len(data):
        raise AmtError("the encapsulated IPv4 packet's lengths do not hold")
    if _checksum(data[:ihl]) != 0:
        raise AmtError("the encapsulated IPv4 header checksum is wrong")
    return IpPacket(
        str(ipaddress.IPv4Address(data[12:16])),
        str(ipaddress.IPv4Address(data[16:20])),
        data[9],
        data[8],
        data[ihl:total],
    )


def read_ip_packet(data: bytes) -> IpPacket:
    """The IPv4 packet in ``data`` (a Multicast Data datagram, an encapsulated query or
    report); AmtError when it is not a whole, correct one."""
    return _ip_packet(data)


def udp_datagram(
    source: tuple[str, int], group: tuple[str, int], payload: bytes, *, ttl: int = 16
) -> bytes:
    """A whole IPv4/UDP datagram of ``payload`` from ``source`` to ``group`` (what a
    relay puts in Multicast Data; the UDP checksum set over the pseudo-header)."""
    (src, sport), (dst, dport) = source, group
    length = 8 + len(payload)
    pseudo = _ipv4(src) + _ipv4(dst) + struct.pack("!BBH", 0, 17, length)
    udp = struct.pack("!HHHH", sport, dport, length, 0) + payload
    check = _checksum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", check) + udp[8:]
    return ipv4_packet(src, dst, 17, udp, ttl=ttl, router_alert=False)


def read_udp_datagram(data: bytes) -> tuple[tuple[str, int], tuple[str, int], bytes]:
    """((source, port), (destination, port), payload) of an IPv4/UDP datagram."""
    packet = _ip_packet(data)
    if packet.protocol != 17 or len(packet.payload) < 8:
        raise AmtError("the datagram is not UDP")
    sport, dport, length = struct.unpack_from("!HHH", packet.payload)
    if length < 8 or length > len(packet.payload):
        raise AmtError("the UDP length does not hold")
    return (
        (packet.source, sport),
        (packet.destination, dport),
        packet.payload[8:length],
    )


def igmpv3_general_query(
    source: str, *, max_response_s: float = 10.0, query_interval_s: int = 125, robustness: int = 2
) -> bytes:
    """An IGMPv3 General Query (RFC 3376 section 4.1) in its IPv4 packet, as a relay
    puts it in a Membership Query: QQIC tells the gateway how often to report."""
    code = _code(max_response_s * 10)
    qqic = _code(query_interval_s)
    body = struct.pack("!BBH4sBBH", IGMP_QUERY, code, 0, bytes(4), robustness & 7, qqic, 0)
    body = body[:2] + struct.pack("!H", _checksum(body)) + body[4:]
    return ipv4_packet(source, ALL_SYSTEMS, 2, body)


def _code(value: float) -> int:
    """RFC 3376 section 4.1.1/4.1.7: values up to 127 as they are, larger ones in the
    floating-point form (1 exp(3) mant(4)), rounded down."""
    v = int(value)
    if v < 128:
        return v
    for exp in range(8):
        mant = (v >> (exp + 3)) - 16
        if 0 <= mant < 16:
            return 0x80 | (exp << 4) | mant
    return 0xFF


def _uncode(code: int) -> int:
    if code < 128:
        return code
    return ((code & 0x0F) | 0x10) << (((code >> 4) & 0x07) + 3)


@dataclass(frozen=True, slots=True)
class GeneralQuery:
    max_response_s: float
    query_interval_s: int
    robustness: int


def read_general_query(packet: bytes) -> GeneralQuery:
    """The IGMPv3 General Query in an encapsulated IPv4 packet."""
    ip = _ip_packet(packet)
    body = ip.payload
    if ip.protocol != 2 or len(body) < 12 or body[0] != IGMP_QUERY:
        raise AmtError("not an IGMP query")
    if _checksum(body) != 0:
        raise AmtError("the IGMP checksum is wrong")
    return GeneralQuery(_uncode(body[1]) / 10, _uncode(body[9]), body[8] & 7)


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One group record of an IGMPv3 report: ``kind`` (MODE_IS_INCLUDE,
    ALLOW_NEW_SOURCES, BLOCK_OLD_SOURCES, ...), the group and its sources."""

    kind: int
    group: str
    sources: tuple[str, ...] = field(default=())


def igmpv3_report(source: str, records: list[GroupRecord]) -> bytes:
    """An IGMPv3 Membership Report (RFC 3376 section 4.2) in its IPv4 packet, as a
    gateway puts it in a Membership Update: e.g. ``GroupRecord(ALLOW_NEW_SOURCES,
    "232.1.1.1", ("192.0.2.1",))`` joins (S, G), BLOCK_OLD_SOURCES leaves it."""
    body = b""
    for record in records:
        if not ipaddress.IPv4Address(record.group).is_multicast:
            raise AmtError(f"{record.group} is not a multicast group")
        body += struct.pack("!BBH4s", record.kind, 0, len(record.sources), _ipv4(record.group))
        body += b"".join(_ipv4(s) for s in record.sources)
    head = struct.pack("!BBHHH", IGMPV3_REPORT, 0, 0, 0, len(records))
    message = head + body
    message = message[:2] + struct.pack("!H", _checksum(message)) + message[4:]
    return ipv4_packet(source, IGMPV3_ROUTERS, 2, message)


def read_report(
    packet: bytes, *, max_records: int = 64, max_sources: int = 64
) -> list[GroupRecord]:
    """The group records of an IGMPv3 report in an encapsulated IPv4 packet; at most
    ``max_records`` records of ``max_sources`` sources each (a relay bounds what one
    gateway may ask)."""
    ip = _ip_packet(packet)
    body = ip.payload
    if ip.protocol != 2 or len(body) < 8 or body[0] != IGMPV3_REPORT:
        raise AmtError("not an IGMPv3 report")
    if _checksum(body) != 0:
        raise AmtError("the IGMP checksum is wrong")
    count = struct.unpack_from("!H", body, 6)[0]
    if count > max_records:
        raise AmtError(f"{count} group records (at most {max_records})")
    records: list[GroupRecord] = []
    at = 8
    for _ in range(count):
        if at + 8 > len(body):
            raise AmtError("a group record runs past the report")
        kind, aux, nsrc = struct.unpack_from("!BBH", body, at)
        if nsrc > max_sources:
            raise AmtError(f"{nsrc} sources in one record (at most {max_sources})")
        group = str(ipaddress.IPv4Address(body[at + 4 : at + 8]))
        end = at + 8 + 4 * nsrc + 4 * aux
        if end > len(body):
            raise AmtError("a group record runs past the report")
        sources = tuple(
            str(ipaddress.IPv4Address(body[at + 8 + 4 * i : at + 12 + 4 * i])) for i in range(nsrc)
        )
        records.append(GroupRecord(kind, group, sources))
        at = end
    return records
