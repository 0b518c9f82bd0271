"""Turns taken (`Reservations.take_turn`): where no turn behind an origin's queue and no
start ahead of it ends a download in time, it may take the turn of a waiting download
at least `take_ratio` times bigger, the latest queued, and smaller ones after it fill
the rest of that turn (issue 33, the earlier seeds: gen-19-042's 34 MB clients refused
behind a queue of 331 MB turns; docs/results/2026-11-28-balancer-reservations.md,
section 10). Pure: explicit `now`, no clock."""

from __future__ import annotations

import random

import pytest

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.algorithms.headroom_reservations import Reservations
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


def full_queue(take_ratio: float = 3.0) -> tuple[Reservations, str]:
    """One origin of 100 MB/s: 5000 MB running (due at 50 s), then a turn of 1000 MB at
    100 MB/s from 50 to 60 s (due at 80 s) whose client waits; the token of that turn."""
    res = Reservations(lambda _: 100 * MB, margin_s=0.0, claim_s=10.0, take_ratio=take_ratio)
    res.note("o", left_bytes=5000 * MB, now=0.0, due=50.0)
    big = res.plan("i", ["o"], left_bytes=1000 * MB, rate=100 * MB, time_left_s=80.0, now=0.0)
    assert big is not None and (big.start, big.end) == pytest.approx((50.0, 60.0))
    return res, res.commit(big, now=0.0).token


def test_a_small_download_no_turn_fits_takes_the_turn_of_a_bigger_one_still_waiting() -> None:
    res, big = full_queue()
    kwargs = {"rate": 50 * MB, "time_left_s": 58.0, "now": 0.0}
    # behind the queue it ends at 61 s, past its 58 s; ahead of it, the running 5000 MB
    # would end past their due: refused by both
    assert res.plan("j", ["o"], left_bytes=100 * MB, **kwargs) is None
    assert res.slip_in("j", ["o"], left_bytes=100 * MB, **kwargs) is None
    small = res.take_turn("j", ["o"], left_bytes=100 * MB, **kwargs)
    assert small is not None and small.turn is not None
    # at the big one's start, its own 2 s at 50 MB/s
    assert (small.origin, small.start, small.end) == ("o", 50.0, pytest.approx(52.0))
    assert not small.claimed
    held = res.commit(small, now=0.0)
    assert held.token in res.waiting and big not in res.waiting
    # the book is not told: it still plans the 1000 MB of the turn
    assert res.book("o", now=0.0).work_at(0.0) == pytest.approx(6000 * MB)
    # The client of the big turn, back at its start, has none: placed anew (None).
    assert res.claim(big, deadline_at=80.0, now=50.0) is None
    # A second small one goes in the same turn once the first one's bytes are sent at
    # the turn's rate (1 s), not at once beside it.
    second = res.take_turn(
        "j", ["o"], left_bytes=300 * MB, rate=100 * MB, time_left_s=58.0, now=0.0
    )
    assert second is not None and second.turn is small.turn
    assert (second.start, second.end) == pytest.approx((51.0, 54.0))
    res.commit(second, now=0.0)
    # 600 MB are left in the turn, 6 s of it from 54 s: 700 MB do not fit, and no other
    # turn waits
    assert (
        res.take_turn("j", ["o"], left_bytes=700 * MB, rate=100 * MB, time_left_s=80.0, now=0.0)
        is None
    )
    # nor past its own deadline: 100 MB from 54 s end at 55 s
    assert (
        res.take_turn("j", ["o"], left_bytes=100 * MB, rate=100 * MB, time_left_s=54.5, now=0.0)
        is None
    )
    assert (
        res.take_turn("j", ["o"], left_bytes=100 * MB, rate=100 * MB, time_left_s=55.5, now=0.0)
        is not None
    )


def test_a_turn_is_taken_only_by_a_download_take_ratio_times_smaller_the_latest_queued() -> None:
    res, first = full_queue()
    later = res.plan("i", ["o"], left_bytes=1000 * MB, rate=100 * MB, time_left_s=80.0, now=0.0)
    assert later is not None and later.start == pytest.approx(60.0)
    second = res.commit(later, now=0.0).token
    kwargs = {"rate": 100 * MB, "time_left_s": 75.0, "now": 0.0}
    # 400 MB: 1000 MB is less than 3 times that
    assert res.take_turn("j", ["o"], left_bytes=400 * MB, **kwargs) is None
    taken = res.take_turn("j", ["o"], left_bytes=300 * MB, **kwargs)
    assert taken is not None and taken.start == pytest.approx(60.0)
    assert first in res.waiting and second not in res.waiting
    # take_ratio 0: never
    off, token = full_queue(take_ratio=0.0)
    assert off.take_turn("j", ["o"], left_bytes=10 * MB, **kwargs) is None
    assert token in off.waiting


