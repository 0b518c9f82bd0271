"""`classify_missing`: the pieces a peer lacks, by who could give them; `PeerInfoTally`:
the pieces only a seed holds among its connected peers."""

import collections
import types
from typing import Any

import libtorrent as lt

from pressrun.peer.sources import (
    MissingPieces,
    PeerInfoTally,
    classify_missing,
    origins_share_bps,
    peers_slow,
    shared_out,
)
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

    def __init__(
        self,
        pieces: list[bool],
        *,
        seed: bool = False,
        web: bool = False,
        choked: bool = False,
        interested: bool = False,
        pid: bytes = bytes(20),
    ) -> None:
        self.connection_type = lt.peer_info.web_seed if web else lt.peer_info.standard_bittorrent
        self.flags = (
            (lt.peer_info.seed if seed else 0)
            | (lt.peer_info.choked if choked else 0)
            | (lt.peer_info.remote_interested if interested else 0)
        )
        self.pieces = pieces
        self.pid = _Pid(pid)
        self.ip = ("127.0.0.1", 8000)
        self.total_download = 0
        self.payload_down_speed = 0


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


def test_with_a_free_upload_slot_every_downloading_peer_would_be_served() -> None:
    # The ring names the first receivers of a piece its source alone holds among the
    # peers the source serves. A peer holds such a piece off until it is named, so it
    # is not interested, so not unchoked: at a swarm's start nobody was, and the first
    # pieces brought in waited for the supernode's 4 s fallback. libtorrent unchokes a
    # newly interested peer at once while an upload slot is free: all of them count.
    a, b, c = (_Info([False], pid=bytes([i]) * 20, choked=i != 1) for i in (1, 2, 3))
    tally = PeerInfoTally()
    tally.update([a, b, c], upload_slots=8)
    assert tally.unchoked_ids == ("01" * 20,)
    assert tally.served_ids == ("01" * 20, "02" * 20, "03" * 20)  # (before: the one)
    # every slot taken: only those it unchokes
    tally.update([a, b, c], upload_slots=1)
    assert tally.served_ids == ("01" * 20,)
    # any number of slots (unchoke_slots_limit -1)
    tally.update([a, b, c], upload_slots=-1)
    assert len(tally.served_ids) == 3


def test_a_free_slot_serves_a_newly_interested_peer_not_one_choked_already() -> None:
    # libtorrent fills a free slot with a peer that becomes interested (its
    # preemptive unchoke); a peer interested already and choked was passed over by the
    # last rechoke and waits for the next (15 s). Seven unchoked of eight slots is the
    # middle of a swarm (62% of the status samples at N = 40): counting every
    # connected peer as served then, the ring named receivers the source chokes
    peers = [
        _Info([False], pid=bytes([i]) * 20, choked=i > 7, interested=i != 9) for i in range(1, 10)
    ]
    tally = PeerInfoTally()
    tally.update(peers, upload_slots=8)
    assert len(tally.unchoked_ids) == 7
    # peer 8: interested and choked, not served; peer 9: not interested, served
    assert tally.served_ids == tuple(bytes([i]).hex() * 20 for i in (1, 2, 3, 4, 5, 6, 7, 9))
    # any number of slots: every interested peer is unchoked at once, all served
    tally.update(peers, upload_slots=-1)
    assert "08" * 20 in tally.served_ids


def test_starved_peers_start_on_different_pieces() -> None:
    ids = [f"{i:02x}" * 20 for i in range(8)]
    absent = (3, 9, 14, 20)
    orders = [shared_out(absent, me, [o for o in ids if o != me]) for me in ids]
    assert all(sorted(o) == sorted(absent) for o in orders)  # each owes them all
    # in its own order: two peers a piece to start with, not all eight on piece 3
    assert collections.Counter(o[0] for o in orders) == {3: 2, 9: 2, 14: 2, 20: 2}
    assert shared_out((), ids[0], ids[1:]) == ()


class _Handle:
    """The libtorrent handle as `SwarmStatus` reads it: piece availability (the
    connected BitTorrent peers holding each piece; no web seed connected) and nothing
    in flight."""

    def __init__(self, availability: list[int]) -> None:
        self.availability = availability

    def piece_availability(self) -> list[int]:
        return self.availability

    def get_download_queue(self) -> list[object]:
        return []


