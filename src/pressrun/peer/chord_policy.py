"""The `chord` uploader policy: the ring's supernodes choose who uploads each piece.

004_3e4b985b4cf14853.txt, III.A (docs/chord.md): the tracker gives a joining peer every
piece's key and the issue's supernodes; for each piece it lacks, the peer asks the
supernode that answers for the piece's key who uploads it (`pressrun.chord.pieces`:
a holder that still owes upload first, then the least loaded). The peer connects to
the uploaders it is given (`pressrun.peer.ring_client`, libtorrent ``connect_peer``);
a piece nobody holds is this peer's to bring in: those get the top priority here, and
the peer adapter fetches them from the origins itself (``fetches_owed_pieces``, as
`stripes` does). A piece only one connected peer holds gets the middle priority, so
it leaves its bringer at once: with libtorrent's own picking alone, pieces a bringer
fetched stayed at that one peer for 20 s and more at N = 40 (measured: docs/chord.md)
while it uploaded common pieces. Everything else is the lowest priority (never 0).

Until the ring has answered (no supernode registered, tracker without a ring, a
peer whose port others cannot reach) the policy is `stripes`: the default where a ring
is reachable, the same behaviour where it is not.
"""

from __future__ import annotations

from collections.abc import Iterable

from pressrun.peer.stripes_policy import StripesPolicy
from pressrun.peer.uploader import (
    MAX_PRIORITY,
    MID_PRIORITY,
    MIN_PRIORITY,
    PiecePlan,
    SwarmView,
    UploaderPolicy,
)


class ChordPolicy(UploaderPolicy):
    """The ring's answers as piece priorities (module docstring)."""

    name = "chord"
    fetches_owed_pieces = True
    #: the adapter looks for this to start a ring client
    uses_ring = True

    def __init__(self) -> None:
        self._fallback = StripesPolicy()
        self.ring_ready = False
        self.bring_in: frozenset[int] = frozenset()

    def set_ring_answers(self, bring_in: Iterable[int]) -> None:
        """The pieces the ring made this peer responsible for bringing in."""
        self.ring_ready = True
        self.bring_in = frozenset(bring_in)

    def ring_lost(self) -> None:
        """No supernode answers any more: back to `stripes`."""
        self.ring_ready = False
        self.bring_in = frozenset()

    def waiting_on(self, absent: Iterable[int]) -> list[int]:
        """Of the pieces no connected peer holds, those the ring answers for: all of
        them once it has answered (the ring client asks about every one of them, and
        the ring says who brings each in: a peer never fetches them from the origins
        on its own, which at the end of a flash crowd made every peer that lost the
        holder of the last pieces fetch the same ones)."""
        if not self.ring_ready:
            return []
        return list(absent)

    def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
        """Top priority for the pieces to bring in, the lowest for the rest."""
        if not self.ring_ready or not view.have:
            return self._fallback.plan(view, now=now)
        # (also with no downloading peer connected yet: the pieces the ring gave this
        # peer to bring in are fetched at once, and the others wait for the ring)
        holders = view.holders or (0,) * len(view.have)
        return PiecePlan(
            tuple(
                MAX_PRIORITY
                if i in self.bring_in and not held
                else (MID_PRIORITY if n == 1 and not held else MIN_PRIORITY)
                for i, (held, n) in enumerate(zip(view.have, holders, strict=True))
            )
        )
