"""Reserved starts: under overload, downloads are sent first come first served at their
clients' whole rate, and a client with no room now is told when its room begins.

Why, and the rules with the runs behind them: docs/balancer.md, "Reserved starts" (in
short: admitted at their need, a burst's downloads share the links for their whole
deadline and the clients arriving meanwhile give up; the capacity bound,
`pressrun.sim.metrics.capacity_bound`, is a queue; here each origin keeps one, and a
client whose turn is later is told to come back then: `NoDirective.reservation`).

An origin's *book* (`OriginBook`) is its queue as a fluid: the bytes admitted and not
yet sent, drained at the origin's room. A download of ``L`` bytes left by a client whose
link carries ``a`` bytes/s, at ``r = min(a, room)``, ends when the work ahead and its
own ``L`` are sent (never before ``L / r`` from now) and starts ``L / r`` before that;
while the rates of the transfers running at once stay within the origin's room, an
evenly shared link gives each its whole rate (max-min: nobody's bottleneck is the
origin), so each ends about when planned. A client is given the origin where it ends
first; it is refused when no origin can end its download by its deadline (less
`margin_s` where the queue ahead sets its end): the queue does not hold a client it
cannot serve in time.

Starts ahead (`Reservations.slip_in`): where no turn behind the queue ends in time, a
download may start now ahead of it. The link is shared evenly, so it moves every
download queued there later by its bytes over the drain, and itself gets at least an
even share among the transfers there: started where every download queued still ends
by its due (`OriginBook.slack_bytes`; a turn later is due by its deadline less its
margin, a transfer running by its deadline) and it ends by its own. Only then: where a
turn fits, the client is served either way, and the turns keep the transfers running at
once few, each at its client's whole rate.

Turns taken (`Reservations.take_turn`): where neither fits, a download may take the turn
of a waiting one at least `take_ratio` times bigger, the latest queued (its client, back
at its start, has none and is placed anew); the smaller downloads that fit in that
turn's time at its rate share it, one after another. The same bytes serve more clients
small. The book is not told: its work and dues stay the turn's, so nothing planned later
counts on bytes a smaller download leaves unused.

Bounded: a reservation not claimed within `claim_s` of its start (the client gave up)
is cancelled, its bytes given back; at most `max_reservations` wait at once (then the
refusal is the ordinary one); a book follows at most `max_reservations` dues, forgotten
once sent or past (beyond that, nothing more starts ahead there).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class Reservation:
    """One download's reserved room on an origin: `rate` bytes/s from `start` to `end`."""

    token: str
    origin: str
    issue_id: str
    rate: float
    start: float
    end: float
    left_bytes: float
    #: the origin book's `added_bytes` when it was queued (its place in the queue), and
    #: its `front_bytes` then (the bytes started ahead of the queue since are ahead too)
    queued_before: float = 0.0
    front_before: float = 0.0
    #: when its client's deadline falls, and how long before it the download must end
    deadline_at: float = math.inf
    margin_s: float = 0.0
    claimed: bool = False
    #: started now ahead of the queue (`Reservations.slip_in`), not behind it
    ahead: bool = False
    #: placed in the turn of a bigger download (`Reservations.take_turn`)
    turn: TakenTurn | None = None


@dataclass(slots=True)
class TakenTurn:
    """The turn of a waiting download given to smaller ones (`Reservations.take_turn`):
    its origin, its place in the queue, its time (`start` to `end`) and its rate; the
    bytes not given yet and when the next download placed in it may start (one after
    another, so that the turn never sends faster than planned)."""

    origin: str
    start: float
    end: float
    rate: float
    left_bytes: float
    queued_before: float
    front_before: float
    next_start: float


