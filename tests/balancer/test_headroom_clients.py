"""Issue 10: `headroom` counting what a client tells of itself (``have=``, ``size=``,
``rate=``, ``elapsed=``: `ClientHint`), through the core as the service drives it."""

from __future__ import annotations

import random

import pytest

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.algorithms.headroom_clients import MIN_NEED_SHARE
from pressrun.balancer.events import ClientHint, OriginSpec, OriginStatus

MB = 1e6
SIZE = 120_000_000  # a 120 MB issue with a target of 120 s: it needs 1 MB/s


def _headroom(*names: str) -> Headroom:
    alg = make_algorithm("headroom", [OriginSpec(n, "") for n in names], random.Random(1))
    assert isinstance(alg, Headroom)
    alg.set_issue_need("i", SIZE / 120.0)
    return alg


def _status(
    name: str, link: float, n: int, *, started: int | None = None, rate: float | None = None
) -> OriginStatus:
    """An origin of `link` bytes/s (told and real) with `n` downloads of issue i."""
    per = rate if rate is not None else (link / n if n else 0.0)
    return OriginStatus(
        name, 0.1 + 0.001 * n, 0.1 + 0.001 * n, per * n, link, n, frozenset({"i"}),
        frozenset(), per if n else None, {"i": per} if n else {}, {"i": n} if n else {},
        started if started is not None else n, {"i": started if started is not None else n},
    )  # fmt: skip


def _measured(alg: Headroom, name: str, link: float, n: int) -> None:
    alg.handle_status(_status(name, link, 0, started=0), now=0.0)
    alg.handle_status(_status(name, link, n), now=1.0)