def _status_with_ring_answers(fetch_bps: int) -> tuple[Any, Any]:
    # Six pieces: 0 held (the ring had this peer bring it in), 1 and 2 held by no
    # connected peer (the ring says others bring them: `wait`), 3 held by one
    # connected peer (held off: the chord policy's priority 0), 4 and 5 by two.
    from pressrun.peer.chord_policy import ChordPolicy
    from pressrun.peer.uploader import SwarmView
    from swarm_status_rig import six_piece_status

    handle = _Handle([1, 0, 0, 1, 2, 2])
    policy = ChordPolicy()
    policy.set_ring_answers(bring_in=[0])
    status = six_piece_status(handle, policy, upload_limit_bps=1_000_000)
    status._feed.fetch_bps = fetch_bps  # its last piece from the origins came at this rate
    have = (True, False, False, False, False, False)
    plan = policy.plan(
        SwarmView(
            peer_id="ab" * 20,
            info_hash="12" * 20,
            have=have,
            connected_peers=2,
            leecher_ids=("cd" * 20, "ef" * 20),
            holders=tuple(handle.availability),
        ),
        now=10.0,
    )
    assert plan is not None and plan.piece_priorities[3] == 0  # held off
    status.last_plan = plan.piece_priorities
    st = types.SimpleNamespace(pieces=list(have), is_seeding=False)
    return status, st


def test_a_peer_takes_from_roomy_origins_what_its_peers_cannot_give_it_yet() -> None:
    # `make emulate SCENARIO=small`: the origin client took 2.2 s, the ring's swarm
    # clients 13.9-14.9 s, told `wait` 186 times while the origins had room. A piece
    # no connected peer holds (the ring: another brings it) and one it holds off now
    # come from the origins while they send this peer as fast as it takes pieces
    # (before: nothing owed, the peer waited on the ring)
    status, st = _status_with_ring_answers(fetch_bps=2_000_000)
    # (its peers have given it 256 kB/s at best: slow against the origins; nothing
    # from them at all is not known yet, `test_nothing_from_peers_yet_is_not_slow_peers`)
    status.peak_download_bps = 256_000
    _tradable, owed, coming = status._sources(st)
    # first what no peer can give it yet (1, 2: nobody connected holds them; 3: held
    # off), then what its peers hold (4, 5), which the feed skips while libtorrent
    # fetches them from a peer: its peers are an addition (test_origin_room.py)
    assert set(status._feed.owed[:3]) == {1, 2, 3}
    assert set(status._feed.owed[3:]) == {4, 5}
    assert (owed, coming) == (5, 0)
    assert status._feed.parallel == 2  # two requests at a time while they have room


def test_busy_origins_or_a_full_download_leave_the_pieces_to_the_ring() -> None:
    # the loopback bench: the origin's 2 MB/s shared by 40 bringers, 50 kB/s each
    # against 1 MB/s of upload a peer: nothing but what the ring hands out
    status, st = _status_with_ring_answers(fetch_bps=50_000)
    status._feed.parallel = 2
    _tradable, owed, coming = status._sources(st)
    assert status._feed.owed == ()
    assert (owed, coming) == (2, 2)
    assert status._feed.parallel == 1  # one at a time: a second would split its share
    # roomy origins, but its peers fill its download already (and have been as fast):
    # nothing its peers hold, nor the piece it holds off (its one holder gives it);
    # what nobody connected holds, while a request to the origins gives at least half
    # what a connection to a peer gives (`sources.unheld_room`: a piece nobody
    # connected holds is in no download, full or not)
    status, st = _status_with_ring_answers(fetch_bps=2_000_000)
    status.download_bps = status.peak_download_bps = 1_500_000
    status.upload_limit_bps = 0
    status.tally.connection_bps = 1_500_000  # (one peer gives it all)
    status._sources(st)
    assert set(status._feed.owed) == {1, 2}
    status.tally.connection_bps = 4_000_001  # (a request gives less than half of one)
    status._sources(st)
    assert status._feed.owed == ()
    # no measure of the origins yet, nor any reference: one piece at a time from
    # them, to find out
    status, st = _status_with_ring_answers(fetch_bps=0)
    status.upload_limit_bps = 0
    status._sources(st)
    assert set(status._feed.owed[:3]) == {1, 2, 3}
    assert status._feed.parallel == 1


def test_the_origins_have_room_at_half_the_rate_a_peer_takes_pieces_at() -> None:
    from pressrun.peer.sources import origins_have_room

    # nothing fetched yet and nothing to compare with: room until a piece from them
    # says otherwise (before: none, and a reader whose peers held everything never
    # measured them); with a reference (an upload limit, a rate from peers): none
    assert origins_have_room(0, 0)
    assert not origins_have_room(0, 1_000_000)
    assert origins_have_room(500_000, 1_000_000)
    assert not origins_have_room(499_999, 1_000_000)
    # its peers fill half its download already: nothing from the origins, unless they
    # give it more than its peers ever did (a slow peer is an addition, not a wait)
    # (their best 1.2 MB/s: not slow)
    assert origins_have_room(2_000_000, 1_000_000, 499_999, best_peers_bps=1_200_000)
    assert not origins_have_room(2_000_000, 1_000_000, 500_000, best_peers_bps=1_200_000)
    assert origins_have_room(1_000_000, 256_000, download_bps=256_000, best_peers_bps=256_000)
    assert not origins_have_room(1_000_000, 600_000, download_bps=600_000, best_peers_bps=600_000)
    # the first peer of a small swarm, no upload limit, alone so far: nothing to
    # compare the origins' rate with, and nothing from peers (`make emulate
    # SCENARIO=small`: its first swarm client took 4.2 s against 1.8 s on an origin)
    assert origins_have_room(2_000_000, 0)


