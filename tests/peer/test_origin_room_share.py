"""The origins' room judged against their share among the swarm's leechers (issue 29).

`pressrun.origin` serves the answers asked together in turns (575475a), so the k-th
fetch of a round measures the origins' rate over k: the first fetches of a swarm's
start come fast. On the code before, a peer whose peers gave it little at that moment
took such a measure for room (`sources.origins_have_room`) and fetched pieces the ring
gave others to bring (the eighty-peer loopback bench at half the rates: 1.34 and 1.07
origin copies; docs/results/2026-11-28-swarm-limit.md, sections 21 and 22).
"""

from __future__ import annotations

from pressrun.peer.sources import origins_have_room

#: the loopback bench at half the rates: each peer uploads 500 kB/s (its reference),
#: one 128 KiB piece from the 1 MB/s origin alone takes 131 ms
UPLOAD_BPS = 500_000
FIRST_FETCH_BPS = 1_000_000


def test_a_fast_first_fetch_of_a_big_swarm_is_no_room_while_its_peers_give_nothing_yet() -> None:
    # the bringer of the first piece of eighty: its fetch came first in the origins'
    # queue, its peers gave nothing yet (nothing known, not slow); before: room
    assert not origins_have_room(FIRST_FETCH_BPS, UPLOAD_BPS, 0, None, leechers=80)
    # ... nor once its peers gave it something and dip now
    assert not origins_have_room(FIRST_FETCH_BPS, UPLOAD_BPS, 100_000, 900_000, leechers=80)


def test_a_stale_fast_fetch_is_no_room_at_a_dip_while_the_peers_are_not_slow() -> None:
    # a peer of forty at the full rates (1 MB/s upload), its last fetch made while the
    # origins idled (2 MB/s), its download between two pieces at 400 kB/s; its peers
    # gave 900 kB/s over their window: not slow against 2 MB/s shared by forty
    assert not origins_have_room(2_000_000, 1_000_000, 400_000, 900_000, leechers=40)


def test_the_origins_still_have_room_for_a_small_swarm_and_for_slow_peers() -> None:
    # a reader alone with a slow seed (tests/peer/test_origin_room.py's): room
    assert origins_have_room(FIRST_FETCH_BPS, UPLOAD_BPS, 0, None, leechers=1)
    # two leechers, origins far faster than the peers: room while peers give little
    assert origins_have_room(4_000_000, 1_000_000, 200_000, None, leechers=2)
    # a big swarm whose peers are slow against the origins' share: an addition
    assert origins_have_room(FIRST_FETCH_BPS, UPLOAD_BPS, 0, 5_000, leechers=80)
    # no reference at all (no upload limit, nothing from peers yet): any rate is room
    assert origins_have_room(FIRST_FETCH_BPS, 0, 0, None, leechers=80)
