"""`ChordPolicy.hold_unheld` (a bench knob, off by default: `bench/swarm.py
--hold-unheld 1`): the pieces no connected peer holds that the ring gave this peer
nothing for are held off, but `HOLD_MARGIN` of them from its own place among them.

At priority 1 every peer of the loopback bench's N = 40 became interested in a bringer
the moment its HAVE came: the bringer unchoked the first eight, most of them not the
ring's named first receivers, which waited for its next one-second tick (named at
0.52 s, piece whole at 1.51 s, trace h1-C3 of docs/results/2026-11-28-swarm-limit.md
section 17)."""

from __future__ import annotations

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.uploader import HOLD_MARGIN, HOLD_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, SwarmView


def _plan(policy: ChordPolicy, peer_id: str) -> tuple[int, ...]:
    # twelve pieces: 0 held, 1 brought in by this peer, 2 named first (its source
    # fetching it), 3 given an uploader, 4 and 5 held by one and two connected peers,
    # 6-11 held by nobody connected
    have = (True,) + (False,) * 11
    holders = (0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0)
    view = SwarmView(
        peer_id=peer_id, info_hash="12" * 20, have=have, connected_peers=3, holders=holders
    )
    plan = policy.plan(view, now=1.0)
    assert plan is not None
    return plan.piece_priorities


def _policy(hold: bool) -> ChordPolicy:
    policy = ChordPolicy()
    policy.hold_unheld = hold
    policy.set_ring_answers(bring_in={1}, first={2}, given={3})
    return policy


def test_off_by_default_pieces_nobody_holds_stay_wanted() -> None:
    got = _plan(_policy(False), "ab" * 20)
    assert [got[i] for i in range(6, 12)] == [MIN_PRIORITY] * 6
    assert ChordPolicy.hold_unheld is False


def test_held_off_but_the_rings_own_and_a_margin_in_the_peers_own_order() -> None:
    plans = {pid: _plan(_policy(True), pid) for pid in ("ab" * 20, "cd" * 20, "ef" * 20)}
    for got in plans.values():
        # the ring's pieces as before: brought in at the top, named and given wanted
        assert got[1] == MAX_PRIORITY and got[2] == MIN_PRIORITY and got[3] == MIN_PRIORITY
        # held by one connected peer: the tree's hold as before; by two: wanted
        assert got[4] == HOLD_PRIORITY and got[5] == MIN_PRIORITY
        # nobody holds 6-11: held off but for what keeps HOLD_MARGIN wanted (the
        # ring's four wanted ones count: nothing more needed here)
        assert [got[i] for i in range(6, 12)] == [HOLD_PRIORITY] * 6
    # with nothing of the ring's, HOLD_MARGIN of them stay wanted, from each peer's own
    # place (the peers of a crowd do not all want the same three)
    bare = ChordPolicy()
    bare.hold_unheld = True
    bare.set_ring_answers(bring_in=())
    kept = {}
    for pid in ("ab" * 20, "cd" * 20, "ef" * 20, "01" * 20):
        got = _plan(bare, pid)
        wanted = [i for i in range(1, 12) if got[i] != HOLD_PRIORITY]
        assert len(wanted) >= HOLD_MARGIN, got
        kept[pid] = tuple(wanted)
    assert len(set(kept.values())) > 1, kept
