"""The ring client's pacing (`pressrun.peer.ring_client`, docs/chord.md): when each
piece this peer lacks may be asked about again, which pieces a round asks about (its two
windows), and the supernodes found silent lately.

Pure: every call takes the time (the event loop's monotonic ``loop.time()``) as an
argument; no I/O, no clock, no task (the pure-core rule: the ring client is its
adapter).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection

#: pieces asked about in one round at most, of those no connected peer holds and
#: again of those one holds (the first of the askable ones in this peer's own order,
#: `AskPacing.window`): every peer asked about every piece it lacked that no connected
#: peer held, so the answers grew with pieces x peers, nearly all ``wait`` (47,283
#: answers at N = 40, 160 pieces; docs/chord.md). A supernode hands a peer at most
#: `pressrun.chord.directory.MAX_BRING_AHEAD` pieces to bring in at once, and names
#: two first receivers of a piece: a window of that size loses neither.
MAX_WANTS = 8
#: a piece answered ``wait`` (nobody to upload it yet) is asked again after this long,
#: doubled with every further ``wait`` up to ``reask_s``; at once when the number of
#: its connected holders changes (none, one)
_WAIT_REASK_S = 1.0
#: a supernode found silent (a report not answered in time, or answered with a status
#: other than 200) is left out of the owners the ring client guesses, and named
#: ``failed`` in its lookups, until it answers again or for this long: the tracker stops
#: listing a supernode it has not heard from for 30 s (its TTL) and the ring routes
#: around a dead one within seconds, so by then a dead one is gone from both and the
#: claim adds nothing; a live one that answered late once (a loaded host) or refused one
#: report is asked again. Kept for good before: its keys went to its successor for the
#: peer's whole life, and every lookup the peer asked made the supernodes check the
#: claim through the ring again (chord.aio ``failed_recheck_s``)
FAILED_FORGET_S = 30.0
#: supernodes found silent kept at most, the oldest claim forgotten first (a supernode
#: reads at most 64 of a lookup's ``failed``; the stats' record keeps the first 64)
MAX_FAILED = 64


class AskPacing:
    """When each piece is asked about again: after ``reask_s`` once answered with an
    uploader or a piece to bring in; after 1 s, then 2 s, then ``reask_s`` while
    answered ``wait``; at once when it got or lost its one connected holder (the ring's
    answer for it changes: a bringer, first receivers)."""

    def __init__(self, *, peer_id: str, num_pieces: int, reask_s: float, max_wants: int) -> None:
        self.peer_id = peer_id
        self.num_pieces = num_pieces
        self.reask_s = reask_s
        self.max_wants = max_wants
        #: piece -> (when it may be asked again, whether it had one connected holder)
        self._ask_at: dict[int, tuple[float, bool]] = {}
        self._waits: dict[int, int] = {}  # piece -> the ``wait`` answers in a row

    def askable(self, piece: int, lonely: bool, now: float) -> bool:
        """Whether ``piece`` (with one connected holder if ``lonely``) may be asked
        about at ``now``: its answer is old, or its one connected holder came or went."""
        at, was_lonely = self._ask_at.get(piece, (-1e9, lonely))
        return now >= at or was_lonely != lonely

    def may_ask(self, piece: int, lonely: bool, now: float) -> bool:
        """`askable`, and if so the piece is noted as asked about with ``lonely``
        (its ``wait`` answers count from 1 s again when that changed)."""
        if not self.askable(piece, lonely, now):
            return False
        at, was_lonely = self._ask_at.get(piece, (-1e9, lonely))
        if was_lonely != lonely:
            self._waits.pop(piece, None)
        self._ask_at[piece] = (at, lonely)
        return True

    def answered(self, piece: int, now: float, *, wait: bool) -> None:
        """The ring answered about ``piece`` at ``now``: ``wait`` (nobody to upload it
        yet), or an uploader or a piece to bring in."""
        waits = self._waits[piece] = self._waits.get(piece, 0) + 1 if wait else 0
        delay = min(_WAIT_REASK_S * 2 ** (waits - 1), self.reask_s) if wait else self.reask_s
        lonely = self._ask_at.get(piece, (0.0, False))[1]
        self._ask_at[piece] = (now + delay, lonely)

    def ask_again(self, pieces: Collection[int], now: float) -> None:
        """``pieces`` (answered ``wait``) may be asked about at once: this peer just
        brought a piece in, and its report frees its place among what the supernodes
        hand out to be brought in. Asked only after the ``wait`` answers' 1-3 s, the
        next piece waited for some asker's next question: on the loopback bench at
        N = 40 with the supernodes' fetch limit at ten at once, the origins had no fetch
        in flight at 1.0 s, the first ten done at 0.24-0.82 s and the next handed out
        at 1.03-1.07 s (docs/results/2026-11-28-swarm-limit.md, section 18)."""
        for p in pieces:
            if self._waits.get(p, 0) > 0 and p in self._ask_at:
                self._ask_at[p] = (min(now, self._ask_at[p][0]), self._ask_at[p][1])

    def worth_a_round(self, lacked: Collection[int], lonely: Collection[int], now: float) -> bool:
        """Whether a piece of ``lacked`` (those it lacks with at most one connected
        holder; ``lonely``: those with one) may be asked about now: one asked before
        whose answer is old or whose one connected holder came or went, or one never
        asked about while its window has room for it (with the window full of pieces
        answered ``wait``, every nudge would otherwise be urgent and the rounds would
        run every ``min_gap_s``). Each of `window`'s two windows on its own: counted
        over both, a peer whose first round asked about eight pieces nobody connected
        held asked about a piece a neighbour had just brought in only at its next
        regular round."""
        if any(p in self._ask_at and self.askable(p, p in lonely, now) for p in lacked):
            return True
        for one_holder in (True, False):
            side = [p for p in lacked if (p in lonely) == one_holder]
            pending = sum(1 for p in side if p in self._ask_at)
            if pending < self.max_wants and any(p not in self._ask_at for p in side):
                return True
        return False

    def window(self, wanted: Collection[int], lonely: Collection[int], now: float) -> set[int]:
        """The pieces to ask about this round: of ``wanted`` (lacked, with at most one
        connected holder), those that may be asked now, in this peer's own order (from
        its place among the pieces, set by its id, round to the start), so the peers of
        a crowd ask about different pieces first: at most ``max_wants`` of those one
        connected peer holds, and at most ``max_wants`` of those none holds.

        The two are windows of their own. A piece one connected peer holds is held off
        (`ChordPolicy`: priority 0) until the ring names this peer a first receiver or
        the piece has a second holder, and its source's upload waits on the naming; the
        pieces nobody holds get ``wait`` or a piece to bring in. In one window in the
        peer's order, a piece just brought in was asked about only once the rotation
        reached it: on the loopback bench at N = 20 the first pieces brought in (0.8 to
        1.5 s) had their first receivers named 1 to 3 s later, after up to 28 ``wait``
        answers to the askers whose windows held it (docs/results/2026-11-28-swarm-limit.md)."""
        if not wanted:
            return set()
        start = zlib.crc32(self.peer_id.encode()) % self.num_pieces
        order = sorted(wanted, key=lambda p: (p - start) % self.num_pieces)
        chosen: set[int] = set()
        for one_holder in (True, False):
            taken = 0
            for p in order:
                if taken >= self.max_wants:
                    break
                if (p in lonely) == one_holder and self.may_ask(p, one_holder, now):
                    chosen.add(p)
                    taken += 1
        return chosen


class SilentSupernodes:
    """The supernodes found silent lately (`FAILED_FORGET_S`), oldest claim first, at
    most `MAX_FAILED`: left out of the owners guessed and named ``failed`` in lookups."""

    def __init__(self, *, forget_s: float = FAILED_FORGET_S) -> None:
        self.forget_s = forget_s
        self._at: dict[str, float] = {}  # supernode -> when found silent, oldest first

    def found(self, sn: str, now: float) -> None:
        """``sn`` did not answer at ``now`` (the newest claim; the oldest beyond
        `MAX_FAILED` forgotten)."""
        self._at.pop(sn, None)  # (to the end: the newest claim)
        self._at[sn] = now
        while len(self._at) > MAX_FAILED:
            del self._at[next(iter(self._at))]

    def answers(self, sn: str) -> None:
        """``sn`` answered again: no longer silent."""
        self._at.pop(sn, None)

    def at(self, now: float) -> set[str]:
        """The supernodes found silent less than ``forget_s`` before ``now`` that have
        not answered since (the older claims are forgotten)."""
        for sn in [a for a, at in self._at.items() if now - at >= self.forget_s]:
            del self._at[sn]
        return set(self._at)
