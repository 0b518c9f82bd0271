"""The origin's pure core, driven with explicit `now`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pressrun.origin.config import OriginConfig
from pressrun.origin.core import (
    CHUNK_TARGET_S,
    MIN_ACTIVE_S,
    MIN_CHUNK_BYTES,
    ByteSpan,
    RangeNotSatisfiable,
    TrafficMeter,
    content_type_for,
    if_range_holds,
    make_etag,
    next_chunk_bytes,
    none_match,
    parse_range,
    valid_name,
)

# ------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name", ["weekly-2026-47", "a", "A.pdf", "x_y-z.torrent", "manifest.json", "a" * 128]
)
def test_valid_names(name: str) -> None:
    assert valid_name(name)


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", ".hidden", "-x", "a/b", "a\\b", "a b", "a\n", "a" * 129, "é.pdf", "%2e"],
)
def test_invalid_names(name: str) -> None:
    assert not valid_name(name)


# ----------------------------------------------------------------------- ranges


@pytest.mark.parametrize(
    ("header", "size", "span"),
    [
        ("bytes=0-9", 100, (0, 9)),
        ("bytes=10-19", 100, (10, 19)),
        ("bytes=90-", 100, (90, 99)),
        ("bytes=-10", 100, (90, 99)),
        ("bytes=-1000", 100, (0, 99)),  # suffix longer than the file: all of it
        ("bytes=50-1000", 100, (50, 99)),  # last byte past the end: clamped
        ("bytes=99-99", 100, (99, 99)),
        ("bytes= 5 - 6 ", 100, (5, 6)),
        ("Bytes=0-0", 1, (0, 0)),
        ("bytes=0-1,", 100, (0, 1)),  # an empty list element is skipped
    ],
)
def test_single_ranges(header: str, size: int, span: tuple[int, int]) -> None:
    got = parse_range(header, size)
    assert got == ByteSpan(span[0], span[1], size)
    assert got.length == span[1] - span[0] + 1
    assert got.content_range() == f"bytes {span[0]}-{span[1]}/{size}"


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=100-", 100),  # starts at the end
        ("bytes=200-300", 100),
        ("bytes=-0", 100),
        ("bytes=0-0", 0),  # nothing to satisfy in an empty file
        ("bytes=-5", 0),
        ("bytes=5-4", 100),  # malformed: last before first
        ("bytes=a-b", 100),
        ("bytes=-", 100),
        ("bytes=1", 100),
        ("bytes=", 100),
        ("bytes", 100),
        ("bytes=0x1-2", 100),
        ("bytes=+1-2", 100),
        ("bytes=1-2,x", 100),  # several ranges, one malformed
    ],
)
def test_unsatisfiable_or_malformed_ranges(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, size)


def test_no_header_other_unit_and_multi_range_mean_the_whole_file() -> None:
    assert parse_range(None, 100) is None
    assert parse_range("items=0-5", 100) is None
    assert parse_range("bytes=0-1,5-6", 100) is None
    # several ranges, some unsatisfiable: still the whole file
    assert parse_range("bytes=0-1,500-600", 100) is None


@given(size=st.integers(0, 10_000), a=st.integers(0, 20_000), b=st.integers(0, 20_000))
def test_range_spans_stay_inside_the_file(size: int, a: int, b: int) -> None:
    for header in (f"bytes={a}-{b}", f"bytes={a}-", f"bytes=-{b}"):
        try:
            span = parse_range(header, size)
        except RangeNotSatisfiable:
            continue
        assert span is not None
        assert 0 <= span.first <= span.last < size
        assert span.length >= 1


def _general(header: str, size: int) -> ByteSpan | str | None:
    """The general parse's answer: the leading space keeps it off the fast path."""
    try:
        return parse_range(" " + header, size)
    except RangeNotSatisfiable:
        return "416"


@given(
    size=st.integers(0, 10_000),
    a=st.integers(0, 20_000),
    b=st.integers(0, 20_000),
    form=st.sampled_from(["{a}-{b}", "{a}-", "-{b}", "0{a}-{b}", "{a}-{b},", "{a}--{b}"]),
)
def test_the_fast_path_answers_as_the_general_parse(size: int, a: int, b: int, form: str) -> None:
    header = "bytes=" + form.format(a=a, b=b)
    try:
        fast: ByteSpan | str | None = parse_range(header, size)
    except RangeNotSatisfiable:
        fast = "416"
    assert fast == _general(header, size)


