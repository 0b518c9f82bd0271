"""bencode and announce/scrape query parsing: round trips, strictness, fuzzing."""

from __future__ import annotations

from urllib.parse import quote_from_bytes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.bencode import BencodeError, bdecode, bencode
from pressrun.tracker.codec import (
    FailureCode,
    QueryError,
    encode_announce_reply,
    encode_failure,
    parse_announce_query,
    parse_scrape_query,
)
from pressrun.tracker.events import (
    AddressFamily,
    AnnounceEvent,
    AnnounceReply,
    LeaveRule,
    PeerContact,
)

IH = bytes([0, 0xFF, 0x80, 0x25, 0x26, 0x3D, 0x2B, 0x20]) + bytes(range(200, 212))
PID = b"-PR0001-" + bytes(range(12))


def q(**params: bytes | str | int) -> str:
    parts = []
    for name, value in params.items():
        raw = value if isinstance(value, bytes) else str(value).encode()
        parts.append(f"{name}={quote_from_bytes(raw, safe='')}")
    return "&".join(parts)


GOOD = {"info_hash": IH, "peer_id": PID, "port": 6881, "uploaded": 1, "downloaded": 2, "left": 3}

bencodable = st.recursive(
    st.integers(min_value=-(2**70), max_value=2**70) | st.binary(max_size=40),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.binary(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


@given(bencodable)
def test_bencode_round_trip(value: object) -> None:
    data = bencode(value)  # type: ignore[arg-type]
    assert bdecode(data) == value
    assert bencode(bdecode(data)) == data  # canonical: one encoding per value


def test_bencode_known_bytes_and_sorted_keys() -> None:
    assert bencode({"b": 1, "a": [b"x", -3, "é"]}) == b"d1:al1:xi-3e2:\xc3\xa9e1:bi1ee"
    assert bencode(0) == b"i0e"
    with pytest.raises(BencodeError):
        bencode(True)
    with pytest.raises(BencodeError):
        bencode(1.5)  # type: ignore[arg-type]
    with pytest.raises(BencodeError):
        bencode({"a": 1, b"a": 2})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"i01e",  # leading zero
        b"i-0e",  # negative zero
        b"ie",
        b"i-e",
        b"i12",  # unterminated
        b"03:abc",  # length with a leading zero
        b"5:abc",  # runs past the end
        b"d1:bi1e1:ai2ee",  # keys out of order
        b"d1:ai1e1:ai2ee",  # duplicate key
        b"di1ei2ee",  # non-string key
        b"l",  # unterminated list
        b"d1:a",  # dict ends after a key
        b"i1ei2e",  # trailing garbage
        b"le ",
        b"x",
        b"l" * 65 + b"e" * 65,  # nesting beyond the limit
    ],
)
def test_bdecode_rejects_non_canonical(data: bytes) -> None:
    with pytest.raises(BencodeError):
        bdecode(data)


def test_bdecode_depth_limit_is_a_parameter() -> None:
    assert bdecode(b"llee", max_depth=2) == [[]]
    with pytest.raises(BencodeError):
        bdecode(b"llee", max_depth=1)


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=200))
def test_bdecode_fuzz_only_raises_the_typed_error(data: bytes) -> None:
    try:
        value = bdecode(data)
    except BencodeError:
        return
    assert bencode(value) == data  # anything accepted is canonical


@settings(max_examples=500, deadline=None)
@given(bencodable, st.integers(min_value=0, max_value=400), st.binary(min_size=1, max_size=3))
def test_bdecode_fuzz_mutated_valid_input(value: object, at: int, junk: bytes) -> None:
    data = bytearray(bencode(value))  # type: ignore[arg-type]
    at = at % (len(data) + 1)
    data[at : at + len(junk)] = junk
    try:
        decoded = bdecode(bytes(data))
    except BencodeError:
        return
    assert bencode(decoded) == bytes(data)


