"""The hand-over from the swarm to the carousel (`pressrun.clients.carousel_handover`):
the order of its steps, what each side's failure leaves going, and that no piece is
counted twice, driven event by event."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.clients.carousel_handover import (
    CarouselHandover,
    CheckPieces,
    HandoverEffect,
    ReceiveSide,
    StartReceive,
    StopReceive,
    StopSwarm,
    SwarmSide,
)
from pressrun.clients.events import LocalProtocolError

PIECES = 382  # flash-crowd-50-desktops' issue: 50 MB in 131 kB pieces


def test_the_receive_starts_with_the_checked_pieces_before_the_swarm_stops() -> None:
    # a dsl-20 leaver of the run at a23629d: 8% of the file (30 pieces) held when the
    # carousel was chosen, a resume's 2 pieces kept before
    h = CarouselHandover(PIECES, kept=[0, 1])
    held = list(range(30))
    # 1: only the held pieces not verified yet are read back
    assert h.start(held) == [CheckPieces(tuple(range(2, 30)))]
    assert h.receive is ReceiveSide.WAITING and h.swarm is SwarmSide.RUNNING
    # piece 29's bytes were still on their way to the file: not handed
    effects = h.handle_checked(range(2, 30), range(2, 29))
    # 2: the receive starts with what checked out; the swarm keeps running
    assert effects == [StartReceive(tuple(range(29)))]
    assert h.swarm is SwarmSide.RUNNING
    # 3: its first packets came: only now is the swarm stopped
    assert h.handle_receive_running() == [StopSwarm()]
    assert h.swarm is SwarmSide.CLOSING and h.ran
    # 4: the swarm closed holding 4 pieces more (29 again, 30-32): those alone are read
    assert h.handle_swarm_ended(held=range(33)) == [CheckPieces((29, 30, 31, 32))]
    assert not h.done
    assert h.handle_checked((29, 30, 31, 32), (29, 30, 31, 32)) == []
    # the carousel's copy verified every piece
    assert h.handle_receive_ended(range(PIECES)) == []
    assert h.done
    assert h.have() == list(range(PIECES))
    # the carousel's bytes are the pieces only it brought: not the resume's, not the
    # swarm's (handed or checked after it closed)
    assert h.carousel_only() == list(range(33, PIECES))


def test_a_leaver_with_nothing_starts_the_receive_without_reading_the_file() -> None:
    h = CarouselHandover(PIECES)
    assert h.start(()) == [StartReceive(())]
    assert h.handle_receive_running() == [StopSwarm()]
    assert h.handle_swarm_ended(held=()) == []
    h.handle_receive_ended(range(PIECES))
    assert h.done and h.carousel_only() == list(range(PIECES))


def test_a_receive_that_never_ran_leaves_the_client_in_the_swarm() -> None:
    # the join failed (no multicast route) or the plan had expired: no first packet
    h = CarouselHandover(PIECES)
    h.start(range(10))
    h.handle_checked(range(10), range(10))
    assert h.handle_receive_ended(()) == []
    assert h.resume_swarm and h.done and not h.ran
    assert h.swarm is SwarmSide.RUNNING  # never told to stop
    # a running signal that comes after the end changes nothing
    assert h.handle_receive_running() == []
    assert h.swarm is SwarmSide.RUNNING


def test_a_receive_that_brought_pieces_ran_whatever_its_signal_said() -> None:
    h = CarouselHandover(PIECES)
    h.start(())
    # the receive ended with the carousel's pieces before its running signal was seen
    assert h.handle_receive_ended(range(PIECES)) == [StopSwarm()]
    assert h.ran and not h.resume_swarm and not h.done
    h.handle_swarm_ended(held=())
    assert h.done and h.carousel_only() == list(range(PIECES))


def test_a_swarm_that_fails_while_the_receive_joins_leaves_the_receive_going() -> None:
    h = CarouselHandover(PIECES)
    h.start(range(5))
    h.handle_checked(range(5), range(5))
    # the swarm failed with 8 pieces held: the 3 new ones are read back
    assert h.handle_swarm_ended(held=range(8)) == [CheckPieces((5, 6, 7))]
    h.handle_checked((5, 6, 7), (5, 6, 7))
    # the receive runs on: nothing to stop
    assert h.handle_receive_running() == []
    assert not h.done
    h.handle_receive_ended(range(PIECES))
    assert h.done and h.ran
    assert h.carousel_only() == list(range(8, PIECES))


def test_a_swarm_that_fails_during_the_check_still_gets_the_receive_started() -> None:
    h = CarouselHandover(PIECES)
    h.start(range(5))
    assert h.handle_swarm_ended(held=range(5)) == []  # the same pieces: being checked
    assert h.handle_checked(range(5), range(5)) == [StartReceive(tuple(range(5)))]


def test_a_swarm_that_completes_first_stops_the_receive() -> None:
    h = CarouselHandover(PIECES)
    h.start(())
    assert h.handle_swarm_ended(held=(), completed=True) == [StopReceive()]
    assert h.swarm_completed and not h.done
    h.handle_receive_ended(range(3))  # stopped with a few pieces decoded
    assert h.done and h.have() == list(range(PIECES))
    assert h.carousel_only() == []


def test_a_swarm_that_completes_during_the_check_starts_no_receive() -> None:
    h = CarouselHandover(PIECES)
    h.start(range(300))
    assert h.handle_swarm_ended(held=(), completed=True) == []
    assert h.handle_checked(range(300), range(300)) == []
    assert h.done and h.receive is ReceiveSide.ENDED and not h.ran


def test_events_out_of_order_are_the_callers_error() -> None:
    h = CarouselHandover(PIECES)
    with pytest.raises(LocalProtocolError):
        h.handle_receive_ended(())  # no receive started yet
    h.start(())
    with pytest.raises(LocalProtocolError):
        h.start(())
    h.handle_swarm_ended(held=())
    with pytest.raises(LocalProtocolError):
        h.handle_swarm_ended(held=())
    with pytest.raises(ValueError, match="at least one piece"):
        CarouselHandover(0)


def test_pieces_outside_the_issue_are_ignored() -> None:
    h = CarouselHandover(4, kept=[-1, 9])
    assert h.start([3, 7]) == [CheckPieces((3,))]
    assert h.handle_checked([3], [3, 7]) == [StartReceive((3,))]


_EVENTS = st.lists(st.sampled_from(["checked", "running", "swarm", "receive"]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    held=st.sets(st.integers(0, 39)),
    bad=st.sets(st.integers(0, 39)),
    late=st.sets(st.integers(0, 39)),
    decoded=st.sets(st.integers(0, 39)),
    completed=st.booleans(),
    order=_EVENTS,
)
def test_no_piece_is_counted_twice_in_any_order(
    held: set[int],
    bad: set[int],
    late: set[int],
    decoded: set[int],
    completed: bool,
    order: list[str],
) -> None:
    """Whatever order the outcomes come in: every piece counted is verified from one
    side, the carousel's are disjoint from the others', a piece that failed its check
    is never handed, and the swarm is stopped only after the receive ran."""
    h = CarouselHandover(40)
    pending: list[CheckPieces] = []
    stopped_swarm_after_run: list[bool] = []

    def apply(effects: Sequence[HandoverEffect]) -> None:
        for e in effects:
            if isinstance(e, CheckPieces):
                pending.append(e)
            elif isinstance(e, StartReceive):
                assert not set(e.known) & bad
            elif isinstance(e, StopSwarm):
                stopped_swarm_after_run.append(h.ran)

    apply(h.start(held))
    for event in order:
        if event == "checked" and pending:
            c = pending.pop(0)
            apply(h.handle_checked(c.pieces, set(c.pieces) - bad))
        elif event == "running":
            apply(h.handle_receive_running())
        elif event == "swarm" and h.swarm is not SwarmSide.ENDED:
            apply(h.handle_swarm_ended(held=held | late, completed=completed))
        elif event == "receive" and h.receive in (ReceiveSide.STARTED, ReceiveSide.RUNNING):
            apply(h.handle_receive_ended(decoded))
    assert all(stopped_swarm_after_run)
    assert not set(h.carousel_only()) & h.verified
    assert set(h.have()) == h.verified | h.carousel
    if not h.swarm_completed:
        assert h.verified <= (held | late) - bad
