"""The `stripes` uploader policy: each downloading peer fetches its own share first.

Why. Every peer that arrives in a burst asks the origins' web seeds for pieces at
once. libtorrent picks them rarest first, but pieces on their way to other peers are
invisible to it (they count only once a HAVE arrives), so with N peers sharing the
origins' capacity each slow request runs for seconds and many peers fetch the same
pieces: on the loopback bench at N = 20 only about half of what the origin sent in the
first ten seconds was a piece new to the swarm (docs/swarm.md).

What. The downloading peers this peer is connected to, and itself, are the members;
each piece belongs to the member with the highest random weight for it (rendezvous
hashing: a hash of the member's id and the piece index, `owners`), and the peer raises
its own pieces, its stripe, to the top priority. With ``fetches_owed_pieces`` the peer
adapter fetches the stripe's pieces that no connected peer holds from the origins
itself (`pressrun.peer.aio`), one piece at a time; libtorrent still picks every request
between peers (rarest first within a priority).

Peers' views differ (a connection not made yet, or lost): a piece's owner in the whole
swarm sees itself as the owner in any view, so every piece is in some peer's stripe
(no gaps), and a peer that misses a member takes over only that member's pieces whose
next-highest weight is its own (a few duplicates). Contiguous stripes of the sorted
members (``[r * P // S, (r + 1) * P // S)``, before) moved every stripe above a missing
member: at 320 pieces, 43 were in nobody's stripe at 15 s, fetched only when peers
starved (docs/chord.md "Benches"). The stripes' sizes vary around P / S (a binomial
spread, not +-1).

A peer alone (no downloading peer connected) leaves libtorrent's order alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pressrun.peer.uploader import MAX_PRIORITY, MIN_PRIORITY, PiecePlan, SwarmView, UploaderPolicy

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _member_weight_seed(member: str) -> int:
    return int.from_bytes(hashlib.blake2b(member.encode(), digest_size=8).digest(), "big")


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    # splitmix64's finaliser (uint64 arithmetic wraps)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def owners(members: Sequence[str], pieces: int) -> tuple[int, ...]:
    """For each of ``pieces`` pieces, the index in ``members`` of its owner: the member
    with the highest weight for it (rendezvous hashing)."""
    if not members:
        raise ValueError("no members to own the pieces")
    seeds = np.array([_member_weight_seed(m) for m in members], dtype=np.uint64)
    index = np.arange(pieces, dtype=np.uint64) * _GOLDEN
    weights = _mix(seeds[:, None] ^ index[None, :])
    return tuple(int(i) for i in np.argmax(weights, axis=0))


class StripesPolicy(UploaderPolicy):
    """Own stripe first (module docstring)."""

    name = "stripes"
    fetches_owed_pieces = True

    def __init__(self) -> None:
        # the plan of the last view (this peer, the members, the piece count): views
        # change seldom
        self._cached: tuple[tuple[str, tuple[str, ...], int], PiecePlan] | None = None

    def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
        """Top priority for this peer's stripe, the lowest (never 0) for the rest."""
        members = tuple(sorted({view.peer_id, *view.leecher_ids}))
        pieces = len(view.have)
        if len(members) < 2 or not pieces:
            return None
        key = (view.peer_id, members, pieces)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        me = members.index(view.peer_id)
        plan = PiecePlan(
            tuple(MAX_PRIORITY if o == me else MIN_PRIORITY for o in owners(members, pieces))
        )
        self._cached = (key, plan)
        return plan
