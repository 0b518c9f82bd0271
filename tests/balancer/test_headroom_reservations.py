"""Reserved starts (`headroom_reservations`, issue 33): each origin's queue as a fluid,
first come first served at the clients' whole rate; a client with no room now is told
when its turn comes. Pure, with an explicit `now`."""

from __future__ import annotations

import math
import random

import pytest

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.algorithms.headroom_reservations import OriginBook, Reservations
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    ClientHint,
    Directive,
    DirectiveRequested,
    NoDirective,
    OriginSpec,
    Refusal,
    StatusReceived,
)

from .test_headroom_deadlines import status

MB = 1e6


def test_an_empty_origin_starts_a_download_now_at_its_clients_rate() -> None:
    book = OriginBook(100 * MB, now=0.0)
    # 50 MB at 10 MB/s: 5 s, whatever the origin's room beyond that
    assert book.slot(50 * MB, 10 * MB, now=0.0) == (0.0, 5.0)


def test_a_download_queued_behind_work_starts_when_the_work_ahead_leaves_it_room() -> None:
    book = OriginBook(100 * MB, now=0.0)
    book.add(1000 * MB, now=0.0)  # 10 s of the origin's room
    start, end = book.slot(50 * MB, 10 * MB, now=0.0)
    # ends when the 1050 MB are sent (10.5 s), starts its own 5 s before
    assert end == pytest.approx(10.5)
    assert start == pytest.approx(5.5)
    # the queue drains at the origin's rate: 4 s later, 600 MB are left
    assert book.work_at(4.0) == pytest.approx(600 * MB)
    assert book.slot(50 * MB, 10 * MB, now=4.0) == pytest.approx((5.5, 10.5))


def test_a_reservation_goes_to_the_origin_where_it_ends_first() -> None:
    rooms = {"big": 100 * MB, "small": 10 * MB}
    res = Reservations(rooms.__getitem__, margin_s=0.0)
    res.book("big", now=0.0).add(2000 * MB, now=0.0)  # busy for 20 s
    planned = res.plan(
        "i", ["big", "small"], left_bytes=50 * MB, rate=10 * MB, time_left_s=60.0, now=0.0
    )
    assert planned is not None
    assert (planned.origin, planned.start, planned.end) == ("small", 0.0, 5.0)
    assert planned.claimed  # a start now: the client goes there at once


def test_a_download_no_origin_can_end_by_its_deadline_is_refused() -> None:
    res = Reservations(lambda _: 100 * MB, margin_s=5.0)
    res.book("o", now=0.0).add(5000 * MB, now=0.0)  # 50 s of work ahead
    kwargs = {"left_bytes": 100 * MB, "rate": 100 * MB, "now": 0.0}
    # it would end at 51 s: not with 55 s left (margin 5 s), yes with 56 s
    assert res.plan("i", ["o"], time_left_s=55.0, **kwargs) is None
    planned = res.plan("i", ["o"], time_left_s=56.0, **kwargs)
    assert planned is not None and planned.start == pytest.approx(50.0)
    # a link too slow for the file in time is refused even on an idle origin
    assert (
        res.plan("i", ["idle"], left_bytes=100 * MB, rate=1 * MB, time_left_s=90.0, now=0.0) is None
    )


def test_the_margin_is_for_the_queue_ahead_not_for_the_clients_own_link() -> None:
    # gen-11-021: 149 MB over a 1.25 MB/s link due in 120 s takes 119 s. On an idle
    # origin nothing is forecast, so it is admitted; behind a queue that sets its end
    # it must end the margin before its deadline.
    res = Reservations(lambda _: 100 * MB, margin_s=12.0)
    kwargs = {"left_bytes": 149 * MB, "rate": 1.25 * MB, "time_left_s": 120.0, "now": 0.0}
    assert res.plan("i", ["o"], **kwargs) is not None
    busy = Reservations(lambda _: 100 * MB, margin_s=12.0)
    busy.book("o", now=0.0).add(11_851 * MB, now=0.0)  # with it, 120 s of work
    assert busy.plan("i", ["o"], **kwargs) is None
    assert busy.plan("i", ["o"], **{**kwargs, "time_left_s": 132.0}) is not None


def test_a_client_told_to_come_back_is_placed_at_its_start_and_not_before() -> None:
    res = Reservations(lambda _: 100 * MB, margin_s=0.0, claim_s=10.0)
    res.book("o", now=0.0).add(3000 * MB, now=0.0)  # 30 s of work ahead
    planned = res.plan("i", ["o"], left_bytes=100 * MB, rate=100 * MB, time_left_s=60.0, now=0.0)
    assert planned is not None and not planned.claimed
    held = res.commit(planned, now=0.0)
    assert held.token and held.start == pytest.approx(30.0)
    # too early: still waiting, told the same start
    early = res.claim(held.token, deadline_at=60.0, now=12.0)
    assert early is not None and not early.claimed and early.start == pytest.approx(30.0)
    # at its start: claimed, and forgotten by the waiting list (bounded)
    on_time = res.claim(held.token, deadline_at=60.0, now=30.0)
    assert on_time is not None and on_time.claimed
    assert held.token not in res.waiting
    # its bytes stay queued: the next client ends behind it (a start within a second
    # of now is a start now)
    after = res.plan("i", ["o"], left_bytes=200 * MB, rate=100 * MB, time_left_s=60.0, now=30.0)
    assert after is not None and after.end == pytest.approx(33.0) and after.claimed


