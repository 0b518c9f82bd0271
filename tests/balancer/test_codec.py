"""The balancer's JSON codec: /stats in (strict), directives out (docs/protocols.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balancer.fake_origin import stats_doc
from pressrun.balancer.codec import (
    RequestFormatError,
    StatusFormatError,
    decode_status,
    encode_directive,
    encode_refusal,
    encode_status,
    parse_client_hint,
    parse_failed,
    parse_reservation,
)
from pressrun.balancer.events import (
    ClientHint,
    DeliveryMode,
    Directive,
    NoDirective,
    OriginStatus,
    RankedOrigin,
    Refusal,
    SwarmInfo,
)

# The example of docs/protocols.md, verbatim.
PROTOCOL_EXAMPLE = {
    "name": "origin-a",
    "cpu_percent": 12.5,
    "ram_percent": 40.1,
    "out_bytes_per_s": 1234567.0,
    "interval_s": 1.0,
    "capacity_bytes_per_s": 125000000.0,
    "egress_cap_bytes_per_s": None,
    "active_transfers": 3,
    "issues": ["weekly-2026-47"],
    "cached_issues": ["weekly-2026-47"],
    "mean_transfer_bytes_per_s": 2500000.0,
    "mean_transfer_bytes_per_s_by_issue": {"weekly-2026-47": 2500000.0},
    "bytes_sent_total": 123456789,
    "transfers_total": 42,
    "active_transfers_by_issue": {"weekly-2026-47": 3},
    "transfers_total_by_issue": {"weekly-2026-47": 42},
    "bytes_sent_by_issue": {"weekly-2026-47": 123456789},
    "recent_intervals": [{"start_s": 5021.5, "end_s": 5022.5, "bytes": 1234567}],
}


def test_decode_the_protocol_example() -> None:
    s = decode_status(json.dumps(PROTOCOL_EXAMPLE).encode(), origin_name="a")
    assert s == OriginStatus(
        name="a",  # the balancer's name for it, not the origin's own
        cpu_fraction=pytest.approx(0.125),  # type: ignore[arg-type]
        ram_fraction=pytest.approx(0.401),  # type: ignore[arg-type]
        out_bytes_per_s=1234567.0,
        capacity_bytes_per_s=125000000.0,
        active_transfers=3,
        issues=frozenset({"weekly-2026-47"}),
        cached_issues=frozenset({"weekly-2026-47"}),
        mean_transfer_bytes_per_s=2500000.0,
        mean_transfer_bytes_per_s_by_issue={"weekly-2026-47": 2500000.0},
        active_transfers_by_issue={"weekly-2026-47": 3},
        transfers_total=42,
        transfers_total_by_issue={"weekly-2026-47": 42},
    )


def test_integers_are_numbers_and_optional_fields_may_be_absent_or_null() -> None:
    doc = stats_doc("x", ["i"], cpu_percent=50, out_bytes_per_s=0)
    for key in ("interval_s", "egress_cap_bytes_per_s", "bytes_sent_total", "transfers_total"):
        del doc[key]
    s = decode_status(doc, origin_name="x")
    assert s.cpu_fraction == 0.5
    assert s.mean_transfer_bytes_per_s is None


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("cpu_percent", "12", "must be a number"),
        ("cpu_percent", 100.5, "percentage 0..100"),
        ("ram_percent", -1, "must not be negative"),
        ("ram_percent", True, "must be a number"),
        ("out_bytes_per_s", None, "must be a number"),
        ("capacity_bytes_per_s", 0, "must be positive"),
        ("active_transfers", 1.5, "must be an integer"),
        ("active_transfers", -2, "must not be negative"),
        ("issues", "weekly", "must be a list"),
        ("issues", ["ok", "../etc"], "invalid issue id"),
        ("cached_issues", [3], "invalid issue id"),
        ("mean_transfer_bytes_per_s", "fast", "must be a number"),
        ("mean_transfer_bytes_per_s_by_issue", [], "must be an object"),
        ("interval_s", 0, "must be positive"),
        ("egress_cap_bytes_per_s", -5, "must not be negative"),
        ("bytes_sent_total", 1.0, "must be an integer"),
        ("name", 7, "must be a string"),
        ("active_transfers_by_issue", [], "must be an object"),
        ("transfers_total_by_issue", "many", "must be an object"),
        ("bytes_sent_by_issue", {"../x": 1}, "invalid issue id"),
        ("active_transfers_by_issue", {"i": 1}, "more than active_transfers"),
    ],
)
def test_a_bad_field_is_named(field: str, value: Any, problem: str) -> None:
    doc = stats_doc("x", ["i"])
    doc[field] = value
    with pytest.raises(StatusFormatError) as info:
        decode_status(doc, origin_name="x")
    assert info.value.field == field
    assert problem in str(info.value)
    assert f"'{field}'" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("active_transfers_by_issue", -1, "must not be negative"),
        ("transfers_total_by_issue", 1.5, "must be an integer"),
        ("bytes_sent_by_issue", True, "must be an integer"),
        ("bytes_sent_by_issue", None, "must be an integer"),
    ],
)
def test_a_bad_per_issue_count_names_the_issue(field: str, value: Any, problem: str) -> None:
    doc = stats_doc("x", ["i"], active_transfers=5, **{field: {"i": value}})
    with pytest.raises(StatusFormatError) as info:
        decode_status(doc, origin_name="x")
    assert info.value.field == f"{field}.i"
    assert problem in str(info.value)


def test_per_issue_counts_are_optional_and_the_active_ones_are_kept() -> None:
    plain = decode_status(stats_doc("x", ["i"], active_transfers=2), origin_name="x")
    assert plain.active_transfers_by_issue == {}
    doc = stats_doc(
        "x",
        ["i", "j"],
        active_transfers=2,
        active_transfers_by_issue={"i": 1, "j": 1},
        transfers_total_by_issue={"i": 7, "j": 1},
        bytes_sent_by_issue={"i": 10, "j": 0},
    )
    status = decode_status(doc, origin_name="x")
    assert status.active_transfers_by_issue == {"i": 1, "j": 1}
    assert encode_status(status)["active_transfers_by_issue"] == {"i": 1, "j": 1}


def test_a_bad_per_issue_rate_names_the_issue() -> None:
    doc = stats_doc("x", ["i"], mean_transfer_bytes_per_s_by_issue={"i": -3.0})
    with pytest.raises(StatusFormatError) as info:
        decode_status(doc, origin_name="x")
    assert info.value.field == "mean_transfer_bytes_per_s_by_issue.i"


@pytest.mark.parametrize("field", ["cpu_percent", "capacity_bytes_per_s", "issues"])
def test_a_missing_field_is_named(field: str) -> None:
    doc = stats_doc("x", ["i"])
    del doc[field]
    with pytest.raises(StatusFormatError, match=f"'{field}' is missing"):
        decode_status(doc, origin_name="x")


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[1, 2]", b"\xff\xfe", b'{"cpu_percent": NaN}', "null"],
)
def test_not_an_object_is_a_status_format_error(payload: bytes | str) -> None:
    with pytest.raises(StatusFormatError):
        decode_status(payload, origin_name="x")


def test_nan_and_infinity_are_refused() -> None:
    # Python's json reads NaN/Infinity; a NaN in the score heap would break ranking
    body = json.dumps(stats_doc("x", ["i"], out_bytes_per_s=float("nan")))
    with pytest.raises(StatusFormatError, match="finite"):
        decode_status(body, origin_name="x")
    body = json.dumps(stats_doc("x", ["i"], capacity_bytes_per_s=float("inf")))
    with pytest.raises(StatusFormatError, match="finite"):
        decode_status(body, origin_name="x")


issue_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z")
finite = st.floats(0.0, 1e12, allow_nan=False)


@given(
    cpu=st.floats(0.0, 100.0),
    ram=st.floats(0.0, 100.0),
    out=finite,
    cap=st.floats(1e-3, 1e12),
    active=st.integers(0, 10**6),
    issues=st.frozensets(issue_ids, max_size=4),
    cached=st.frozensets(issue_ids, max_size=4),
    mean=st.none() | finite,
    by_issue=st.dictionaries(issue_ids, finite, max_size=3),
)
def test_encode_decode_round_trip(
    cpu: float,
    ram: float,
    out: float,
    cap: float,
    active: int,
    issues: frozenset[str],
    cached: frozenset[str],
    mean: float | None,
    by_issue: dict[str, float],
) -> None:
    doc = stats_doc(
        "x",
        sorted(issues),
        cpu_percent=cpu,
        ram_percent=ram,
        out_bytes_per_s=out,
        capacity_bytes_per_s=cap,
        active_transfers=active,
        cached_issues=sorted(cached),
        mean_transfer_bytes_per_s=mean,
        mean_transfer_bytes_per_s_by_issue=by_issue,
    )
    status = decode_status(json.dumps(doc), origin_name="x")
    again = decode_status(json.dumps(encode_status(status)), origin_name="x")
    assert again.issues == status.issues and again.cached_issues == status.cached_issues
    assert again.cpu_fraction == pytest.approx(status.cpu_fraction)
    assert again.out_bytes_per_s == status.out_bytes_per_s
    assert dict(again.mean_transfer_bytes_per_s_by_issue) == by_issue


def test_encode_directive_is_the_protocol_shape() -> None:
    directive = Directive(
        issue_id="weekly-2026-47",
        mode=DeliveryMode.ORIGIN,
        origins=(
            RankedOrigin("origin-a", "http://127.0.0.1:8001", 2950.0),
            RankedOrigin("origin-c", "http://127.0.0.1:8003", 2100.0),
        ),
        swarm=None,
        fallbacks=(),
        expires_in_s=5.0,
        algorithm="alg2",
    )
    assert json.loads(json.dumps(encode_directive(directive))) == {
        "issue_id": "weekly-2026-47",
        "mode": "origin",
        "origins": [
            {"name": "origin-a", "url": "http://127.0.0.1:8001", "score": 2950.0},
            {"name": "origin-c", "url": "http://127.0.0.1:8003", "score": 2100.0},
        ],
        "swarm": None,
        "multicast": None,
        "fallbacks": [],
        "expires_in_s": 5.0,
        "algorithm": "alg2",
    }


def test_encode_directive_swarm_and_non_finite_score() -> None:
    directive = Directive(
        "i",
        DeliveryMode.SWARM,
        (RankedOrigin("a", "http://a", float("-inf")),),
        SwarmInfo("http://a/content/i/i.torrent", "http://t/announce", "ab" * 20),
        (DeliveryMode.ORIGIN,),
        5.0,
        "wlc",
    )
    doc = encode_directive(directive)
    # JSON has no infinities: json.dumps would write "-Infinity", which clients reject
    assert doc["origins"][0]["score"] is None
    assert doc["swarm"] == {
        "torrent_url": "http://a/content/i/i.torrent",
        "tracker_url": "http://t/announce",
        "info_hash": "ab" * 20,
    }
    assert doc["fallbacks"] == ["origin"]
    json.dumps(doc, allow_nan=False)


def test_encode_refusal() -> None:
    refusal = NoDirective("i", Refusal.NO_ORIGIN_UP, "no origin is answering", 2.0)
    assert encode_refusal(refusal) == {"error": "no origin is answering"}


def test_parse_failed() -> None:
    assert parse_failed([]) == frozenset()
    assert parse_failed([""]) == frozenset()
    assert parse_failed(["origin-a,origin-b", "origin-c"]) == {"origin-a", "origin-b", "origin-c"}
    for bad in ("a,,b", ",a", "a b", "a/b", "a\n"):
        with pytest.raises(RequestFormatError):
            parse_failed([bad])


def test_parse_client_hint() -> None:
    assert parse_client_hint({}) is None
    assert parse_client_hint({"failed": "a"}) is None
    assert parse_client_hint({"have": "100", "size": "400", "rate": "2.5e6"}) == ClientHint(
        100, 400, 2.5e6
    )
    assert parse_client_hint({"size": "4", "elapsed": "12.5"}) == ClientHint(0, 4, None, 12.5)
    assert parse_client_hint({"elapsed": "1e9"}) == ClientHint(0, None, None, 86400.0)
    assert parse_client_hint({"size": "400"}) == ClientHint(0, 400, None)
    assert parse_client_hint({"rate": "1000000"}) == ClientHint(0, None, 1e6)
    # absurd values are clamped: a rate to 1 kB/s .. 100 Gbit/s, sizes to 2**53
    assert parse_client_hint({"rate": "1e-9"}) == ClientHint(0, None, 1e3)
    assert parse_client_hint({"rate": "1e300"}) == ClientHint(0, None, 12.5e9)
    huge = str(10**19)
    assert parse_client_hint({"have": huge, "size": huge}) == ClientHint(2**53, 2**53, None)
    bad: list[tuple[dict[str, str], str]] = [
        ({"have": "10"}, "needs size="),
        ({"have": "500", "size": "400"}, "more than size="),
        ({"size": "0"}, "size= must be at least"),
        ({"have": "-1", "size": "4"}, "have= must be a number of bytes"),
        ({"size": "1.5"}, "size= must be a number of bytes"),
        ({"size": ""}, "size= must be a number of bytes"),
        ({"size": "1" * 21}, "size= must be a number of bytes"),
        ({"rate": "fast"}, "rate= must be"),
        ({"rate": "nan"}, "rate= must be"),
        ({"rate": "inf"}, "rate= must be"),
        ({"rate": "0"}, "rate= must be"),
        ({"rate": "-5"}, "rate= must be"),
        ({"elapsed": "-1"}, "elapsed= must be"),
        ({"elapsed": "soon"}, "elapsed= must be"),
        ({"elapsed": "nan"}, "elapsed= must be"),
    ]
    for query, message in bad:
        with pytest.raises(RequestFormatError, match=message):
            parse_client_hint(query)


def test_parse_request_class() -> None:
    from pressrun.balancer.codec import parse_request_class
    from pressrun.balancer.events import RequestClass

    assert parse_request_class({}) is None
    assert parse_request_class({"class": "small"}) is RequestClass.SMALL
    assert parse_request_class({"class": "catalogue"}) is RequestClass.CATALOGUE
    with pytest.raises(RequestFormatError, match="class= must be one of small, crowd"):
        parse_request_class({"class": "huge"})


def test_a_reserved_start_names_its_token_and_the_client_names_it_back() -> None:
    # docs/protocols.md, "Reserved starts": the 503's body carries the token and the
    # unrounded wait; a plain refusal is unchanged
    reserved = NoDirective("w", Refusal.RESERVED, "busy; reserved", 12.3456, "r42")
    assert encode_refusal(reserved) == {
        "error": "busy; reserved",
        "reservation": "r42",
        "retry_after_s": 12.346,
    }
    assert encode_refusal(NoDirective("w", Refusal.ALL_FULL, "full", 2.0)) == {"error": "full"}
    assert parse_reservation({"reservation": "r42"}) == "r42"
    assert parse_reservation({}) is None
    for bad in ("", "r 42", "x" * 41, "r42;drop"):
        with pytest.raises(RequestFormatError, match="reservation="):
            parse_reservation({"reservation": bad})
