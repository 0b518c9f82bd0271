"""The `stripes` uploader policy (pure) and the core's rule that a peer keeps the web
seeds while it owes the swarm pieces only the origins hold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pressrun.peer.config import desktop_profile
from pressrun.peer.core import PeerCore
from pressrun.peer.events import DropWebSeeds, Progress, RestoreWebSeeds, SwarmCounts
from pressrun.peer.stripes_policy import StripesPolicy, stripe
from pressrun.peer.uploader import MAX_PRIORITY, MIN_PRIORITY, SwarmView, make_uploader_policy

MB = 1_000_000


@given(members=st.integers(1, 300), pieces=st.integers(0, 2000))
def test_stripes_partition_the_pieces_evenly(members: int, pieces: int) -> None:
    stripes = [stripe(r, members, pieces) for r in range(members)]
    flat = [i for s in stripes for i in s]
    assert flat == list(range(pieces))  # contiguous, disjoint, in rank order, complete
    sizes = [len(s) for s in stripes]
    assert max(sizes) - min(sizes) <= 1


def test_stripe_rejects_a_rank_outside_the_ring() -> None:
    with pytest.raises(ValueError, match="rank 3"):
        stripe(3, 3, 10)


def view(peer_id: str, others: list[str], pieces: int = 10) -> SwarmView:
    return SwarmView(
        peer_id=peer_id,
        info_hash="ab" * 20,
        have=(False,) * pieces,
        connected_peers=len(others),
        leecher_ids=tuple(sorted(others)),
    )


def test_every_piece_is_top_priority_for_exactly_one_member() -> None:
    ids = [f"{i:02x}" * 20 for i in (9, 3, 7, 1)]
    policy = make_uploader_policy("stripes")
    assert isinstance(policy, StripesPolicy)
    owners = [0] * 10
    for me in ids:
        plan = policy.plan(view(me, [o for o in ids if o != me]), now=0.0)
        assert plan is not None
        assert set(plan.piece_priorities) <= {MIN_PRIORITY, MAX_PRIORITY}
        for i, prio in enumerate(plan.piece_priorities):
            owners[i] += prio == MAX_PRIORITY
    assert owners == [1] * 10
    # ranks follow the sorted ids: the smallest id owns the first stripe
    first = policy.plan(view(ids[3], ids[:3]), now=0.0)
    assert first is not None and first.piece_priorities[:2] == (MAX_PRIORITY,) * 2


def test_a_peer_alone_leaves_libtorrent_to_choose() -> None:
    assert StripesPolicy().plan(view("aa" * 20, []), now=0.0) is None
    assert StripesPolicy().plan(view("aa" * 20, ["bb" * 20], pieces=0), now=0.0) is None


def progress(*, down: int, web: int, tradable: int, owed: int, done: int = 0) -> Progress:
    return Progress(
        done_bytes=done,
        wanted_bytes=100 * MB,
        pieces_have=0,
        pieces_total=100,
        uploaded_bytes=0,
        downloaded_bytes=down,
        connected_peers=9,
        web_seed_bytes=web,
        tradable_pieces=tradable,
        owed_pieces=owed,
    )


def test_web_seeds_kept_while_the_peer_owes_pieces_and_restored_when_it_does() -> None:
    cfg = desktop_profile(web_seed_share_factor=1.0, web_seed_hold_s=0.0, web_seed_starved_s=1.0)
    core = PeerCore(cfg, now=0.0)
    core.handle_swarm_counts(SwarmCounts(seeds=0, leechers=10), now=0.1)
    # its share (10 MB) is taken, peers hold pieces it lacks, but 2 pieces of its
    # stripe are held by nobody: it keeps the origins
    effects = core.handle_progress(progress(down=12 * MB, web=11 * MB, tradable=5, owed=2), now=1.0)
    assert not [e for e in effects if isinstance(e, DropWebSeeds)] and core.web_seeds_on
    effects = core.handle_progress(progress(down=13 * MB, web=12 * MB, tradable=5, owed=0), now=2.0)
    assert [e for e in effects if isinstance(e, DropWebSeeds)] and not core.web_seeds_on
    # a piece it owes shows up again (a new ring view): back after web_seed_starved_s
    effects = core.handle_progress(progress(down=14 * MB, web=12 * MB, tradable=5, owed=1), now=3.0)
    assert not [e for e in effects if isinstance(e, RestoreWebSeeds)]
    effects = core.handle_progress(progress(down=15 * MB, web=12 * MB, tradable=5, owed=1), now=4.0)
    assert [e for e in effects if isinstance(e, RestoreWebSeeds)] and core.web_seeds_on
