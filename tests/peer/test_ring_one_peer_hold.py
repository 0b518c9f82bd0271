"""The `chord` policy's hold of a piece one connected peer holds (the tree) needs
another peer to trade with meanwhile: with one peer to take from, nothing is held off.

flash-crowd-50-desktops at 8134473 (docs/results/2026-11-28-emulation-swarm-policy.md,
session 26): the first swarm client's one peer for its first 7-8 s was the origin
reader's sharing copy, a leecher; every piece of that copy had one connected holder and
was held off for up to 4 s while the ring handed the client pieces to bring in, so it
took 41.6-45.0 MB from the origins against 24.5-35.8 MB with `stripes`.
"""

from __future__ import annotations

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.uploader import HOLD_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, SwarmView

PIECES = 12


def swarm_view(holders: tuple[int, ...], leechers: tuple[str, ...]) -> SwarmView:
    return SwarmView(
        peer_id="aa",
        info_hash="12" * 20,
        have=(False,) * PIECES,
        connected_peers=1 + len(leechers),
        leecher_ids=leechers,
        holders=holders,
    )


def test_the_pieces_of_the_one_connected_leecher_are_not_held_off() -> None:
    # the sharing copy holds pieces 0-5; the ring hands this peer 8-11 to bring in
    policy = ChordPolicy()
    policy.set_ring_answers({8, 9, 10, 11})
    holders = (1,) * 6 + (0,) * 6
    plan = policy.plan(swarm_view(holders, ("bb",)), now=1.0)
    assert plan is not None
    assert plan.piece_priorities == (MIN_PRIORITY,) * 8 + (MAX_PRIORITY,) * 4
    # (before: pieces 0-5 at HOLD_PRIORITY until named, or hold_s)


def test_the_pieces_of_a_lone_seed_are_not_held_off_beside_named_ones() -> None:
    # one seed: every piece has one holder; three named first-receiver pieces kept
    # enough wanted for the rest to stay on hold before
    policy = ChordPolicy()
    policy.set_ring_answers(set(), first={0, 1, 2})
    plan = policy.plan(swarm_view((1,) * PIECES, ()), now=1.0)
    assert plan is not None
    assert plan.piece_priorities == (MAX_PRIORITY,) * 3 + (MIN_PRIORITY,) * 9


def test_with_two_downloading_peers_the_tree_holds() -> None:
    # a swarm's start: two bringers, each the one holder of its pieces
    policy = ChordPolicy()
    policy.set_ring_answers({8, 9, 10, 11}, first={0})
    holders = (1,) * 6 + (0,) * 6
    plan = policy.plan(swarm_view(holders, ("bb", "cc")), now=1.0)
    assert plan is not None
    assert plan.piece_priorities == (
        (MAX_PRIORITY,) + (HOLD_PRIORITY,) * 5 + (MIN_PRIORITY,) * 2 + (MAX_PRIORITY,) * 4
    )
    # ... until hold_s has passed
    later = policy.plan(swarm_view(holders, ("bb", "cc")), now=1.0 + policy.hold_s)
    assert later is not None and HOLD_PRIORITY not in later.piece_priorities


def test_with_a_second_holder_anywhere_the_tree_holds() -> None:
    # one downloading peer and a seed: piece 0 has both, pieces 1-5 the seed alone
    policy = ChordPolicy()
    policy.set_ring_answers(set(), first={6, 7, 8})
    holders = (2,) + (1,) * (PIECES - 1)
    plan = policy.plan(swarm_view(holders, ("bb",)), now=1.0)
    assert plan is not None
    assert plan.piece_priorities[1:6] == (HOLD_PRIORITY,) * 5
    assert plan.piece_priorities[0] == MIN_PRIORITY