def _late(end: float, own_s: float, deadline_at: float, margin_s: float, *, now: float) -> bool:
    """Whether a download ending at `end` misses its deadline: by the deadline itself
    where its own link sets the end (no queue ahead holds it: nothing to forecast),
    by the deadline less `margin_s` where the queue ahead does (the queue is a fluid
    forecast: a start costs a round trip and a startup, a status is stale)."""
    queued = end > now + own_s * (1.0 + 1e-9) + 1e-9
    return end > deadline_at - (margin_s if queued else 0.0)


class OriginBook:
    """One origin's queue as a fluid: the bytes admitted and not yet sent (`work_bytes`,
    the transfers running and the starts reserved), drained at what the origin sends
    (`drain_bytes_per_s`: its room, or what its statuses show it sends while busy).

    Each download queued is also kept as (mark, due): it ends once the bytes through it,
    ``mark + front_bytes - drained_bytes``, are sent, and must end by `due` (its
    deadline less its margin). A download started ahead of the queue (`add_front`)
    moves every one queued later by its bytes; `slack_bytes` is how many such bytes the
    queue can take with every download still ending by its due.
    """

    __slots__ = (
        "_key",
        "_key_drain",
        "added_bytes",
        "at",
        "drain_bytes_per_s",
        "drained_bytes",
        "front_bytes",
        "items",
        "max_items",
        "taken_bytes",
        "work_bytes",
    )

    def __init__(self, drain_bytes_per_s: float, *, now: float, max_items: int = 100_000) -> None:
        self.work_bytes = 0.0
        self.at = now
        self.drain_bytes_per_s = drain_bytes_per_s
        #: bytes ever queued, and ever drained or taken back: a reservation's place in
        #: the queue is the bytes queued before it less those drained since
        self.added_bytes = 0.0
        self.drained_bytes = 0.0
        #: bytes ever started ahead of the queue (`add_front`), and ever taken back
        #: (`remove`: counted as drained for the reservations' places, not for `items`,
        #: since those queued before the one taken back are not helped by it)
        self.front_bytes = 0.0
        self.taken_bytes = 0.0
        #: (mark, due) of the downloads queued (module docstring); at most `max_items`
        self.items: list[tuple[float, float]] = []
        self.max_items = max_items
        #: min over `items` of drain x due - mark, for the drain `_key_drain`
        self._key = math.inf
        self._key_drain = drain_bytes_per_s

    def work_at(self, now: float) -> float:
        """The bytes still queued at `now`."""
        return max(self.work_bytes - self.drain_bytes_per_s * max(now - self.at, 0.0), 0.0)

    def _advance(self, now: float) -> None:
        if now > self.at:
            work = self.work_at(now)
            self.drained_bytes += self.work_bytes - work
            self.work_bytes = work
            self.at = now
            if work <= 0.0 and self.items:
                self.items.clear()  # all sent
                self._key = math.inf

    def ahead_of(self, queued_before: float, front_before: float = 0.0, *, now: float) -> float:
        """Bytes still queued ahead of a reservation queued after `queued_before` (and
        after `front_before` bytes started ahead of the queue: those since are ahead)."""
        self._advance(now)
        return max(queued_before + self.front_bytes - front_before - self.drained_bytes, 0.0)

    def slot(
        self, left_bytes: float, rate: float, *, now: float, ahead: float | None = None
    ) -> tuple[float, float]:
        """(start, end) of a download of `left_bytes` at up to `rate` bytes/s queued
        behind the work there (or behind `ahead` bytes): it ends when the work ahead
        and its own is sent, never before `left_bytes / rate` from now, and starts its
        own rate's time before."""
        drain = self.drain_bytes_per_s
        own = left_bytes / rate
        work = self.work_at(now) if ahead is None else ahead
        end = max(now + own, now + (work + left_bytes) / drain)
        return end - own, end

    def add(self, left_bytes: float, *, now: float, due: float = math.inf) -> None:
        """Queue `left_bytes` more, to end by `due`."""
        self._advance(now)
        self.work_bytes += left_bytes
        self.added_bytes += left_bytes
        # through it now: the work queued, its own included (`add` is at the back)
        self._keep(self.added_bytes - self.taken_bytes - self.front_bytes, due, now=now)

    def add_front(self, left_bytes: float, *, now: float, due: float = math.inf) -> None:
        """Start `left_bytes` now, ahead of the queue: every download queued ends that
        many bytes later."""
        self._advance(now)
        self.work_bytes += left_bytes
        self.added_bytes += left_bytes
        self.front_bytes += left_bytes
        self._keep(left_bytes + self._sent() - self.front_bytes, due, now=now)

    def _sent(self) -> float:
        """Bytes drained, not counting those taken back."""
        return self.drained_bytes - self.taken_bytes

    def _keep(self, mark: float, due: float, *, now: float) -> None:
        if due == math.inf:
            return
        if len(self.items) >= self.max_items:
            self._prune(now=now)
            if len(self.items) >= self.max_items:
                self._key = -math.inf  # too many to follow: nothing more goes ahead
                return
        self.items.append((mark, due))
        self._key = min(self._key, self.drain_bytes_per_s * due - mark)

    def _prune(self, *, now: float) -> None:
        """Forget the downloads sent or past their due, and recount `_key` at the
        drain now."""
        self._advance(now)
        sent = self._sent() - self.front_bytes
        drain = self.drain_bytes_per_s
        self.items = [(m, d) for m, d in self.items if m > sent and d > now]
        self._key = min((drain * d - m for m, d in self.items), default=math.inf)
        self._key_drain = drain

    def slack_bytes(self, *, now: float) -> float:
        """Bytes the queue can start ahead of it with every download queued still
        ending by its due (inf when none is queued with a due)."""
        if self._key_drain != self.drain_bytes_per_s or self._key == -math.inf:
            self._prune(now=now)
        self._advance(now)
        through = self.front_bytes - self._sent()
        return self._key - through - self.drain_bytes_per_s * now

    def remove(self, left_bytes: float, *, now: float) -> None:
        """Take back a reservation's bytes (its client gave up)."""
        self._advance(now)
        taken = min(self.work_bytes, left_bytes)
        self.work_bytes -= taken
        self.drained_bytes += taken
        self.taken_bytes += taken

    def observe(self, room: float, *, now: float) -> None:
        """A status: the queue drains at the origin's room as the algorithm now knows it
        (learned from what it sends, at most as told). Draining at what it sends while
        its queue is long was measured worse: a queue of starts still to come sends
        little (docs/results/2026-11-28-balancer-reservations.md)."""
        self._advance(now)
        self.drain_bytes_per_s = room


