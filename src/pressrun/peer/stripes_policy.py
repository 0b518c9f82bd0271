"""The `stripes` uploader policy: each downloading peer fetches its own stripe first.

Why. Every peer that arrives in a burst asks the origins' web seeds for pieces at
once. libtorrent picks them rarest first, but pieces on their way to other peers are
invisible to it (they count only once a HAVE arrives), so with N peers sharing the
origins' capacity each slow request runs for seconds and many peers fetch the same
pieces: on the loopback bench at N = 20 only about half of what the origin sent in the
first ten seconds was a piece new to the swarm (docs/swarm.md).

What. The downloading peers this peer is connected to, and itself, sorted by peer id
form a ring of S members; the member at rank r owns the contiguous stripe of pieces
``[r * P // S, (r + 1) * P // S)`` (P pieces), and raises those pieces to the top
priority. With ``fetches_owed_pieces`` the peer adapter fetches the stripe's pieces
that no connected peer holds from the origins itself (`pressrun.peer.aio`), one piece
at a time; libtorrent still picks every request between peers (rarest first within a
priority). Peers' views differ for a moment while the swarm forms; that costs a few
duplicate pieces, never a missing one (priorities only order, nothing is excluded).

A peer alone (no downloading peer connected) leaves libtorrent's order alone.
"""

from __future__ import annotations

from pressrun.peer.uploader import MAX_PRIORITY, MIN_PRIORITY, PiecePlan, SwarmView, UploaderPolicy


def stripe(rank: int, members: int, pieces: int) -> range:
    """The pieces the member at ``rank`` of ``members`` owns: a contiguous stripe."""
    if not 0 <= rank < members:
        raise ValueError(f"rank {rank} is not in 0..{members - 1}")
    return range(rank * pieces // members, (rank + 1) * pieces // members)


class StripesPolicy(UploaderPolicy):
    """Own stripe first (module docstring)."""

    name = "stripes"
    fetches_owed_pieces = True

    def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
        """Top priority for this peer's stripe, the lowest (never 0) for the rest."""
        members = sorted({view.peer_id, *view.leecher_ids})
        if len(members) < 2 or not view.have:
            return None
        own = stripe(members.index(view.peer_id), len(members), len(view.have))
        return PiecePlan(
            tuple(MAX_PRIORITY if i in own else MIN_PRIORITY for i in range(len(view.have)))
        )
