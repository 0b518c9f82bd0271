"""The `stripes` uploader policy (pure) and the core's rule that a peer keeps the web
seeds while it owes the swarm pieces only the origins hold."""

from __future__ import annotations

import collections
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pressrun.peer.config import desktop_profile
from pressrun.peer.core import PeerCore
from pressrun.peer.events import DropWebSeeds, Progress, RestoreWebSeeds, SwarmCounts
from pressrun.peer.stripes_policy import StripesPolicy, owners
from pressrun.peer.uploader import MAX_PRIORITY, MIN_PRIORITY, SwarmView, make_uploader_policy

MB = 1_000_000


@given(members=st.integers(1, 60), pieces=st.integers(0, 400))
def test_every_piece_has_exactly_one_owner(members: int, pieces: int) -> None:
    ids = [f"{i:040x}" for i in range(members)]
    own = owners(ids, pieces)
    assert len(own) == pieces and all(0 <= o < members for o in own)
    # the owner of a piece does not depend on the order the members are listed in
    backwards = ids[::-1]
    assert [backwards[o] for o in owners(backwards, pieces)] == [ids[o] for o in own]


@given(
    members=st.integers(2, 40),
    pieces=st.integers(1, 320),
    seen=st.lists(st.floats(0.0, 1.0), min_size=40, max_size=40),
    seed=st.integers(0, 10**6),
)
def test_differing_views_leave_no_piece_in_nobodys_stripe(
    members: int, pieces: int, seen: list[float], seed: int
) -> None:
    # each member sees itself and a random part of the others (connections not made
    # yet, or lost): every piece is still in some member's own stripe
    rng = random.Random(seed)
    ids = [f"{rng.getrandbits(160):040x}" for _ in range(members)]
    covered: set[int] = set()
    for i, me in enumerate(ids):
        view_ids = sorted({me, *(o for o in ids if rng.random() < seen[i])})
        covered |= {k for k, o in enumerate(owners(view_ids, pieces)) if view_ids[o] == me}
    assert covered == set(range(pieces))


def test_a_missing_member_moves_only_its_own_pieces() -> None:
    ids = [f"{i * 7919:040x}" for i in range(40)]
    full = owners(ids, 320)
    without = [m for m in ids if m != ids[5]]
    part = owners(without, 320)
    moved = [k for k in range(320) if ids[full[k]] != without[part[k]]]
    assert moved == [k for k in range(320) if full[k] == 5]
    # and the stripes are roughly even: 8 a member on average
    sizes = collections.Counter(full)
    assert max(sizes.values()) <= 20 and len(sizes) >= 35


def test_owners_needs_members() -> None:
    with pytest.raises(ValueError, match="no members"):
        owners([], 10)


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
    counts = [0] * 10
    for me in ids:
        plan = policy.plan(view(me, [o for o in ids if o != me]), now=0.0)
        assert plan is not None
        assert set(plan.piece_priorities) <= {MIN_PRIORITY, MAX_PRIORITY}
        for i, prio in enumerate(plan.piece_priorities):
            counts[i] += prio == MAX_PRIORITY
    assert counts == [1] * 10


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