def test_a_reservation_never_claimed_is_cancelled_and_its_bytes_given_back() -> None:
    res = Reservations(lambda _: 100 * MB, margin_s=0.0, claim_s=10.0)
    res.book("o", now=0.0).add(3000 * MB, now=0.0)
    planned = res.plan("i", ["o"], left_bytes=1000 * MB, rate=100 * MB, time_left_s=90.0, now=0.0)
    assert planned is not None
    held = res.commit(planned, now=0.0)  # start at 30 s, 1000 MB queued behind the 3000
    assert res.book("o", now=0.0).work_at(0.0) == pytest.approx(4000 * MB)
    # its client never comes: 10 s after its start it is cancelled
    assert res.claim(held.token, deadline_at=90.0, now=41.0) is None
    assert held.token not in res.waiting
    assert res.book("o", now=41.0).work_at(41.0) == pytest.approx(0.0)


def test_a_start_moves_later_when_the_origin_turns_out_slower() -> None:
    rooms = {"o": 100 * MB}
    res = Reservations(rooms.__getitem__, margin_s=0.0)
    res.book("o", now=0.0).add(3000 * MB, now=0.0)
    planned = res.plan("i", ["o"], left_bytes=100 * MB, rate=50 * MB, time_left_s=120.0, now=0.0)
    assert planned is not None
    held = res.commit(planned, now=0.0)
    assert held.start == pytest.approx(29.0)  # 3100 MB at 100 MB/s end at 31 s, 2 s of its own
    # its statuses show a link of 50 MB/s (told wrong, learned from what it sends):
    # the queue drains at that, and the client coming back at 29 s is told to wait on
    rooms["o"] = 50 * MB
    res.observe("o", now=1.0)
    again = res.claim(held.token, deadline_at=120.0, now=29.0)
    assert again is not None and not again.claimed
    # 3000 MB: 100 MB drained in the first second, the rest at 50 MB/s: 59 s
    assert again.start == pytest.approx(59.0)
    # and one that would now end after its client's deadline is cancelled, its bytes
    # given back
    work = res.book("o", now=30.0).work_at(30.0)
    assert res.claim(held.token, deadline_at=60.0, now=30.0) is None
    assert res.book("o", now=30.0).work_at(30.0) == pytest.approx(work - 100 * MB)


def test_an_origin_out_of_rotation_forgets_its_queue_and_its_waiting_clients() -> None:
    res = Reservations(lambda _: 100 * MB, margin_s=0.0)
    res.book("o", now=0.0).add(3000 * MB, now=0.0)
    planned = res.plan("i", ["o"], left_bytes=100 * MB, rate=100 * MB, time_left_s=60.0, now=0.0)
    assert planned is not None
    held = res.commit(planned, now=0.0)
    res.drop_origin("o")
    assert res.claim(held.token, deadline_at=60.0, now=30.0) is None
    assert res.books == {} and res.waiting == {}


def test_the_waiting_clients_are_bounded() -> None:
    res = Reservations(lambda _: 100 * MB, margin_s=0.0, max_reservations=2)
    res.book("o", now=0.0).add(3000 * MB, now=0.0)
    kwargs = {"left_bytes": 100 * MB, "rate": 100 * MB, "time_left_s": math.inf, "now": 0.0}
    for _ in range(2):
        planned = res.plan("i", ["o"], **kwargs)
        assert planned is not None
        res.commit(planned, now=0.0)
    assert res.plan("i", ["o"], **kwargs) is None  # then the refusal is the ordinary one


# --- through the core: the directive request and its answers ----------------------


def crowd_core() -> BalancerCore:
    """One origin told 100 MB/s (95 with u_bw), one issue of 100 MB due in 100 s (a need
    of 1 MB/s) whose crowd asks for 3 times the origin's room."""
    origins = [OriginSpec("o", "http://o")]
    alg = make_algorithm("headroom", origins, random.Random(1))
    alg.set_issue_need("i", 1 * MB, deadline_s=100.0)
    core = BalancerCore(BalancerConfig(), origins, alg, now=0.0)
    core.handle_timer(now=0.0)
    core.handle_status_received(StatusReceived(status({}, out=0.0, issues=ISSUE)), now=0.5)
    return core


ISSUE = frozenset({"i"})


def ask(
    core: BalancerCore, *, now: float, reservation: str | None = None, elapsed: float = 0.0
) -> Directive | NoDirective:
    """A client of a 50 MB/s link asks for the whole issue."""
    hint = ClientHint(0, int(100 * MB), 50 * MB, elapsed)
    return core.handle_directive_requested(
        DirectiveRequested("i", client=hint, reservation=reservation), now=now
    )


