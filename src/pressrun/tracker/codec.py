"""Bytes <-> tracker messages: bencode (BEP 3), announce and scrape queries, answers.

Pure: no I/O, no clock. Two error types, both ``CodecError``:

- ``BencodeError``: bytes that are not canonical bencode. The decoder is strict
  (BEP 3 says integers have no leading zeros and ``i-0e`` is invalid, dictionary keys
  are byte strings in sorted order): it also rejects duplicate or unsorted keys,
  string lengths with leading zeros, trailing bytes after the value, and nesting
  deeper than a limit (so a hostile input cannot exhaust the stack).
- ``QueryError``: an announce or scrape query a tracker must refuse. It carries a
  ``FailureCode`` (a short, bounded label for metrics) and a sentence for the client's
  ``failure reason``.

Queries are parsed from the RAW query string with ``urllib.parse.unquote_to_bytes``:
``info_hash`` and ``peer_id`` are 20 arbitrary bytes, and decoding ``%XX`` as UTF-8
(what aiohttp's ``request.query`` does) corrupts them (FIELD-NOTES.md, libtorrent).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import TypeAlias
from urllib.parse import unquote_to_bytes

from pressrun.tracker.events import (
    PEER_LEAVE_RULES,
    AddressFamily,
    AnnounceEvent,
    AnnounceReply,
    AnnounceRequest,
    LeaveRule,
    SwarmStats,
)

# What bdecode returns: byte strings stay bytes, dictionary keys are bytes.
Bencoded: TypeAlias = "int | bytes | list[Bencoded] | dict[bytes, Bencoded]"
# What bencode accepts: also str (UTF-8) for strings and keys, tuples for lists.
Bencodable: TypeAlias = (
    "int | bytes | str | Sequence[Bencodable] | Mapping[bytes, Bencodable]"
    " | Mapping[str, Bencodable]"
)

MAX_DEPTH = 64  # lists/dicts nested deeper than this are refused
MAX_INT_DIGITS = 64  # longer integers are refused (no bencode field needs them)
MAX_COUNTER = 2**63 - 1  # uploaded/downloaded/left fit a signed 64-bit integer
MAX_QUERY_CHARS = 8192
ID_BYTES = 20


class CodecError(ValueError):
    """Bytes or a query the codec refuses."""


class BencodeError(CodecError):
    """The input is not canonical bencode (the message says where and why)."""


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
# bencode


def bencode(value: Bencodable) -> bytes:
    """Encode ``value`` canonically: dictionary keys sorted as raw bytes.

    Raises ``BencodeError`` for a type bencode has no form for (floats, None, bool)
    or for duplicate keys after UTF-8 encoding.
    """
    out: list[bytes] = []
    _encode_into(value, out, 0)
    return b"".join(out)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def _encode_into(value: object, out: list[bytes], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise BencodeError(f"value nests deeper than {MAX_DEPTH} levels")
    # bool is an int subclass; bencode has no booleans, so refuse rather than guess.
    if isinstance(value, bool):
        raise BencodeError("bencode has no booleans; encode 0 or 1 explicitly")
    if isinstance(value, int):
        out.append(b"i%de" % value)
    elif isinstance(value, bytes | str):
        raw = _as_bytes(value)
        out.append(b"%d:" % len(raw))
        out.append(raw)
    elif isinstance(value, Mapping):
        items: dict[bytes, object] = {}
        for key, item in value.items():
            if not isinstance(key, bytes | str):
                raise BencodeError(f"dictionary key {key!r} is not a string")
            raw_key = _as_bytes(key)
            if raw_key in items:
                raise BencodeError(f"dictionary key {raw_key!r} appears twice")
            items[raw_key] = item
        out.append(b"d")
        for raw_key in sorted(items):
            out.append(b"%d:" % len(raw_key))
            out.append(raw_key)
            _encode_into(items[raw_key], out, depth + 1)
        out.append(b"e")
    elif isinstance(value, list | tuple):
        out.append(b"l")
        for item in value:
            _encode_into(item, out, depth + 1)
        out.append(b"e")
    else:
        raise BencodeError(f"cannot bencode a {type(value).__name__}")


def bdecode(data: bytes, *, max_depth: int = MAX_DEPTH) -> Bencoded:
    """Decode one canonical bencoded value that spans all of ``data``.

    Raises ``BencodeError`` (and nothing else) for any input that is not exactly one
    canonical value: see the module docstring for what strict means here.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BencodeError(f"bdecode takes bytes, not {type(data).__name__}")
    buf = bytes(data)
    if not buf:
        raise BencodeError("empty input")
    value, end = _decode_at(buf, 0, 0, max_depth)
    if end != len(buf):
        raise BencodeError(f"{len(buf) - end} trailing byte(s) after the value at offset {end}")
    return value


def _decode_digits(buf: bytes, start: int, stop_byte: int, what: str) -> tuple[int, int]:
    """Parse a canonical non-negative decimal from ``start`` up to ``stop_byte``."""
    end = buf.find(stop_byte, start, start + MAX_INT_DIGITS + 1)
    if end < 0:
        raise BencodeError(f"{what} at offset {start} is unterminated or too long")
    digits = buf[start:end]
    if not digits or not digits.isdigit():
        raise BencodeError(f"{what} at offset {start} is not a decimal number")
    if len(digits) > 1 and digits[0:1] == b"0":
        raise BencodeError(f"{what} at offset {start} has a leading zero")
    return int(digits), end


def _decode_at(buf: bytes, pos: int, depth: int, max_depth: int) -> tuple[Bencoded, int]:
    if pos >= len(buf):
        raise BencodeError(f"input ends at offset {pos} where a value was expected")
    lead = buf[pos]
    if lead == 0x69:  # 'i'
        negative = buf[pos + 1 : pos + 2] == b"-"
        start = pos + 2 if negative else pos + 1
        magnitude, end = _decode_digits(buf, start, 0x65, "integer")
        if negative and magnitude == 0:
            raise BencodeError(f"integer at offset {pos} is negative zero")
        return (-magnitude if negative else magnitude), end + 1
    if 0x30 <= lead <= 0x39:  # a digit: a string's length
        length, colon = _decode_digits(buf, pos, 0x3A, "string length")
        start = colon + 1
        if start + length > len(buf):
            raise BencodeError(f"string at offset {pos} runs past the end of the input")
        return buf[start : start + length], start + length
    if lead in (0x6C, 0x64):  # 'l' or 'd'
        if depth >= max_depth:
            raise BencodeError(f"value at offset {pos} nests deeper than {max_depth} levels")
        pos += 1
        if lead == 0x6C:
            items: list[Bencoded] = []
            while buf[pos : pos + 1] != b"e":
                item, pos = _decode_at(buf, pos, depth + 1, max_depth)
                items.append(item)
            return items, pos + 1
        mapping: dict[bytes, Bencoded] = {}
        previous: bytes | None = None
        while buf[pos : pos + 1] != b"e":
            if pos >= len(buf) or not 0x30 <= buf[pos] <= 0x39:
                raise BencodeError(f"dictionary key at offset {pos} is not a string")
            key, pos = _decode_at(buf, pos, depth + 1, max_depth)
            assert isinstance(key, bytes)
            if previous is not None and key <= previous:
                raise BencodeError(f"dictionary key {key!r} is out of order or repeated")
            previous = key
            mapping[key], pos = _decode_at(buf, pos, depth + 1, max_depth)
        return mapping, pos + 1
    raise BencodeError(f"unexpected byte {buf[pos : pos + 1]!r} at offset {pos}")


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
