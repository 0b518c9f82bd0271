"""AMT relay discovery by DNS (RFC 8777, DRIAD): the AMTRELAY records at the reverse
name of a multicast source, pure codec plus one blocking lookup.

A gateway that wants (S, G) asks its resolver for the AMTRELAY records (RR type 260)
of S's reverse name (``4.3.2.1.in-addr.arpa.`` for 1.2.3.4): each names a relay near
the source, by IPv4 address or by domain name (then looked up as an A record), with a
precedence (lower first) and the D bit (set: the gateway may send its Request to the
relay directly; clear: it sends a Relay Discovery there first, RFC 8777 section 4.2.5).
A record of type 0 says there is no relay. IPv6 relays are skipped (pressrun's AMT is
IPv4 only).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from pressrun.multicast.amt import AMT_PORT

#: the AMTRELAY RR type (RFC 8777 section 4.1) and A, IN
TYPE_AMTRELAY = 260
TYPE_A = 1
CLASS_IN = 1
DNS_PORT = 53
#: relay types in the record (RFC 8777 section 4.2.3)
RELAY_NONE, RELAY_IPV4, RELAY_IPV6, RELAY_NAME = 0, 1, 2, 3


class DnsError(ValueError):
    """A DNS answer that cannot be read, or no answer."""


@dataclass(frozen=True, slots=True)
class AmtRelayRecord:
    precedence: int
    discovery_optional: bool  # the D bit
    relay_type: int
    relay: str | None  # an IPv4 address or a domain name; None for type 0 (or IPv6)


def reverse_name(source: str) -> str:
    """The reverse-mapping name of an IPv4 source: ``"4.3.2.1.in-addr.arpa"``."""
    return ipaddress.IPv4Address(source).reverse_pointer


def _name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise DnsError(f"bad label in {name!r}")
        out += bytes([len(raw)]) + raw
    return out + b"\x00"


def encode_query(name: str, rtype: int, query_id: int) -> bytes:
    """A recursive query for ``name``'s ``rtype`` records, class IN."""
    header = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0)
    return header + _name(name) + struct.pack("!HH", rtype, CLASS_IN)


def _read_name(data: bytes, offset: int, depth: int = 0) -> tuple[str, int]:
    """(the name at ``offset``, the offset after it), following compression pointers."""
    labels: list[str] = []
    while True:
        if offset >= len(data) or depth > 16:
            raise DnsError("a name runs past the message")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data):
                raise DnsError("a cut compression pointer")
            pointer = ((length & 0x3F) << 8) | data[offset + 1]
            rest, _ = _read_name(data, pointer, depth + 1)
            labels.append(rest)
            return ".".join(x for x in labels if x), offset + 2
        offset += 1
        if length == 0:
            return ".".join(labels), offset
        labels.append(data[offset : offset + length].decode("ascii", "replace"))
        offset += length


def parse_answers(data: bytes, query_id: int) -> list[tuple[int, bytes, bytes]]:
    """(type, rdata, the whole message) of each answer of a reply to ``query_id``
    (rdata's names may point into the message); DnsError on a malformed reply, an
    error code or another id."""
    if len(data) < 12:
        raise DnsError("a reply shorter than a DNS header")
    qid, flags, qd, an, _, _ = struct.unpack_from("!HHHHHH", data)
    if qid != query_id or not flags & 0x8000:
        raise DnsError("not the reply to our query")
    if flags & 0x000F:
        raise DnsError(f"the resolver answered rcode {flags & 0x000F}")
    offset = 12
    for _ in range(qd):
        _, offset = _read_name(data, offset)
        offset += 4
    out: list[tuple[int, bytes, bytes]] = []
    for _ in range(an):
        _, offset = _read_name(data, offset)
        if offset + 10 > len(data):
            raise DnsError("a cut answer")
        rtype, _, _, length = struct.unpack_from("!HHIH", data, offset)
        offset += 10
        if offset + length > len(data):
            raise DnsError("an answer's data runs past the message")
        out.append((rtype, data[offset : offset + length], data))
        offset += length
    return out