def test_a_crowd_beyond_the_room_is_told_when_to_come_back_and_placed_then() -> None:
    core = crowd_core()
    answers = [ask(core, now=1.0 + k / 300) for k in range(300)]
    # The first ones start now; once the crowd's demand says overload, each is queued
    # at its client's whole rate (2 s each at 50 MB/s): started now while the queue
    # ahead leaves it room, told to come back at its turn after, refused once its turn
    # would end past its deadline less the margin (a tenth of it: 100 - 10 s).
    kinds = [
        "origin"
        if isinstance(a, Directive)
        else ("reserved" if a.reason is Refusal.RESERVED else "full")
        for a in answers
    ]
    assert kinds[0] == "origin" and "reserved" in kinds and kinds[-1] == "full"
    reserved = [a for a in answers if isinstance(a, NoDirective) and a.reservation]
    waits = [a.retry_after_s for a in reserved]
    assert waits == sorted(waits) and waits[0] > 1.0 and waits[-1] < 90.0
    # the queue holds what the origin sends by then: 95 MB/s x 90 s of 100 MB
    assert len(reserved) + kinds.count("origin") == pytest.approx(95 * 90 / 100, abs=3)
    # Coming back early: the same reservation, the same start.
    first = reserved[0]
    assert first.reservation is not None
    start = 1.0 + answers.index(first) / 300 + first.retry_after_s
    again = ask(core, now=start - 1.5, reservation=first.reservation, elapsed=start - 2.5)
    assert isinstance(again, NoDirective) and again.reservation == first.reservation
    assert again.retry_after_s == pytest.approx(1.5)
    # At its start: the reserved origin, admitted whatever the crowd asks meanwhile.
    placed = ask(core, now=start, reservation=first.reservation, elapsed=start - 1.0)
    assert isinstance(placed, Directive) and placed.origins[0].name == "o"
    # A reservation is claimed once: named again, it is an unknown one (placed anew).
    anew = ask(core, now=start + 0.1, reservation=first.reservation, elapsed=start - 0.9)
    assert not (isinstance(anew, NoDirective) and anew.reservation == first.reservation)


def test_without_reservations_the_crowd_is_refused_full() -> None:
    # reservations 0: the answers of the code before (no reserved start)
    origins = [OriginSpec("o", "http://o")]
    alg = make_algorithm("headroom", origins, random.Random(1), {"reservations": 0})
    alg.set_issue_need("i", 1 * MB, deadline_s=100.0)
    core = BalancerCore(BalancerConfig(), origins, alg, now=0.0)
    core.handle_timer(now=0.0)
    core.handle_status_received(StatusReceived(status({}, out=0.0, issues=ISSUE)), now=0.5)
    answers = [ask(core, now=1.0 + k / 300) for k in range(300)]
    assert not any(isinstance(a, NoDirective) and a.reservation for a in answers)


def test_reserved_starts_still_waiting_hold_their_room_once_the_crowd_has_passed() -> None:
    # gen-19-042: the last refusal was more than `overload_memory_s` ago and the crowd's
    # demand no longer says overload, but starts reserved for it are still to come. Placed
    # by room, a newcomer counts only the transfers running, not those starts, and
    # overbooks the origin (190 placed at 41-45 s on an origin whose book held 43 GB of
    # waiting starts: 110 of its clients ended past their deadline). While a reservation
    # waits, the book places the newcomers behind it. (The crowd's demand rule is off
    # here so that the refusals alone say overload, and stop saying it after 30 s.)
    origins = [OriginSpec("o", "http://o")]
    alg = make_algorithm("headroom", origins, random.Random(1), {"demand_overload": 0})
    assert isinstance(alg, Headroom)
    alg.set_issue_need("i", 1 * MB, deadline_s=100.0)
    core = BalancerCore(BalancerConfig(), origins, alg, now=0.0)
    core.handle_timer(now=0.0)
    core.handle_status_received(StatusReceived(status({}, out=0.0, issues=ISSUE)), now=0.5)
    answers = [ask(core, now=1.0 + k / 300) for k in range(300)]
    reserved = [a for a in answers if isinstance(a, NoDirective) and a.reservation]
    assert max(1.0 + answers.index(a) / 300 + a.retry_after_s for a in reserved) > 80.0
    # 40 s on, no refusal since 2 s; the origin reports its 10 transfers running (the
    # reserved starts come later), with room to spare: one more client asks.
    running = status({"i": 10}, out=94 * MB, issues=ISSUE)
    core.handle_status_received(StatusReceived(running), now=40.0)
    late = ask(core, now=41.0)
    assert isinstance(late, NoDirective)
    assert late.reason is Refusal.RESERVED and late.reservation is not None
    # its turn comes after the bytes still queued before it on the origin (the book's
    # fluid, drained at 95 MB/s; those of starts never claimed were given back 10 s
    # after them), less its own 2 s at 50 MB/s: well after now
    assert alg.reservations is not None
    queued = alg.reservations.books["o"].work_at(41.0)  # its own 100 MB included
    assert queued > 2_000 * MB
    assert late.retry_after_s == pytest.approx(queued / (95 * MB) - 2.0, abs=0.1)
