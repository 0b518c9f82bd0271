"""The `chord` uploader policy: the ring's supernodes choose who uploads each piece.

004_3e4b985b4cf14853.txt, III.A (docs/chord.md): the tracker gives a joining peer every
piece's key and the issue's supernodes; for each piece it lacks, the peer asks the
supernode that answers for the piece's key who uploads it (`pressrun.chord.pieces`:
a holder that still owes upload first, then the least loaded). The peer connects to
the uploaders it is given (`pressrun.peer.ring_client`, libtorrent ``connect_peer``);
a piece nobody holds is this peer's to bring in: those get the top priority here, and
the peer adapter fetches them from the origins itself (``fetches_owed_pieces``, as
`stripes` does). **A piece only one connected peer holds spreads as a tree, not a
star**: the supernode that answers for it names one or two first receivers (the
answer's ``first``), which take it at the top priority; every other peer holds it off
(priority 0) until a second holder exists, for at most ``hold_s`` (then it asks the
one holder like everyone else: a named receiver its source does not serve, a loaded
machine), and trades common pieces meanwhile; a peer with one peer to take from has
none to trade, and holds nothing off (`_one_connected_peer`). With
every peer asking the one bringer for it (libtorrent's availability makes a
one-holder piece the rarest, whatever its priority below 7), a bringer's upload went to
the same one or two pieces for 24 to 38 peers while its other brought pieces had no
second holder for up to 28 s (measured: docs/chord.md). Everything else is the lowest
priority; a peer never holds off every piece it lacks (`PiecePlan.checked`).

**A newcomer waits for the ring's first answer** (at most ``ring_wait_s``): nothing
is owed meanwhile, so no piece is fetched from the origins on the peer's own. With the
`stripes` stripe fetched at once, 33 of 40 peers of a flash crowd fetched a piece each
from the origins' 2 MB/s in parallel, so the first pieces arrived 3.7 s after the start
and the swarm had nothing to trade until then (5 of them fetched twice); the ring's
first answer comes 0.4 s after the start (measured: docs/chord.md) and hands the
pieces to a few bringers, each fetching one at a time. Where there is no ring (the
tracker says 404: `ring_lost`) or it does not answer within ``ring_wait_s``, the policy
is `stripes`: the default where a ring is reachable, the same behaviour where it is
not.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from pressrun.peer.stripes_policy import StripesPolicy
from pressrun.peer.uploader import (
    HOLD_MARGIN,
    HOLD_PRIORITY,
    MAX_PRIORITY,
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

    #: the peers it unchokes at most while it downloads (None: the session's eight),
    #: and while it holds a piece no connected peer holds (its first receivers')
    upload_slots: int | None = None
    sole_upload_slots: int | None = None
    #: hold off (priority 0) the pieces no connected peer holds that the ring gave this
    #: peer nothing for, but `HOLD_MARGIN` of them in its own order (`_hold_unheld`);
    #: off: measured on the bench (`bench/swarm.py --hold-unheld 1`)
    hold_unheld: bool = False

    def __init__(
        self, *, hold_s: float = 4.0, ring_wait_s: float = 3.0, origins_held_s: float = 2.5
    ) -> None:
        self._fallback = StripesPolicy()
        self.hold_s = hold_s
        self.ring_wait_s = ring_wait_s
        #: how long a supernode's ``origins_held`` stands (a little more than the
        #: ring client's regular round, which hears it again)
        self.origins_held_s = origins_held_s
        self._origins_held_at = float("-inf")
        self._lonely_since: dict[int, float] = {}
        self._first_plan_at: float | None = None
        self._now = 0.0
        self.ring_ready = False
        #: no ring to wait for (the tracker has none, or it stopped answering)
        self.ring_absent = False
        self.bring_in: frozenset[int] = frozenset()
        self.first: frozenset[int] = frozenset()
        self.given: frozenset[int] = frozenset()

    def set_ring_answers(
        self, bring_in: Iterable[int], first: Iterable[int] = (), given: Iterable[int] = ()
    ) -> None:
        """The pieces the ring made this peer responsible for bringing in, those it
        named this peer a first receiver of, and those it named an uploader for
        outside the first receivers (``given``: the ring knows two holders or more,
        so the piece is no tree's to wait for)."""
        self.ring_ready = True
        self.ring_absent = False
        self.bring_in = frozenset(bring_in)
        self.first = frozenset(first)
        self.given = frozenset(given)

    def ring_lost(self) -> None:
        """No ring (the tracker lists none) or no supernode answers any more: back
        to `stripes`, at once."""
        self.ring_ready = False
        self.ring_absent = True
        self.bring_in = self.first = self.given = frozenset()

    def hold_origins(self, now: float) -> None:
        """A supernode said the origins' egress is the ring's now (its fetch limit
        binds: `pressrun.chord.directory.PieceDirectory.origins_held`)."""
        self._origins_held_at = now

    def origins_held(self, now: float) -> bool:
        """The ring holds the origins' egress for the pieces it hands out: whatever
        rate this peer's own fetches got, the origins have no room for pieces of its
        own (`pressrun.peer.status`)."""
        return not self.ring_absent and now - self._origins_held_at <= self.origins_held_s

    def waiting_on(self, absent: Iterable[int]) -> list[int]:
        """Of the pieces no connected peer holds, those the ring answers for: all of
        them once it has answered (the ring client asks about every one of them, and
        the ring says who brings each in: a peer never fetches them from the origins
        on its own, which at the end of a flash crowd made every peer that lost the
        holder of the last pieces fetch the same ones)."""
        if not self.ring_ready and not self._awaiting_ring:
            return []
        return list(absent)

    @property
    def _awaiting_ring(self) -> bool:
        # (before the first plan too: the ring client may ask before the first poll)
        return not self.ring_absent and (
            self._first_plan_at is None or self._now - self._first_plan_at < self.ring_wait_s
        )

    def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
        """Top priority for the pieces to bring in, the lowest for the rest."""
        if self._first_plan_at is None:
            self._first_plan_at = now
        self._now = now
        if not self.ring_ready and self._awaiting_ring and view.have:
            # the ring's first answer is coming: nothing owed until then
            return PiecePlan(tuple(MIN_PRIORITY for _ in view.have))
        if not self.ring_ready or not view.have:
            return self._fallback.plan(view, now=now)
        # (also with no downloading peer connected yet: the pieces the ring gave this
        # peer to bring in are fetched at once, and the others wait for the ring)
        holders = view.holders or (0,) * len(view.have)
        pairs = list(zip(view.have, holders, strict=True))
        lonely = {i for i, (held, n) in enumerate(pairs) if n == 1 and not held}
        self._lonely_since = {i: self._lonely_since.get(i, now) for i in lonely}
        tree = not _one_connected_peer(view.leecher_ids, pairs)
        priorities = [
            self._priority(i, n, now, tree=tree) if not held else MIN_PRIORITY
            for i, (held, n) in enumerate(pairs)
        ]
        if self.hold_unheld:
            self._hold_unheld(priorities, pairs, view.peer_id)
        return PiecePlan.checked(
            priorities,
            view.have,
            # (no deadline on a first receiver's piece: libtorrent requests a piece past
            # its deadline from every holder it has, so its bytes came twice; docs/chord.md)
            upload_slots=self._upload_slots(pairs),
        )

    def _hold_unheld(
        self, priorities: list[int], pairs: list[tuple[bool, int]], peer_id: str
    ) -> None:
        # A piece nobody connected holds, at priority 1, makes this peer interested in
        # its first holder the moment that one's HAVE comes: at a swarm's start every
        # peer was, the bringer unchoked the first eight, its named first receivers
        # waited for its next tick (the others held the piece off at their next plan).
        # Held off, only the ring's named receivers (and those given an uploader) want
        # it; `HOLD_MARGIN` such pieces stay wanted, from this peer's own place among
        # them (a torrent with nothing wanted is "finished" and drops its seeds).
        unheld = [
            i
            for i, (held, n) in enumerate(pairs)
            if not held and n == 0 and priorities[i] == MIN_PRIORITY
            and i not in self.first and i not in self.given
        ]  # fmt: skip
        wanted = sum(1 for p, (held, _) in zip(priorities, pairs, strict=True) if p and not held)
        keep = max(0, HOLD_MARGIN - (wanted - len(unheld)))
        if not unheld:
            return
        at = zlib.crc32(peer_id.encode()) % len(unheld)
        for i in (unheld[at:] + unheld[:at])[keep:]:
            priorities[i] = HOLD_PRIORITY

    def _upload_slots(self, pairs: list[tuple[bool, int]]) -> int | None:
        sole = any(held and n == 0 for held, n in pairs)
        if sole and self.sole_upload_slots is not None:
            return self.sole_upload_slots
        return self.upload_slots

    def _priority(self, piece: int, holders: int, now: float, *, tree: bool = True) -> int:
        # (a first receiver's piece whose source does not hold it yet stays low: top
        # priority with no connected holder would make it owed, fetched from the origins)
        if holders == 0:
            return MAX_PRIORITY if piece in self.bring_in else MIN_PRIORITY
        if holders == 1:
            if piece in self.first:
                return MAX_PRIORITY
            if piece in self.given:
                # the ring named an uploader for it, not first receivers: it knows a
                # second holder (maybe one this peer is not connected to yet). Held
                # off until that connection showed the piece, a peer waited up to
                # ``hold_s`` for a tree that has grown already
                return MIN_PRIORITY
            held_off = tree and now - self._lonely_since[piece] < self.hold_s
            return HOLD_PRIORITY if held_off else MIN_PRIORITY
        return MIN_PRIORITY


def _one_connected_peer(leecher_ids: tuple[str, ...], pairs: list[tuple[bool, int]]) -> bool:
    """Whether this peer has one peer to take from: no piece it lacks is held by two
    connected peers, and at most one of them is downloading (one leecher, or one seed,
    beside peers that hold nothing it lacks). Then a piece that peer holds is no tree's
    to wait for: holding it off leaves this peer nothing to trade meanwhile, only the
    origins. In flash-crowd-50-desktops the first swarm client's
    one peer for its first 7-8 s was the origin reader's sharing copy; holding off its
    pieces (4 s each, until named a first receiver, eight asked a round) while the ring
    handed it 87-143 pieces to bring in, it took 41.6-45.0 MB from the origins against
    24.5-35.8 MB with `stripes`, 8.2-10.6 MB from that copy against 16.7-25.8
    (docs/results/2026-11-28-emulation-swarm-policy.md, session 26)."""
    return len(leecher_ids) <= 1 and all(held or n <= 1 for held, n in pairs)