@pytest.mark.parametrize(
    "header", ["bytes=\u0661-\u0662", "bytes=1-\u00b2", "bytes=99999999999999999999-1", "bytes=5-4"]
)
def test_the_fast_path_leaves_odd_digits_to_the_general_parse(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 100)
    assert _general(header, 100) == "416"


# ------------------------------------------------------------------- validators


def test_etag_is_strong_and_changes_with_each_input() -> None:
    base = make_etag(100, 1_000, 7)
    assert base.startswith('"') and base.endswith('"') and not base.startswith("W/")
    assert (
        len({base, make_etag(101, 1_000, 7), make_etag(100, 1_001, 7), make_etag(100, 1_000, 8)})
        == 4
    )


def test_if_none_match_uses_the_weak_comparison() -> None:
    tag = make_etag(1, 2, 3)
    assert none_match(tag, tag)
    assert none_match(f"W/{tag}", tag)
    assert none_match(f'"other", {tag}', tag)
    assert none_match("*", tag)
    assert not none_match('"other"', tag)
    assert not none_match(None, tag)


def test_if_range_needs_a_strong_match_or_the_exact_date() -> None:
    tag = make_etag(1, 2, 3)
    date = "Sun, 22 Nov 2026 21:00:00 GMT"
    assert if_range_holds(None, tag, date)
    assert if_range_holds(tag, tag, date)
    assert not if_range_holds(f"W/{tag}", tag, date)
    assert not if_range_holds('"stale"', tag, date)
    assert if_range_holds(date, tag, date)
    assert not if_range_holds("Sun, 22 Nov 2026 20:00:00 GMT", tag, date)


def test_content_types() -> None:
    assert content_type_for("a.pdf") == "application/pdf"
    assert content_type_for("a.EPUB") == "application/epub+zip"
    assert content_type_for("x.torrent") == "application/x-bittorrent"
    assert content_type_for("manifest.json") == "application/json"
    assert content_type_for("noext") == "application/octet-stream"
    assert content_type_for("a.weird") == "application/octet-stream"


# ----------------------------------------------------------------- traffic meter


def test_meter_out_rate_and_mean_per_transfer() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=300.0, now=0.0)
    assert meter.next_deadline() == 1.0
    assert meter.last_report.mean_transfer_bytes_per_s is None
    a = meter.transfer_started("issue-a", now=0.0)
    b = meter.transfer_started("issue-b", now=0.5)
    meter.bytes_sent(a, 1000, now=0.4)
    meter.bytes_sent(b, 500, now=0.9)
    assert meter.active_transfers == 2
    report = meter.handle_timer(now=1.0)
    assert report.interval_s == pytest.approx(1.0)
    assert report.out_bytes_per_s == pytest.approx(1500.0)
    # a: 1000 B over 1 s; b: 500 B over its 0.5 s in the interval
    assert report.mean_transfer_bytes_per_s == pytest.approx((1000.0 + 1000.0) / 2)
    assert report.mean_transfer_bytes_per_s_by_issue == {
        "issue-a": pytest.approx(1000.0),
        "issue-b": pytest.approx(1000.0),
    }
    assert meter.next_deadline() == 2.0
    assert meter.bytes_sent_total == 1500 and meter.transfers_total == 2


def test_meter_counts_a_transfer_that_ended_within_the_interval() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=300.0, now=0.0)
    t = meter.transfer_started("i", now=0.2)
    meter.bytes_sent(t, 300, now=0.3)
    assert meter.transfer_ended(t, now=0.5) == 300
    assert meter.transfer_ended(t, now=0.6) == 300  # idempotent
    assert meter.active_transfers == 0
    report = meter.handle_timer(now=1.0)
    assert report.transfers_seen == 1
    assert report.mean_transfer_bytes_per_s == pytest.approx(300 / 0.3)
    # the next interval has no transfer at all
    report = meter.handle_timer(now=2.0)
    assert report.out_bytes_per_s == 0.0
    assert report.mean_transfer_bytes_per_s is None
    assert report.mean_transfer_bytes_per_s_by_issue == {}


def test_meter_floors_tiny_active_times() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=300.0, now=0.0)
    t = meter.transfer_started("i", now=0.999999)
    meter.bytes_sent(t, 1000, now=1.0)
    report = meter.handle_timer(now=1.0)
    assert report.mean_transfer_bytes_per_s == pytest.approx(1000 / MIN_ACTIVE_S)