def test_a_resuming_client_is_counted_at_what_it_lacks_over_the_time_it_has_left() -> None:
    alg = _headroom("a")
    # 20 MB/s link, 19 MB/s room: 18 downloads needing 1 MB/s leave room for one.
    _measured(alg, "a", 20 * MB, 18)
    assert alg.client_need("i", None) is None
    assert alg.client_need("i", ClientHint(0, SIZE)) is None  # a new client: 1 MB/s
    half = ClientHint(SIZE // 2, SIZE, None, 0.0)
    assert alg.client_need("i", half) == pytest.approx(0.5 * MB)
    # 60 MB left after 60 s of its 120: 1 MB/s, as a new one
    assert alg.client_need("i", ClientHint(SIZE // 2, SIZE, None, 60.0)) is None
    # 30 MB left after 60 s: 0.5 MB/s
    late = ClientHint(SIZE * 3 // 4, SIZE, None, 60.0)
    assert alg.client_need("i", late) == pytest.approx(0.5 * MB)
    # lying: all but one byte, or a wait longer than the target, buys no more than the floor
    assert alg.client_need("i", ClientHint(SIZE - 1, SIZE, None, 0.0)) == pytest.approx(
        MIN_NEED_SHARE * MB
    )
    assert alg.client_need("i", ClientHint(SIZE // 2, SIZE, None, 500.0)) is None
    # two new clients fill the room (19 - 18 = 1 MB/s); two halves fit where one new one does
    alg.handle_pick_for("a", "i", half, now=1.1)
    assert [n for n, _ in alg.rank_for("i", half, now=1.1)] == ["a"]
    assert alg.rank_for("i", None, now=1.1) == []  # 18.5 committed: no 1 MB/s left
    alg.handle_pick_for("a", "i", half, now=1.2)
    assert alg.rank_for("i", half, now=1.2) == []
    assert alg.models["a"].pending_bytes == pytest.approx(1.0 * MB)


def test_a_resumed_transfer_is_counted_below_its_need_until_its_bytes_have_come() -> None:
    alg = _headroom("a")
    _measured(alg, "a", 20 * MB, 17)
    half = ClientHint(SIZE // 2, SIZE, None, 0.0)
    alg.handle_pick_for("a", "i", half, now=1.5)
    # the origin reports it started: 18 transfers of i, counted 17 + 0.5 MB/s
    alg.handle_status(_status("a", 20 * MB, 18, started=18, rate=1 * MB), now=2.0)
    m = alg.models["a"]
    assert m.pending == 0
    assert m.committed_bytes_per_s == pytest.approx(17.5 * MB)
    # at 1 MB/s its 60 MB have come after 60 s: counted at the issue's need again
    alg.handle_status(_status("a", 20 * MB, 18, started=18, rate=1 * MB), now=30.0)
    assert m.committed_bytes_per_s == pytest.approx(17.5 * MB)
    alg.handle_status(_status("a", 20 * MB, 18, started=18, rate=1 * MB), now=62.5)
    assert m.committed_bytes_per_s == pytest.approx(18 * MB)
    assert m.reliefs == []


def test_a_client_whose_link_cannot_carry_its_need_waits_while_others_are_refused() -> None:
    alg = _headroom("a")
    _measured(alg, "a", 20 * MB, 10)
    slow = ClientHint(0, SIZE, 0.5 * MB, 0.0)  # 120 MB at 0.5 MB/s: 240 s, target 120
    fast = ClientHint(0, SIZE, 100 * MB, 0.0)
    assert [n for n, _ in alg.rank_for("i", slow, now=1.0)] == ["a"]  # room: served
    for _ in range(9):
        alg.handle_pick_for("a", "i", fast, now=1.0)
    assert alg.rank_for("i", fast, now=1.0) == []  # 19 committed: a new client is refused
    _measured(alg, "a", 20 * MB, 10)  # the picks settled and ended; room again
    alg.handle_status(_status("a", 20 * MB, 10, started=10), now=2.0)
    assert [n for n, _ in alg.rank_for("i", fast, now=2.0)] == ["a"]
    # a slow one is refused until no one has been for `overload_memory_s` (30 s)
    assert alg.rank_for("i", slow, now=2.0) == []
    assert alg.rank_for("i", slow, now=30.9) == []
    assert [n for n, _ in alg.rank_for("i", slow, now=31.1)] == ["a"]
    # saying it is slow never helps: the same request without a rate is served
    alg.refused_at = 31.0
    assert [n for n, _ in alg.rank_for("i", ClientHint(0, SIZE), now=31.5)] == ["a"]


def test_an_origin_that_gives_a_client_its_whole_link_ranks_first() -> None:
    # a big origin with many transfers (more room in all, 2 MB/s each) and an idle
    # small one (9.5 MB/s for one more): a 6.25 MB/s client gets all its link only on
    # the small one; a gigabit client gets it nowhere, and most room wins.
    alg = _headroom("big", "small")
    _measured(alg, "big", 100 * MB, 47)
    _measured(alg, "small", 10 * MB, 0)
    alg.handle_status(_status("small", 10 * MB, 1), now=1.0)  # measured with one
    alg.handle_status(_status("small", 10 * MB, 0, started=1), now=2.0)
    alg.handle_status(_status("big", 100 * MB, 47), now=2.0)
    dsl = ClientHint(0, SIZE, 6.25 * MB, 0.0)
    gigabit = ClientHint(0, SIZE, 125 * MB, 0.0)
    assert [n for n, _ in alg.rank_for("i", dsl, now=2.0)] == ["small", "big"]
    assert [n for n, _ in alg.rank_for("i", gigabit, now=2.0)] == ["big", "small"]
    assert [n for n, _ in alg.rank_for("i", None, now=2.0)] == ["big", "small"]


def test_transfers_slow_at_their_clients_end_teach_nothing_of_the_origins_link() -> None:
    # 20 downloads needing 1 MB/s, each client's link 0.3 MB/s (its rate=): the origin
    # sends 6 MB/s of its 100. Without the rates that reads as an origin holding its
    # transfers back, learned at 6 MB/s (issue 10, gen-17-099: a 5 GB/s origin learned
    # at 440 MB/s, then 80, from its 10-50 Mbit/s clients); with them it is not.
    told = ClientHint(0, SIZE, 0.3 * MB, 0.0)
    for hint, learned in ((told, None), (ClientHint(0, SIZE), 6 * MB)):
        alg = _headroom("a")
        alg.handle_status(_status("a", 100 * MB, 0, started=0), now=0.0)
        for _ in range(20):
            alg.handle_pick_for("a", "i", hint, now=0.5)
        alg.handle_status(_status("a", 100 * MB, 20, started=20, rate=0.3 * MB), now=1.0)
        m = alg.models["a"]
        assert m.learned_bytes_per_s == (None if learned is None else pytest.approx(learned))
        if hint is told:
            assert m.client_slow == {"i": pytest.approx(20 * 0.7 * MB)}
            assert m.committed_bytes_per_s == pytest.approx(20 * MB)  # room: at the need


def test_a_slow_client_of_an_issue_without_a_stated_need_is_never_refused_for_it() -> None:
    # The default need (1 MB/s) is what a transfer should get, not a deadline: a client
    # reading at 0.4 MB/s (the security soak test's) is served while others are refused.
    alg = make_algorithm("headroom", [OriginSpec("a", "")], random.Random(1))
    assert isinstance(alg, Headroom)
    alg.handle_status(_status("a", 20 * MB, 0, started=0), now=0.0)
    alg.handle_status(
        OriginStatus(
            "a", 0.2, 0.2, 10 * MB, 20 * MB, 10, frozenset({"j"}), frozenset(), 1 * MB,
            {"j": 1 * MB}, {"j": 10}, 10, {"j": 10},
        ),
        now=1.0,
    )  # fmt: skip
    alg.refused_at = 0.9
    hint = ClientHint(0, 65_000, 0.4 * MB, 0.0)
    assert [n for n, _ in alg.rank_for("j", hint, now=1.0)] == ["a"]


def test_a_client_that_cannot_finish_at_the_share_it_would_get_waits_while_others_are_refused() -> (
    None
):
    # 20 MB/s with 10 transfers: one more would get 0.95 x 20 / 11 = 1.73 MB/s. A new
    # client (120 MB in 120 s) can finish at that; one that has waited 100 s cannot
    # (120 MB in 20 s), and while others are refused for want of room it is too.
    alg = _headroom("a")
    _measured(alg, "a", 20 * MB, 10)
    late = ClientHint(0, SIZE, 100 * MB, 100.0)
    assert [n for n, _ in alg.rank_for("i", late, now=1.0)] == ["a"]  # no one refused
    alg.refused_at = 0.5
    assert alg.rank_for("i", late, now=1.0) == []
    assert [n for n, _ in alg.rank_for("i", ClientHint(0, SIZE, 100 * MB, 0.0), now=1.0)] == ["a"]
    assert [n for n, _ in alg.rank_for("i", late, now=4.6)] == ["a"]  # 4 s since
