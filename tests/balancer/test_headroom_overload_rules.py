"""headroom under a crowd several times its origins' room (issue 33): the room goes to
the downloads that cost the others least, and the crowd's own demand says the
balancer is overloaded before anyone is refused (`headroom_overload`).

These tests use only `Headroom`'s public entry points, so they run on the code before
the rules too (where they fail: the dear download is admitted, and so is the client
whose link cannot bring the file in time in a crowd's first seconds)."""

from __future__ import annotations

import random

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.events import ClientHint, OriginSpec

from .test_headroom_deadlines import status

MB = 1e6


def new_client(size: float, rate: float) -> ClientHint:
    return ClientHint(have_bytes=0, size_bytes=int(size), rate_bytes_per_s=rate, elapsed_s=0.0)


SMALL = ("small", 30 * MB, 300.0)  # 0.1 MB/s
BIG = ("big", 230 * MB, 300.0)  # 0.77 MB/s: one costs the link what 7.7 small ones do


def crowded(pricing: float) -> Headroom:
    """One 100 MB/s origin that refused a client for want of room at t=3, then has room
    again, while 1,200 new clients of the small issue asked over 10 s: 30 MB each, over
    the issue's 300 s deadline about 4 a second (120 MB/s, more than the origin's 95),
    over the last 30 s about 34 a second (1 GB/s)."""
    # Reserved starts off: under overload the book queues the downloads whose clients
    # tell their link (first come, first served; tests/balancer/
    # test_headroom_reservations.py), and pricing refuses only the others.
    alg = make_algorithm(
        "headroom",
        [OriginSpec("o", "")],
        random.Random(1),
        {"overload_pricing": pricing, "reservations": 0},
    )
    assert isinstance(alg, Headroom)
    issues = frozenset({SMALL[0], BIG[0]})
    for name, size, deadline in (SMALL, BIG):
        alg.set_issue_need(name, size / deadline, deadline_s=deadline)
    alg.handle_status(status({}, out=0.0, issues=issues), now=0.0)
    full = {"big": 124}  # 124 x 0.77 = 95 MB/s of needs: no room for another
    alg.handle_status(status(full, out=94 * MB, issues=issues), now=1.0)
    alg.handle_status(status(full, out=94 * MB, issues=issues), now=2.0)
    assert alg.rank_for("big", new_client(BIG[1], 10 * MB), now=3.0) == []
    room = {"big": 40}  # 31 MB/s of needs: room for 83 more big ones by need
    alg.handle_status(status(room, out=60 * MB, issues=issues), now=4.0)
    for k in range(1200):
        alg.rank_for("small", new_client(SMALL[1], 10 * MB), now=10.0 + k / 120)
    return alg


def test_under_overload_a_dear_download_is_refused_while_cheap_ones_ask_for_all_the_room() -> None:
    priced = crowded(1.0)
    assert priced.rank_for("big", new_client(BIG[1], 10 * MB), now=20.0) == []
    # the cheap ones are still admitted, and a client resuming the big issue that lacks
    # less than a small download is cheap too (its sunk bytes cost nothing more)
    assert priced.rank_for("small", new_client(SMALL[1], 10 * MB), now=20.0)
    resuming = ClientHint(
        have_bytes=int(BIG[1] - 20 * MB),
        size_bytes=int(BIG[1]),
        rate_bytes_per_s=10 * MB,
        elapsed_s=200.0,
    )
    assert priced.rank_for("big", resuming, now=20.0)
    # without the rule (overload_pricing 0) the dear download takes the room
    assert crowded(0.0).rank_for("big", new_client(BIG[1], 10 * MB), now=20.0)


def test_pricing_ends_when_the_overload_does() -> None:
    # 30 s after the last refusal for want of room, the dear issue is admitted again
    # (overload_memory_s), however large the cheap demand still is.
    priced = crowded(1.0)
    assert priced.rank_for("big", new_client(BIG[1], 10 * MB), now=34.0)


def test_a_burst_that_fits_by_its_deadline_prices_nobody_out() -> None:
    # 300 small ones in 10 s want 1 GB/s over the last 30 s, but over their 300 s
    # deadline 30 MB/s of the origin's 95: a burst the origin serves in time, not a
    # crowd beyond it (a refusal for want of room there came from something else).
    alg = make_algorithm("headroom", [OriginSpec("o", "")], random.Random(1))
    assert isinstance(alg, Headroom)
    issues = frozenset({SMALL[0], BIG[0]})
    for name, size, deadline in (SMALL, BIG):
        alg.set_issue_need(name, size / deadline, deadline_s=deadline)
    alg.handle_status(status({}, out=0.0, issues=issues), now=0.0)
    alg.handle_status(status({"big": 124}, out=94 * MB, issues=issues), now=1.0)
    alg.handle_status(status({"big": 124}, out=94 * MB, issues=issues), now=2.0)
    assert alg.rank_for("big", new_client(BIG[1], 10 * MB), now=3.0) == []
    alg.handle_status(status({"big": 40}, out=60 * MB, issues=issues), now=4.0)
    for k in range(300):
        alg.rank_for("small", new_client(SMALL[1], 10 * MB), now=10.0 + k / 30)
    assert alg.rank_for("big", new_client(BIG[1], 10 * MB), now=20.0)


def idle_origin(crowd: int) -> Headroom:
    """An idle 100 MB/s origin and an issue of 228 MB due in 158 s (1.44 MB/s); `crowd`
    clients on gigabit links asked for it in the last 5 s."""
    alg = make_algorithm("headroom", [OriginSpec("o", "")], random.Random(1))
    assert isinstance(alg, Headroom)
    alg.set_issue_need("i", 228 * MB / 158.0, deadline_s=158.0)
    alg.handle_status(status({}, out=0.0, issues=frozenset({"i"})), now=0.0)
    for k in range(crowd):
        alg.rank_for("i", new_client(228 * MB, 125 * MB), now=5.0 * k / max(crowd, 1))
    return alg


def test_a_crowds_first_seconds_refuse_a_client_whose_link_cannot_finish_in_time() -> None:
    # 6 Mbit/s (0.75 MB/s): 228 MB take 304 s, the deadline is 158 s. Before anyone was
    # refused, 200 gigabit clients asking in 5 s want, over that deadline, 290 MB/s of
    # a 95 MB/s origin: the bytes go to those who can finish.
    slow = new_client(228 * MB, 0.75 * MB)
    assert idle_origin(200).rank_for("i", slow, now=5.0) == []
    # Without a crowd it is served, as before (refusing a client for its link alone
    # while there is room is not done: issue 10).
    assert idle_origin(0).rank_for("i", slow, now=5.0)
