"""Whatever the policy, a peer takes from the origins what its peers cannot give it yet
while the origins have room (issue 29): a piece no connected peer holds comes from them
while one request to them gives what one connection to a peer gives now
(`sources.unheld_room`), not only while it beats all its peers together.

The figures are those of the emulated flash crowd at 2241ab3 (session 23's policy
pair, /work/runs/s23-pair/chord): a `chord` reader on a 20 Mbit/s link that started at
71 s got its first piece from the origins at 130 kB/s on a new connection, then 1.0-1.7
MB/s from 21 peers (about 80 kB/s a connection); the ring handed it nothing to bring
in, so it owed nothing, fetched one more piece and nothing after (0.26 MB from the
origins in all, 54.4 s against 34.2 s for the same client with `stripes`).
"""

from __future__ import annotations

import pytest

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.sources import (
    MissingPieces,
    PeerInfoTally,
    origin_fill,
    origins_have_room,
    unheld_room,
)
from pressrun.peer.status import SwarmStatus
from pressrun.peer.stripes_policy import StripesPolicy
from pressrun.peer.uploader import HOLD_PRIORITY, MIN_PRIORITY, UploaderPolicy
from swarm_status_rig import connected_peer, plan_among, six_piece_status, torrent_status

_HAVE = (True, False, False, False, False, False)
#: 21 peers sending, 80 kB/s each (1.68 MB/s together)
_SENDING = 21
_CONNECTION_BPS = 80_000
_FIRST_FETCH_BPS = 130_000


class _Handle:
    """Six pieces, piece 0 held; nobody connected holds 1, 2 or 3, two hold 4 and 5
    (no web-seed connection); 21 connected peers send, 3 do not."""

    def piece_availability(self) -> list[int]:
        return [2, 0, 0, 0, 2, 2]

    def get_download_queue(self) -> list[object]:
        return []

    def get_peer_info(self) -> list[object]:
        return [connected_peer(i, down_bps=_CONNECTION_BPS) for i in range(_SENDING)] + [
            connected_peer(100 + i, down_bps=0) for i in range(3)
        ]


def _crowd_reader(policy: UploaderPolicy) -> SwarmStatus:
    handle = _Handle()
    status = six_piece_status(handle, policy, web_seed="http://origin-a")
    plan_among(status, handle, policy, _HAVE, leechers=24)
    # its one piece from the origins came at 130 kB/s (a new connection, at the
    # busiest moment), and nothing measured them again
    status._feed.fetch_bps = _FIRST_FETCH_BPS
    for k, now in enumerate((10.0, 11.0, 12.0)):
        st = torrent_status(
            list(_HAVE),
            up_bps=600_000,
            down_bps=_SENDING * _CONNECTION_BPS,
            leechers=25,
            uploaded=k * 600_000,
            downloaded=(k + 10) * _SENDING * _CONNECTION_BPS,
            peers=24,
        )
        status.read(st, now=now, planning=False)
    return status


def _chord() -> ChordPolicy:
    policy = ChordPolicy()
    policy.set_ring_answers(bring_in=())  # the ring answered: nothing to bring in
    return policy


@pytest.mark.parametrize("policy", [_chord, StripesPolicy], ids=["chord", "stripes"])
def test_a_crowd_reader_takes_what_nobody_connected_holds_from_the_origins(
    policy: type[UploaderPolicy],
) -> None:
    # On the code before, nothing was owed: the origins' 130 kB/s was under half its
    # peers' 1.68 MB/s together, so they "had no room", and nothing measured them again
    status = _crowd_reader(policy())
    assert status.tally.connection_bps == _CONNECTION_BPS
    owed = set(status._feed.owed)
    assert {1, 2, 3} <= owed, owed
    # (pieces its peers hold stay theirs: the origins beat no peer in all)
    assert not {4, 5} & owed, owed


def test_one_request_is_judged_against_one_connection() -> None:
    assert unheld_room(_FIRST_FETCH_BPS, _CONNECTION_BPS)
    # the rule for every piece, against its peers together, says no
    assert not origins_have_room(_FIRST_FETCH_BPS, _SENDING * _CONNECTION_BPS, 1_000_000)
    # a request slower than half a connection: no room
    assert not unheld_room(39_000, _CONNECTION_BPS)
    # nobody sends to it: whatever the origins give is room
    assert unheld_room(10_000, 0)
    # not measured yet: the probe is `origins_have_room`'s to decide
    assert not unheld_room(0, 0)


def test_the_loopback_bench_origins_stay_without_room() -> None:
    # the bench: 2 MB/s of origins shared by 20 to 40 fetches (50-100 kB/s each), each
    # peer's upload capped at 1 MB/s: a capped peer knows what a peer gives, and the
    # origins are judged as before (`origins_have_room`): with the cap as the floor of
    # one connection, a fetch that came fast while few fetched stood as room, and the
    # bench's forty peers took 1.05-1.07 origin copies against 1.00-1.01
    for fetch_bps in (50_000, 100_000, 400_000, 1_600_000):
        assert not unheld_room(fetch_bps, 60_000, upload_limit_bps=1_000_000)


def test_a_chord_reader_leaves_to_its_source_what_the_ring_named_one_for() -> None:
    # piece 2: the ring named this reader a first receiver (its bringer fetches it);
    # piece 3: it named an uploader (two holders or more, not connected yet): both are
    # on their way; piece 1 the ring answered `wait` for: the origins' while they have room
    policy = _chord()
    policy.set_ring_answers(bring_in=(), first=(2,), given=(3,))
    status = _crowd_reader(policy)
    owed = set(status._feed.owed)
    assert 1 in owed and not {2, 3} & owed, owed


def test_unheld_fill_is_what_nobody_connected_holds_and_the_stranded_pieces() -> None:
    missing = MissingPieces(tradable=3, lonely=(4,), owed=(1,), absent=(2, 3))
    plan = [MIN_PRIORITY, 7, MIN_PRIORITY, MIN_PRIORITY, HOLD_PRIORITY, MIN_PRIORITY]
    fill = origin_fill(
        missing,
        plan,
        room=False,
        unheld=True,
        peer_id="ab" * 20,
        leecher_ids=(),
        have=[True, False, False, False, False, False],
        stranded={5},
    )
    # not the owed piece (the feed has it), not the held-off one (its one holder gives
    # it; the ring's tree), not the others its peers hold
    assert sorted(fill) == [2, 3, 5]
    nothing = origin_fill(missing, plan, room=False, peer_id="ab" * 20, leecher_ids=())
    assert nothing == ()


def test_a_connection_rate_is_that_of_the_connections_sending() -> None:
    tally = PeerInfoTally()
    tally.update(
        [
            connected_peer(1, down_bps=90_000),
            connected_peer(2, down_bps=30_000),
            connected_peer(3, down_bps=0),
        ]
    )
    assert tally.connection_bps == 60_000
    tally.update([connected_peer(3, down_bps=0)])
    assert tally.connection_bps == 0
