"""Pieces as keys: placement balance, the uploader choice, handoffs."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.chord.aio import fetches_at_once
from pressrun.chord.directory import MAX_BRING_AHEAD, ORIGINS_HELD_S, PieceDirectory
from pressrun.chord.ids import RING, node_id_for
from pressrun.chord.pieces import (
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
    # (the rates their own totals show between two reports: a claimed rate counts up
    # to that, or to the lower median of the claims: test_directory_bounds)
    d = PieceDirectory(rng=random.Random(3))
    rows = [("slow", 4_000, 1_000), ("fast", 8_000, 8_000), ("mute", 1_000, 0)]
    for now in (0.0, 1.0):
        for pid, owed, rate in rows:
            d.handle_report(
                peer_id=pid,
                address=f"{pid}:1",
                have=[2],
                uploaded_bytes=int(now * rate),
                downloaded_bytes=owed + int(now * rate),
                upload_bps=rate,
                now=now,
            )
    # fast: 1 s to pay back; slow: 4 s; mute: rate unknown, last among the owers
    assert d.choose_uploader(2, peer_id="x1", address="x:1", now=1.0).peer_id == "fast"
    d.handle_left("fast")
    assert d.choose_uploader(2, peer_id="x2", address="x:1", now=1.0).peer_id == "slow"
    d.handle_left("slow")
    assert d.choose_uploader(2, peer_id="x3", address="x:1", now=1.0).peer_id == "mute"
    # a report without a rate keeps the one said before
    d.handle_report(
        peer_id="slow", address="slow:1", have=[], uploaded_bytes=0, downloaded_bytes=4_000, now=3
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


def test_a_bringer_is_handed_what_it_fetches_in_a_round_at_its_origin_rate() -> None:
    # 48 pieces of 1 MiB; one at a time until the asker said its origin rate
    mib = 1 << 20
    d = PieceDirectory(
        rng=random.Random(1), max_bringing_per_peer=1, num_pieces=48, file_bytes=48 * mib
    )

    def handed(peer: str, pieces: range, now: float) -> list[int]:
        ask = d.choose_uploader
        return [p for p in pieces if ask(p, peer_id=peer, address=peer, now=now).bring_in]

    assert handed("x", range(0, 8), 0.0) == [0]
    # 2.5 MB/s (a 20 Mbit/s link): 4 pieces in the 2 s to its next round
    d.handle_report(
        peer_id="x", address="x", have=[0], uploaded_bytes=0, downloaded_bytes=mib,
        now=1.0, bring_bps=2_500_000,
    )  # fmt: skip
    assert handed("x", range(1, 12), 1.0) == [1, 2, 3, 4]
    # origins shared by 40 fetches (the loopback bench: 50 kB/s): one at a time
    d.handle_report(
        peer_id="y", address="y", have=[], uploaded_bytes=0, downloaded_bytes=0,
        now=1.0, bring_bps=50_000,
    )  # fmt: skip
    assert handed("y", range(12, 20), 1.0) == [12]
    # a rate claimed absurdly high: MAX_BRING_AHEAD pieces at most
    d.handle_report(
        peer_id="z", address="z", have=[], uploaded_bytes=0, downloaded_bytes=0,
        now=1.0, bring_bps=10**12,
    )  # fmt: skip
    assert len(handed("z", range(20, 48), 1.0)) == MAX_BRING_AHEAD
    # the rate counts only where the piece size is known
    d2 = PieceDirectory(rng=random.Random(1), max_bringing_per_peer=1)
    d2.handle_report(
        peer_id="x", address="x", have=[], uploaded_bytes=0, downloaded_bytes=0,
        now=0.0, bring_bps=10**9,
    )  # fmt: skip
    assert [
        p for p in range(4) if d2.choose_uploader(p, peer_id="x", address="x", now=0.0).bring_in
    ] == [0]


def test_handoff_round_trip_and_garbage() -> None:
    d = PieceDirectory(rng=random.Random(1))
    d.handle_report(
        peer_id="a", address="a:1", have=[1, 2], uploaded_bytes=1, downloaded_bytes=2, now=3.0
    )
    blob = d.export([1], now=5.0)
    e = PieceDirectory(rng=random.Random(2))
    # (another process's clock: the holder's age, 2 s, is what travels)
    assert e.adopt(blob, now=1000.0) == 1
    assert e.pieces == {1: {"a"}} and e.holders["a"].downloaded_bytes == 2
    assert e.holders["a"].reported_at == 998.0
    for junk in (None, 3, {"pieces": 1}, {"pieces": {"x": ["a"]}, "holders": {"a": [1]}}):
        assert PieceDirectory(rng=random.Random(3)).adopt(junk, now=0.0) == 0


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


def test_a_receiver_its_source_chokes_gives_its_place_to_one_it_serves() -> None:
    # named while the bringer fetched (it served everyone then); once it holds the
    # piece and says it chokes that receiver, an asker it serves takes the place
    d = PieceDirectory(rng=random.Random(1), first_receivers=1, bring_in_s=10.0)
    assert d.choose_uploader(7, peer_id="b", address="b:1", now=0.0).bring_in
    assert d.choose_uploader(7, peer_id="x", address="x:1", now=0.5).first
    d.handle_report(
        peer_id="b", address="b:1", have=[7], uploaded_bytes=0, downloaded_bytes=0, now=1.0,
        unchoked=["y"],
    )  # fmt: skip
    assert d.choose_uploader(7, peer_id="w", address="w:1", now=1.2).wait  # (choked too)
    assert d.choose_uploader(7, peer_id="y", address="y:1", now=1.5).first
    assert d.choose_uploader(7, peer_id="x", address="x:1", now=1.6).wait
    # a receiver the source chokes now stays named until an asker it serves comes
    d.handle_report(
        peer_id="b", address="b:1", have=[7], uploaded_bytes=0, downloaded_bytes=0, now=2.0,
        unchoked=["q"],
    )  # fmt: skip
    assert d.choose_uploader(7, peer_id="y", address="y:1", now=2.1).first  # (still named)
    assert d.choose_uploader(7, peer_id="q", address="q:1", now=2.2).first
    assert d.choose_uploader(7, peer_id="y", address="y:1", now=2.3).wait


def test_fetches_at_once_are_what_the_origins_complete_in_a_second() -> None:
    # the loopback bench: 2 MB/s, 160 pieces of 128 KiB, five supernodes: 15.3 pieces
    # a second, four fetches a supernode (twenty in the ring; forty peers each fetched
    # one at once before)
    assert fetches_at_once(2_000_000, 160, 160 * 128 * 1024, 5, fetch_s=1.0) == 4
    assert fetches_at_once(2_000_000, 160, 160 * 128 * 1024, 1, fetch_s=1.0) == 16
    assert fetches_at_once(1_000, 160, 160 * 128 * 1024, 5, fetch_s=1.0) == 1  # at least one
    # unknown origins' rate (`pressrun serve origin`'s supernodes), or off: no limit
    assert fetches_at_once(0, 160, 160 * 128 * 1024, 5, fetch_s=1.0) is None
    assert fetches_at_once(2_000_000, 160, 160 * 128 * 1024, 5, fetch_s=0.0) is None
    d = PieceDirectory(rng=random.Random(1), max_fetching=2, bring_in_s=10.0)
    got = [d.choose_uploader(k, peer_id=p, address=f"{p}:1", now=0.0) for k, p in enumerate("abc")]
    assert [u.bring_in for u in got] == [True, True, False] and got[2].wait
    # a piece reported frees its place: the next asker brings the next one in
    d.handle_report(
        peer_id="a", address="a:1", have=[0], uploaded_bytes=0, downloaded_bytes=0, now=1.0
    )
    assert d.choose_uploader(2, peer_id="c", address="c:1", now=1.1).bring_in
    assert d.choose_uploader(3, peer_id="d", address="d:1", now=1.2).wait


def test_the_origins_are_the_rings_while_its_fetch_limit_binds() -> None:
    # the limit kept "c" from a piece at 0.0: every answer says the origins are held
    # (a peer told so fetches nothing from them on its own) for `ORIGINS_HELD_S`,
    # and again whenever the limit keeps an asker waiting; a directory with no limit
    # never says it (the small emulation's origins have room for the peers' feeds)
    d = PieceDirectory(rng=random.Random(1), max_fetching=2, bring_in_s=10.0)
    assert not d.origins_held(0.0)
    for k, p in enumerate("ab"):
        assert d.choose_uploader(k, peer_id=p, address=f"{p}:1", now=0.0).bring_in
    assert d.choose_uploader(2, peer_id="c", address="c:1", now=0.0).wait
    assert d.origins_held(0.0) and d.origins_held(ORIGINS_HELD_S)
    assert not d.origins_held(ORIGINS_HELD_S + 0.1)  # nobody kept waiting since
    assert d.choose_uploader(3, peer_id="d", address="d:1", now=3.0).wait
    assert d.origins_held(3.0 + ORIGINS_HELD_S)
    free = PieceDirectory(rng=random.Random(1), bring_in_s=10.0)
    for k, p in enumerate("abcdef"):
        free.choose_uploader(k, peer_id=p, address=f"{p}:1", now=0.0)
    assert not free.origins_held(0.0)


P = 256 * 1024  # piece bytes
FILE = 80 * P


def ordered() -> PieceDirectory:
    # five peers reporting to one supernode of an 80-piece issue, 1 MB/s upload each
    d = PieceDirectory(
        rng=random.Random(1),
        first_receivers=2,
        order_askers=True,
        num_pieces=80,
        file_bytes=FILE,
        origin_bps=2_000_000,
    )
    rows = {
        # peer: (missing, download_bps, uploaded, downloaded, unused_upload_bps)
        "slow": (70, 100_000, 0, 10 * P, 900_000),  # 70 / 0.1 MB/s: critical
        "mid": (40, 4_000_000, 20 * P, 40 * P, 800_000),
        "idle": (40, 4_000_000, 20 * P, 40 * P, 1_000_000),
        "busy": (40, 4_000_000, 20 * P, 40 * P, 0),
        # uploaded the whole file already, almost done: leaves with its last piece
        "done": (4, 4_000_000, FILE, 76 * P, 0),
    }
    for pid, (missing, down, up, got, unused) in rows.items():
        d.handle_report(
            peer_id=pid, address=f"{pid}:1", have=[], uploaded_bytes=up, downloaded_bytes=got,
            now=0.0, upload_bps=1_000_000, download_bps=down, missing=missing,
            unused_upload_bps=unused,
        )  # fmt: skip
    return d


def test_the_askers_passes_and_thresholds() -> None:
    # the model's passes (`pressrun.sim.swarm_model._Swarm._passes`) over what this
    # supernode sees: critical first, the rest, those that leave when done and are
    # ahead last
    d = ordered()
    for pid in ("slow", "mid", "idle", "busy", "done"):
        d.choose_uploader(9, peer_id=pid, address=f"{pid}:1", now=1.0)  # (recent askers)
    s = d.sample(1.0)
    assert s.missing == 70 + 40 * 3 + 4 and s.upload_bps == 5_000_000 + 2_000_000
    assert s.median_downloaded == 40 * P and s.median_unused_bps == 800_000
    # the swarm would finish everyone it sees in 194 / 7 MB/s; "slow" needs 70 / 0.1
    passes = {pid: d.asker_pass(d.holders[pid], 1.0) for pid in d.holders}
    assert passes == {"slow": 0, "mid": 1, "idle": 1, "busy": 1, "done": 2}
    # the threshold itself: at 7 pieces per MB/s of its download "mid" is not critical,
    # at 200 pieces per MB/s (missing 40 at 0.2 MB/s) it is
    d.handle_report(
        peer_id="mid", address="mid:1", have=[], uploaded_bytes=0, downloaded_bytes=0,
        now=1.5, download_bps=200_000,
    )  # fmt: skip
    assert d.asker_pass(d.holders["mid"], 1.5) == 0
    # "done" behind the median asker is not held back (it is not ahead)
    d.holders["done"].downloaded_bytes = 0
    assert d.asker_pass(d.holders["done"], 1.6) == 1
    # without the size nobody is known to leave when done; off: one pass
    d.file_bytes = 0
    d.holders["done"].downloaded_bytes = 76 * P
    assert d.asker_pass(d.holders["done"], 1.7) == 1
    d.order_askers = False
    assert {d.asker_pass(h, 1.8) for h in d.holders.values()} == {1}


def test_the_askers_order_names_first_receivers_and_bringers() -> None:
    d = ordered()
    d.handle_report(
        peer_id="src", address="src:1", have=[3], uploaded_bytes=0, downloaded_bytes=0,
        now=0.5, upload_bps=1_000_000,
    )  # fmt: skip
    for pid in ("mid", "idle", "busy", "done"):
        d.choose_uploader(50, peer_id=pid, address=f"{pid}:1", now=1.0)  # recent askers
    # of the one source's piece: the asker that goes last waits while others ask, and
    # so does one with less upload to spare than the median recent asker
    assert d.choose_uploader(3, peer_id="done", address="done:1", now=1.1).wait
    assert d.choose_uploader(3, peer_id="busy", address="busy:1", now=1.1).wait
    # the critical asker and the one with the most upload to spare are named
    assert d.choose_uploader(3, peer_id="slow", address="slow:1", now=1.2).first
    assert d.choose_uploader(3, peer_id="idle", address="idle:1", now=1.2).first
    assert d.choose_uploader(3, peer_id="mid", address="mid:1", now=1.2).wait  # (two named)
    # a piece whose better askers do not come: anyone once first_s passed, none named
    assert d.choose_uploader(4, peer_id="busy", address="busy:1", now=1.3).bring_in
    assert d.choose_uploader(4, peer_id="done", address="done:1", now=1.4).wait
    assert d.choose_uploader(4, peer_id="done", address="done:1", now=5.5).first
    # a piece nobody holds: not brought in by the asker that leaves when done while
    # others ask; by the next
    d.choose_uploader(50, peer_id="mid", address="mid:1", now=5.55)
    assert d.choose_uploader(60, peer_id="done", address="done:1", now=5.6).wait
    assert d.choose_uploader(60, peer_id="mid", address="mid:1", now=5.6).bring_in
    # several holders: a critical asker gets the least loaded one
    for pid in ("h1", "h2"):
        d.handle_report(
            peer_id=pid, address=f"{pid}:1", have=[7], uploaded_bytes=0,
            downloaded_bytes=5 * P, now=5.7, upload_bps=1_000_000,
        )  # fmt: skip
    d.holders["h1"].assigned_at = [5.7, 5.7]  # h1 owes more and pays back later...
    d.holders["h2"].downloaded_bytes = 0  # ...h2 owes nothing: the owing rule picks h1
    assert d.choose_uploader(7, peer_id="mid", address="mid:1", now=5.8).peer_id == "h1"
    assert d.choose_uploader(7, peer_id="slow", address="slow:1", now=5.8).peer_id == "h2"


def test_a_forged_or_absurd_report_is_held_to_what_is_credible() -> None:
    d = PieceDirectory(rng=random.Random(1), order_askers=True, num_pieces=80)

    def report(now: float, uploaded: int, **kw: int) -> None:
        d.handle_report(
            peer_id="x", address="x:1", have=[], uploaded_bytes=uploaded,
            downloaded_bytes=0, now=now, **kw,
        )  # fmt: skip

    # no upload rate said: no unused upload counted, whatever it claims
    report(0.0, 0, unused_upload_bps=10**9)
    assert d.holders["x"].unused_upload_bps == 0
    # more unused than its upload: its upload
    report(10.0, 0, upload_bps=1_000_000, unused_upload_bps=10**9)
    assert d.holders["x"].unused_upload_bps == 1_000_000
    # its uploaded total grew at 0.9 MB/s over the last 2 s: 0.1 MB/s to spare at most
    report(12.0, 1_800_000, unused_upload_bps=1_000_000)
    assert d.holders["x"].unused_upload_bps == 100_000
    # (over 30 s the average says little about now: the claim stands)
    report(42.0, 30_000_000, unused_upload_bps=700_000)
    assert d.holders["x"].unused_upload_bps == 700_000
    # totals never go down; more missing pieces than the issue has: all of them
    report(43.0, 0, missing=10**6)
    assert d.holders["x"].uploaded_bytes == 30_000_000 and d.holders["x"].missing == 80
    # a report without the new fields keeps what it said
    report(44.0, 30_000_000)
    assert d.holders["x"].unused_upload_bps == 700_000 and d.holders["x"].missing == 80


def test_a_bringer_asking_again_about_its_own_piece_is_told_to_bring_it_in() -> None:
    # The answer handing x pieces 0 and 1 to bring in was lost (x's request timed out
    # on a loaded host after the supernode had answered it: 24 supernode failures in
    # an emulated flash crowd). x asks about them again with its allowance taken by
    # those very pieces: before, `wait`, and for bring_in_s (30 s) nobody brought them
    # in while every other asker was pointed at x
    d = PieceDirectory(rng=random.Random(1), max_bringing_per_peer=2, bring_in_s=30.0)
    assert d.choose_uploader(0, peer_id="x", address="x:1", now=0.0).bring_in
    assert d.choose_uploader(1, peer_id="x", address="x:1", now=0.0).bring_in
    for p in (0, 1):
        again = d.choose_uploader(p, peer_id="x", address="x:1", now=2.0)
        assert again.bring_in and again.peer_id == "x" and not again.wait
    # still two at a time: a third piece waits
    assert d.choose_uploader(2, peer_id="x", address="x:1", now=2.0).wait
    # the others are still pointed at x (the reservation stands from its first hand-out)
    other = d.choose_uploader(0, peer_id="y", address="y:1", now=3.0)
    assert not other.bring_in and other.peer_id == "x"
    # and it lapses bring_in_s after it was first handed out, asked again or not
    late = d.choose_uploader(0, peer_id="y", address="y:1", now=30.5)
    assert late.bring_in and late.peer_id == "y"


def test_a_piece_only_a_seed_holds_goes_to_every_asker() -> None:
    # `make emulate SCENARIO=small` (a 4 MB issue, three swarm clients): the last
    # swarm client found one seed holding the pieces it lacked, whose first receivers
    # were named already among the two others; every one of those pieces was answered
    # `wait` (0 first, 10 `wait`) and held off, and it took 3.86 s against the origin
    # client's 1.69 s. A seed's pieces are not new to the swarm: no tree for them.
    d = PieceDirectory(rng=random.Random(1), first_receivers=2, first_s=4.0)
    for pid, missing in (("seed", 0), ("b", 5), ("quiet", None)):
        d.handle_report(
            peer_id=pid, address=f"{pid}:1", have=[{"seed": 3, "b": 4, "quiet": 5}[pid]],
            uploaded_bytes=0, downloaded_bytes=0, now=0.0, missing=missing,
        )  # fmt: skip
    ask = [d.choose_uploader(3, peer_id=p, address=f"{p}:1", now=1.0) for p in "wxyz"]
    assert all(a.address == "seed:1" and not a.wait and not a.first for a in ask), ask
    # a leecher's piece, or one whose holder said nothing of what it lacks: a tree
    for piece, source in ((4, "b:1"), (5, "quiet:1")):
        ask = [d.choose_uploader(piece, peer_id=p, address=f"{p}:1", now=1.0) for p in "wxyz"]
        assert [a.first for a in ask] == [True, True, False, False], ask
        assert ask[0].address == source and ask[3].wait
