"""Headroom dispatch's reserved starts as the algorithm uses them (issue 33): when a
download is placed by the book (`HeadroomBooking._from_book`), the reservation given
out (`reserved_start`) and claimed (`claim_reservation`), and what the book learns of
each pick (`_book_pick`). The queue itself, per origin, is
`pressrun.balancer.algorithms.headroom_reservations`; the rules and the measurements
behind them: docs/balancer.md, "Reserved starts". Moved here from the class
`pressrun.balancer.algorithms.headroom.Headroom`, which inherits them, as they were.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Set

from pressrun.balancer.algorithms.base import ScoredAlgorithm
from pressrun.balancer.algorithms.headroom_model import OriginModel
from pressrun.balancer.algorithms.headroom_reservations import Reservation, Reservations
from pressrun.balancer.events import ClientHint, OriginStatus


class HeadroomBooking(ScoredAlgorithm):
    """The booking methods of `Headroom` (abstract: `Headroom` is the algorithm)."""

    # set by `_init_booking` (and `models` by `Headroom.__init__`)
    reservations: Reservations | None
    reservation_margin_s: float
    reservation_margin_share: float
    refused_at: float
    overload_memory: float
    _planned: Reservation | None
    _claimed: str | None
    _serving_others: set[str]
    models: dict[str, OriginModel]

    @abstractmethod
    def _capacity(self, name: str, status: OriginStatus) -> float:
        """An origin's capacity in bytes per second (`Headroom._capacity`)."""

    @abstractmethod
    def _overloaded(self, memory_s: float, *, now: float) -> bool:
        """Whether the crowd is beyond the room (`Headroom._overloaded`)."""

    def _init_booking(self) -> None:
        """The book's state and parameters (from `Headroom.__init__`)."""
        #: reserved starts under overload (`headroom_reservations`); None: off
        self.reservations = (
            Reservations(
                self._reservable_room,
                transfers=self._transfers_on,
                margin_s=self.param("reservation_margin_s", 30.0),
                claim_s=self.param("reservation_claim_s", 10.0),
                take_ratio=self.param("reservation_take_ratio", 3.0),
            )
            if self.param("reservations", 1.0) > 0
            else None
        )
        #: a queued download must end this long before its deadline: the least of
        #: `reservation_margin_s` and `reservation_margin_share` of the deadline
        self.reservation_margin_s = self.param("reservation_margin_s", 30.0)
        self.reservation_margin_share = self.param("reservation_margin_share", 0.1)
        #: where the book would queue the last `rank_for`'s download: queued by the
        #: pick (a start now) or by `reserved_start` (a start later)
        self._planned = None
        #: the origin of the last reservation claimed (already queued in its book)
        self._claimed = None
        #: origins whose last status shows transfers of issues without a stated
        #: deadline (streams, or issues placed by their class): no book then
        self._serving_others = set()

    def _reservable_room(self, name: str) -> float:
        """Bytes/s the book may reserve on an origin: its capacity as measured (as told
        while not measured yet); 0 out of rotation."""
        status = self.statuses.get(name)
        if status is None:
            return 0.0
        return self._capacity(name, status)

    def _transfers_on(self, name: str) -> float:
        """The transfers an origin runs (its last status) and the picks on their way
        to it: what a download started there now shares its link with."""
        status = self.statuses.get(name)
        m = self.models.get(name)
        running = 0.0 if status is None else float(status.active_transfers)
        return running + (0.0 if m is None else float(m.pending))

    def _from_book(
        self, issue_id: str, client: ClientHint | None, exclude: Set[str], *, now: float
    ) -> list[tuple[str, float]] | None:
        """Under overload, a download whose client tells its size and link, of an issue
        with a stated deadline, is placed by the book (`headroom_reservations`): on the
        origin where its start comes first, now ([origin]) or later ([], with
        `reserved_start` set), or refused ([]) when none ends it in time. None: not
        the book's (not overloaded, or not told enough): ranked by room."""
        book = self.reservations
        deadline = self.issue_deadlines.get(issue_id)
        if (
            book is None
            or deadline is None
            # The book plans the bytes of the downloads it is told of: beside streams
            # (their bitrate held for their play-through) its queue would take their
            # room (gen-7-005: 1311 served by room, 879 with the book), and beside
            # transfers it does not place (the back catalogue, small objects placed
            # by their class) its own would be slower than planned and late (the
            # mixed workload: a back issue unfinished). Those are left to the room.
            or self.paced_issues
            or self._serving_others
            or client is None
            or not client.size_bytes
            or not client.rate_bytes_per_s
            or (not book.waiting and not self._overloaded(self.overload_memory, now=now))
        ):
            return None
        holders = [
            n for n, st in self.statuses.items() if n not in exclude and issue_id in st.issues
        ]
        left = float(max(client.size_bytes - client.have_bytes, 1))
        time_left = deadline - (client.elapsed_s or 0.0)
        margin = min(self.reservation_margin_s, self.reservation_margin_share * deadline)
        # A turn behind the queue; where none ends in time, a start now ahead of it,
        # where that makes no download queued there late (`Reservations.slip_in`: the
        # link is shared evenly). Only then: where the queue gives a turn in time, the
        # client is served either way, and the turns keep the link's transfers few,
        # each at its client's whole rate (one start ahead of each turn put
        # gen-7-033's burst on its biggest origin at once, lost when it failed).
        # Where neither fits, the turn of a waiting download at least
        # `reservation_take_ratio` times bigger (`Reservations.take_turn`): the same
        # bytes serve more clients small.
        planned = None
        for place in (book.plan, book.slip_in, book.take_turn):
            planned = place(
                issue_id,
                holders,
                left_bytes=left,
                rate=client.rate_bytes_per_s,
                time_left_s=time_left,
                now=now,
                margin_s=margin,
            )
            if planned is not None:
                break
        if planned is None:
            self.refused_at = now
            return []
        # Queued when the core acts on it: the pick (`handle_pick_for`), or the
        # reservation it gives out (`reserved_start`).
        self._planned = planned
        if planned.start > now:
            return []
        return [(planned.origin, planned.rate)]

    def reserved_start(self, *, now: float) -> tuple[str, float] | None:
        planned, self._planned = self._planned, None
        if planned is None or planned.claimed or self.reservations is None:
            return None
        res = self.reservations.commit(planned, now=now)
        return res.token, res.start

    def claim_reservation(
        self, issue_id: str, token: str, *, exclude: Set[str] = frozenset(), now: float
    ) -> list[tuple[str, float]] | float | None:
        self._planned = None
        self._claimed = None
        book = self.reservations
        if book is None:
            return None
        held = book.waiting.get(token)
        deadline = self.issue_deadlines.get(issue_id)
        if held is None or held.issue_id != issue_id or deadline is None:
            return None
        res = book.claim(token, deadline_at=held.deadline_at, now=now)
        if res is None:
            return None
        if res.origin in exclude or res.origin not in self.statuses:
            book.cancel(token, now=now)
            return None
        if not res.claimed:
            return res.start
        self._claimed = res.origin
        return [(res.origin, res.rate)]

    def handle_origin_down(self, name: str, *, now: float) -> None:
        super().handle_origin_down(name, now=now)
        if self.reservations is not None:
            self.reservations.drop_origin(name)
            self._serving_others.discard(name)

    def _book_pick(
        self, name: str, issue_id: str, client: ClientHint | None, *, now: float
    ) -> None:
        """The book learns of a pick: a reservation claimed is queued already, a start
        the book planned now is queued, and a download placed by room (not under
        overload) is queued too, so that when overload comes the book knows the bytes
        the origin has to send."""
        planned, self._planned = self._planned, None
        claimed, self._claimed = self._claimed, None
        book = self.reservations
        if book is None or claimed == name:
            return
        if planned is not None and planned.claimed and planned.origin == name:
            book.commit(planned, now=now)
            return
        if (
            client is None
            or not client.size_bytes
            or not client.rate_bytes_per_s
            or issue_id not in self.issue_deadlines
        ):
            return
        # Held to its deadline (not less a margin: it runs now, forecast by the drain
        # alone) when the book weighs a start ahead of the queue.
        book.note(
            name,
            left_bytes=float(max(client.size_bytes - client.have_bytes, 1)),
            now=now,
            due=now + self.issue_deadlines[issue_id] - (client.elapsed_s or 0.0),
        )
