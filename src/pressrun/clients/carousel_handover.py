"""Leaving the swarm for the carousel without a gap: the hand-over's decisions.

Once a swarm client has chosen the issue's carousel (:mod:`.carousel_switch`), the
order is:

1. the pieces the swarm holds (libtorrent's view) that are not verified yet are read
   back from the partial file against the signed manifest (`CheckPieces`): the bytes
   the decoder will read are the ones checked, and only held pieces are read (before,
   every piece of the file was hashed again after the swarm had closed: 0.1-1.0 s);
2. the carousel's receive starts at once with those pieces (`StartReceive`): the
   decoder takes their source symbols as arrived, and the watch's plan is joined
   without waiting for the next announcement; the swarm keeps running meanwhile;
3. when the receive's first packets have come (`handle_receive_running`) the swarm
   is closed (`StopSwarm`; its close, 0.5-0.7 s, now runs beside the receive);
4. the pieces the swarm completed after step 1 are checked when it has closed (their
   bytes are on disk then) and counted as the swarm's: the carousel's figure is what
   it brought beyond every piece verified from elsewhere, so no piece is counted twice.

Before (flash-crowd-50-desktops at a23629d, 29 Nov), the swarm was closed and every
piece hashed before the receive began, and the receive then waited for the next
announcement: a leaver joined the carousel 1.3-1.9 s after the sender started it,
against 0.3 s for a reader already waiting for it.

Either side failing leaves the other going: a receive that ends before its first
packet leaves the client in the swarm (`resume_swarm`); a swarm that fails or stalls
meanwhile leaves the receive running with what was handed to it; a swarm that
completes the copy first (its final check read every piece) stops the receive.

Pure: no clock, no I/O; `swarm_handoff` runs the effects and feeds the outcomes in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import Enum

from pressrun.clients.events import LocalProtocolError

__all__ = [
    "CarouselHandover",
    "CheckPieces",
    "HandoverEffect",
    "ReceiveSide",
    "StartReceive",
    "StopReceive",
    "StopSwarm",
    "SwarmSide",
]


@dataclass(frozen=True, slots=True)
class CheckPieces:
    """Read these pieces back from the partial file against the manifest
    (`CarouselHandover.handle_checked` with the ones that match)."""

    pieces: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartReceive:
    """Start the carousel's receive; its decoder takes ``known`` (verified pieces) as
    arrived."""

    known: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StopSwarm:
    """Close the swarm session: the receive runs."""


@dataclass(frozen=True, slots=True)
class StopReceive:
    """Stop the receive: the swarm completed the copy first."""


HandoverEffect = CheckPieces | StartReceive | StopSwarm | StopReceive


class SwarmSide(Enum):
    RUNNING = "running"
    CLOSING = "closing"  # told to stop (`StopSwarm`)
    ENDED = "ended"


class ReceiveSide(Enum):
    WAITING = "waiting"  # the held pieces are being checked before it starts
    STARTED = "started"  # joining; no packet yet
    RUNNING = "running"  # its first packets came
    ENDED = "ended"


class CarouselHandover:
    """One hand-over from the swarm to the carousel (the module docstring).

    ``num_pieces``: the issue's; ``kept``: pieces verified before (a resume), handed
    to the receive and never counted as the carousel's.
    """

    def __init__(self, num_pieces: int, kept: Iterable[int] = ()) -> None:
        if num_pieces < 1:
            raise ValueError("an issue has at least one piece")
        self.num_pieces = num_pieces
        #: pieces verified against the manifest from elsewhere than the carousel
        self.verified: set[int] = {i for i in kept if 0 <= i < num_pieces}
        #: the pieces the receive's decoder was given
        self.handed: tuple[int, ...] = ()
        #: pieces the carousel's copy verified (the receive's outcome)
        self.carousel: set[int] = set()
        self.swarm = SwarmSide.RUNNING
        self.receive = ReceiveSide.WAITING
        #: the swarm's own final check passed: every piece is verified
        self.swarm_completed = False
        #: the receive's first packets came (the client left the swarm for it)
        self.ran = False
        self._checking: set[int] = set()
        self._started = False

    # --- events in ------------------------------------------------------------

    def start(self, held: Collection[int]) -> list[HandoverEffect]:
        """The carousel was chosen while the swarm holds ``held`` (libtorrent's view)."""
        if self._started:
            raise LocalProtocolError("the hand-over has started already")
        self._started = True
        check = self._to_check(held)
        if check:
            return [check]
        return self._start_receive()

    def handle_checked(
        self, pieces: Collection[int], good: Collection[int]
    ) -> list[HandoverEffect]:
        """A `CheckPieces` ended: of ``pieces``, ``good`` matched the manifest."""
        asked = set(pieces)
        self._checking -= asked
        self.verified |= {i for i in good if i in asked and 0 <= i < self.num_pieces}
        if self.receive is ReceiveSide.WAITING and not self._checking:
            return self._start_receive()
        return []

    def handle_receive_running(self) -> list[HandoverEffect]:
        """The receive's first packets came: the carousel is flowing."""
        if self.receive is not ReceiveSide.STARTED:
            return []  # late news of a receive stopped or ended
        self.receive = ReceiveSide.RUNNING
        self.ran = True
        return self._stop_swarm()

    def handle_swarm_ended(
        self, *, held: Collection[int], completed: bool = False
    ) -> list[HandoverEffect]:
        """The swarm fetch ended: closed after `StopSwarm`, or by itself (failed,
        stalled, or ``completed``: its final check read every piece). ``held``: the
        pieces it held at the end (libtorrent's view, or a stall's checked pieces)."""
        if self.swarm is SwarmSide.ENDED:
            raise LocalProtocolError("the swarm ended twice")
        self.swarm = SwarmSide.ENDED
        if completed:
            self.swarm_completed = True
            self.verified = set(range(self.num_pieces))
            self._checking.clear()
            if self.receive is ReceiveSide.WAITING:
                self.receive = ReceiveSide.ENDED  # never started: nothing to stop
                return []
            if self.receive is not ReceiveSide.ENDED:
                return [StopReceive()]
            return []
        check = self._to_check(held)
        return [check] if check else []

    def handle_receive_ended(self, good: Collection[int]) -> list[HandoverEffect]:
        """The receive ended (complete, failed or stopped); ``good``: the pieces its
        copy verified against the manifest."""
        if self.receive in (ReceiveSide.WAITING, ReceiveSide.ENDED):
            raise LocalProtocolError("no receive is running")
        self.carousel = {i for i in good if 0 <= i < self.num_pieces}
        self.receive = ReceiveSide.ENDED
        if self.carousel - self.verified:
            self.ran = True  # it brought pieces: it ran, whatever its signal said
        return self._stop_swarm() if self.ran else []

    # --- what it decided ------------------------------------------------------

    @property
    def resume_swarm(self) -> bool:
        """The receive ended before its first packet while the swarm still runs: the
        client stays in the swarm (the hand-over is over, nothing was left)."""
        return self.receive is ReceiveSide.ENDED and self.swarm is SwarmSide.RUNNING

    @property
    def done(self) -> bool:
        """Both sides ended and nothing is being checked (or the swarm is resumed)."""
        if self.resume_swarm:
            return True
        return (
            self.swarm is SwarmSide.ENDED
            and self.receive is ReceiveSide.ENDED
            and not self._checking
        )

    def have(self) -> list[int]:
        """Every piece verified, from whichever side."""
        return sorted(self.verified | self.carousel)

    def carousel_only(self) -> list[int]:
        """The pieces only the carousel brought (its bytes): each piece is counted once,
        as the swarm's (or a resume's) when it was verified from there too."""
        return sorted(self.carousel - self.verified)

    # --- helpers --------------------------------------------------------------

    def _to_check(self, held: Collection[int]) -> CheckPieces | None:
        todo = {i for i in held if 0 <= i < self.num_pieces} - self.verified - self._checking
        if not todo:
            return None
        self._checking |= todo
        return CheckPieces(tuple(sorted(todo)))

    def _stop_swarm(self) -> list[HandoverEffect]:
        if self.swarm is SwarmSide.RUNNING:
            self.swarm = SwarmSide.CLOSING
            return [StopSwarm()]
        return []

    def _start_receive(self) -> list[HandoverEffect]:
        if self.swarm is SwarmSide.ENDED and self.swarm_completed:
            self.receive = ReceiveSide.ENDED
            return []
        self.receive = ReceiveSide.STARTED
        self.handed = tuple(sorted(self.verified))
        return [StartReceive(self.handed)]