def test_announce_parses_binary_info_hash_from_raw_query() -> None:
    r = parse_announce_query(
        q(**GOOD, event="started", compact=1, numwant=5, key="ab12", leave_rule="ratio")
    )
    assert r.info_hash == IH and r.peer_id == PID
    assert (r.port, r.uploaded, r.downloaded, r.left) == (6881, 1, 2, 3)
    assert r.event is AnnounceEvent.STARTED and r.compact and r.numwant == 5
    assert r.key == b"ab12".hex() and r.leave_rule is LeaveRule.RATIO
    # Unencoded unreserved bytes and lower-case escapes decode the same.
    raw = (
        "info_hash="
        + "".join(f"%{b:02x}" for b in IH)
        + "&"
        + q(**{k: v for k, v in GOOD.items() if k != "info_hash"})
    )
    assert parse_announce_query(raw).info_hash == IH
    plain = parse_announce_query(q(**GOOD))
    assert plain.event is AnnounceEvent.NONE and not plain.compact and plain.numwant is None


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"info_hash": None}, FailureCode.MISSING_PARAMETER),
        ({"info_hash": b"short"}, FailureCode.BAD_INFO_HASH),
        ({"info_hash": IH + b"x"}, FailureCode.BAD_INFO_HASH),
        ({"peer_id": b"x" * 19}, FailureCode.BAD_PEER_ID),
        ({"peer_id": None}, FailureCode.MISSING_PARAMETER),
        ({"port": None}, FailureCode.MISSING_PARAMETER),
        ({"port": 0}, FailureCode.BAD_PORT),
        ({"port": 65536}, FailureCode.BAD_PORT),
        ({"port": "http"}, FailureCode.BAD_PORT),
        ({"uploaded": "1.5"}, FailureCode.BAD_NUMBER),
        ({"downloaded": "-1"}, FailureCode.BAD_NUMBER),
        ({"left": "ten"}, FailureCode.BAD_NUMBER),
        ({"left": str(2**63)}, FailureCode.BAD_NUMBER),
        ({"uploaded": None}, FailureCode.MISSING_PARAMETER),
        ({"event": "finished"}, FailureCode.BAD_EVENT),
        ({"compact": "yes"}, FailureCode.BAD_COMPACT),
        ({"numwant": "many"}, FailureCode.BAD_NUMBER),
        ({"ip": "not-an-ip"}, FailureCode.BAD_IP),
        ({"key": "k" * 65}, FailureCode.BAD_KEY),
        ({"leave_rule": "bored"}, FailureCode.BAD_LEAVE_RULE),
        ({"leave_rule": "expired"}, FailureCode.BAD_LEAVE_RULE),  # the tracker's own rule
    ],
)
def test_announce_rejects_with_typed_code(change: dict[str, object], code: FailureCode) -> None:
    params = {**GOOD, **change}
    query = q(**{k: v for k, v in params.items() if v is not None})  # type: ignore[arg-type]
    with pytest.raises(QueryError) as info:
        parse_announce_query(query)
    assert info.value.code is code
    assert info.value.reason


def test_real_client_queries() -> None:
    """Announces exactly as third-party clients send them."""
    aria2c = (
        "info_hash=%92%26%F6%D6%1BK%F0%BD%87RJ%A6%F9%A9%C0%BAR%B6Tr"
        "&peer_id=A2-1-36-0-o%16V%1F%0Dd%86%F1%03%83&uploaded=0&downloaded=0&left=0"
        "&compact=1&key=V%1F%0Dd%86%F1%03%83&numwant=50&no_peer_id=1&port=51413"
        "&event=started&supportcrypto=1"
    )
    r = parse_announce_query(aria2c)
    assert r.info_hash.hex() == "9226f6d61b4bf0bd87524aa6f9a9c0ba52b65472"
    assert r.peer_id.startswith(b"A2-1-36-0-") and r.port == 51413 and r.compact
    assert r.key == bytes.fromhex("561f0d6486f10383").hex()
    assert r.event is AnnounceEvent.STARTED and r.numwant == 50