def read_amtrelay(rdata: bytes) -> AmtRelayRecord:
    """One AMTRELAY record's data (RFC 8777 section 4.2)."""
    if len(rdata) < 2:
        raise DnsError("an AMTRELAY record shorter than 2 bytes")
    precedence, flags = rdata[0], rdata[1]
    d_bit, relay_type = bool(flags & 0x80), flags & 0x7F
    relay: str | None = None
    if relay_type == RELAY_IPV4:
        if len(rdata) != 6:
            raise DnsError("an AMTRELAY IPv4 relay is not 4 bytes")
        relay = str(ipaddress.IPv4Address(rdata[2:6]))
    elif relay_type == RELAY_NAME:
        # the name is not compressed (section 4.2.4); read within the record
        relay, _ = _read_name(rdata, 2)
    elif relay_type not in (RELAY_NONE, RELAY_IPV6):
        raise DnsError(f"unknown AMTRELAY relay type {relay_type}")
    return AmtRelayRecord(precedence, d_bit, relay_type, relay)


def encode_amtrelay(record: AmtRelayRecord) -> bytes:
    """An AMTRELAY record's data (for tests and for a zone's operator)."""
    flags = (0x80 if record.discovery_optional else 0) | record.relay_type
    head = bytes([record.precedence, flags])
    if record.relay_type == RELAY_IPV4 and record.relay is not None:
        return head + ipaddress.IPv4Address(record.relay).packed
    if record.relay_type == RELAY_NAME and record.relay is not None:
        return head + _name(record.relay)
    return head


def system_resolver() -> tuple[str, int]:
    """The first IPv4 ``nameserver`` of /etc/resolv.conf; DnsError without one."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError as err:
        raise DnsError(f"no resolver: {err}") from None
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                return str(ipaddress.IPv4Address(parts[1])), DNS_PORT
            except ipaddress.AddressValueError:
                continue
    raise DnsError("no IPv4 nameserver in /etc/resolv.conf")


def _ask(name: str, rtype: int, server: tuple[str, int], timeout_s: float) -> list[bytes]:
    """The rdata of ``name``'s ``rtype`` answers from ``server`` (UDP, one try)."""
    query_id = secrets.randbits(16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(encode_query(name, rtype, query_id), server)
        while True:
            try:
                data, peer = sock.recvfrom(4096)
            except TimeoutError:
                raise DnsError(f"no answer from {server[0]}:{server[1]}") from None
            if peer[:2] != server:
                continue  # not the resolver: ignored
            answers = parse_answers(data, query_id)
            return [rdata for t, rdata, _ in answers if t == rtype]


def discover_relays(
    source: str, server: tuple[str, int], *, timeout_s: float = 2.0
) -> tuple[list[tuple[str, int]], bool]:
    """The AMT relays for channels of ``source`` from ``server`` (RFC 8777), best
    precedence first, and whether the gateway may skip Relay Discovery (every record's
    D bit set). DnsError when the lookup fails; an empty list when no record names an
    IPv4 relay."""
    records = [
        read_amtrelay(rdata)
        for rdata in _ask(reverse_name(source), TYPE_AMTRELAY, server, timeout_s)
    ]
    records.sort(key=lambda r: r.precedence)
    relays: list[tuple[str, int]] = []
    for record in records:
        if record.relay is None:
            continue
        if record.relay_type == RELAY_IPV4:
            relays.append((record.relay, AMT_PORT))
        elif record.relay_type == RELAY_NAME:
            for rdata in _ask(record.relay, TYPE_A, server, timeout_s):
                if len(rdata) == 4:
                    relays.append((str(ipaddress.IPv4Address(rdata)), AMT_PORT))
    direct = bool(records) and all(r.discovery_optional for r in records)
    return relays, direct
