"""Starts ahead of an origin's queue (`Reservations.slip_in`, `OriginBook.slack_bytes`):
a download no turn behind the queue ends in time starts now when every download queued
there still ends by its due (issue 33, the earlier seeds: docs/results/2026-11-28-
balancer-reservations.md, section 9). Pure: explicit `now`, no clock."""

from __future__ import annotations

import pytest

from pressrun.balancer.algorithms.headroom_reservations import OriginBook, Reservations

MB = 1e6


def test_a_download_no_turn_fits_starts_ahead_when_no_queued_one_is_made_late() -> None:
    # gen-13-030, gen-19-045: a client of a small file, asking when the queue ahead ends
    # after its deadline, was refused although the origin, sharing its link evenly,
    # would send it in seconds and delay the queued ones by a fraction of a second.
    res = Reservations(lambda _: 100 * MB, transfers=lambda _: 9.0, margin_s=0.0)
    res.book("o", now=0.0).add(5000 * MB, now=0.0, due=52.0)  # ends at 50 s, due at 52 s
    assert res.book("o", now=0.0).slack_bytes(now=0.0) == pytest.approx(200 * MB)
    kwargs = {"rate": 100 * MB, "time_left_s": 40.0, "now": 0.0}
    # behind the queue: 150 MB end at 51.5 s, past its 40 s
    assert res.plan("i", ["o"], left_bytes=150 * MB, **kwargs) is None
    ahead = res.slip_in("i", ["o"], left_bytes=150 * MB, **kwargs)
    assert ahead is not None and ahead.ahead and ahead.claimed
    # ahead: it shares the link with the 9 transfers there, at least a tenth of it
    assert (ahead.origin, ahead.start, ahead.end) == ("o", 0.0, pytest.approx(15.0))
    res.commit(ahead, now=0.0)
    book = res.book("o", now=0.0)
    assert book.work_at(0.0) == pytest.approx(5150 * MB)
    assert book.slack_bytes(now=0.0) == pytest.approx(50 * MB)
    # 100 MB more ahead would end the queued one at 52.5 s: refused (it fits no turn)
    assert res.slip_in("i", ["o"], left_bytes=100 * MB, **kwargs) is None
    # and its own end counts: 40 MB shared with 9 others ends at 4 s, not with 3 s left
    assert res.slip_in("i", ["o"], left_bytes=40 * MB, **{**kwargs, "time_left_s": 3.0}) is None
    assert res.slip_in("i", ["o"], left_bytes=40 * MB, **kwargs) is not None


def test_a_start_ahead_moves_the_reserved_turns_later_by_its_bytes() -> None:
    res = Reservations(lambda _: 100 * MB, transfers=lambda _: 0.0, margin_s=0.0, claim_s=10.0)
    res.book("o", now=0.0).add(3000 * MB, now=0.0)  # 30 s of work ahead
    turn = res.plan("i", ["o"], left_bytes=100 * MB, rate=100 * MB, time_left_s=60.0, now=0.0)
    assert turn is not None and turn.start == pytest.approx(30.0)
    held = res.commit(turn, now=0.0)
    ahead = res.slip_in("i", ["o"], left_bytes=200 * MB, rate=100 * MB, time_left_s=10.0, now=0.0)
    assert ahead is not None
    res.commit(ahead, now=0.0)
    # the client comes back at its turn: the 200 MB started ahead were sent before it
    back = res.claim(held.token, deadline_at=60.0, now=30.0)
    assert back is not None and not back.claimed and back.start == pytest.approx(32.0)


def test_a_transfer_started_now_is_held_to_its_deadline_a_turn_later_less_the_margin() -> None:
    # The margin covers what the queue ahead forecasts (a start costs a round trip and
    # a startup, a status is stale); a transfer running is forecast by the drain alone.
    # Held to its deadline less the margin, the queue of gen-2026-097's surviving
    # origin (placed by room before the failure, ending within 0.96 of its deadline)
    # left no start ahead for the clients of the origin that failed: 179 served,
    # below alg2's 185; 200 held to its deadline.
    res = Reservations(lambda _: 100 * MB, margin_s=10.0)
    now_start = res.plan("i", ["o"], left_bytes=1000 * MB, rate=100 * MB, time_left_s=60.0, now=0.0)
    assert now_start is not None and now_start.claimed
    res.commit(now_start, now=0.0)
    # through it 1000 MB, due at 60 s: 6000 - 1000
    assert res.book("o", now=0.0).slack_bytes(now=0.0) == pytest.approx(5000 * MB)
    later = res.plan("i", ["o"], left_bytes=1000 * MB, rate=1000 * MB, time_left_s=60.0, now=0.0)
    assert later is not None and not later.claimed
    res.commit(later, now=0.0)
    # through it 2000 MB, due at 60 - 10 s
    assert res.book("o", now=0.0).slack_bytes(now=0.0) == pytest.approx(3000 * MB)
    # a transfer placed by room (`note`) is held to the due it is given
    res.note("o", left_bytes=500 * MB, now=0.0, due=20.0)
    assert res.book("o", now=0.0).slack_bytes(now=0.0) == pytest.approx(-500 * MB)


def test_the_slack_follows_the_drain_and_forgets_what_is_sent() -> None:
    book = OriginBook(100 * MB, now=0.0)
    assert book.slack_bytes(now=0.0) == float("inf")  # nothing queued with a due
    book.add(1000 * MB, now=0.0, due=30.0)
    book.add(1000 * MB, now=0.0, due=25.0)
    # the second one's: 2000 MB by 25 s
    assert book.slack_bytes(now=0.0) == pytest.approx(500 * MB)
    assert book.slack_bytes(now=5.0) == pytest.approx(500 * MB)  # drained as planned
    # the origin turns out slower: 1500 MB left at 5 s, 20 s at 50 MB/s -> 1000 MB by 25 s
    book.observe(50 * MB, now=5.0)
    assert book.slack_bytes(now=5.0) == pytest.approx(-500 * MB)
    # once all is sent, nothing is held back (the slack is not a leftover of the past)
    assert book.slack_bytes(now=40.0) == float("inf")
    assert not book.items
    # a reservation taken back does not help the ones queued before it
    book.add(1000 * MB, now=40.0, due=60.0)
    book.add(1000 * MB, now=40.0, due=90.0)
    book.remove(1000 * MB, now=40.0)
    assert book.slack_bytes(now=40.0) == pytest.approx(0.0)