def test_meter_late_timer_uses_the_real_interval() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=300.0, now=0.0)
    t = meter.transfer_started("i", now=0.0)
    meter.bytes_sent(t, 3000, now=2.0)
    report = meter.handle_timer(now=3.0)
    assert report.interval_s == pytest.approx(3.0)
    assert report.out_bytes_per_s == pytest.approx(1000.0)


def test_meter_cached_issues_follow_the_window() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=10.0, now=0.0)
    t = meter.transfer_started("old", now=0.0)
    meter.bytes_sent(t, 10, now=1.0)
    meter.transfer_ended(t, now=2.0)
    long_one = meter.transfer_started("long", now=0.0)
    assert meter.cached_issues(now=5.0) == ["long", "old"]
    assert meter.cached_issues(now=12.0) == ["long", "old"]
    # 'old' last served at 2.0: out of the window after 12.0; 'long' is still active
    assert meter.cached_issues(now=12.5) == ["long"]
    meter.bytes_sent(long_one, 10, now=12.5)  # moving (a stalled one would not count)
    meter.handle_timer(now=13.0)
    assert meter.cached_issues(now=13.0) == ["long"]
    meter.transfer_ended(long_one, now=13.0)
    assert meter.cached_issues(now=23.0) == ["long"]
    assert meter.cached_issues(now=23.5) == []


@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["start", "send", "end", "tick"]),
            st.floats(0.0, 0.7),
            st.integers(0, 100_000),
            st.integers(0, 5),
        ),
        max_size=80,
    )
)
def test_meter_conserves_bytes_and_counts(events: list[tuple[str, float, int, int]]) -> None:
    """Bytes in the interval reports add up to bytes sent; active counts never go wrong."""
    meter = TrafficMeter(interval_s=1.0, cache_window_s=5.0, now=0.0)
    now = 0.0
    live: list[int] = []
    issue_of: dict[int, str] = {}
    started: dict[str, int] = {}
    sent_by_issue: dict[str, int] = {}
    reported = 0
    sent = 0
    for kind, gap, n, pick in events:
        now += gap
        if kind == "start":
            issue = f"issue-{pick}"
            tid = meter.transfer_started(issue, now=now)
            live.append(tid)
            issue_of[tid] = issue
            started[issue] = started.get(issue, 0) + 1
        elif kind == "send" and live:
            tid = live[pick % len(live)]
            meter.bytes_sent(tid, n, now=now)
            sent += n
            sent_by_issue[issue_of[tid]] = sent_by_issue.get(issue_of[tid], 0) + n
        elif kind == "end" and live:
            meter.transfer_ended(live.pop(pick % len(live)), now=now)
        elif kind == "tick" and now >= meter.next_deadline():
            report = meter.handle_timer(now=now)
            reported += report.out_bytes
            if report.mean_transfer_bytes_per_s is not None:
                assert report.mean_transfer_bytes_per_s >= 0
        # a transfer idle for stalled_after_s (5 s; 80 gaps of up to 0.7 s reach it)
        # moves from the active count to the stalled one: together they are the open ones
        assert meter.active_transfers + meter.stalled_transfers == len(live)
        open_by_issue: dict[str, int] = {}
        for tid in live:
            open_by_issue[issue_of[tid]] = open_by_issue.get(issue_of[tid], 0) + 1
        by_issue = meter.active_transfers_by_issue()
        assert sum(by_issue.values()) == meter.active_transfers
        assert all(0 < n <= open_by_issue.get(issue, 0) for issue, n in by_issue.items())
        if meter.stalled_transfers == 0:
            assert by_issue == dict(sorted(open_by_issue.items()))
    # per-issue totals are never forgotten (the cache window forgets only the cache view)
    assert meter.transfers_by_issue == started
    assert {i: b for i, b in meter.bytes_sent_by_issue.items() if b} == {
        i: b for i, b in sent_by_issue.items() if b
    }
    reported += meter.handle_timer(now=now + 1.0).out_bytes
    assert reported == sent == meter.bytes_sent_total


def test_meter_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        TrafficMeter(interval_s=0.0, cache_window_s=1.0, now=0.0)
    with pytest.raises(ValueError):
        TrafficMeter(interval_s=1.0, cache_window_s=-1.0, now=0.0)


# ------------------------------------------------------------------------ config


