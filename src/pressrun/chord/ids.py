"""Chord identifiers: 160-bit integers from SHA-1, and intervals on the ring.

Stoica et al. (ToN 2003, section IV.A): a node's identifier is the SHA-1 of its address
and a key's the SHA-1 of the key; key k belongs to its *successor*, the first node whose
identifier is equal to or follows k clockwise on the circle of 2^160 identifiers.

Pieces are keys (004_3e4b985b4cf14853.txt, III.A, hosts and content swapped): the key
of piece k of an issue is SHA-1(info-hash || k), k as 4 bytes big-endian.
"""

from __future__ import annotations

import hashlib
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
