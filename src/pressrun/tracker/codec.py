"""Bytes <-> tracker messages: announce and scrape queries, their bencoded answers.

Pure: no I/O, no clock. Bencode itself is ``pressrun.bencode`` (the project's one codec
for it; its ``BencodeError`` is a ``ValueError``). An announce or scrape
query a tracker must refuse raises ``QueryError`` (a ``CodecError``): it carries a
``FailureCode`` (a short, bounded label for metrics) and a sentence for the client's
``failure reason``.

Queries are parsed from the RAW query string with ``urllib.parse.unquote_to_bytes``:
``info_hash`` and ``peer_id`` are 20 arbitrary bytes, and decoding ``%XX`` as UTF-8
(what aiohttp's ``request.query`` does) corrupts them (FIELD-NOTES.md, libtorrent).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from enum import Enum
from urllib.parse import unquote_to_bytes

from pressrun.bencode import Bencodable, bencode
from pressrun.tracker.events import (
    PEER_LEAVE_RULES,
    AddressFamily,
    AnnounceEvent,
    AnnounceReply,
    AnnounceRequest,
    LeaveRule,
    SwarmStats,
)

MAX_COUNTER = 2**63 - 1  # uploaded/downloaded/left fit a signed 64-bit integer
MAX_QUERY_CHARS = 8192
ID_BYTES = 20


class CodecError(ValueError):
    """Bytes or a query the codec refuses."""


class FailureCode(Enum):
    """Why an announce or scrape was refused: a bounded label for metrics."""

    MALFORMED_QUERY = "malformed_query"
    MISSING_PARAMETER = "missing_parameter"
    DUPLICATE_PARAMETER = "duplicate_parameter"
    BAD_INFO_HASH = "bad_info_hash"
    BAD_PEER_ID = "bad_peer_id"
    BAD_PORT = "bad_port"
    BAD_NUMBER = "bad_number"
    BAD_EVENT = "bad_event"
    BAD_COMPACT = "bad_compact"
    BAD_IP = "bad_ip"
    BAD_KEY = "bad_key"
    BAD_LEAVE_RULE = "bad_leave_rule"


class QueryError(CodecError):
    """An announce or scrape query the tracker refuses with a ``failure reason``."""

    def __init__(self, code: FailureCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# ---------------------------------------------------------------------------
# queries


def split_query(raw_query: str | bytes) -> dict[bytes, list[bytes]]:
    """Split a raw query string into parameters, percent-decoding to bytes.

    Names and values are decoded with ``unquote_to_bytes`` (``+`` stays a plus: BEP 3
    clients percent-encode every byte that is not unreserved). Raises ``QueryError``
    for a query too long or not encodable.
    """
    if len(raw_query) > MAX_QUERY_CHARS:
        raise QueryError(FailureCode.MALFORMED_QUERY, "query string is too long")
    if isinstance(raw_query, str):
        # Lone surrogates can reach here from a lenient HTTP parser; keep them as bytes
        # rather than crash (they then fail validation like any other garbage).
        raw = raw_query.encode("utf-8", "surrogatepass")
    else:
        raw = bytes(raw_query)
    params: dict[bytes, list[bytes]] = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        name, _, value = part.partition(b"=")
        params.setdefault(unquote_to_bytes(name), []).append(unquote_to_bytes(value))
    return params


def _single(params: Mapping[bytes, list[bytes]], name: bytes) -> bytes | None:
    values = params.get(name)
    if values is None:
        return None
    if len(values) != 1:
        raise QueryError(
            FailureCode.DUPLICATE_PARAMETER, f"{name.decode()} is given {len(values)} times"
        )
    return values[0]


def _required(params: Mapping[bytes, list[bytes]], name: bytes) -> bytes:
    value = _single(params, name)
    if value is None:
        raise QueryError(FailureCode.MISSING_PARAMETER, f"{name.decode()} is missing")
    return value


def _counter(value: bytes, name: str) -> int:
    """A non-negative decimal that fits in 63 bits."""
    if value.startswith(b"-") and value[1:].isdigit():
        raise QueryError(FailureCode.BAD_NUMBER, f"{name} must not be negative")
    if not value or not value.isdigit() or not value.isascii():
        raise QueryError(FailureCode.BAD_NUMBER, f"{name} must be a decimal integer")
    if len(value) > 19 or int(value) > MAX_COUNTER:
        raise QueryError(FailureCode.BAD_NUMBER, f"{name} is larger than 2^63 - 1")
    return int(value)


def _twenty_bytes(value: bytes, code: FailureCode, name: str) -> bytes:
    if len(value) != ID_BYTES:
        raise QueryError(code, f"{name} must be {ID_BYTES} bytes, got {len(value)}")
    return value


def parse_announce_query(raw_query: str | bytes) -> AnnounceRequest:
    """Parse and validate a BEP 3 announce query into an ``AnnounceRequest``.

    Raises ``QueryError`` (and nothing else) when the query is not a valid announce.
    Lenient where clients differ: ``numwant`` absent or negative means the default, a
    ``numwant`` beyond 63 bits is kept as "as many as allowed"; ``event=paused``
    (BEP 21) is a regular update; unknown parameters are ignored.
    """
    params = split_query(raw_query)
    info_hash = _twenty_bytes(
        _required(params, b"info_hash"), FailureCode.BAD_INFO_HASH, "info_hash"
    )
    peer_id = _twenty_bytes(_required(params, b"peer_id"), FailureCode.BAD_PEER_ID, "peer_id")

    port_raw = _required(params, b"port")
    if not port_raw.isdigit() or not port_raw.isascii() or len(port_raw) > 5:
        raise QueryError(FailureCode.BAD_PORT, "port must be a decimal integer 1-65535")
    port = int(port_raw)
    if not 1 <= port <= 65535:
        raise QueryError(FailureCode.BAD_PORT, f"port {port} is out of range 1-65535")

    uploaded = _counter(_required(params, b"uploaded"), "uploaded")
    downloaded = _counter(_required(params, b"downloaded"), "downloaded")
    left = _counter(_required(params, b"left"), "left")

    event_raw = _single(params, b"event") or b""
    if event_raw == b"paused":
        event = AnnounceEvent.NONE
    else:
        try:
            event = AnnounceEvent(event_raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise QueryError(
                FailureCode.BAD_EVENT, "event must be started, completed, stopped or empty"
            ) from None

    compact_raw = _single(params, b"compact")
    if compact_raw not in (None, b"0", b"1"):
        raise QueryError(FailureCode.BAD_COMPACT, "compact must be 0 or 1")
    compact = compact_raw == b"1"

    numwant: int | None = None
    numwant_raw = _single(params, b"numwant")
    if numwant_raw:
        if numwant_raw.startswith(b"-") and numwant_raw[1:].isdigit():
            numwant = None  # some clients send -1 for "the tracker's default"
        elif numwant_raw.isdigit() and numwant_raw.isascii():
            numwant = MAX_COUNTER if len(numwant_raw) > 18 else int(numwant_raw)
        else:
            raise QueryError(FailureCode.BAD_NUMBER, "numwant must be a decimal integer")

    ip: str | None = None
    ip_raw = _single(params, b"ip")
    if ip_raw:
        try:
            ip = str(ipaddress.ip_address(ip_raw.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            raise QueryError(FailureCode.BAD_IP, "ip must be an IPv4 or IPv6 address") from None

    # BEP 7's key is opaque: libtorrent sends hex digits, aria2c raw bytes. Only
    # equality matters (telling a restarted client from a continuing one), so keep it
    # as hex of whatever bytes came.
    key: str | None = None
    key_raw = _single(params, b"key")
    if key_raw:
        if len(key_raw) > 64:
            raise QueryError(FailureCode.BAD_KEY, "key must be at most 64 bytes")
        key = key_raw.hex()

    leave_rule: LeaveRule | None = None
    rule_raw = _single(params, b"leave_rule")
    if rule_raw:
        allowed = sorted(rule.value for rule in PEER_LEAVE_RULES)
        try:
            leave_rule = LeaveRule(rule_raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            leave_rule = None
        if leave_rule not in PEER_LEAVE_RULES:
            raise QueryError(
                FailureCode.BAD_LEAVE_RULE, f"leave_rule must be one of {', '.join(allowed)}"
            )

    return AnnounceRequest(
        info_hash=info_hash,
        peer_id=peer_id,
        port=port,
        uploaded=uploaded,
        downloaded=downloaded,
        left=left,
        event=event,
        compact=compact,
        numwant=numwant,
        ip=ip,
        key=key,
        leave_rule=leave_rule,
    )


def parse_scrape_query(raw_query: str | bytes) -> tuple[bytes, ...]:
    """The info-hashes a BEP 48 scrape asks about; empty means every swarm.

    Raises ``QueryError`` for an info_hash that is not 20 bytes.
    """
    params = split_query(raw_query)
    hashes = params.get(b"info_hash", [])
    for value in hashes:
        _twenty_bytes(value, FailureCode.BAD_INFO_HASH, "info_hash")
    return tuple(dict.fromkeys(hashes))


# ---------------------------------------------------------------------------
# answers


def encode_failure(reason: str) -> bytes:
    """A BEP 3 failure answer (clients expect it with HTTP 200)."""
    return bencode({"failure reason": reason})


def _compact_peer(ip: str, port: int) -> bytes:
    return ipaddress.ip_address(ip).packed + port.to_bytes(2, "big")


def encode_announce_reply(reply: AnnounceReply) -> bytes:
    """Bencode an announce answer: BEP 23 ``peers``/``peers6`` or BEP 3 dictionaries."""
    body: dict[str, Bencodable] = {
        "interval": reply.interval_s,
        "min interval": reply.min_interval_s,
        "complete": reply.complete,
        "incomplete": reply.incomplete,
    }
    if reply.compact:
        body["peers"] = b"".join(
            _compact_peer(p.ip, p.port) for p in reply.peers if p.family is AddressFamily.IPV4
        )
        body["peers6"] = b"".join(
            _compact_peer(p.ip, p.port) for p in reply.peers if p.family is AddressFamily.IPV6
        )
    else:
        body["peers"] = [{"peer id": p.peer_id, "ip": p.ip, "port": p.port} for p in reply.peers]
    return bencode(body)


def encode_scrape_reply(stats: Iterable[SwarmStats], *, min_interval_s: int) -> bytes:
    """Bencode a BEP 48 scrape answer for the given swarms."""
    files: dict[bytes, Bencodable] = {
        s.info_hash: {"complete": s.seeds, "incomplete": s.leechers, "downloaded": s.completed}
        for s in stats
    }
    return bencode({"files": files, "flags": {"min_request_interval": min_interval_s}})
