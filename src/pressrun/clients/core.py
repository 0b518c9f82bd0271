"""The download plan of one issue: sections, handoffs, failed origins, giving up.

Pure: no socket, clock or task. The adapter (:mod:`pressrun.clients.aio`) asks the
plan what to fetch, tells it what happened with ``now``, and acts on the returned
events. State:

- every manifest piece is *pending*, *in flight* (in a started section) or
  *verified* (its SHA-256 matched and it is on disk);
- a *section* is a run of consecutive pending pieces, at most ``section_size``
  bytes, stopping at the first piece that is verified or in flight; so a section
  never asks for a verified byte, and on the happy path every byte is asked for
  exactly once;
- each section starts with a fresh directive from the balancer, so a long download
  can move to another origin between sections: the section handoff of
  001_524169374db25375.txt, where a long transfer is split into sections and each
  section may be served by a different server. Their measurements put the best at
  about half of the transfers handed off once and show that excessive handoffs hurt;
  hence the default of three sections per file (at most two handoffs between
  sections, see `ClientConfig.section_size_for`; leaving a slow origin mid-section,
  below, adds one where it pays);
- an origin that failed (error, reset, stall, corrupt piece, unsatisfiable range) is
  remembered for ``failed_ttl_s`` and named in ``failed=`` on every directive request
  meanwhile: the WSDM retry rule of 003_fb4a16d3be88866e.txt (a retry re-selects a path
  excluding the one marked failed). Pieces verified before the failure are kept; the
  section's other pieces go back to pending and the next section picks them up;
- a worker with nothing left to assign may take over the back half of a section that,
  at the rate it has shown so far, still needs more than ``steal_after_s``: the section
  is cut short (its worker stops at the new end) and the rest starts on another origin.
  This is the handoff of 001 applied where it pays, to a transfer stuck on a slow
  server, without extra handoffs for sections that go well;
- a worker whose own section is that slow *and* at less than a third of the best rate
  this download has seen leaves it at the next piece boundary (the rest goes back to
  the plan) and marks the origin slow: it is passed over while the balancer offers
  another, but not named in ``failed=`` (it works, just slowly for us). The relative
  test keeps a client on a slow link of its own from moving for nothing;
- a new section prefers an origin none of the download's open sections is on, so
  with two sections at once the download has two paths and an idle worker to take
  over from the slower one;
- pieces may be *in flight from the swarm* (owned by `SWARM`, no section's): an
  origin reader that shares in the issue's swarm takes from its peers the pieces they
  hold (`pressrun.clients.swarm_take` decides which, and when they go back);
  `cut_section` ends an open section short for it as a steal does;
- failures in a row without a verified piece in between are counted; at
  ``max_attempts_without_progress``, once ``give_up_after_s`` passed without progress,
  the plan gives up with a one-line reason. Each failure also pushes the next attempt
  back (``not_before``) by an exponential backoff (a Retry-After when longer),
  lengthened at random by up to ``retry_jitter`` of itself so that clients refused
  together do not come back in step.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from pressrun.clients.config import ClientConfig
from pressrun.clients.events import (
    DownloadComplete,
    DownloadGaveUp,
    Event,
    LocalProtocolError,
    OriginFailed,
    OriginSlow,
    PiecesReleased,
    PlanState,
    Section,
    SectionStarted,
)

__all__ = ["DownloadPlan"]

#: a section is "slow" for `should_move` / `slow_origins` when its rate is below the
#: best rate this download has seen divided by this
SLOW_FACTOR = 3.0
#: the shortest window a rate is measured over (a section that ends quicker counts as
#: having taken this long)
MIN_RATE_WINDOW_S = 0.1
#: the owner, among the pieces in flight, of those asked of the issue's swarm
#: (sections are numbered from 0)
SWARM = -1


class DownloadPlan:
    """What remains of one download and what to fetch next (see the module docstring)."""

    def __init__(
        self,
        *,
        size_bytes: int,
        piece_size_bytes: int,
        config: ClientConfig,
        verified: Iterable[int] = (),
        now: float,
        rng: random.Random | None = None,
    ) -> None:
        """``rng`` draws each retry's jitter (`ClientConfig.retry_jitter`: clients
        refused together come back spread out); None: no jitter (exact times)."""
        if size_bytes < 1 or piece_size_bytes < 1:
            raise LocalProtocolError("size_bytes and piece_size_bytes must be positive")
        self.size_bytes = size_bytes
        self.piece_size_bytes = piece_size_bytes
        self.num_pieces = -(-size_bytes // piece_size_bytes)
        self.config = config
        self._rng = rng
        self.section_size_bytes = config.section_size_for(size_bytes, piece_size_bytes)
        self._section_pieces = self.section_size_bytes // piece_size_bytes
        self.verified: set[int] = set()
        for index in verified:
            if not 0 <= index < self.num_pieces:
                raise LocalProtocolError(f"verified piece {index} is outside the file")
            self.verified.add(index)
        # piece -> section id, for pieces in flight
        self._in_flight: dict[int, int] = {}
        self.sections: dict[int, Section] = {}
        # section id -> (started at, verified bytes so far): its observed rate
        self._progress: dict[int, tuple[float, int]] = {}
        # the best rate (bytes/s) a section of this download has shown: evidence of
        # what the client's own link can do, so a slow origin is told from a slow link
        self.best_rate_bytes_per_s = 0.0
        self._next_id = 0
        self._failed_until: dict[str, float] = {}
        # origin -> (marked slow at, until): passed over while another is offered
        self._slow: dict[str, tuple[float, float]] = {}
        self._last_origin: str | None = None
        self.handoffs = 0
        self.sections_started = 0
        self.failures_in_a_row = 0
        self.failures_total = 0
        self.not_before = now
        self._progress_at = now  # the start, or the last verified piece
        self.give_up_reason: str | None = None
        self.state = PlanState.COMPLETE if self._all_verified() else PlanState.DOWNLOADING

    # ------------------------------------------------------------------ queries

    def piece_span(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of piece ``index``."""
        if not 0 <= index < self.num_pieces:
            raise LocalProtocolError(f"piece {index} is outside the file")
        offset = index * self.piece_size_bytes
        return offset, min(self.piece_size_bytes, self.size_bytes - offset)

    @property
    def verified_bytes(self) -> int:
        """Bytes in verified pieces."""
        return sum(self.piece_span(i)[1] for i in self.verified)

    def remaining_ranges(self) -> list[tuple[int, int]]:
        """The byte ranges ``[start, end)`` not yet verified, merged, in order."""
        ranges: list[tuple[int, int]] = []
        for index in range(self.num_pieces):
            if index in self.verified:
                continue
            start, length = self.piece_span(index)
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], start + length)
            else:
                ranges.append((start, start + length))
        return ranges

    def has_unassigned(self) -> bool:
        """True if some piece is neither verified nor in flight."""
        return any(
            i not in self.verified and i not in self._in_flight for i in range(self.num_pieces)
        )

    def unassigned_sections(self) -> int:
        """How many sections `start_section` would make of the pieces neither verified
        nor in flight (each run of them cut into sections of the section size)."""
        sections = run = 0
        for i in range(self.num_pieces + 1):
            if i < self.num_pieces and i not in self.verified and i not in self._in_flight:
                run += 1
            elif run:
                sections += -(-run // self._section_pieces)
                run = 0
        return sections

    def failed_origins(self, *, now: float) -> frozenset[str]:
        """The origins to name in ``failed=`` now (failed less than ``failed_ttl_s`` ago)."""
        return frozenset(name for name, until in self._failed_until.items() if now < until)

    def pick_origin(self, candidates: Sequence[str], *, now: float) -> str | None:
        """The first of the directive's origins (preference order) not failed now,
        preferring one this download is not already using and does not see slow.

        The balancer scores every client's load; this client knows what it gets: an
        origin one of its sections is on, or one that has been slow for it, is passed
        over when the balancer offers another.
        """
        failed = self.failed_origins(now=now)
        usable = [name for name in candidates if name not in failed]
        if not usable:
            return None
        slow = self.slow_origins(now=now)
        in_use = {section.origin for section in self.sections.values()}
        # spread this download's sections over origins (a second path, as with
        # multihoming), then avoid slow ones, else the balancer's first
        for avoid in (slow | in_use, slow):
            for name in usable:
                if name not in avoid:
                    return name
        return usable[0]

    def slow_origins(self, *, now: float) -> frozenset[str]:
        """Origins marked slow (a section left them) or whose open sections still
        need more than ``steal_after_s``."""
        if self.config.steal_after_s is None:
            return frozenset()
        slow = {name for name, (_, until) in self._slow.items() if now < until}
        for section_id, section in self.sections.items():
            if self._relatively_slow(section_id, now=now):
                slow.add(section.origin)
        return frozenset(slow)

    def next_deadline(self) -> float | None:
        """When the next attempt may start (after a failure's backoff or a 503's
        Retry-After); None once the plan is over."""
        if self.state is not PlanState.DOWNLOADING:
            return None
        return self.not_before

    def _all_verified(self) -> bool:
        return len(self.verified) == self.num_pieces

    # ------------------------------------------------------------------- inputs

    def start_section(self, origin: str, *, now: float) -> SectionStarted | None:
        """Hand the next run of pending pieces to ``origin``; None if nothing is left
        to assign (every piece verified or in flight) or the plan is over."""
        if self.state is not PlanState.DOWNLOADING:
            return None
        first = next(
            (
                i
                for i in range(self.num_pieces)
                if i not in self.verified and i not in self._in_flight
            ),
            None,
        )
        if first is None:
            return None
        end = first
        limit = min(self.num_pieces, first + self._section_pieces)
        while end < limit and end not in self.verified and end not in self._in_flight:
            end += 1
        start_byte = self.piece_span(first)[0]
        last_offset, last_length = self.piece_span(end - 1)
        section = Section(
            section_id=self._next_id,
            origin=origin,
            first_piece=first,
            end_piece=end,
            start_byte=start_byte,
            end_byte=last_offset + last_length,
        )
        self._next_id += 1
        self.sections[section.section_id] = section
        self._progress[section.section_id] = (now, 0)
        for index in section.pieces:
            self._in_flight[index] = section.section_id
        self.sections_started += 1
        handed_off_from = None
        if self._last_origin is not None and self._last_origin != origin:
            handed_off_from = self._last_origin
            self.handoffs += 1
        self._last_origin = origin
        return SectionStarted(section, handed_off_from)

    def section_end(self, section_id: int) -> int:
        """The current end piece (exclusive) of an open section: a steal may have
        moved it down since the section started; 0 once the section is closed."""
        section = self.sections.get(section_id)
        return 0 if section is None else section.end_piece

    def _seconds_left(self, section_id: int, *, now: float) -> float | None:
        """How long the section still needs at its observed rate; None when it ran
        less than ``steal_min_elapsed_s``."""
        started_at, done = self._progress[section_id]
        elapsed = now - started_at
        if elapsed < self.config.steal_min_elapsed_s:
            return None
        left = sum(self.piece_span(i)[1] for i in self.pending_of(section_id))
        if done == 0:
            return float("inf")
        return left / (done / elapsed)

    def _relatively_slow(self, section_id: int, *, now: float) -> bool:
        """The section still needs more than ``steal_after_s`` and goes at less than
        a third of the best rate this download has seen (so a slow link of the
        client's own, where every section is slow, moves nothing)."""
        if self.config.steal_after_s is None:
            return False
        left = self._seconds_left(section_id, now=now)
        if left is None or left <= self.config.steal_after_s:
            return False
        started_at, done = self._progress[section_id]
        rate = done / max(now - started_at, MIN_RATE_WINDOW_S)
        return rate * SLOW_FACTOR < self.best_rate_bytes_per_s

    def pending_of(self, section_id: int) -> list[int]:
        """The open section's pieces not verified yet, in order."""
        section = self.sections[section_id]
        return [i for i in section.pieces if self._in_flight.get(i) == section_id]

    def should_move(self, section_id: int, *, now: float) -> bool:
        """True if the section's worker should leave it at this piece boundary: at its
        observed rate it still needs more than ``steal_after_s`` (and at least two
        pieces), and its origin was not chosen knowingly after being marked slow."""
        if self.config.steal_after_s is None or section_id not in self.sections:
            return False
        section = self.sections[section_id]
        marked = self._slow.get(section.origin)
        if marked is not None and now < marked[1] and self._progress[section_id][0] >= marked[0]:
            return False  # the balancer had nothing better when it started
        if len(self.pending_of(section_id)) < 2:
            return False
        return self._relatively_slow(section_id, now=now)

    def handle_section_moved(self, section_id: int, *, now: float) -> list[Event]:
        """The worker left a slow section at a piece boundary (`should_move`): its
        other pieces go back to the plan and the origin is marked slow for
        ``failed_ttl_s``, passed over by `pick_origin` while another is offered. Not
        a failure: it is not named in ``failed=`` and counts nothing toward giving up."""
        section = self._section(section_id)
        released = self._release(section)
        until = now + self.config.failed_ttl_s
        self._slow[section.origin] = (now, until)
        # the transfer is handed off here; its next section does not count again
        self.handoffs += 1
        self._last_origin = None
        events: list[Event] = [OriginSlow(section.origin, until)]
        if released:
            events.append(PiecesReleased(section_id, released))
        return events

    def worth_stealing(self, *, now: float) -> bool:
        """True if some open section would be taken over now (`steal_section`)."""
        if self.config.steal_after_s is None:
            return False
        for section_id in self.sections:
            if len(self.pending_of(section_id)) < 2:
                continue
            left = self._seconds_left(section_id, now=now)
            if left is not None and left > self.config.steal_after_s:
                return True
        return False

    def steal_section(self, candidates: Sequence[str], *, now: float) -> SectionStarted | None:
        """Take over the back half of the slowest open section, for the first of
        ``candidates`` (a directive's origins) that is neither failed nor that
        section's origin; None when no section is worth it (see ``steal_after_s``)."""
        if self.state is not PlanState.DOWNLOADING or self.config.steal_after_s is None:
            return None
        victim: Section | None = None
        worst = self.config.steal_after_s
        for section_id, section in self.sections.items():
            if len(self.pending_of(section_id)) < 2:
                continue  # the piece being received stays with its worker
            left = self._seconds_left(section_id, now=now)
            if left is not None and left > worst:
                victim, worst = section, left
        if victim is None:
            return None
        failed = self.failed_origins(now=now)
        origin = next((o for o in candidates if o not in failed and o != victim.origin), None)
        if origin is None:
            return None
        pending = self.pending_of(victim.section_id)
        # The victim keeps the first half (it receives pieces in order: the lowest
        # pending piece is the one on the wire); the thief takes the rest, which is a
        # run of consecutive pieces (pending pieces of one section are consecutive).
        cut = pending[(len(pending) + 1) // 2]
        if pending[-1] - cut + 1 != len(pending) - pending.index(cut):
            return None  # not one run (pieces verified out of order): leave it
        end = victim.end_piece
        self.cut_section(victim.section_id, cut)
        stolen = Section(
            section_id=self._next_id,
            origin=origin,
            first_piece=cut,
            end_piece=end,
            start_byte=self.piece_span(cut)[0],
            end_byte=victim.end_byte,
        )
        self._next_id += 1
        self.sections[stolen.section_id] = stolen
        self._progress[stolen.section_id] = (now, 0)
        for index in stolen.pieces:
            self._in_flight[index] = stolen.section_id
        self.sections_started += 1
        self.handoffs += 1
        self._last_origin = origin
        return SectionStarted(stolen, victim.origin)

    def cut_section(self, section_id: int, cut: int) -> None:
        """End an open section before piece ``cut`` (its worker stops there:
        `section_end`); its pieces from ``cut`` on are neither verified nor in flight
        then. ``cut`` must leave it one piece at least."""
        section = self._section(section_id)
        if not section.first_piece < cut <= section.end_piece:
            raise LocalProtocolError(f"cannot cut section {section_id} at piece {cut}")
        last_offset, last_length = self.piece_span(cut - 1)
        self.sections[section_id] = Section(
            section_id=section_id,
            origin=section.origin,
            first_piece=section.first_piece,
            end_piece=cut,
            start_byte=section.start_byte,
            end_byte=last_offset + last_length,
        )
        for index in range(cut, section.end_piece):
            if self._in_flight.get(index) == section_id:
                del self._in_flight[index]

    # ------------------------------------------------- pieces in flight from the swarm

    @property
    def swarm_claims(self) -> tuple[int, ...]:
        """The pieces asked of the swarm and not delivered yet, in order."""
        return tuple(sorted(i for i, owner in self._in_flight.items() if owner == SWARM))

    def unassigned_runs(self) -> list[tuple[int, int]]:
        """The runs ``[start, end)`` of pieces neither verified nor in flight, in order."""
        runs: list[tuple[int, int]] = []
        for i in range(self.num_pieces):
            if i in self.verified or i in self._in_flight:
                continue
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        return runs

    def assign_to_swarm(self, indices: Iterable[int]) -> None:
        """The pieces (neither verified nor in flight) are asked of the swarm."""
        chosen = sorted(set(indices))
        for index in chosen:
            self.piece_span(index)  # (inside the file)
            if index in self.verified or index in self._in_flight:
                raise LocalProtocolError(f"piece {index} is verified or in flight already")
        for index in chosen:
            self._in_flight[index] = SWARM

    def unassign_swarm(self, indices: Iterable[int]) -> tuple[int, ...]:
        """The pieces among ``indices`` asked of the swarm go back to the plan; which."""
        released = tuple(sorted(i for i in set(indices) if self._in_flight.get(i) == SWARM))
        for index in released:
            del self._in_flight[index]
        return released

    def handle_swarm_piece(self, index: int, *, now: float) -> tuple[bool, list[Event]]:
        """Piece ``index`` came from the swarm, matched its SHA-256 and is on disk.
        Taken (True) unless it is verified already or a section has it (that section
        brings it); the events of a verified piece."""
        self.piece_span(index)  # (inside the file)
        owner = self._in_flight.get(index)
        if self.state is not PlanState.DOWNLOADING or index in self.verified:
            return False, []
        if owner is not None and owner != SWARM:
            return False, []
        self._in_flight.pop(index, None)
        self.verified.add(index)
        self.failures_in_a_row = 0
        self._progress_at = now
        if self._all_verified():
            self.state = PlanState.COMPLETE
            return True, [DownloadComplete()]
        return True, []

    def handle_piece_verified(self, section_id: int, index: int, *, now: float) -> list[Event]:
        """Piece ``index`` of the section arrived, matched its SHA-256 and is on disk."""
        section = self._section(section_id)
        if index not in section.pieces:
            raise LocalProtocolError(f"piece {index} is not in section {section_id}")
        if self._in_flight.get(index) != section_id:
            raise LocalProtocolError(f"piece {index} was already settled")
        del self._in_flight[index]
        self.verified.add(index)
        started_at, done = self._progress[section_id]
        done += self.piece_span(index)[1]
        self._progress[section_id] = (started_at, done)
        self.failures_in_a_row = 0
        self.not_before = now
        self._progress_at = now
        events: list[Event] = []
        closed = not any(self._in_flight.get(i) == section_id for i in section.pieces)
        elapsed = now - started_at
        if closed or elapsed >= self.config.steal_min_elapsed_s:
            rate = done / max(elapsed, MIN_RATE_WINDOW_S)
            self.best_rate_bytes_per_s = max(self.best_rate_bytes_per_s, rate)
        if closed:
            del self.sections[section_id]
            del self._progress[section_id]
        if self._all_verified():
            self.state = PlanState.COMPLETE
            events.append(DownloadComplete())
        return events

    def handle_piece_corrupt(self, section_id: int, index: int, *, now: float) -> list[Event]:
        """Piece ``index`` came from the section's origin with the wrong SHA-256: the
        piece is discarded, the origin failed, the section ended (its unverified pieces
        are fetched again from elsewhere)."""
        section = self._section(section_id)
        if index not in section.pieces:
            raise LocalProtocolError(f"piece {index} is not in section {section_id}")
        return self.handle_section_failed(
            section_id, f"piece {index} failed its SHA-256 check", now=now
        )

    def handle_section_failed(
        self, section_id: int, reason: str, *, now: float, origin_at_fault: bool = True
    ) -> list[Event]:
        """The section's transfer ended early (error, reset, stall, bad answer).

        Verified pieces stay; the rest go back to pending. With ``origin_at_fault`` the
        origin is named in ``failed=`` for ``failed_ttl_s``.
        """
        section = self._section(section_id)
        released = self._release(section)
        events: list[Event] = [PiecesReleased(section_id, released)] if released else []
        if origin_at_fault:
            events.append(self._mark_failed(section.origin, reason, now=now))
        events.extend(self._count_failure(f"origin {section.origin}: {reason}", now=now))
        return events

    def handle_section_finished(self, section_id: int, *, now: float) -> list[Event]:
        """The section's response ended. Every piece should be verified by now; any
        that is not (a short body) fails the section."""
        section = self.sections.get(section_id)
        if section is None:
            return []  # every piece verified: the section was closed then
        return self.handle_section_failed(
            section_id, "the response ended before the section was complete", now=now
        )

    def handle_directive_failed(
        self,
        reason: str,
        *,
        now: float,
        retry_after_s: float | None = None,
        no_origin_left: bool = False,
    ) -> list[Event]:
        """The balancer could not give a usable directive (unreachable, 503, or every
        origin it listed has failed).

        ``no_origin_left``: the balancer had no origin besides those named in
        ``failed=`` (its 503, or a list of failed ones only). Then the failed marks are
        forgiven, so the next request names none: with no other path left, a retry
        of a failed one is the only way on (a transient failure of every origin must
        not end the download), and the failure still counts toward giving up.
        """
        if no_origin_left:
            self._failed_until.clear()
        return self._count_failure(reason, now=now, retry_after_s=retry_after_s)

    def handle_start_reserved(self, *, retry_after_s: float, now: float) -> None:
        """The balancer reserved a start for this download ``retry_after_s`` from now
        (its 503 named a reservation, docs/protocols.md): the next request waits for it
        and is not a failure (a turn in a queue; counting it would give up on a wait
        the balancer promised to end)."""
        self.not_before = max(self.not_before, now + retry_after_s)

    def handle_origin_failed(self, origin: str, reason: str, *, now: float) -> list[Event]:
        """An origin failed outside a section (e.g. its manifest request)."""
        return [self._mark_failed(origin, reason, now=now), *self._count_failure(reason, now=now)]

    def handle_pieces_lost(self, indices: Iterable[int], *, now: float) -> list[Event]:
        """Verified pieces turned out bad on disk (the final check): fetch them again."""
        lost = [i for i in indices if i in self.verified]
        for index in lost:
            self.verified.discard(index)
        if lost and self.state is PlanState.COMPLETE:
            self.state = PlanState.DOWNLOADING
        return self._count_failure(f"{len(lost)} verified pieces were bad on disk", now=now)

    # ---------------------------------------------------------------- internals

    def _section(self, section_id: int) -> Section:
        section = self.sections.get(section_id)
        if section is None:
            raise LocalProtocolError(f"no open section {section_id}")
        return section

    def _release(self, section: Section) -> tuple[int, ...]:
        released = tuple(i for i in section.pieces if self._in_flight.get(i) == section.section_id)
        for index in released:
            del self._in_flight[index]
        del self.sections[section.section_id]
        del self._progress[section.section_id]
        return released

    def _mark_failed(self, origin: str, reason: str, *, now: float) -> OriginFailed:
        until = now + self.config.failed_ttl_s
        self._failed_until[origin] = max(until, self._failed_until.get(origin, until))
        return OriginFailed(origin, reason, until)

    def _count_failure(
        self, reason: str, *, now: float, retry_after_s: float | None = None
    ) -> list[Event]:
        self.failures_in_a_row += 1
        self.failures_total += 1
        spread = 0.0 if self._rng is None else self._rng.random()
        backoff = self.config.backoff_s(self.failures_in_a_row, retry_after_s, spread)
        self.not_before = max(self.not_before, now + backoff)
        if self.state is PlanState.DOWNLOADING and self.config.gives_up(
            self.failures_in_a_row, now - self._progress_at
        ):
            self.state = PlanState.GAVE_UP
            self.give_up_reason = (
                f"gave up after {self.failures_in_a_row} failed attempts in a row "
                f"without progress; the last: {reason}"
            )
            return [DownloadGaveUp(self.give_up_reason)]
        return []
