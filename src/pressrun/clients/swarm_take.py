"""Which pieces an origin reader takes from the issue's swarm, and when they go back
(issue 28). Pure: no socket, clock or task; the adapter
(`pressrun.clients.origin_seed`) passes what its sharing session sees and ``now``.

An origin reader (the balancer sent it to the origins: the first readers of a crowd)
shares its copy in the issue's swarm while it downloads (`origin_seed`). Before, it
took nothing from that swarm: in flash-crowd-50-desktops it fetched its last 11-12
MB from the origins while the second reader, whose own feed had brought those very
pieces from the origins, was already seeding the whole issue (session 25,
docs/results/2026-11-29-origin-egress.md). Now the pieces a connected peer holds
that the origins need not bring are asked of the swarm (`claim`):

- of a run of pieces no section has, the held ones, so that each run left to the
  origins between them is `MIN_ORIGIN_RUN` long at least, or none (a shorter one
  would cost a section, a directive and a Range request, for a few pieces);
- of an open section, the same among its pending pieces but the first
  `KEEP_PIECES`: the section is cut before the first piece taken (its Range
  response is closed when its worker reaches the cut, as after a steal), the pieces
  after it that were not taken are left to new sections.

Each piece comes through libtorrent (its SHA-1 of the torrent), is read back and
checked against the signed manifest's SHA-256 before the plan takes it (`taken`).

**No slower than the origins alone.** The reader's link is what limits it (a 20
Mbit/s reader beside a 50 Mbit/s seed): a piece from the swarm replaces one from the
origins on the same link. What could make it slower is a swarm that brings its
claims late while the origin sections are done. So the swarm is asked for at most
`PROBE_PIECES` (the pieces the origins would reach last) until it has shown a rate
(`budget`: over `RATE_WINDOW_S`, after ``steal_min_elapsed_s`` of claims) of a third
of the best a section of this download showed or more (the test of a slow section,
`DownloadPlan.should_move`: on a link that limits the reader, a swarm that fills it
is as fast as the origins could be), for any number while it keeps it. Once nothing is
left to assign (a section worker is idle), a swarm that has not shown that third
gives back at once the claims of which no block was asked, then its claims beyond
``left * rate / (rate + best)`` (the split at which both would end together; the
pieces begun are kept first), every claim after ``steal_after_s`` of nothing
(`take_back`); those never go to the swarm again. A claim no connected peer
holds any more goes back at once, and every claim when the sharing ends (`release`,
`release_all`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable

from pressrun.clients.core import MIN_RATE_WINDOW_S, SLOW_FACTOR, DownloadPlan
from pressrun.clients.events import Event, PlanState

__all__ = ["KEEP_PIECES", "MIN_ORIGIN_RUN", "PROBE_PIECES", "RATE_WINDOW_S", "SwarmTake", "spaced"]

#: an open section keeps at least this many of its pending pieces when the swarm takes
#: from it (the piece on the wire and the next, as a steal keeps the first half)
KEEP_PIECES = 2
#: a run of pieces left to the origins between pieces the swarm takes is this long at
#: least, or none
MIN_ORIGIN_RUN = 4
#: the swarm's rate is what it delivered over this many seconds (since its claims
#: began, when that is shorter)
RATE_WINDOW_S = 2.0
#: the claims out at most until the swarm has shown a rate (`SwarmTake.rate`)
PROBE_PIECES = 8


def spaced(start: int, end: int, wanted: Collection[int]) -> list[int]:
    """The pieces of ``wanted`` in ``[start, end)`` to take so that every run left
    between them (and at either end) is `MIN_ORIGIN_RUN` long at least, or empty:
    from the left, a wanted piece is taken when the run before it is empty or long
    enough; a short run left at the end gives back the pieces taken before it."""
    taken: list[int] = []
    run = 0  # pieces left since the last one taken
    for index in range(start, end):
        if index in wanted and (run == 0 or run >= MIN_ORIGIN_RUN):
            taken.append(index)
            run = 0
        else:
            run += 1
    while taken and 0 < run < MIN_ORIGIN_RUN:
        taken.pop()
        run = end - (taken[-1] + 1 if taken else start)
    return taken


class SwarmTake:
    """The swarm's share of one origin download (the module docstring)."""

    def __init__(self, plan: DownloadPlan) -> None:
        self.plan = plan
        #: since when claims are out
        self._since: float | None = None
        #: (when, bytes) of each piece taken within the rate's window (bounded by it)
        self._recent: deque[tuple[float, int]] = deque()
        #: the rate it showed when its claims last ran out (None: never)
        self._known_rate: float | None = None
        #: pieces given back to the origins for good (bounded by the file's pieces)
        self._taken_back: set[int] = set()
        #: what the swarm delivered and the plan took
        self.pieces = 0
        self.bytes = 0
        #: pieces it delivered that the plan did not take (a section had them)
        self.spare = 0
        self.claimed_total = 0
        self.taken_back_total = 0

    def claim(self, held: Collection[int], *, now: float) -> tuple[int, ...]:
        """Ask the swarm for the pieces of ``held`` (a connected peer holds each) the
        origins need not bring (module docstring), within `budget`, the pieces the
        origins would reach last first; the pieces claimed now."""
        plan = self.plan
        if plan.state is not PlanState.DOWNLOADING:
            return ()
        wanted = {i for i in held if 0 <= i < plan.num_pieces}
        wanted -= plan.verified
        wanted -= self._taken_back
        room = self.budget(now=now)
        claimed: list[int] = []
        for start, end in reversed(plan.unassigned_runs()):
            chosen = self._within(spaced(start, end, wanted), start, room)
            room = None if room is None else room - self._bytes(chosen)
            plan.assign_to_swarm(chosen)
            claimed.extend(chosen)
        latest_first = sorted(plan.sections.items(), key=lambda item: -item[1].end_piece)
        for section_id, section in latest_first:
            pending = plan.pending_of(section_id)
            if len(pending) <= KEEP_PIECES or pending[-1] + 1 != section.end_piece:
                continue  # (pending pieces not one run: left alone)
            chosen = spaced(pending[0] + KEEP_PIECES, section.end_piece, wanted)
            chosen = self._within(chosen, None, room)
            if chosen:
                room = None if room is None else room - self._bytes(chosen)
                plan.cut_section(section_id, chosen[0])
                plan.assign_to_swarm(chosen)
                claimed.extend(chosen)
        if claimed and self._since is None:
            self._since = now
            self._recent.clear()
        self.claimed_total += len(claimed)
        return tuple(sorted(claimed))

    def budget(self, *, now: float) -> int | None:
        """The bytes it may ask the swarm for now besides its claims out; None: no limit.
        No limit once the swarm's rate is a third of the best a section of this download
        showed or more; until then (no rate yet, or a slower one: it may change),
        `PROBE_PIECES` out at most."""
        plan = self.plan
        rate = self.rate(now=now)
        if rate is not None and rate > 0 and rate * SLOW_FACTOR >= plan.best_rate_bytes_per_s:
            return None
        return max(0, PROBE_PIECES * plan.piece_size_bytes - self._bytes(plan.swarm_claims))

    def _within(self, chosen: list[int], start: int | None, room: int | None) -> list[int]:
        """The last of ``chosen`` (`spaced` pieces) that fit in ``room`` bytes (None: all);
        then, for a run no section has (from ``start``), none that would leave a run
        shorter than `MIN_ORIGIN_RUN` before them."""
        if room is None:
            return chosen
        kept: list[int] = []
        for index in reversed(chosen):
            length = self.plan.piece_span(index)[1]
            if length > room:
                break
            room -= length
            kept.append(index)
        kept.reverse()
        while start is not None and kept and 0 < kept[0] - start < MIN_ORIGIN_RUN:
            kept.pop(0)
        return kept

    def _bytes(self, indices: Iterable[int]) -> int:
        return sum(self.plan.piece_span(i)[1] for i in indices)

    def taken(self, index: int, *, now: float) -> tuple[bool, list[Event]]:
        """Piece ``index`` came from the swarm and matched the manifest (it is on disk):
        the plan's answer (`DownloadPlan.handle_swarm_piece`), counted."""
        took, events = self.plan.handle_swarm_piece(index, now=now)
        if took:
            length = self.plan.piece_span(index)[1]
            self.pieces += 1
            self.bytes += length
            self._recent.append((now, length))
        else:
            self.spare += 1
        if self._since is not None and not self.plan.swarm_claims:
            # all delivered: the rate it showed stands until new claims show theirs
            window = min(RATE_WINDOW_S, max(now - self._since, MIN_RATE_WINDOW_S))
            self._known_rate = self._window_bytes(now) / window
        self._settle()
        return took, events

    def release(self, indices: Iterable[int], *, for_good: bool = False) -> tuple[int, ...]:
        """Claims among ``indices`` go back to the origins (no connected peer holds them,
        or a delivered copy failed the manifest's check); ``for_good``: never claimed
        again. Which."""
        released = self.plan.unassign_swarm(indices)
        if for_good:
            self._taken_back.update(released)
            self.taken_back_total += len(released)
        self._settle()
        return released

    def release_all(self) -> tuple[int, ...]:
        """Every claim goes back (the sharing ended); never claimed again."""
        return self.release(self.plan.swarm_claims, for_good=True)

    def rate(self, *, now: float) -> float | None:
        """Bytes/s the swarm delivered over the last `RATE_WINDOW_S` while claims were
        out (since they began, when later); before ``steal_min_elapsed_s`` of claims,
        the rate it showed when its claims last ran out (None: never)."""
        if self._since is None or now - self._since < self.plan.config.steal_min_elapsed_s:
            return self._known_rate
        return self._window_bytes(now) / min(RATE_WINDOW_S, now - self._since)

    def _window_bytes(self, now: float) -> int:
        while self._recent and self._recent[0][0] <= now - RATE_WINDOW_S:
            self._recent.popleft()
        return sum(n for _, n in self._recent)

    def take_back(self, started: Collection[int], *, now: float) -> tuple[int, ...]:
        """Once nothing is left to assign, what goes back to the origins (for good)
        because the swarm is not shown fast (module docstring): at once, the claims not
        begun (``started``: a block asked of a peer) while it has not shown a third of
        the best rate of a section; below that third, the begun ones beyond the split at
        which both would end together; after a window of nothing, all of them after
        ``steal_after_s``."""
        plan = self.plan
        after = plan.config.steal_after_s
        claims = plan.swarm_claims
        since = self._since
        if after is None or since is None or not claims or plan.has_unassigned():
            return ()
        known = self.rate(now=now)
        if known is None or known * SLOW_FACTOR < plan.best_rate_bytes_per_s:
            # not shown fast (yet): a worker is idle, so what it has not begun goes back
            # at once (the small scenario's second origin reader at 8194bb7 waited on
            # the swarm for the last of a 4 MB issue: 2.18 s against 1.72 before)
            idle = [i for i in claims if i not in started]
            if idle:
                return self.release(idle, for_good=True)
        if now - since < plan.config.steal_min_elapsed_s:
            return ()  # (judged on its own claims, not on the rate it showed before)
        rate = self._window_bytes(now) / min(RATE_WINDOW_S, now - since)
        if rate == 0:  # nothing over the window: what it has not begun, or all of it
            idle = [i for i in claims if i not in started]
            return self.release(claims if now - since >= after else idle, for_good=True)
        best = plan.best_rate_bytes_per_s
        if rate * SLOW_FACTOR >= best:
            return ()  # as fast as the origins have been: the reader's link, not the swarm
        # split so that both would end together: it keeps left * rate / (rate + best),
        # the pieces begun first, then the lowest
        room = self._bytes(claims) * rate / (rate + best)
        order = [i for i in claims if i in started] + [i for i in claims if i not in started]
        back: list[int] = []
        for index in order:
            length = plan.piece_span(index)[1]
            if length <= room:
                room -= length
            else:
                back.append(index)
        return self.release(back, for_good=True)

    def _settle(self) -> None:
        if not self.plan.swarm_claims:
            self._since = None
