"""While the ring holds the origins' egress for the pieces it hands out (a supernode's
fetch limit binds: its answers say ``origins_held``), a peer counts no room at the
origins for fetches of its own, whatever rate its own fetches got (issue 29).

On the loopback bench at N = 40 with the supernodes' fetch limit at ten fetches at
once, each fetch came at 200-650 kB/s, and one peer's first piece came in the origin's
first burst (128 KiB in 80 ms): against its 1 MB/s upload that was room, and its feed
fetched 34 pieces nobody had handed it, the first two at 0.53 s, while the ring held
the other peers' fetches back (1.08-1.09 origin copies; at N = 80 1.36 and 1.76;
docs/results/2026-11-28-swarm-limit.md, section 17, the trace `h2-D40-1.json`). These
status reads replay that peer's first second.
"""

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.status import SwarmStatus
from swarm_status_rig import plan_among, six_piece_status, torrent_status

_HAVE = (True, False, False, False, False, False)


class _Handle:
    """Six pieces, piece 0 held (its bringer's, from the origins); nobody connected
    holds 1, 2 or 3, two hold 4 and 5 (no web-seed connection)."""

    def piece_availability(self) -> list[int]:
        return [1, 0, 0, 0, 2, 2]

    def get_download_queue(self) -> list[object]:
        return []

    def get_peer_info(self) -> list[object]:
        return []


def _bench_peer() -> tuple[SwarmStatus, ChordPolicy]:
    handle = _Handle()
    policy = ChordPolicy()
    policy.set_ring_answers(bring_in=[0])
    # the bench's 1 MB/s a peer
    status = six_piece_status(handle, policy, upload_limit_bps=1_000_000)
    assert plan_among(status, handle, policy, _HAVE, leechers=39) is not None
    return status, policy


def _first_second(status: SwarmStatus, leechers: int = 2) -> None:
    # its first piece came in 80 ms (1.6 MB/s), nothing from its peers yet (nobody
    # holds a piece they could trade before 0.8 s); ``leechers`` downloading peers
    # (the tracker's count: the bench's 40, or a swarm just starting whose origins'
    # share is room by itself, `sources.origins_have_room`)
    status._feed.fetch_bps = 1_638_400
    for now in (0.25, 0.5, 0.75):
        st = torrent_status(
            list(_HAVE),
            up_bps=0,
            down_bps=0,
            leechers=leechers,
            uploaded=0,
            downloaded=0,
            peers=39,
        )
        status.read(st, now=now, planning=False)


def test_a_fast_first_fetch_is_room_where_the_ring_holds_nothing() -> None:
    # the rule as it stands without a fetch limit: the origins gave this peer more
    # than half its upload rate, and shared between two downloading peers still do,
    # its peers nothing yet, so what nobody holds comes from them
    status, _ = _bench_peer()
    _first_second(status)
    assert {1, 2, 3} <= set(status._feed.owed), status._feed.owed


def test_a_fast_first_fetch_among_forty_is_no_room() -> None:
    # among 40 downloading peers the origins' 1.6 MB/s is 41 kB/s each: one fetch that
    # came first in their queue is no room (issue 29: at N = 80 the bringers of the
    # first four pieces fetched 7 more at 0.6-0.9 s; `sources.origins_have_room`)
    status, _ = _bench_peer()
    _first_second(status, leechers=40)
    assert not {1, 2, 3} & set(status._feed.owed), status._feed.owed


def test_no_room_of_its_own_while_the_ring_holds_the_origins() -> None:
    # a supernode said ``origins_held`` at 0.2 s: the pieces nobody holds are the
    # ring's to hand out, nothing is owed beyond them (on the code before, pieces 1, 2
    # and 3 were owed: its feed fetched them beside the ring's bringers)
    status, policy = _bench_peer()
    policy.hold_origins(0.2)
    _first_second(status)
    assert not {1, 2, 3} & set(status._feed.owed), status._feed.owed
    assert status._feed.parallel == 1
    assert not status._feed.take_busy


def test_the_hold_lapses_when_the_ring_stops_saying_it() -> None:
    # every piece handed out, the limit binds no more: after `origins_held_s` with no
    # supernode saying it, the origins' idle room is room again
    status, policy = _bench_peer()
    policy.hold_origins(-5.0)
    _first_second(status)
    assert {1, 2, 3} <= set(status._feed.owed), status._feed.owed
    assert not policy.origins_held(0.75)
    assert policy.origins_held(-3.0)
