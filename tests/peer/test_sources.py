"""`classify_missing`: the pieces a peer lacks, by who could give them; `PeerInfoTally`:
the pieces only a seed holds among its connected peers."""

import collections

import libtorrent as lt

from pressrun.peer.sources import MissingPieces, PeerInfoTally, classify_missing, shared_out
from pressrun.peer.uploader import MAX_PRIORITY


def test_web_seeds_do_not_count_as_holders() -> None:
    # 2 web-seed connections: availability 2 means only the origins hold the piece
    # (and 3 is one BitTorrent peer's alone: lonely, the ring names its first receivers)
    have = [True, False, False, False, False, False]
    avail = [3, 3, 2, 2, 2, 4]
    plan = [1, 1, MAX_PRIORITY, 1, MAX_PRIORITY, 1]
    assert classify_missing(have, avail, 2, plan) == MissingPieces(
        tradable=2, lonely=(1,), owed=(2, 4), absent=(3,)
    )


def test_without_a_plan_nothing_is_owed() -> None:
    assert classify_missing([False, False], [0, 1], 0, None) == MissingPieces(
        tradable=1, lonely=(1,), owed=(), absent=(0,)
    )


def test_a_complete_copy_lacks_nothing() -> None:
    assert classify_missing([True] * 3, [0, 0, 0], 1, None) == MissingPieces(0, (), (), ())


class _Pid:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def to_bytes(self) -> bytes:
        return self.raw


class _Info:
    """The fields of libtorrent's peer_info that the tally reads."""

    def __init__(self, pieces: list[bool], *, seed: bool = False, web: bool = False) -> None:
        self.connection_type = lt.peer_info.web_seed if web else lt.peer_info.standard_bittorrent
        self.flags = lt.peer_info.seed if seed else 0
        self.pieces = pieces
        self.pid = _Pid(bytes(20))
        self.ip = ("127.0.0.1", 8000)
        self.total_download = 0


def test_a_seed_counts_the_pieces_only_it_holds_among_downloading_peers() -> None:
    tally = PeerInfoTally()
    leecher = _Info([True, False, False, True])
    other = _Info([False, False, True, False])
    tally.update([leecher, other, _Info([], web=True)], count_sole=True)
    assert tally.sole_pieces == 1  # piece 1: nobody connected holds it
    # no downloading peer connected: nobody needs anything from this seed
    tally.update([_Info([True] * 4, seed=True)], count_sole=True)
    assert tally.sole_pieces == 0
    # counted only when asked (a downloading peer does not need it)
    tally.update([leecher, other], count_sole=False)
    assert tally.sole_pieces == 0


def test_starved_peers_start_on_different_pieces() -> None:
    ids = [f"{i:02x}" * 20 for i in range(8)]
    absent = (3, 9, 14, 20)
    orders = [shared_out(absent, me, [o for o in ids if o != me]) for me in ids]
    assert all(sorted(o) == sorted(absent) for o in orders)  # each owes them all
    # in its own order: two peers a piece to start with, not all eight on piece 3
    assert collections.Counter(o[0] for o in orders) == {3: 2, 9: 2, 14: 2, 20: 2}
    assert shared_out((), ids[0], ids[1:]) == ()