def test_announce_duplicates_and_numwant_extremes() -> None:
    with pytest.raises(QueryError) as info:
        parse_announce_query(q(**GOOD) + "&port=7000")
    assert info.value.code is FailureCode.DUPLICATE_PARAMETER
    assert parse_announce_query(q(**GOOD, numwant=10**9)).numwant == 10**9
    assert parse_announce_query(q(**GOOD, numwant=10**40)).numwant == 2**63 - 1
    assert parse_announce_query(q(**GOOD, numwant=-1)).numwant is None
    assert parse_announce_query(q(**GOOD, event="paused")).event is AnnounceEvent.NONE
    with pytest.raises(QueryError):
        parse_announce_query("x" * 9000)


query_text = st.text(
    alphabet=st.sampled_from(list("&=%+;?#abcdefinoprstuwkl_0123456789-xyzAF ")) | st.characters(),
    max_size=300,
)


@settings(max_examples=1500, deadline=None)
@given(query_text)
def test_announce_query_fuzz_only_raises_the_typed_error(raw: str) -> None:
    try:
        parse_announce_query(raw)
    except QueryError as err:
        assert isinstance(err.code, FailureCode)


def test_lone_surrogates_and_raw_bytes_are_typed_errors() -> None:
    for raw in ("\ud800", "info_hash=\udcff", b"\xff\xfe=\x00"):
        with pytest.raises(QueryError):
            parse_announce_query(raw)


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "info_hash",
                "peer_id",
                "port",
                "uploaded",
                "downloaded",
                "left",
                "event",
                "compact",
                "numwant",
                "ip",
                "key",
                "leave_rule",
                "junk",
            ]
        ),
        st.binary(max_size=24) | st.integers(min_value=-5, max_value=70000).map(str),
    ),
    st.binary(max_size=30),
)
def test_announce_query_fuzz_near_valid(params: dict[str, bytes | str], raw_tail: bytes) -> None:
    query = q(**{**GOOD, **params}) + "&" + raw_tail.decode("latin-1")
    try:
        r = parse_announce_query(query)
    except QueryError:
        return
    assert len(r.info_hash) == 20 and len(r.peer_id) == 20 and 1 <= r.port <= 65535
    assert min(r.uploaded, r.downloaded, r.left) >= 0


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_scrape_query_fuzz_only_raises_the_typed_error(raw: bytes) -> None:
    try:
        hashes = parse_scrape_query(raw)
    except QueryError:
        return
    assert all(len(h) == 20 for h in hashes)


def test_scrape_query() -> None:
    assert parse_scrape_query("") == ()
    assert parse_scrape_query(q(info_hash=IH) + "&" + q(info_hash=IH)) == (IH,)
    with pytest.raises(QueryError):
        parse_scrape_query("info_hash=abc")


def test_announce_reply_compact_and_dict() -> None:
    peers = (
        PeerContact(PID, "127.0.0.1", 6881, AddressFamily.IPV4),
        PeerContact(b"p" * 20, "::1", 6882, AddressFamily.IPV6),
    )
    compact = bdecode(encode_announce_reply(AnnounceReply(30, 5, 1, 2, peers, compact=True)))
    assert isinstance(compact, dict)
    assert compact[b"peers"] == bytes([127, 0, 0, 1]) + (6881).to_bytes(2, "big")
    assert compact[b"peers6"] == bytes(15) + b"\x01" + (6882).to_bytes(2, "big")
    assert compact[b"interval"] == 30 and compact[b"min interval"] == 5
    assert (compact[b"complete"], compact[b"incomplete"]) == (1, 2)
    full = bdecode(encode_announce_reply(AnnounceReply(30, 5, 1, 2, peers, compact=False)))
    assert isinstance(full, dict)
    assert full[b"peers"] == [
        {b"peer id": PID, b"ip": b"127.0.0.1", b"port": 6881},
        {b"peer id": b"p" * 20, b"ip": b"::1", b"port": 6882},
    ]
    assert bdecode(encode_failure("no")) == {b"failure reason": b"no"}