# The "peers slow" rule judges the origins' rate as shared among the swarm (issue 29).
# A peer takes the pieces its peers hold from the origins too only while its peers are
# slow against the origins (`sources.peers_slow`). Judged against the rate its own
# fetch got, a fetch that had the origins to itself for a moment (the loopback bench
# at N = 40: one origin of 2 MB/s, peers' uploads 1 MB/s) measured more than twice the
# best its peers ever gave it, though 40 peers share those origins, and each such peer
# took the pieces its peers held from them: `bench/swarm.py --policy chord --n 40` went
# from 1.00 to 1.33-1.51 origin copies at 9654679. The rate that counts is what the
# origins would give each downloading peer if all of them did the same: the fetch's
# rate divided among the swarm's leechers (the tracker's count, at least the connected
# ones). A small swarm (test_origin_room.py: one reader, one slow seed) keeps the rule.

#: the loopback bench's swarm: one origin of 16 Mbit/s, whose 2 MB/s a lone fetch
#: (two requests) gets whole, and peers that have given this one at most 900 kB/s
LONE_FETCH_BPS = 2_000_000
PEERS_BEST_BPS = 900_000


def _peer_ids(n: int) -> tuple[str, ...]:
    return tuple(f"{i:040x}" for i in range(1, n + 1))


def test_a_peer_of_a_forty_peer_swarm_leaves_what_its_peers_hold_to_them() -> None:
    # On the code before: 900 kB/s is under half the lone fetch's 2 MB/s, so the
    # peer owed the origins pieces 4 and 5 too (its peers hold them) and took those
    # libtorrent had queued on a peer at the end (take_busy)
    status, st = _status_with_ring_answers(fetch_bps=LONE_FETCH_BPS)
    status.peak_download_bps = PEERS_BEST_BPS
    status.download_bps = 0  # between two pieces from its peers
    status.tracker_leechers = 40  # the tracker's announce answer: 40 downloading
    status._sources(st)
    assert not {4, 5} & set(status._feed.owed), status._feed.owed
    assert not status._feed.take_busy
    # the origins' share for each of the 40 is 50 kB/s: the peers are not slow
    assert not peers_slow(LONE_FETCH_BPS, PEERS_BEST_BPS, leechers=40)


def test_the_tracker_count_an_announce_old_is_not_the_swarm() -> None:
    # the first peers of a burst heard 1 or 2 leechers from the tracker while dozens
    # were on their way; the connected leechers count as well (and itself)
    status, st = _status_with_ring_answers(fetch_bps=LONE_FETCH_BPS)
    status.peak_download_bps = PEERS_BEST_BPS
    status.tracker_leechers = 1
    status.tally.leecher_ids = _peer_ids(39)
    assert status.swarm_leechers() == 40
    status._sources(st)
    assert not {4, 5} & set(status._feed.owed)
    # nothing heard yet: itself
    status.tracker_leechers = -1
    status.tally.leecher_ids = ()
    assert status.swarm_leechers() == 1


def test_a_small_swarm_still_takes_from_roomy_origins_what_slow_peers_hold() -> None:
    # one reader with a slow seed (test_origin_room.py: 256 KiB/s against 1 MB/s from
    # the origin): the reader is the only leecher, the origins' whole rate is its share
    status, st = _status_with_ring_answers(fetch_bps=1_000_000)
    status.upload_limit_bps = 0
    status.peak_download_bps = status.download_bps = 262_144
    status.tracker_leechers = 1
    status._sources(st)
    assert {4, 5} <= set(status._feed.owed)
    assert status._feed.take_busy
    # two downloading peers share 1 MB/s: 500 kB/s each, and peers at 200 kB/s are slow
    assert peers_slow(1_000_000, 200_000, leechers=2)
    assert not peers_slow(1_000_000, 250_000, leechers=2)


def test_nothing_from_peers_yet_is_not_slow_peers() -> None:
    # at a swarm's start every peer has had nothing from its peers: not known, not
    # slow (a reader whose one peer is slow finds the origins out by its probe)
    status, st = _status_with_ring_answers(fetch_bps=LONE_FETCH_BPS)
    status.tracker_leechers = 12
    status._sources(st)
    assert not {4, 5} & set(status._feed.owed)
    assert not peers_slow(LONE_FETCH_BPS, None, leechers=12)


def test_the_origins_share_is_their_rate_over_the_leechers() -> None:
    assert origins_share_bps(2_000_000, 40) == 50_000
    assert origins_share_bps(2_000_000, 1) == 2_000_000
    assert origins_share_bps(2_000_000, 0) == 2_000_000  # never below one: itself
