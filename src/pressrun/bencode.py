"""Bencode (BEP 3): canonical encoding, and a strict decoder for untrusted bytes.

Pure: no I/O, no clock. The one bencode codec of the project: the tracker's answers
(``pressrun.tracker.codec``), the peers' scrape reads and the torrent check of a
bundle (``pressrun.content.codec.parse_torrent``) all use it.

The decoder is strict (BEP 3 says integers have no leading zeros and ``i-0e`` is
invalid, dictionary keys are byte strings in sorted order): it also rejects duplicate
or unsorted keys, string lengths with leading zeros, trailing bytes after the value,
and nesting deeper than a limit (so a hostile input cannot exhaust the stack). So
every value it accepts re-encodes to exactly the bytes it came from:
``bencode(bdecode(data)) == data``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

# What bdecode returns: byte strings stay bytes, dictionary keys are bytes.
Bencoded: TypeAlias = "int | bytes | list[Bencoded] | dict[bytes, Bencoded]"
# What bencode accepts: also str (UTF-8) for strings and keys, tuples for lists.
Bencodable: TypeAlias = (
    "int | bytes | str | Sequence[Bencodable] | Mapping[bytes, Bencodable]"
    " | Mapping[str, Bencodable]"
)

MAX_DEPTH = 64  # lists/dicts nested deeper than this are refused
MAX_INT_DIGITS = 64  # longer integers are refused (no bencode field needs them)


class BencodeError(ValueError):
    """The input is not canonical bencode (the message says where and why)."""


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
