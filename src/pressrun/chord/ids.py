"""Chord identifiers: 160-bit integers from SHA-1, and intervals on the ring.

Stoica et al. (ToN 2003, section IV.A): a node's identifier is the SHA-1 of its address
and a key's the SHA-1 of the key; key k belongs to its *successor*, the first node whose
identifier is equal to or follows k clockwise on the circle of 2^160 identifiers.

Pieces are keys (004_3e4b985b4cf14853.txt, III.A, hosts and content swapped): the key
of piece k of an issue is SHA-1(info-hash || k), k as 4 bytes big-endian.

Addresses: ``host_of``, and the checks a supernode makes of a request's source
(``seen_address``, ``same_host``).
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

ID_BITS = 160
RING = 1 << ID_BITS


@dataclass(frozen=True, slots=True, order=True)
class NodeRef:
    """A node: its identifier and where to reach it (``host:port``, or a sim name)."""

    id: int
    address: str

    def __post_init__(self) -> None:
        if not 0 <= self.id < RING:
            raise ValueError(f"node id {self.id} is outside the 160-bit ring")

    def __str__(self) -> str:
        return f"{self.id:040x}"[:10] + f"@{self.address}"


def sha1_id(data: bytes) -> int:
    """The ring identifier of ``data``."""
    return int.from_bytes(hashlib.sha1(data).digest(), "big")


def node_id_for(address: str) -> int:
    """A node's default identifier: SHA-1 of its address."""
    return sha1_id(address.encode())


def piece_key(info_hash_hex: str, index: int) -> int:
    """The key of piece ``index``: SHA-1(info-hash || index as 4 bytes big-endian)."""
    if not 0 <= index < 1 << 32:
        raise ValueError(f"piece index {index} out of range")
    return sha1_id(bytes.fromhex(info_hash_hex) + index.to_bytes(4, "big"))


def in_open(x: int, a: int, b: int) -> bool:
    """x in the ring interval (a, b); (a, a) is the whole ring but a."""
    if a < b:
        return a < x < b
    return x > a or x < b if a != b else x != a


def in_half_open(x: int, a: int, b: int) -> bool:
    """x in the ring interval (a, b]; (a, a] is the whole ring."""
    if a < b:
        return a < x <= b
    return x > a or x <= b if a != b else True


def host_of(address: str) -> str:
    """The host of ``host:port`` (``[v6]:port`` without the brackets; a name without a
    port as it is)."""
    return address.rsplit(":", 1)[0].strip("[]") if ":" in address else address


def distance(a: int, b: int) -> int:
    """Clockwise distance from a to b."""
    return (b - a) % RING


def seen_address(remote: str | None, claimed: str) -> str | None:
    """``remote:port``, the port from ``claimed`` (``host:port``); None when either is
    not what it must be (a source that is no IP address, a port that is no port)."""
    port = claimed.rsplit(":", 1)[1] if ":" in claimed else ""
    if remote is None or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    try:
        ip = ipaddress.ip_address(remote)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    if mapped is not None:
        ip = mapped
    return f"[{ip}]:{int(port)}" if ip.version == 6 else f"{ip}:{int(port)}"


def same_host(address: str, remote: str | None) -> bool:
    """True when ``address``'s host (``host:port``) is the IP ``remote`` a request came
    from: a ring message's claimed sender must be where it came from."""
    host = host_of(address)
    if remote is None:
        return False
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(remote)
    except ValueError:
        return False  # names are not accepted: supernodes register by address