class Reservations:
    """Every origin's book, and the reservations clients hold (module docstring).

    `room(name)` is an origin's bytes/s as the algorithm knows them now (learned, at
    most as told); origins not in rotation are not offered. `transfers(name)`: how
    many transfers it runs now (and has on their way), what a download started there
    shares its link with (`slip_in`).
    """

    def __init__(
        self,
        room: Callable[[str], float],
        *,
        transfers: Callable[[str], float] | None = None,
        margin_s: float = 3.0,
        claim_s: float = 10.0,
        take_ratio: float = 0.0,
        max_reservations: int = 100_000,
    ) -> None:
        self.room = room
        self.transfers = transfers
        self.margin_s = margin_s
        self.claim_s = claim_s
        #: a download may take a waiting turn of at least this many times its bytes
        #: (`take_turn`); 0: never
        self.take_ratio = take_ratio
        self.max_reservations = max_reservations
        #: the turns taken whose time has not passed (at most `max_reservations`)
        self.taken: list[TakenTurn] = []
        self.books: dict[str, OriginBook] = {}
        #: reservations whose start is ahead or whose client has not claimed them yet
        self.waiting: dict[str, Reservation] = {}
        #: (start, token) of the waiting reservations, for `_expire` (lazily cleaned)
        self._starts: list[tuple[float, str]] = []
        self._tokens = itertools.count(1)

    def book(self, name: str, *, now: float) -> OriginBook:
        """An origin's book (created empty, draining at its room)."""
        b = self.books.get(name)
        if b is None:
            b = self.books[name] = OriginBook(
                self.room(name), now=now, max_items=self.max_reservations
            )
        return b

    def plan(
        self,
        issue_id: str,
        origins: Iterable[str],
        *,
        left_bytes: float,
        rate: float,
        time_left_s: float,
        now: float,
        margin_s: float | None = None,
    ) -> Reservation | None:
        """Where a download of `left_bytes` by a client whose link carries `rate`
        bytes/s and whose deadline is `time_left_s` away would be queued: the origin
        (of `origins`) where it ends first (`OriginBook.slot`); None when none ends it
        by the deadline less `margin_s`. A start within a second of `now` is a start
        now. Nothing is queued until `commit`."""
        self._expire(now=now)
        margin = self.margin_s if margin_s is None else margin_s
        best: tuple[float, float, str, float] | None = None
        for name in origins:
            room = self.room(name)
            if not room > 0:
                continue
            r = min(rate, room)
            start, end = self.book(name, now=now).slot(left_bytes, r, now=now)
            if _late(end, left_bytes / r, now + time_left_s, margin, now=now):
                continue
            key = (end, start, name, r)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        end, start, name, r = best
        start = now if start <= now + 1.0 else start
        if start > now and len(self.waiting) >= self.max_reservations:
            return None
        return Reservation(
            "",
            name,
            issue_id,
            r,
            start,
            end,
            left_bytes,
            deadline_at=now + time_left_s,
            margin_s=margin,
            claimed=start <= now,
        )

    def slip_in(
        self,
        issue_id: str,
        origins: Iterable[str],
        *,
        left_bytes: float,
        rate: float,
        time_left_s: float,
        now: float,
        margin_s: float | None = None,
    ) -> Reservation | None:
        """A download started now ahead of an origin's queue, where `plan` would queue
        it later or not at all: an origin shares its link evenly, so a download started
        there now takes its bytes from every other's time (it moves each queued one
        later by `left_bytes / drain`), and itself gets at least an even share of the
        link among the transfers there (it ends by ``now + (n + 1) x left_bytes /
        drain`` when the others are no smaller). Started where every download queued
        there still ends by its deadline less its margin (`OriginBook.slack_bytes`)
        and it ends by its own, on the origin where it ends first; None when none.
        Nothing is queued until `commit`."""
        self._expire(now=now)
        margin = self.margin_s if margin_s is None else margin_s
        deadline_at = now + time_left_s
        best: tuple[float, str, float] | None = None
        for name in origins:
            room = self.room(name)
            if not room > 0:
                continue
            book = self.book(name, now=now)
            if book.slack_bytes(now=now) < left_bytes:
                continue
            r = min(rate, room)
            sharing = 1.0 + (self.transfers(name) if self.transfers is not None else 0.0)
            end = now + max(left_bytes / r, sharing * left_bytes / book.drain_bytes_per_s)
            if end > deadline_at - margin:
                continue
            if best is None or (end, name) < best[:2]:
                best = (end, name, r)
        if best is None:
            return None
        end, name, r = best
        return Reservation(
            "",
            name,
            issue_id,
            r,
            now,
            end,
            left_bytes,
            deadline_at=deadline_at,
            margin_s=margin,
            claimed=True,
            ahead=True,
        )

    def take_turn(
        self,
        issue_id: str,
        origins: Iterable[str],
        *,
        left_bytes: float,
        rate: float,
        time_left_s: float,
        now: float,
        margin_s: float | None = None,
    ) -> Reservation | None:
        """A download placed in a turn already taken from a bigger one, or in the turn
        of the waiting download of at least `take_ratio` times its bytes queued last
        on one of `origins` (which is then taken: its client's reservation is gone),
        where `plan` and `slip_in` find none (module docstring). It fits a turn where
        the turn's bytes not given yet hold it, and it starts (at the turn's next
        start, or now if later) and ends within the turn's time at the turn's rate and
        by its deadline (less `margin_s` where it waits). None when none fits.
        Nothing is queued until `commit`."""
        if not self.take_ratio > 0:
            return None
        self._expire(now=now)
        self.taken = [t for t in self.taken if t.end > now and t.origin in self.books]
        margin = self.margin_s if margin_s is None else margin_s
        names = set(origins)
        deadline_at = now + time_left_s

        def fits(
            origin: str, start: float, end: float, turn_rate: float, turn_bytes: float
        ) -> tuple[float, float, float] | None:
            room = self.room(origin)
            if not room > 0 or turn_bytes < left_bytes:
                return None
            r = min(rate, room)
            own = left_bytes / r
            begin = max(start, now)
            if begin + left_bytes / turn_rate > end + 1e-9 or begin + own > end + 1e-9:
                return None
            if _late(begin + own, own, deadline_at, margin, now=now):
                return None
            return begin, begin + own, r

        best: tuple[float, TakenTurn, float, float] | None = None
        for turn in self.taken:
            if turn.origin in names:
                f = fits(turn.origin, turn.next_start, turn.end, turn.rate, turn.left_bytes)
                if f is not None and (best is None or f[1] < best[0]):
                    best = (f[1], turn, f[0], f[2])
        if best is None:
            best = self._take_a_turn(names, fits, left_bytes)
        if best is None:
            return None
        end, turn, start, r = best
        start = now if start <= now + 1.0 else start
        return Reservation(
            "",
            turn.origin,
            issue_id,
            r,
            start,
            end,
            left_bytes,
            queued_before=turn.queued_before,
            front_before=turn.front_before,
            deadline_at=deadline_at,
            margin_s=margin,
            claimed=start <= now,
            turn=turn,
        )

    def _take_a_turn(
        self,
        names: set[str],
        fits: Callable[[str, float, float, float, float], tuple[float, float, float] | None],
        left_bytes: float,
    ) -> tuple[float, TakenTurn, float, float] | None:
        """`take_turn`'s new turn: the waiting download queued last on one of `names`
        of at least `take_ratio` times `left_bytes` whose turn `fits` the download,
        taken (its reservation is gone, its bytes stay in the book)."""
        if len(self.taken) >= self.max_reservations:
            return None
        last: Reservation | None = None
        for res in self.waiting.values():
            if res.claimed or res.turn is not None or res.origin not in names:
                continue
            if res.left_bytes < self.take_ratio * left_bytes:
                continue
            if fits(res.origin, res.start, res.end, res.rate, res.left_bytes) is None:
                continue
            if last is None or res.queued_before > last.queued_before:
                last = res
        if last is None:
            return None
        del self.waiting[last.token]
        turn = TakenTurn(
            last.origin,
            last.start,
            last.end,
            last.rate,
            last.left_bytes,
            last.queued_before,
            last.front_before,
            last.start,
        )
        self.taken.append(turn)
        f = fits(turn.origin, turn.next_start, turn.end, turn.rate, turn.left_bytes)
        assert f is not None  # as for `last`
        return f[1], turn, f[0], f[2]

    def commit(self, planned: Reservation, *, now: float) -> Reservation:
        """Queue a `plan`'s download on its origin: a start now is claimed at once, a
        later one waits for its client (`claim`) under a new token."""
        book = self.book(planned.origin, now=now)
        turn = planned.turn
        if turn is not None:
            # In a turn taken: its bytes are in the book already; the next one placed
            # in it starts once this one's bytes are sent at the turn's rate.
            turn.left_bytes -= planned.left_bytes
            turn.next_start = (
                max(turn.next_start, now, planned.start) + planned.left_bytes / turn.rate
            )
            return self._hold(planned)
        planned.queued_before = book.added_bytes
        planned.front_before = book.front_bytes
        # A start later is held to its deadline less its margin (the queue ahead is a
        # forecast: a start costs a round trip and a startup, a status is stale); a
        # transfer started now only to its deadline (`OriginBook`: what a start ahead
        # may not make late).
        due = planned.deadline_at - (0.0 if planned.claimed else planned.margin_s)
        if planned.ahead:
            book.add_front(planned.left_bytes, now=now, due=due)
        else:
            book.add(planned.left_bytes, now=now, due=due)
        return self._hold(planned)

    def _hold(self, planned: Reservation) -> Reservation:
        """A token for a reservation queued; held for its client if its start is later."""
        planned.token = f"r{next(self._tokens)}"
        if not planned.claimed:
            self.waiting[planned.token] = planned
            heapq.heappush(self._starts, (planned.start, planned.token))
        return planned

    def note(self, name: str, *, left_bytes: float, now: float, due: float = math.inf) -> None:
        """A transfer the algorithm placed by room, not by the book, started on an
        origin: its bytes queued there, so that under overload the book knows them
        (and, with the `due` it must end by, does not start one ahead that would make
        it late)."""
        self.book(name, now=now).add(left_bytes, now=now, due=due)

    def observe(self, name: str, *, now: float) -> None:
        """A status of the origin: its queue drains at its room as now known."""
        room = self.room(name)
        if room > 0:
            self.book(name, now=now).observe(room, now=now)

    def claim(self, token: str, *, deadline_at: float, now: float) -> Reservation | None:
        """The client of a reservation came back: its reservation if it is still held
        (its start not more than `claim_s` past), else None; `claimed` once its start
        has come (within a second). Its start is checked against the queue as the
        origin's statuses now show it drain: when the bytes still ahead of it need
        longer than was reserved (the origin sends less than it was told), the start
        moves later, and the reservation is cancelled (None) when it would then end
        after `deadline_at` less `margin_s`."""
        self._expire(now=now)
        res = self.waiting.get(token)
        if res is None:
            return None
        book = self.books.get(res.origin)
        if book is None:
            self.waiting.pop(token, None)
            return None
        ahead = book.ahead_of(res.queued_before, res.front_before, now=now)
        start, end = book.slot(res.left_bytes, res.rate, now=now, ahead=ahead)
        if _late(end, res.left_bytes / res.rate, deadline_at, res.margin_s, now=now):
            self.cancel(token, now=now)
            return None
        if start > res.start:
            res.start, res.end = start, end
            heapq.heappush(self._starts, (start, token))
        if res.start <= now + 1.0:
            del self.waiting[token]
            res.claimed = True
        return res

    def cancel(self, token: str, *, now: float) -> None:
        """Take back a waiting reservation's bytes (its client gave up, or its origin
        failed for it)."""
        res = self.waiting.pop(token, None)
        if res is not None and res.turn is not None:
            res.turn.left_bytes += res.left_bytes  # back to the turn it was placed in
            return
        if res is not None and res.origin in self.books:
            self.books[res.origin].remove(res.left_bytes, now=now)

    def drop_origin(self, name: str) -> None:
        """The origin left the rotation: its queue is gone (its clients fail over and
        are placed again), its waiting reservations forgotten."""
        self.books.pop(name, None)
        self.taken = [t for t in self.taken if t.origin != name]
        for token in [t for t, r in self.waiting.items() if r.origin == name]:
            del self.waiting[token]

    def _expire(self, *, now: float) -> None:
        """Cancel the reservations not claimed within `claim_s` of their start."""
        starts = self._starts
        while starts and starts[0][0] + self.claim_s < now:
            start, token = heapq.heappop(starts)
            res = self.waiting.get(token)
            if res is not None and res.start == start:  # else moved later, or claimed
                self.cancel(token, now=now)
