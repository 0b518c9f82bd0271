"""Which pieces an origin reader takes from the issue's swarm, and when they go back
(`pressrun.clients.swarm_take`, issue 28), with a stepped clock."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.clients.config import DESKTOP
from pressrun.clients.core import DownloadPlan
from pressrun.clients.events import DownloadComplete, PlanState
from pressrun.clients.swarm_take import (
    KEEP_PIECES,
    MIN_ORIGIN_RUN,
    PROBE_PIECES,
    SwarmTake,
    spaced,
)

PIECE = 64 * 1024


def plan(pieces: int = 30, sections: int = 3) -> DownloadPlan:
    """A plan of ``pieces`` whole pieces in ``sections`` sections (10 each by default)."""
    config = replace(DESKTOP, max_sections=sections)
    return DownloadPlan(
        size_bytes=pieces * PIECE, piece_size_bytes=PIECE, config=config, verified=(), now=0.0
    )


def runs_left(start: int, end: int, taken: list[int]) -> list[int]:
    """The lengths of the runs of ``[start, end)`` not taken."""
    lengths: list[int] = []
    run = 0
    for index in range(start, end):
        if index in taken:
            lengths.append(run)
            run = 0
        else:
            run += 1
    lengths.append(run)
    return lengths


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 39)), st.integers(0, 10), st.integers(10, 40))
def test_the_runs_left_to_the_origins_are_long_enough_or_none(
    wanted: set[int], start: int, end: int
) -> None:
    taken = spaced(start, end, wanted)
    assert set(taken) <= wanted and taken == sorted(taken)
    assert all(start <= i < end for i in taken)
    if taken:  # (none taken: the run is as it was)
        assert all(n == 0 or n >= MIN_ORIGIN_RUN for n in runs_left(start, end, taken))
    # every piece wanted: all of it
    assert spaced(start, end, set(range(start, end))) == list(range(start, end))


def test_every_piece_held_is_taken_and_a_scattered_few_are_not() -> None:
    assert spaced(0, 10, set(range(10))) == list(range(10))
    # 2 and 5 held: taking 2 would leave a run of 2 before it; 5 leaves 5 and 4
    assert spaced(0, 10, {2, 5}) == [5]
    assert spaced(0, 10, {2, 7}) == []  # 7 would leave 2 after it
    # the held tail of a run is taken, a run of 4 left before it
    assert spaced(0, 10, {4, 5, 6, 7, 8, 9}) == [4, 5, 6, 7, 8, 9]
    # 0-7 held: 6 and 7 stay with the run after them (2 would be too short)
    assert spaced(0, 10, set(range(8))) == [0, 1, 2, 3, 4, 5]


def test_the_held_pieces_of_an_open_section_are_taken_and_the_section_cut() -> None:
    p = plan()
    take = SwarmTake(p)
    started = p.start_section("origin-a", now=0.0)
    assert started is not None and started.section.pieces == range(0, 10)
    sid = started.section.section_id
    p.handle_piece_verified(sid, 0, now=0.5)
    # 9, 8 and 7 held, 5 too but taking it would leave 6 alone: 7-9 go to the swarm,
    # the section ends at 7
    assert take.claim({5, 7, 8, 9}, now=1.0) == (7, 8, 9)
    assert p.section_end(sid) == 7
    assert p.swarm_claims == (7, 8, 9)
    # the swarm shows a rate: no limit then; all held: the section keeps the piece on
    # the wire and the next
    take.taken(7, now=1.5)
    take.taken(8, now=2.0)
    assert take.budget(now=2.0) is None
    claimed = take.claim(set(range(30)), now=2.0)
    assert claimed == (3, 4, 5, 6, *range(10, 30))
    assert p.section_end(sid) == 1 + KEEP_PIECES
    assert p.pending_of(sid) == [1, 2]
    # no piece is both a section's and the swarm's, and every piece is somewhere
    assert not set(p.swarm_claims) & set(p.pending_of(sid))
    assert set(p.swarm_claims) | set(p.pending_of(sid)) | p.verified == set(range(30))
    assert not p.has_unassigned()


def test_until_the_swarm_shows_a_rate_it_is_asked_for_a_few_pieces_the_last_first() -> None:
    p = plan()
    take = SwarmTake(p)
    started = p.start_section("origin-a", now=0.0)
    assert started is not None
    claimed = take.claim(set(range(30)), now=0.0)
    assert claimed == tuple(range(30 - PROBE_PIECES, 30))
    assert take.claim(set(range(30)), now=0.5) == ()
    # the section is not cut for them
    assert p.section_end(started.section.section_id) == 10


def test_pieces_no_section_has_are_taken_and_the_next_section_skips_them() -> None:
    p = plan()
    take = SwarmTake(p)
    started = p.start_section("origin-a", now=0.0)
    assert started is not None and started.section.pieces == range(0, 10)
    # 12-19 held; 10-11 would be left alone (2 < MIN_ORIGIN_RUN), so 12 and 13 wait
    assert take.claim(set(range(12, 20)), now=0.0) == tuple(range(14, 20))
    second = p.start_section("origin-b", now=0.0)
    assert second is not None and second.section.pieces == range(10, 14)
    third = p.start_section("origin-a", now=0.0)
    assert third is not None and third.section.pieces == range(20, 30)


def test_a_piece_from_the_swarm_is_taken_once_and_completes_the_download() -> None:
    p = plan(pieces=4, sections=1)
    take = SwarmTake(p)
    assert take.claim({0, 1, 2, 3}, now=0.0) == (0, 1, 2, 3)
    assert take.taken(1, now=0.1) == (True, [])
    assert take.taken(1, now=0.2) == (False, [])  # once
    for index in (0, 2):
        assert take.taken(index, now=0.3) == (True, [])
    took, events = take.taken(3, now=0.4)
    assert took and isinstance(events[0], DownloadComplete)
    assert p.state is PlanState.COMPLETE
    assert take.pieces == 4 and take.bytes == 4 * PIECE and take.spare == 1


def test_a_piece_a_section_has_is_left_to_the_section() -> None:
    p = plan()
    take = SwarmTake(p)
    started = p.start_section("origin-a", now=0.0)
    assert started is not None
    took, _ = take.taken(5, now=0.5)  # (the bait, or a claim given back meanwhile)
    assert not took and 5 not in p.verified
    assert p.pending_of(started.section.section_id) == list(range(10))


def test_a_swarm_that_brings_nothing_gives_its_claims_back_once_nothing_is_left() -> None:
    p = plan(pieces=10, sections=1)
    take = SwarmTake(p)
    started = p.start_section("origin-a", now=0.0)
    assert started is not None
    sid = started.section.section_id
    assert take.claim(set(range(10)), now=0.0) == tuple(range(KEEP_PIECES, 10))
    assert p.section_end(sid) == KEEP_PIECES
    # the section's two pieces come; nothing from the swarm, no rate shown: a worker
    # is idle, so what it has not begun goes back at once (2 and 3 have a block asked)
    for index in range(KEEP_PIECES):
        p.handle_piece_verified(sid, index, now=0.5)
    assert take.take_back({2, 3}, now=0.5) == (4, 5, 6, 7, 8, 9)
    assert p.has_unassigned() and p.swarm_claims == (2, 3)
    # for good: held, they are not asked of the swarm again
    again = p.start_section("origin-a", now=2.0)
    assert again is not None and again.section.pieces == range(4, 10)
    assert take.claim(set(range(10)), now=2.0) == ()
    # begun pieces stay until the swarm brought nothing for steal_after_s
    assert take.take_back({2, 3}, now=0.6) == ()  # (judged after steal_min_elapsed_s)
    assert take.take_back({2, 3}, now=3.0) == ()
    assert take.take_back({2, 3}, now=4.5) == (2, 3)
    assert take.taken_back_total == 8


def origin_at_ten_pieces_a_second() -> tuple[DownloadPlan, SwarmTake, int]:
    """A plan of 40 pieces in one section whose first 12 came at 10 a second, and the
    swarm asked for its last `PROBE_PIECES` at 1.0 s."""
    p = plan(pieces=40, sections=1)
    take = SwarmTake(p)
    started = p.start_section("origin-a", now=0.0)
    assert started is not None
    sid = started.section.section_id
    for index in range(12):
        p.handle_piece_verified(sid, index, now=0.1 * (index + 1))
    assert p.best_rate_bytes_per_s >= 9 * PIECE
    assert take.claim(set(range(40)), now=1.0) == tuple(range(32, 40))
    assert p.section_end(sid) == 32
    return p, take, sid


def test_a_slow_swarm_gives_back_what_the_origins_would_bring_sooner() -> None:
    p, take, _ = origin_at_ten_pieces_a_second()
    # the swarm: 2 pieces a second (a fifth of the origin's rate)
    for n, index in enumerate(range(32, 36)):
        take.taken(index, now=1.5 + 0.5 * n)
    assert take.budget(now=3.0) == (PROBE_PIECES - 4) * PIECE  # (slow: a few at a time)
    # 4 left: those not begun go back at once; at the split the swarm would keep
    # 1 * 2 / 12 of a piece: none, the piece begun too (the origin brings it in a
    # tenth of a second)
    assert take.take_back({36}, now=3.0) == (37, 38, 39)
    assert take.take_back({36}, now=3.0) == ()  # (a worker takes them first)
    assert p.start_section("origin-a", now=3.0) is not None
    assert take.take_back({36}, now=3.0) == (36,)
    assert p.swarm_claims == ()
    # not again; still asked for a few others (the rate it shows may change)
    assert take.claim(set(range(40)), now=3.0) == tuple(range(24, 32))


def test_a_swarm_as_fast_as_the_origins_keeps_its_claims_and_takes_more() -> None:
    p, take, sid = origin_at_ten_pieces_a_second()
    # 4 pieces a second from the swarm, more than a third of the origin's 10
    for n, index in enumerate(range(32, 40)):
        take.taken(index, now=1.0 + 0.25 * (n + 1))
    assert take.budget(now=3.0) is None
    assert take.claim(set(range(40)), now=3.0) == tuple(range(12 + KEEP_PIECES, 32))
    assert p.section_end(sid) == 12 + KEEP_PIECES
    # 18 out need 4.5 s at 4 a second, but at more than a third of the origin's rate
    # (a link both share): kept
    p.handle_piece_verified(sid, 12, now=3.0)
    p.handle_piece_verified(sid, 13, now=3.0)
    assert not p.has_unassigned()
    assert take.take_back(set(), now=3.0) == ()
    # while some pieces are left to assign, nothing goes back whatever the rate
    p2 = plan(pieces=10, sections=1)
    take2 = SwarmTake(p2)
    assert take2.claim({8, 9, 7, 6}, now=0.0) == (6, 7, 8, 9)
    assert take2.take_back(set(), now=30.0) == ()


def test_claims_released_go_back_to_the_plan() -> None:
    p = plan(pieces=10, sections=1)
    take = SwarmTake(p)
    take.claim(set(range(10)), now=0.0)
    # the last PROBE_PIECES but those that would leave a run of 2 or 3 before them
    assert p.swarm_claims == tuple(range(4, 10))
    # (its peers no longer hold them): back to the plan, asked again once held
    assert take.release([3, 4, 11]) == (4,)
    assert p.unassigned_runs() == [(0, 5)]
    assert take.claim({3, 4}, now=0.1) == (4,)  # (3 would leave a run of 3)
    # the sharing ended: every claim back, for good
    assert take.release_all() == tuple(range(4, 10))
    assert p.swarm_claims == () and p.unassigned_runs() == [(0, 10)]
    # (0-3 were never asked for: they may be)
    assert take.claim(set(range(10)), now=0.2) == (0, 1, 2, 3)
