"""The download plan, driven synchronously with a stepped clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.clients.config import DESKTOP, MOBILE, ClientConfig, profile
from pressrun.clients.core import DownloadPlan
from pressrun.clients.events import (
    DownloadComplete,
    DownloadGaveUp,
    LocalProtocolError,
    OriginFailed,
    OriginSlow,
    PiecesReleased,
    PlanState,
    Section,
)

KIB = 1024
MIB = 1024 * KIB
PIECE = 256 * KIB


def plan(
    size: int = 10 * PIECE,
    piece: int = PIECE,
    config: ClientConfig = DESKTOP,
    verified: tuple[int, ...] = (),
    now: float = 0.0,
) -> DownloadPlan:
    return DownloadPlan(
        size_bytes=size, piece_size_bytes=piece, config=config, verified=verified, now=now
    )


def start(p: DownloadPlan, origin: str = "origin-a", now: float = 0.0) -> Section:
    started = p.start_section(origin, now=now)
    assert started is not None
    return started.section


def finish(p: DownloadPlan, section: Section, now: float = 0.0) -> list[object]:
    events: list[object] = []
    for index in section.pieces:
        events += p.handle_piece_verified(section.section_id, index, now=now)
    events += p.handle_section_finished(section.section_id, now=now)
    return events


# ------------------------------------------------------------- section planning


def test_default_section_is_a_third_of_the_file_in_whole_pieces() -> None:
    # 40 MiB in 256 KiB pieces: 160 pieces, ceil(160/3) = 54 pieces per section
    assert DESKTOP.section_size_for(40 * MIB, PIECE) == 54 * PIECE
    # so the file comes in 3 sections: at most 2 handoffs (001: too many hurt)
    p = plan(size=40 * MIB)
    sections = []
    while (s := p.start_section("a", now=0.0)) is not None:
        sections.append(s.section)
    assert [(s.first_piece, s.end_piece) for s in sections] == [(0, 54), (54, 108), (108, 160)]
    assert sections[-1].end_byte == 40 * MIB


def test_section_size_rounding_and_bounds() -> None:
    # a tiny file: one piece, at least one piece per section
    assert DESKTOP.section_size_for(1000, PIECE) == PIECE
    # an explicit size is rounded up to whole pieces
    assert replace(DESKTOP, section_bytes=PIECE + 1).section_size_for(10 * PIECE, PIECE) == (
        2 * PIECE
    )
    # mobile caps automatic sections at 8 MiB
    assert MOBILE.section_size_for(100 * MIB, PIECE) == 8 * MIB
    assert MOBILE.section_size_for(3 * MIB, PIECE) == 4 * PIECE  # ceil(12/3) pieces
    assert DESKTOP.with_section_mb(2).section_size_for(100 * MIB, PIECE) == 2 * MIB


def test_profiles() -> None:
    assert profile("desktop") is DESKTOP and not DESKTOP.metered
    assert profile("mobile").metered and MOBILE.concurrency < DESKTOP.concurrency
    with pytest.raises(ValueError, match="unknown profile"):
        profile("tablet")
    with pytest.raises(ValueError):
        ClientConfig(concurrency=0)
    with pytest.raises(ValueError):
        DESKTOP.with_section_mb(0)


def test_section_range_header_and_short_last_piece() -> None:
    p = plan(size=3 * PIECE + 100, config=replace(DESKTOP, section_bytes=2 * PIECE))
    first, second = start(p), start(p)
    assert first.range_header() == f"bytes=0-{2 * PIECE - 1}"
    assert (second.first_piece, second.end_piece) == (2, 4)
    assert second.range_header() == f"bytes={2 * PIECE}-{3 * PIECE + 99}"
    assert second.length_bytes == PIECE + 100
    assert p.start_section("a", now=0.0) is None  # everything in flight


def test_complete_after_every_piece() -> None:
    p = plan(size=5 * PIECE)
    events: list[object] = []
    while (s := p.start_section("a", now=0.0)) is not None:
        events += finish(p, s.section)
    assert p.state is PlanState.COMPLETE
    assert events[-1] == DownloadComplete()
    assert p.remaining_ranges() == []
    assert p.verified_bytes == 5 * PIECE


# -------------------------------------------------------------------- handoff


def test_handoff_between_sections_counts_origin_changes() -> None:
    p = plan(size=9 * PIECE, config=replace(DESKTOP, section_bytes=3 * PIECE))
    s1 = p.start_section("origin-a", now=0.0)
    assert s1 is not None and s1.handed_off_from is None
    finish(p, s1.section)
    s2 = p.start_section("origin-b", now=1.0)  # the balancer picked another origin
    assert s2 is not None and s2.handed_off_from == "origin-a"
    finish(p, s2.section)
    s3 = p.start_section("origin-b", now=2.0)
    assert s3 is not None and s3.handed_off_from is None
    finish(p, s3.section)
    assert p.handoffs == 1 and p.sections_started == 3
    assert p.state is PlanState.COMPLETE


# ------------------------------------------------------- failed origin exclusion


def test_failed_origin_is_excluded_for_its_ttl() -> None:
    config = replace(DESKTOP, section_bytes=4 * PIECE, failed_ttl_s=30.0)
    p = plan(size=8 * PIECE, config=config)
    s = start(p, "origin-a", now=10.0)
    p.handle_piece_verified(s.section_id, 0, now=10.5)
    events = p.handle_section_failed(s.section_id, "the connection was reset", now=11.0)
    assert PiecesReleased(s.section_id, (1, 2, 3)) in events
    failed = [e for e in events if isinstance(e, OriginFailed)]
    assert failed == [OriginFailed("origin-a", "the connection was reset", 41.0)]
    # the WSDM retry rule: named in failed= and skipped in the directive's list
    assert p.failed_origins(now=12.0) == {"origin-a"}
    assert p.pick_origin(["origin-a", "origin-b"], now=12.0) == "origin-b"
    assert p.pick_origin(["origin-a"], now=12.0) is None
    # after the ttl it may be tried again
    assert p.failed_origins(now=41.0) == frozenset()
    assert p.pick_origin(["origin-a", "origin-b"], now=41.0) == "origin-a"


def test_failure_keeps_verified_pieces_and_the_rest_is_refetched() -> None:
    p = plan(size=8 * PIECE, config=replace(DESKTOP, section_bytes=4 * PIECE))
    s = start(p, "origin-a")
    for index in (0, 1):
        p.handle_piece_verified(s.section_id, index, now=0.0)
    p.handle_section_failed(s.section_id, "stalled", now=1.0)
    assert p.verified == {0, 1}
    # the next section starts where the failed one stopped, on another origin
    s2 = start(p, "origin-b", now=2.0)
    assert (s2.first_piece, s2.end_piece) == (2, 6)
    assert p.handoffs == 1


def test_corrupt_piece_fails_the_origin_and_releases_the_piece() -> None:
    p = plan(size=4 * PIECE)
    s = start(p, "origin-c")
    p.handle_piece_verified(s.section_id, 0, now=0.0)
    events = p.handle_piece_corrupt(s.section_id, 1, now=0.5)
    assert any(isinstance(e, OriginFailed) and e.origin == "origin-c" for e in events)
    assert 1 not in p.verified
    s2 = start(p, "origin-a", now=1.0)
    assert s2.first_piece == 1


def test_misuse_raises_local_protocol_error() -> None:
    p = plan(size=4 * PIECE, config=replace(DESKTOP, section_bytes=2 * PIECE))
    s = start(p)
    with pytest.raises(LocalProtocolError):
        p.handle_piece_verified(s.section_id, 3, now=0.0)  # not in the section
    p.handle_piece_verified(s.section_id, 0, now=0.0)
    with pytest.raises(LocalProtocolError):
        p.handle_piece_verified(s.section_id, 0, now=0.0)  # twice
    with pytest.raises(LocalProtocolError):
        p.handle_section_failed(99, "x", now=0.0)
    with pytest.raises(LocalProtocolError):
        plan(size=4 * PIECE, verified=(4,))


# --------------------------------------------------------------------- resume


def test_resume_skips_verified_pieces() -> None:
    p = plan(size=10 * PIECE, config=replace(DESKTOP, section_bytes=4 * PIECE), verified=(0, 1, 5))
    assert p.remaining_ranges() == [(2 * PIECE, 5 * PIECE), (6 * PIECE, 10 * PIECE)]
    s1, s2 = start(p), start(p)
    # sections stop at a verified piece and never include one
    assert (s1.first_piece, s1.end_piece) == (2, 5)
    assert (s2.first_piece, s2.end_piece) == (6, 10)
    assert p.start_section("a", now=0.0) is None


def test_resume_with_everything_verified_is_complete() -> None:
    p = plan(size=3 * PIECE, verified=(0, 1, 2))
    assert p.state is PlanState.COMPLETE
    assert p.start_section("a", now=0.0) is None


def test_pieces_lost_on_disk_are_fetched_again() -> None:
    p = plan(size=3 * PIECE, verified=(0, 1, 2))
    p.handle_pieces_lost([1], now=0.0)
    assert p.state is PlanState.DOWNLOADING
    s = start(p)
    assert list(s.pieces) == [1]


# ------------------------------------------------------------------ give up


def test_gives_up_after_n_failures_without_progress() -> None:
    config = replace(DESKTOP, max_attempts_without_progress=3, retry_backoff_s=1.0)
    p = plan(size=4 * PIECE, config=config)
    assert p.handle_directive_failed("balancer unreachable", now=0.0) == []
    assert p.not_before == 1.0  # backoff 1 s, doubling
    s = start(p, "origin-a", now=1.0)
    p.handle_section_failed(s.section_id, "reset", now=1.0)
    assert p.not_before == 3.0
    assert p.state is PlanState.DOWNLOADING
    events = p.handle_directive_failed("503: every origin down", now=3.0, retry_after_s=10.0)
    assert p.state is PlanState.GAVE_UP
    gave_up = [e for e in events if isinstance(e, DownloadGaveUp)]
    assert len(gave_up) == 1 and "3 failed attempts" in gave_up[0].reason
    assert "503: every origin down" in gave_up[0].reason
    assert p.start_section("origin-b", now=20.0) is None
    assert p.next_deadline() is None


def test_progress_resets_the_failure_count() -> None:
    config = replace(DESKTOP, max_attempts_without_progress=2, section_bytes=PIECE)
    p = plan(size=4 * PIECE, config=config)
    for index in range(4):
        p.handle_directive_failed("503", now=float(index))
        s = start(p, now=float(index))
        p.handle_piece_verified(s.section_id, index, now=float(index))
        assert p.failures_in_a_row == 0
    assert p.state is PlanState.COMPLETE
    assert p.failures_total == 4


def test_retry_after_sets_not_before() -> None:
    p = plan()
    p.handle_directive_failed("503", now=5.0, retry_after_s=2.0)
    assert p.not_before == 7.0 == p.next_deadline()


def test_clients_refused_together_come_back_spread_out() -> None:
    """Twenty downloads refused by the same 503 (Retry-After 1 s) at the same moment
    ask again over half a second, each after the full Retry-After. In step, a balancer
    that admits a few after each status of its origins admitted the same early ones
    every time: in the security soak test on a CPU-starved host (29 Nov), six clients
    started within 0.1 s were refused "full" together once a second for 19 s and gave
    up while about 20 others a second were admitted. Before, every one asked again at
    exactly 11.0 s."""
    config = replace(DESKTOP, retry_jitter=0.5)
    plans = [
        DownloadPlan(
            size_bytes=4 * PIECE,
            piece_size_bytes=PIECE,
            config=config,
            now=0.0,
            rng=random.Random(seed),
        )
        for seed in range(20)
    ]
    for rounds in range(1, 4):
        for p in plans:
            p.handle_directive_failed("every origin is full", now=10.0 * rounds, retry_after_s=1.0)
        again = sorted(p.not_before for p in plans)
        assert all(10.0 * rounds + 1.0 <= t <= 10.0 * rounds + 1.5 for t in again)
        assert again[-1] - again[0] > 0.3
        assert len(set(again)) == len(again)


def test_unassigned_sections_counts_what_start_section_would_make() -> None:
    p = plan(size=5 * PIECE, config=replace(DESKTOP, section_bytes=2 * PIECE))
    assert p.unassigned_sections() == 3  # pieces 0-1, 2-3, 4
    first = start(p)
    assert p.unassigned_sections() == 2
    start(p)
    start(p)
    assert p.unassigned_sections() == 0
    p.handle_section_failed(first.section_id, "reset", now=1.0)  # 0-1 back to the plan
    assert p.unassigned_sections() == 1


def test_a_backoff_is_jittered_by_its_draw_within_retry_jitter() -> None:
    config = replace(DESKTOP, retry_backoff_s=0.25, retry_backoff_max_s=4.0, retry_jitter=0.5)
    assert config.backoff_s(1, spread=0.0) == 0.25
    assert config.backoff_s(1, spread=1.0) == 0.375
    assert config.backoff_s(3, retry_after_s=2.0, spread=0.5) == 2.5
    assert replace(config, retry_jitter=0.0).backoff_s(3, retry_after_s=2.0, spread=0.9) == 2.0
    with pytest.raises(ValueError, match="spread"):
        config.backoff_s(1, spread=1.5)
    with pytest.raises(ValueError, match="retry_jitter"):
        replace(config, retry_jitter=-0.1)


# ----------------------------------------------------------------- properties


@st.composite
def plans(draw: st.DrawFn) -> tuple[DownloadPlan, set[int]]:
    piece = draw(st.sampled_from([1, 7, 64, 1000]))
    size = draw(st.integers(min_value=1, max_value=60 * piece))
    num = -(-size // piece)
    section = draw(st.integers(min_value=1, max_value=size + piece))
    verified = draw(st.sets(st.integers(min_value=0, max_value=num - 1)))
    concurrency = draw(st.integers(min_value=1, max_value=4))
    config = replace(DESKTOP, section_bytes=section, concurrency=concurrency)
    p = DownloadPlan(
        size_bytes=size, piece_size_bytes=piece, config=config, verified=verified, now=0.0
    )
    return p, verified


@given(plans(), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_happy_path_requests_every_missing_byte_exactly_once(
    case: tuple[DownloadPlan, set[int]], rng: object
) -> None:
    p, verified_before = case
    requested = bytearray(p.size_bytes)  # how often each byte was asked for
    open_sections: list[Section] = []
    origins = ["a", "b", "c"]
    step = 0
    while p.state is PlanState.DOWNLOADING:
        # fill up to `concurrency` sections, then finish one (in a random order)
        while len(open_sections) < p.config.concurrency:
            started = p.start_section(origins[step % 3], now=float(step))
            step += 1
            if started is None:
                break
            s = started.section
            for piece in s.pieces:
                assert piece not in p.verified  # never overlaps a verified piece
            for b in range(s.start_byte, s.end_byte):
                requested[b] += 1
            open_sections.append(s)
        assert open_sections, "downloading but nothing to fetch"
        s = open_sections.pop(rng.randrange(len(open_sections)))  # type: ignore[attr-defined]
        finish(p, s, now=float(step))
    assert p.state is PlanState.COMPLETE
    for index in range(p.num_pieces):
        offset, length = p.piece_span(index)
        expected = 0 if index in verified_before else 1
        assert all(requested[b] == expected for b in range(offset, offset + length))


@given(plans(), st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_sections_never_overlap_verified_or_in_flight_pieces_under_failures(
    case: tuple[DownloadPlan, set[int]], script: list[tuple[bool, int]]
) -> None:
    p, _ = case
    now = 0.0
    in_flight: dict[int, Section] = {}
    for fail, verify_count in script:
        now += 1.0
        started = p.start_section("abc"[int(now) % 3], now=now)
        if started is not None:
            s = started.section
            for piece in s.pieces:
                assert piece not in p.verified
                assert all(piece not in other.pieces for other in in_flight.values())
            in_flight[s.section_id] = s
        if not in_flight:
            continue
        sid, s = next(iter(in_flight.items()))
        pieces = [i for i in s.pieces if i not in p.verified]
        for index in pieces[:verify_count]:
            p.handle_piece_verified(sid, index, now=now)
        if verify_count >= len(pieces):
            p.handle_section_finished(sid, now=now)
        elif fail:
            p.handle_section_failed(sid, "reset", now=now)
        else:
            continue
        del in_flight[sid]
        assert sid not in p.sections
    # bookkeeping agrees: remaining ranges are exactly the unverified pieces
    remaining = sum(end - start for start, end in p.remaining_ranges())
    assert remaining == p.size_bytes - p.verified_bytes


def test_no_origin_left_forgives_the_failed_marks() -> None:
    config = replace(DESKTOP, max_attempts_without_progress=5)
    p = plan(config=config)
    s = start(p, "origin-a")
    p.handle_section_failed(s.section_id, "reset", now=0.0)
    assert p.failed_origins(now=1.0) == {"origin-a"}
    # the balancer has nothing but origin-a: a 503 to failed=origin-a
    p.handle_directive_failed("503", now=1.0, retry_after_s=1.0, no_origin_left=True)
    assert p.failed_origins(now=1.0) == frozenset()
    assert p.pick_origin(["origin-a"], now=2.0) == "origin-a"
    assert p.failures_in_a_row == 2  # still counted toward giving up


# ------------------------------------------------------- taking over a slow section


def test_steal_takes_the_back_half_of_a_slow_section() -> None:
    config = replace(DESKTOP, section_bytes=8 * PIECE, steal_after_s=4.0)
    p = plan(size=8 * PIECE, config=config)
    s = start(p, "origin-c", now=0.0)
    assert not p.has_unassigned()
    p.handle_piece_verified(s.section_id, 0, now=2.0)  # 1 piece in 2 s: 14 s to go
    assert p.worth_stealing(now=2.0)
    # never to the slow section's own origin
    assert p.steal_section(["origin-c"], now=2.0) is None
    started = p.steal_section(["origin-c", "origin-a"], now=2.0)
    assert started is not None and started.handed_off_from == "origin-c"
    stolen = started.section
    assert stolen.origin == "origin-a" and (stolen.first_piece, stolen.end_piece) == (5, 8)
    assert stolen.range_header() == f"bytes={5 * PIECE}-{8 * PIECE - 1}"
    assert p.section_end(s.section_id) == 5 and p.handoffs == 1
    for index in (1, 2, 3, 4):
        p.handle_piece_verified(s.section_id, index, now=3.0)
    assert p.section_end(s.section_id) == 0  # closed: its worker stops reading
    finish(p, stolen, now=3.0)
    assert p.state is PlanState.COMPLETE


def test_no_steal_from_a_section_that_goes_well_or_just_started() -> None:
    config = replace(DESKTOP, section_bytes=8 * PIECE, steal_after_s=4.0, steal_min_elapsed_s=1.0)
    p = plan(size=8 * PIECE, config=config)
    s = start(p, "origin-a", now=0.0)
    assert not p.worth_stealing(now=0.5)  # too early to judge
    for index in range(6):
        p.handle_piece_verified(s.section_id, index, now=1.5)  # 4 pieces/s: 0.5 s left
    assert not p.worth_stealing(now=1.5)
    assert p.steal_section(["origin-b"], now=1.5) is None
    # a section with one piece left keeps it (that piece is on the wire)
    p.handle_piece_verified(s.section_id, 6, now=30.0)
    assert p.steal_section(["origin-b"], now=60.0) is None
    assert not replace(config, steal_after_s=None).steal_after_s


@given(plans(), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_steals_and_failures_never_overlap_and_every_piece_verifies_once(
    case: tuple[DownloadPlan, set[int]], script: list[tuple[int, int]]
) -> None:
    p, before = case
    p = DownloadPlan(
        size_bytes=p.size_bytes,
        piece_size_bytes=p.piece_size_bytes,
        config=replace(
            p.config,
            steal_after_s=0.5,
            steal_min_elapsed_s=0.0,
            max_attempts_without_progress=10**6,
        ),
        verified=before,
        now=0.0,
    )
    verified_count = dict.fromkeys(range(p.num_pieces), 0)
    for index in before:
        verified_count[index] = 1
    now = 0.0

    def verify_next(sid: int, k: int) -> None:
        section = p.sections[sid]
        for index in [i for i in section.pieces if i not in p.verified][:k]:
            p.handle_piece_verified(sid, index, now=now)
            verified_count[index] += 1
            if sid not in p.sections:
                break

    steps = [*script, *([(0, 5)] * (4 * p.num_pieces + 8))]  # then drive it home
    for action, k in steps:
        if p.state is not PlanState.DOWNLOADING:
            break
        now += 1.0
        origin = "abc"[int(now) % 3]
        if action == 0 or not p.sections:
            p.start_section(origin, now=now)
        elif action == 1:
            started = p.steal_section(["a", "b", "c"], now=now)
            if started is not None:
                s = started.section
                assert all(i not in p.verified for i in s.pieces)
        if p.sections:
            sid = min(p.sections)
            if action == 2 and k == 0:
                p.handle_section_failed(sid, "reset", now=now)
            elif action == 3 and k == 1 and p.should_move(sid, now=now):
                p.handle_section_moved(sid, now=now)
            else:
                verify_next(sid, k)
        # no piece is in two open sections, and none is verified and in one
        seen: set[int] = set()
        for s in p.sections.values():
            for index in range(s.first_piece, p.section_end(s.section_id)):
                if index in p.verified:
                    continue
                assert index not in seen
                seen.add(index)
    while p.state is PlanState.DOWNLOADING:
        now += 1.0
        if not p.sections:
            assert p.start_section("a", now=now) is not None
        verify_next(min(p.sections), 5)
    assert p.state is PlanState.COMPLETE
    assert all(n == 1 for n in verified_count.values())


def test_pick_origin_spreads_sections_over_origins() -> None:
    p = plan(size=8 * PIECE, config=replace(DESKTOP, section_bytes=4 * PIECE))
    start(p, "origin-c", now=0.0)
    assert p.pick_origin(["origin-c", "origin-a"], now=0.0) == "origin-a"
    assert p.pick_origin(["origin-c"], now=0.0) == "origin-c"  # nothing else offered


def test_a_relatively_slow_section_moves_and_its_origin_is_passed_over() -> None:
    config = replace(DESKTOP, section_bytes=4 * PIECE, steal_after_s=4.0, failed_ttl_s=30.0)
    p = plan(size=12 * PIECE, config=config)
    fast = start(p, "origin-a", now=0.0)
    finish(p, fast, now=0.2)  # 4 pieces in 0.2 s: what this client's link can do
    slow = start(p, "origin-c", now=1.0)
    p.handle_piece_verified(slow.section_id, 4, now=4.0)  # 1 piece in 3 s, 9 s to go
    assert p.slow_origins(now=4.0) == {"origin-c"}
    assert p.should_move(slow.section_id, now=4.0)
    assert p.pick_origin(["origin-c", "origin-b"], now=4.0) == "origin-b"
    events = p.handle_section_moved(slow.section_id, now=4.0)
    assert OriginSlow("origin-c", 34.0) in events
    assert PiecesReleased(slow.section_id, (5, 6, 7)) in events
    assert p.failures_in_a_row == 0 and p.failed_origins(now=4.0) == frozenset()
    assert p.pick_origin(["origin-c", "origin-a"], now=5.0) == "origin-a"
    # chosen knowingly after the mark (nothing else offered): it is not moved again
    again = start(p, "origin-c", now=5.0)
    assert (again.first_piece, again.end_piece) == (5, 9)
    p.handle_piece_verified(again.section_id, 5, now=8.0)
    assert not p.should_move(again.section_id, now=8.0)


def test_a_slow_link_of_the_clients_own_moves_nothing() -> None:
    config = replace(DESKTOP, section_bytes=4 * PIECE, steal_after_s=4.0)
    p = plan(size=12 * PIECE, config=config)
    s1, s2 = start(p, "origin-a", now=0.0), start(p, "origin-b", now=0.0)
    p.handle_piece_verified(s1.section_id, 0, now=3.0)
    p.handle_piece_verified(s2.section_id, 4, now=3.0)
    # both need 9 s more, but both go at the best rate seen: the link is the limit
    assert not p.should_move(s1.section_id, now=3.0)
    assert not p.should_move(s2.section_id, now=3.0)
    assert p.slow_origins(now=3.0) == frozenset()
