"""Bytes <-> control-channel announcements (docs/protocols.md, "Multicast control
channel"). Pure: json only; signing and checking are in `pressrun.multicast.control`.

One UDP datagram on the control group carries::

    {"announcement": {...}, "signature": "<128 hex chars>"}

where the signature is Ed25519 over the canonical JSON of the ``announcement`` object
(sorted keys, no spaces, UTF-8: the manifest's canonical form).
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import replace
from typing import Any

from pressrun.content.codec import canonical_json, is_hex, valid_issue_id
from pressrun.multicast.config import FEC_SCHEMES, is_ssm
from pressrun.multicast.events import Announcement, CarouselPlan, ChannelSpec

ANNOUNCEMENT_FORMAT = 1
#: an announcement must fit one UDP datagram
MAX_ANNOUNCEMENT_BYTES = 60_000
#: a round of announcements is cut into datagrams of at most this many bytes (one
#: 1500-byte Ethernet frame with the IP and UDP headers, also inside an AMT tunnel
#: (30 bytes more) with room for another encapsulation, as the channels' packets: a
#: lost fragment loses no other carousel's announcement); a carousel larger than
#: that goes alone
ANNOUNCEMENT_PART_BYTES = 1320
#: parts of one round at most (the 16-bit field a receiver could be asked to track)
MAX_ANNOUNCEMENT_PARTS = 4096
#: the signature and the envelope around the announcement object, in bytes
_ENVELOPE_BYTES = len('{"announcement":,"signature":""}') + 128


class AnnouncementFormatError(ValueError):
    """The bytes are not an announcement of docs/protocols.md."""


def announcement_to_dict(ann: Announcement) -> dict[str, Any]:
    """The ``announcement`` JSON object."""
    return {
        "format": ANNOUNCEMENT_FORMAT,
        "publisher_key": ann.publisher_key,
        "seq": ann.seq,
        "issued_at": ann.issued_at,
        "expires_at": ann.expires_at,
        "part": ann.part,
        "parts": ann.parts,
        "carousels": [carousel_to_dict(c) for c in ann.carousels],
    }


def carousel_to_dict(c: CarouselPlan) -> dict[str, Any]:
    """One carousel object of the announcement (a directive's ``multicast.plan`` too)."""
    return {
        "issue_id": c.issue_id,
        "manifest_sha256": c.manifest_sha256,
        "size_bytes": c.size_bytes,
        "toi": c.toi,
        "fec": c.fec,
        "symbol_bytes": c.symbol_bytes,
        "source_symbols": c.source_symbols,
        "cycle_s": c.cycle_s,
        "channels": [
            {
                "group": ch.group,
                "port": ch.port,
                "tsi": ch.tsi,
                "rate_bps": ch.rate_bps,
                "packets_per_s": ch.packets_per_s,
            }
            for ch in c.channels
        ],
        "sent_packets": list(c.sent_packets),
        # only when set: an any-source plan's bytes (and signature) stay as they were
        **({"source": c.source} if c.source is not None else {}),
    }


def split_announcement(ann: Announcement, max_bytes: int) -> list[Announcement]:
    """One round's announcement cut into parts whose datagrams (signed) are at most
    ``max_bytes`` each, or hold a single carousel: part k is numbered ``ann.seq + k``
    and says ``part=k, parts=n``. A round with no carousel is one part."""
    head = Announcement(ann.publisher_key, ann.seq, ann.issued_at, ann.expires_at, ())
    # the empty part with the widest numbers it may carry: the room left for carousels
    widest = replace(head, seq=ann.seq + MAX_ANNOUNCEMENT_PARTS, parts=MAX_ANNOUNCEMENT_PARTS)
    room = max_bytes - _ENVELOPE_BYTES - len(canonical_json(announcement_to_dict(widest)))
    groups: list[list[CarouselPlan]] = [[]]
    used = 0
    for carousel in ann.carousels:
        size = len(canonical_json(carousel_to_dict(carousel))) + 1  # and its comma
        if groups[-1] and used + size > room:
            groups.append([])
            used = 0
        groups[-1].append(carousel)
        used += size
    if len(groups) > MAX_ANNOUNCEMENT_PARTS:
        raise AnnouncementFormatError(
            f"{len(ann.carousels)} carousels need more than {MAX_ANNOUNCEMENT_PARTS} datagrams"
        )
    return [
        replace(head, seq=ann.seq + k, carousels=tuple(group), part=k, parts=len(groups))
        for k, group in enumerate(groups)
    ]


def signed_bytes(ann: Announcement) -> bytes:
    """The bytes the announcement's signature covers."""
    return canonical_json(announcement_to_dict(ann))


def encode_announcement(ann: Announcement, signature: bytes) -> bytes:
    """One control datagram: the announcement and its signature."""
    data = canonical_json({"announcement": announcement_to_dict(ann), "signature": signature.hex()})
    if len(data) > MAX_ANNOUNCEMENT_BYTES:
        raise AnnouncementFormatError(
            f"the announcement is {len(data)} bytes, more than one datagram "
            f"({MAX_ANNOUNCEMENT_BYTES}); run fewer carousels per sender"
        )
    return data


def _want(d: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise AnnouncementFormatError(f"{key!r} is missing or not a {kind}")
    return value


def _number(d: dict[str, Any], key: str, *, positive: bool = True) -> float:
    value = float(_want(d, key, (int, float)))
    if not math.isfinite(value) or (positive and value <= 0) or value < 0:
        raise AnnouncementFormatError(f"{key!r} must be a finite {'positive ' * positive}number")
    return value


def _count(d: dict[str, Any], key: str, *, minimum: int = 0) -> int:
    value = int(_want(d, key, int))
    if value < minimum:
        raise AnnouncementFormatError(f"{key!r} must be at least {minimum}")
    return value


def _channel(d: object) -> ChannelSpec:
    if not isinstance(d, dict):
        raise AnnouncementFormatError("a channel is not an object")
    group = str(_want(d, "group", str))
    try:
        if not ipaddress.IPv4Address(group).is_multicast:
            raise AnnouncementFormatError(f"channel group {group} is not a multicast address")
    except ipaddress.AddressValueError:
        raise AnnouncementFormatError(f"channel group {group!r} is not an IPv4 address") from None
    port = _count(d, "port", minimum=1)
    if port > 65535:
        raise AnnouncementFormatError(f"channel port {port} is out of range")
    tsi = _count(d, "tsi")
    if tsi >= 1 << 48:
        raise AnnouncementFormatError("a TSI has at most 48 bits")
    return ChannelSpec(group, port, tsi, _number(d, "rate_bps"), _number(d, "packets_per_s"))


def decode_carousel(d: object) -> CarouselPlan:
    """One carousel object of an announcement (or of a directive's ``multicast.plan``,
    docs/protocols.md) as a `CarouselPlan`; AnnouncementFormatError when malformed."""
    if not isinstance(d, dict):
        raise AnnouncementFormatError("a carousel is not an object")
    issue_id = str(_want(d, "issue_id", str))
    if not valid_issue_id(issue_id):
        raise AnnouncementFormatError(f"invalid issue id {issue_id!r}")
    manifest_sha256 = str(_want(d, "manifest_sha256", str))
    if not is_hex(manifest_sha256, 64):
        raise AnnouncementFormatError("manifest_sha256 is not 64 hex characters")
    fec = str(_want(d, "fec", str))
    if fec not in FEC_SCHEMES:
        raise AnnouncementFormatError(f"unknown fec {fec!r}")
    channels = _want(d, "channels", list)
    if not channels:
        raise AnnouncementFormatError(f"carousel {issue_id} has no channel")
    sent = d.get("sent_packets", [])
    if not isinstance(sent, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sent
    ):
        raise AnnouncementFormatError("sent_packets is not a list of counts")
    if sent and len(sent) != len(channels):
        raise AnnouncementFormatError("sent_packets needs one count per channel")
    source = d.get("source")
    if source is not None:
        try:
            address = ipaddress.IPv4Address(str(_want(d, "source", str)))
        except ipaddress.AddressValueError:
            raise AnnouncementFormatError(f"source {source!r} is not an IPv4 address") from None
        if address.is_multicast or address.is_unspecified:
            raise AnnouncementFormatError(f"source {address} is not a unicast address")
        source = str(address)
    specs = tuple(_channel(ch) for ch in channels)
    if source is None and any(is_ssm(ch.group) for ch in specs):
        raise AnnouncementFormatError(
            f"carousel {issue_id} has source-specific groups (232/8) but names no source"
        )
    return CarouselPlan(
        issue_id=issue_id,
        manifest_sha256=manifest_sha256,
        size_bytes=_count(d, "size_bytes"),
        toi=_count(d, "toi", minimum=1),
        fec=fec,
        symbol_bytes=_count(d, "symbol_bytes", minimum=1),
        source_symbols=_count(d, "source_symbols"),
        cycle_s=_number(d, "cycle_s"),
        channels=specs,
        sent_packets=tuple(sent),
        source=source,
    )


def decode_announcement(data: bytes) -> tuple[Announcement, bytes, bytes]:
    """Parse a control datagram: the announcement, the bytes its signature covers and
    the signature. AnnouncementFormatError on anything malformed (the signature is
    not checked here)."""
    if len(data) > MAX_ANNOUNCEMENT_BYTES:
        raise AnnouncementFormatError(f"{len(data)} bytes is too long for an announcement")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AnnouncementFormatError(f"not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise AnnouncementFormatError("not a JSON object")
    body = doc.get("announcement")
    signature_hex = doc.get("signature")
    if not isinstance(body, dict):
        raise AnnouncementFormatError("no announcement object")
    if not isinstance(signature_hex, str) or not is_hex(signature_hex, 128):
        raise AnnouncementFormatError("no signature (128 hex characters)")
    if body.get("format") != ANNOUNCEMENT_FORMAT:
        raise AnnouncementFormatError(f"unknown announcement format {body.get('format')!r}")
    key = str(_want(body, "publisher_key", str))
    if not is_hex(key, 64):
        raise AnnouncementFormatError("publisher_key is not 64 hex characters")
    carousels = _want(body, "carousels", list)
    # a sender before rounds in parts named neither: one part
    parts = _count(body, "parts", minimum=1) if "parts" in body else 1
    part = _count(body, "part") if "part" in body else 0
    if parts > MAX_ANNOUNCEMENT_PARTS or part >= parts:
        raise AnnouncementFormatError(f"part {part} of {parts} is out of range")
    seq = _count(body, "seq", minimum=1)
    if seq - part < 1:
        raise AnnouncementFormatError(f"part {part} cannot have seq {seq}")
    ann = Announcement(
        publisher_key=key.lower(),
        seq=seq,
        issued_at=_number(body, "issued_at"),
        expires_at=_number(body, "expires_at"),
        carousels=tuple(decode_carousel(c) for c in carousels),
        part=part,
        parts=parts,
    )
    return ann, canonical_json(body), bytes.fromhex(signature_hex)