def test_config_units_and_validation(tmp_path: object) -> None:
    from pathlib import Path

    config = OriginConfig(content_dir=Path("c"), capacity_mbps=100.0, egress_cap_mbps=16.0)
    assert config.capacity_bytes_per_s == 12_500_000.0
    assert config.egress_cap_bytes_per_s == 2_000_000.0
    assert config.cap_burst_bytes == max(64 * 1024, 2_000_000.0 * 0.05)
    assert OriginConfig(content_dir=Path("c")).egress_cap_bytes_per_s is None
    for bad in (
        {"capacity_mbps": 0.0},
        {"egress_cap_mbps": -1.0},
        {"stats_interval_s": 0.0},
        {"cache_window_s": -1.0},
        {"name": "bad name"},
        {"port": 70000},
    ):
        with pytest.raises(ValueError):
            OriginConfig(content_dir=Path("c"), **bad)  # type: ignore[arg-type]


# ---------------------------------------------------- stalled transfers (issue 25)


def test_meter_a_stalled_transfer_is_no_load_until_it_moves() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=300.0, now=0.0, stalled_after_s=5.0)
    stuck = meter.transfer_started("w", now=0.0)
    moving = meter.transfer_started("w", now=0.0)
    meter.bytes_sent(stuck, 200_000, now=0.1)  # the socket buffers fill, then nothing
    for t in range(1, 6):
        meter.bytes_sent(moving, 1_000_000, now=t - 0.5)
        meter.handle_timer(now=float(t))
    # at 5.0 the stuck one has sent nothing for 4.9 s: still counted
    assert meter.active_transfers == 2 and meter.stalled_transfers == 0
    meter.bytes_sent(moving, 1_000_000, now=5.5)
    report = meter.handle_timer(now=6.0)
    # 5.9 s without a byte: stalled. Not active, not in the issue's count, and no
    # rate of 0 pulling the per-transfer means down
    assert meter.active_transfers == 1 and meter.stalled_transfers == 1
    assert meter.active_transfers_by_issue() == {"w": 1}
    assert report.transfers_seen == 1
    assert report.mean_transfer_bytes_per_s == pytest.approx(1_000_000)
    # it moves again: counted again at once
    meter.bytes_sent(stuck, 65_536, now=6.2)
    assert meter.active_transfers == 2 and meter.stalled_transfers == 0
    # it stalls again and is cut (the send timeout): counted once, as stalled
    meter.handle_timer(now=12.0)
    meter.handle_timer(now=13.0)
    assert meter.stalled_transfers == 2  # the moving one stopped too
    meter.transfer_ended(stuck, now=13.5)
    meter.transfer_ended(moving, now=13.5)
    assert meter.active_transfers == 0 and meter.stalled_transfers == 0
    assert meter.active_transfers_by_issue() == {}


def test_meter_keeps_the_issue_of_a_stalled_transfer_past_the_cache_window() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=2.0, now=0.0, stalled_after_s=1.0)
    tid = meter.transfer_started("w", now=0.0)
    for t in range(1, 10):
        meter.handle_timer(now=float(t))
    assert meter.stalled_transfers == 1
    # the issue's state outlived the window: bytes and the end still find it
    meter.bytes_sent(tid, 10, now=9.5)
    assert meter.active_transfers == 1
    assert meter.transfer_ended(tid, now=9.6) == 10


def test_next_chunk_bytes_follows_the_client() -> None:
    mib = 1 << 20
    # fast: doubles up to the maximum
    assert next_chunk_bytes(65_536, 0.001, 65_536, max_bytes=mib) == 131_072
    assert next_chunk_bytes(mib, 0.01, mib, max_bytes=mib) == mib
    # slow (200 KB/s): what that rate sends in CHUNK_TARGET_S, at least 64 KiB
    assert next_chunk_bytes(mib, mib / 200_000, mib, max_bytes=mib) == pytest.approx(
        200_000 * CHUNK_TARGET_S, abs=1
    )
    assert next_chunk_bytes(65_536, 30.0, 65_536, max_bytes=mib) == MIN_CHUNK_BYTES
    # never above the configured maximum, even below the minimum
    assert next_chunk_bytes(4096, 10.0, 4096, max_bytes=4096) == 4096


def test_meter_a_transfer_waiting_on_the_cap_is_not_stalled() -> None:
    meter = TrafficMeter(interval_s=1.0, cache_window_s=300.0, now=0.0, stalled_after_s=5.0)
    tid = meter.transfer_started("w", now=0.0)
    meter.transfer_paced(tid, now=4.0)  # 4 s in the egress bucket's queue
    meter.handle_timer(now=6.0)
    assert meter.active_transfers == 1 and meter.stalled_transfers == 0
    meter.handle_timer(now=9.5)
    assert meter.stalled_transfers == 1
    meter.transfer_paced(tid, now=9.6)
    assert meter.active_transfers == 1 and meter.stalled_transfers == 0