def test_a_download_placed_in_a_turn_never_claimed_gives_its_bytes_back_to_the_turn() -> None:
    res, _ = full_queue()
    small = res.take_turn("j", ["o"], left_bytes=300 * MB, rate=100 * MB, time_left_s=70.0, now=0.0)
    assert small is not None and small.turn is not None
    res.commit(small, now=0.0)
    assert small.turn.left_bytes == pytest.approx(700 * MB)
    # not claimed within 10 s of its 50 s start: cancelled, its bytes back in the turn
    # (not taken from the book, which still plans the turn's)
    assert res.claim("nobody", deadline_at=70.0, now=61.0) is None
    assert small.token not in res.waiting
    assert small.turn.left_bytes == pytest.approx(1000 * MB)
    assert res.book("o", now=61.0).work_at(61.0) == pytest.approx(0.0)


def test_an_origin_out_of_rotation_forgets_its_turns_taken() -> None:
    res, _ = full_queue()
    small = res.take_turn("j", ["o"], left_bytes=100 * MB, rate=100 * MB, time_left_s=70.0, now=0.0)
    assert small is not None
    res.commit(small, now=0.0)
    assert res.taken
    res.drop_origin("o")
    assert not res.taken and not res.waiting


# --- through the core: a small issue's client behind a queue of a big issue's ---------


BIG, SMALL = "big", "small"


def ask(core: BalancerCore, issue: str, size: float, *, now: float) -> Directive | NoDirective:
    """A client of a 50 MB/s link asks for a whole issue of `size` bytes."""
    hint = ClientHint(0, int(size), 50 * MB, 0.0)
    return core.handle_directive_requested(DirectiveRequested(issue, client=hint), now=now)


def test_a_small_issues_client_behind_a_full_queue_takes_a_big_waiting_turn() -> None:
    # gen-19-042: the queues of every origin held 331 MB turns up to the deadline less
    # the margin; the 34 MB issue's clients asking then were refused (875 served, round
    # 2's pricing 901, the bound 901). Each takes the turn of a 331 MB one queued last,
    # and the next small ones fill the rest of it: 1000 served.
    origins = [OriginSpec("o", "http://o")]
    alg = make_algorithm("headroom", origins, random.Random(1))
    assert isinstance(alg, Headroom)
    alg.set_issue_need(BIG, 3 * MB, deadline_s=100.0)  # 300 MB
    alg.set_issue_need(SMALL, 0.3 * MB, deadline_s=100.0)  # 30 MB
    core = BalancerCore(BalancerConfig(), origins, alg, now=0.0)
    core.handle_timer(now=0.0)
    issues = frozenset({BIG, SMALL})
    core.handle_status_received(StatusReceived(status({}, out=0.0, issues=issues)), now=0.5)
    answers = [ask(core, BIG, 300 * MB, now=1.0 + k / 100) for k in range(100)]
    assert isinstance(answers[-1], NoDirective) and answers[-1].reason is Refusal.ALL_FULL
    turns = [a for a in answers if isinstance(a, NoDirective) and a.reservation]
    assert turns
    assert alg.reservations is not None
    added = alg.reservations.books["o"].added_bytes
    last = turns[-1]
    last_start = 1.0 + answers.index(last) / 100 + last.retry_after_s
    # The small ones: the first fill what the queue has left before the deadline less
    # the margin; then each would end past it, and the ones after take the turn of the
    # big one queued last, one after another at its rate (0.6 s each at 50 MB/s): ten
    # in its 300 MB; the next ones take the turn queued before it.
    smalls = [ask(core, SMALL, 30 * MB, now=3.0 + k / 100) for k in range(24)]
    assert all(isinstance(a, NoDirective) and a.reservation for a in smalls)
    starts = [3.0 + k / 100 + a.retry_after_s for k, a in enumerate(smalls)]
    in_turn = [t for t in starts if last_start - 0.01 <= t <= last_start + 5.5]
    assert in_turn == pytest.approx([last_start + 0.6 * k for k in range(10)], abs=0.01)
    before = turns[-2]
    before_start = 1.0 + answers.index(before) / 100 + before.retry_after_s
    assert any(abs(t - before_start) < 0.01 for t in starts)
    waiting = alg.reservations.waiting
    assert last.reservation not in waiting and before.reservation not in waiting
    # the book still plans the big turns' bytes, not the small ones' placed in them: it
    # was told only of those queued behind (what it drained meanwhile lets in a few)
    behind = [t for t in starts if t > last_start + 5.5]
    assert 11 <= len(behind) < 14
    book = alg.reservations.books["o"]
    assert book.added_bytes == pytest.approx(added + len(behind) * 30 * MB)
