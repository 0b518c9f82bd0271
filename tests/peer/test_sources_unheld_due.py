"""A piece no connected peer holds comes from the origins once it is due (issue 28):
when the pieces its peers can give would run out before the origins brought it
(`sources.unheld_due`), not while its peers fill its link with pieces it lacks.

The figures are those of flash-crowd-50-desktops at a23629d (the lead's run of session
24, /work/runs/s24-lead/fc50d): client 9, a lossy-10 reader in the swarm from 40.7 s,
had 74 of 382 pieces at +10 s, 12 connected peers giving it about 1.0 MB/s of its 1.25,
its feed's origins at 85-340 kB/s, and 1 to 8 pieces owed at every progress line from
+2 to +35 s: 4.6 MB from the origins, its download 46.8 s (the lossy-10 readers took
44.8-50.2 s at 32718c0, before the unheld rule, with 0.3-2.9 MB each).
"""

from __future__ import annotations

import pytest

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.sources import (
    UNHELD_LEAD,
    MissingPieces,
    origin_fill,
    unheld_due,
)
from pressrun.peer.status import SwarmStatus
from pressrun.peer.stripes_policy import StripesPolicy
from pressrun.peer.uploader import HOLD_PRIORITY, MIN_PRIORITY, UploaderPolicy
from swarm_status_rig import connected_peer, six_piece_status, torrent_status

N = 382
#: nobody connected holds these (the last five)
UNHELD = tuple(range(377, 382))
_SENDING = 12
_CONNECTION_BPS = 85_000  # (12 x 85 kB/s: 1.02 MB/s from its peers)
_FETCH_BPS = 200_000


class _Handle:
    """382 pieces: three connected peers hold every piece but the last five, nobody
    connected holds those; nothing in libtorrent's download queue."""

    def piece_availability(self) -> list[int]:
        return [3] * (N - len(UNHELD)) + [0] * len(UNHELD)

    def get_download_queue(self) -> list[object]:
        return []

    def get_peer_info(self) -> list[object]:
        return [connected_peer(i, down_bps=_CONNECTION_BPS, num_pieces=N) for i in range(_SENDING)]


def _reader(policy: UploaderPolicy, held: int) -> SwarmStatus:
    """The lossy-10 reader holding pieces 0 to ``held - 1``, read three times a second
    apart while its peers give it 1.02 MB/s."""
    handle = _Handle()
    status = six_piece_status(handle, policy, web_seed="http://origin-a", num_pieces=N)
    feed = status._feed
    if isinstance(policy, ChordPolicy):
        policy.set_ring_answers(bring_in=())  # the ring answered: nothing to bring in
    feed.fetch_bps = _FETCH_BPS
    have = [i < held for i in range(N)]
    rate = _SENDING * _CONNECTION_BPS
    for k, now in enumerate((10.0, 11.0, 12.0)):
        st = torrent_status(
            have,
            up_bps=300_000,
            down_bps=rate,
            leechers=14,
            uploaded=k * 300_000,
            downloaded=(k + 10) * rate,
            peers=_SENDING,
        )
        status.read(st, now=now, planning=False)
    return status


@pytest.mark.parametrize("policy", [ChordPolicy, StripesPolicy], ids=["chord", "stripes"])
def test_a_reader_whose_peers_fill_its_link_leaves_the_unheld_pieces_for_later(
    policy: type[UploaderPolicy],
) -> None:
    # 303 pieces its peers hold (39.7 MB: 39 s at 1.02 MB/s) against 5 nobody connected
    # holds (3.3 s from the origins at 200 kB/s): not due. Before, all five were owed
    # (a request to the origins gave more than half of one connection's 85 kB/s)
    status = _reader(policy(), held=74)
    assert status.tally.connection_bps == _CONNECTION_BPS
    assert status._feed.owed == ()
    # its peers' pieces running short (15 left: 1.9 s), the five are owed
    status = _reader(policy(), held=362)
    assert set(status._feed.owed) == set(UNHELD)


def test_unheld_pieces_are_due_when_the_peers_pieces_would_run_out_first() -> None:
    # the lossy-10 reader above: 303 tradable at 1.02 MB/s, 5 unheld at 200 kB/s
    assert not unheld_due(303, 5, 1_020_000, 200_000)
    # due once the tradable ones last at most UNHELD_LEAD x the origins' time
    assert unheld_due(51, 5, 1_020_000, 200_000)
    assert not unheld_due(52, 5, 1_020_000, 200_000)
    assert 51 * 200_000 <= UNHELD_LEAD * 5 * 1_020_000 < 52 * 200_000
    # the flash crowd the unheld rule was written for (tests/peer/test_sources_unheld.py:
    # its peers held few pieces it lacked, and many nobody connected held): due
    assert unheld_due(60, 200, 1_680_000, 130_000)
    # nothing from its peers known, or the origins not measured: due (the probe and
    # `unheld_room` decide); nothing unheld: nothing due
    assert unheld_due(303, 5, None, 200_000)
    assert unheld_due(303, 5, 0, 200_000)
    assert unheld_due(303, 5, 1_020_000, 0)
    assert not unheld_due(0, 0, 1_020_000, 200_000)


def test_roomy_origins_bring_what_nobody_connected_holds_before_a_held_off_piece() -> None:
    # the second reader of flash-crowd-50-desktops (fibre-50) beside the first (dsl-20,
    # origin mode, sharing): the pieces the first holds are held off until the ring
    # names the second a first receiver, and the first gives them then; the origins
    # bring first what the first one lacks (1, 2, and the stranded 5), then the
    # held-off 3, then (its peers slow) what its peers hold (4)
    missing = MissingPieces(tradable=2, lonely=(3,), owed=(), absent=(1, 2))
    plan = [MIN_PRIORITY, MIN_PRIORITY, MIN_PRIORITY, HOLD_PRIORITY, MIN_PRIORITY, MIN_PRIORITY]
    fill = origin_fill(
        missing,
        plan,
        room=True,
        peer_id="ab" * 20,
        leecher_ids=(),
        have=[True, False, False, False, False, False],
        stranded={5},
    )
    assert set(fill[:3]) == {1, 2, 5}
    assert fill[3:] == (3, 4)
