"""Pieces as keys: placement balance, the uploader choice, handoffs."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.chord.ids import RING, node_id_for
from pressrun.chord.pieces import (
    PieceDirectory,
    piece_keys,
    place_one_more,
    place_supernodes,
    responsibility,
    spread,
)

IH = "12" * 20


@settings(deadline=None)  # (a loaded CI machine: the default 200 ms deadline is flaky)
@given(st.integers(1, 400), st.integers(1, 40))
def test_placed_supernodes_answer_for_an_equal_share(num_pieces: int, count: int) -> None:
    keys = piece_keys(IH, num_pieces)
    ids = place_supernodes(keys, count)
    assert len(set(ids)) == count and all(0 <= i < RING for i in ids)
    counts = responsibility(ids, keys)
    lo, hi, _ = spread(counts)
    assert sum(counts.values()) == num_pieces
    assert hi - lo <= 1


def test_placement_beats_plain_hashing_and_a_newcomer_splits_the_biggest_arc() -> None:
    keys = piece_keys(IH, 200)
    plain = responsibility([node_id_for(f"127.0.0.1:{7000 + i}") for i in range(5)], keys)
    placed = responsibility(place_supernodes(keys, 5), keys)
    assert spread(placed)[:2] == (40, 40)
    assert spread(plain)[1] > 40  # plain SHA-1 ids: someone answers for more than a share
    ids = place_supernodes(keys, 4)
    new = place_one_more(ids, keys)
    after = responsibility([*ids, new], keys)
    assert after[new] == 25 and max(after.values()) == 50


def test_the_uploader_owes_first_then_least_loaded_never_left() -> None:
    d = PieceDirectory(rng=random.Random(1))
    d.handle_report(
        peer_id="a", address="a:1", have=[1], uploaded_bytes=9, downloaded_bytes=9, now=0
    )
    d.handle_report(
        peer_id="b", address="b:1", have=[1], uploaded_bytes=0, downloaded_bytes=5, now=0
    )
    d.handle_report(
        peer_id="c", address="c:1", have=[1], uploaded_bytes=0, downloaded_bytes=5, now=0
    )
    first = d.choose_uploader(1, peer_id="x", address="x:1", now=1.0)
    second = d.choose_uploader(1, peer_id="y", address="y:1", now=1.0)
    # both owers before the one that is even, spread over them
    assert {first.peer_id, second.peer_id} == {"b", "c"}
    d.handle_left("b")
    d.handle_left("c")
    third = d.choose_uploader(1, peer_id="z", address="z:1", now=1.0)
    assert third.peer_id == "a" and not third.bring_in
    # the asker itself is never chosen; stale holders are not either
    assert d.choose_uploader(1, peer_id="a", address="a:1", now=1.0).bring_in
    stale = d.choose_uploader(1, peer_id="q", address="q:1", now=100.0)
    assert stale.bring_in and stale.peer_id == "q"


def test_owing_holders_that_pay_back_soonest_come_first() -> None:
    # the simulation's order (pressrun.sim.swarm_model): owed bytes over upload rate
    d = PieceDirectory(rng=random.Random(3))
    rows = [("slow", 4_000, 1_000), ("fast", 8_000, 8_000), ("mute", 1_000, 0)]
    for pid, owed, rate in rows:
        d.handle_report(
            peer_id=pid,
            address=f"{pid}:1",
            have=[2],
            uploaded_bytes=0,
            downloaded_bytes=owed,
            upload_bps=rate,
            now=0,
        )
    # fast: 1 s to pay back; slow: 4 s; mute: rate unknown, last among the owers
    assert d.choose_uploader(2, peer_id="x1", address="x:1", now=1.0).peer_id == "fast"
    d.handle_left("fast")
    assert d.choose_uploader(2, peer_id="x2", address="x:1", now=1.0).peer_id == "slow"
    d.handle_left("slow")
    assert d.choose_uploader(2, peer_id="x3", address="x:1", now=1.0).peer_id == "mute"
    # a report without a rate keeps the one said before
    d.handle_report(
        peer_id="slow", address="slow:1", have=[], uploaded_bytes=0, downloaded_bytes=4_000, now=2
    )
    assert d.holders["slow"].upload_bps == 1_000


def test_a_piece_nobody_holds_is_brought_in_once() -> None:
    d = PieceDirectory(rng=random.Random(1), bring_in_s=5.0)
    first = d.choose_uploader(7, peer_id="x", address="x:1", now=0.0)
    assert first.bring_in and first.peer_id == "x"
    other = d.choose_uploader(7, peer_id="y", address="y:1", now=1.0)
    assert not other.bring_in and other.peer_id == "x"  # wait for the bringer
    late = d.choose_uploader(7, peer_id="z", address="z:1", now=9.0)
    assert late.bring_in and late.peer_id == "z"  # the bringer took too long
    # one asker brings in at most two pieces at a time; then it waits
    assert d.choose_uploader(8, peer_id="z", address="z:1", now=9.0).bring_in
    third = d.choose_uploader(9, peer_id="z", address="z:1", now=9.0)
    assert third.wait and not third.bring_in and third.peer_id == ""
    assert d.choose_uploader(9, peer_id="w", address="w:1", now=9.0).bring_in


def test_a_few_bringers_at_a_time_each_fetching_back_to_back() -> None:
    d = PieceDirectory(rng=random.Random(1), max_bringers=1, max_bringing_per_peer=2)
    assert d.choose_uploader(1, peer_id="x", address="x:1", now=0.0).bring_in
    # another asker waits while x brings this supernode's pieces in
    assert d.choose_uploader(2, peer_id="y", address="y:1", now=0.0).wait
    assert d.choose_uploader(2, peer_id="x", address="x:1", now=0.0).bring_in
    assert d.choose_uploader(3, peer_id="x", address="x:1", now=0.0).wait  # two at a time
    # x reports piece 1: the same report's question takes the next one
    d.handle_report(
        peer_id="x", address="x:1", have=[1], uploaded_bytes=0, downloaded_bytes=1, now=1.0
    )
    assert d.choose_uploader(3, peer_id="x", address="x:1", now=1.0).bring_in
    # what the asker brings in for other supernodes counts against the same cap
    d2 = PieceDirectory(rng=random.Random(1), max_bringing_per_peer=2)
    assert d2.choose_uploader(5, peer_id="z", address="z:1", now=0.0, bringing=2).wait
    # a bringer that leaves frees its slot and its pieces for the next asker
    d.handle_left("x")
    up = d.choose_uploader(2, peer_id="y", address="y:1", now=1.0)
    assert up.bring_in and up.peer_id == "y"


def test_handoff_round_trip_and_garbage() -> None:
    d = PieceDirectory(rng=random.Random(1))
    d.handle_report(
        peer_id="a", address="a:1", have=[1, 2], uploaded_bytes=1, downloaded_bytes=2, now=3.0
    )
    blob = d.export([1])
    e = PieceDirectory(rng=random.Random(2))
    assert e.adopt(blob) == 1
    assert e.pieces == {1: {"a"}} and e.holders["a"].downloaded_bytes == 2
    for junk in (None, 3, {"pieces": 1}, {"pieces": {"x": ["a"]}, "holders": {"a": [1]}}):
        assert PieceDirectory(rng=random.Random(3)).adopt(junk) == 0


def test_a_piece_with_one_source_goes_to_two_first_receivers_it_unchokes() -> None:
    # a tree, not a star: while the bringer "b" alone holds piece 3, two askers it
    # unchokes are named first receivers; the others wait for a second holder
    d = PieceDirectory(rng=random.Random(1), first_receivers=2, first_s=4.0)
    d.handle_report(
        peer_id="b",
        address="b:1",
        have=[3],
        uploaded_bytes=0,
        downloaded_bytes=0,
        now=0.0,
        unchoked=["x", "y", "z"],
    )
    ask = {p: d.choose_uploader(3, peer_id=p, address=f"{p}:1", now=1.0) for p in "wxyz"}
    assert ask["w"].wait and not ask["w"].first  # choked by the source: not named
    assert ask["x"].first and ask["x"].address == "b:1" and not ask["x"].wait
    assert ask["y"].first
    assert ask["z"].wait  # two named already
    # a receiver asking again stays named; a naming lapses after first_s
    assert d.choose_uploader(3, peer_id="x", address="x:1", now=2.0).first
    assert d.choose_uploader(3, peer_id="z", address="z:1", now=5.5).first
    # once a receiver holds it (two holders), the plain uploader choice, nobody named
    d.handle_report(
        peer_id="y", address="y:1", have=[3], uploaded_bytes=0, downloaded_bytes=0, now=6.0
    )
    up = d.choose_uploader(3, peer_id="w", address="w:1", now=6.0)
    assert not up.first and not up.wait and up.address in ("b:1", "y:1")


def test_a_source_that_serves_no_asker_gets_its_receivers_named_after_first_s() -> None:
    d = PieceDirectory(rng=random.Random(1), first_receivers=1, first_s=4.0)
    d.handle_report(
        peer_id="b", address="b:1", have=[3], uploaded_bytes=0, downloaded_bytes=0, now=0.0,
        unchoked=["q"],
    )  # fmt: skip
    assert d.choose_uploader(3, peer_id="w", address="w:1", now=1.0).wait
    assert d.choose_uploader(3, peer_id="w", address="w:1", now=5.5).first
    # a bringer still fetching the piece is its source too (nobody reported it yet)
    d2 = PieceDirectory(rng=random.Random(1), first_receivers=1, bring_in_s=10.0)
    assert d2.choose_uploader(7, peer_id="b", address="b:1", now=0.0).bring_in
    assert d2.choose_uploader(7, peer_id="x", address="x:1", now=0.5).first
    assert d2.choose_uploader(7, peer_id="y", address="y:1", now=0.6).wait
    # (the naming stands while the bringer fetches; it lapses first_s after it holds it)
    assert d2.choose_uploader(7, peer_id="y", address="y:1", now=6.0).wait
    d2.handle_report(
        peer_id="b", address="b:1", have=[7], uploaded_bytes=0, downloaded_bytes=0, now=6.0
    )
    assert d2.choose_uploader(7, peer_id="y", address="y:1", now=9.0).wait
    assert d2.choose_uploader(7, peer_id="y", address="y:1", now=10.5).first
