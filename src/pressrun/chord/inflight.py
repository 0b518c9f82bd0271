"""What one Chord node has under way, pure: open requests and lookups in progress.

- Open requests: each carries an rpc id; the node keeps its deadline and how often it
  was sent, so `pressrun.chord.core` can send it again after ``rpc_timeout_s`` and
  declare the node failed after the retries. A reply is matched by rpc id *and*
  sender, so a stranger cannot answer for someone else.
- Lookups (Stoica et al. IV.C, iterative): the candidates still to ask, closest to
  the key first (older ones stay behind as fall-backs), the nodes asked and those
  known dead to this lookup, every `Closer` answer (to route around a dead successor
  without waiting for stabilisation), and the successors to ping once an answerer
  said `Found`. Hops count every node that answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from pressrun.chord.events import Closer, RequestBody
from pressrun.chord.ids import NodeRef, distance, in_open

_NO_DEADLINE = float("inf")


class Purpose(Enum):
    LOOKUP_STEP = "lookup_step"
    LOOKUP_VERIFY = "lookup_verify"
    STABILIZE = "stabilize"
    CHECK_PREDECESSOR = "check_predecessor"
    FIRE_AND_FORGET = "fire_and_forget"


@dataclass(slots=True)
class Pending:
    to: NodeRef
    body: RequestBody
    purpose: Purpose
    deadline: float
    attempts: int = 1
    lookup_id: int | None = None


class PendingRequests:
    """Open requests by rpc id."""

    def __init__(self) -> None:
        self._open: dict[int, Pending] = {}
        self._next_rpc = 1

    def open(
        self,
        to: NodeRef,
        body: RequestBody,
        purpose: Purpose,
        deadline: float,
        lookup_id: int | None,
    ) -> int:
        rpc = self._next_rpc
        self._next_rpc += 1
        self._open[rpc] = Pending(to, body, purpose, deadline, lookup_id=lookup_id)
        return rpc

    def take(self, rpc: int, sender_id: int) -> Pending | None:
        """The request this reply answers (closed now), or None: unknown or wrong sender."""
        p = self._open.get(rpc)
        if p is None or p.to.id != sender_id:
            return None
        del self._open[rpc]
        return p

    def close(self, rpc: int) -> None:
        del self._open[rpc]

    def overdue(self, now: float) -> list[tuple[int, Pending]]:
        return [(rpc, p) for rpc, p in sorted(self._open.items()) if p.deadline <= now]

    def still_open(self, rpc: int) -> bool:
        return rpc in self._open

    def next_deadline(self) -> float:
        return min((p.deadline for p in self._open.values()), default=_NO_DEADLINE)

    def clear(self) -> None:
        self._open.clear()


class LookupKind(Enum):
    USER = "user"
    FINGER = "finger"
    JOIN = "join"
    REJOIN = "rejoin"


@dataclass(slots=True)
class Lookup:
    key: int
    kind: LookupKind
    finger: int = -1
    candidates: list[NodeRef] = field(default_factory=list)
    successors: list[NodeRef] = field(default_factory=list)
    asked: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    closers: list[tuple[NodeRef, Closer]] = field(default_factory=list)
    #: the node that answered `Found`: the key lies between it and its successor
    finder: NodeRef | None = None
    hops: int = 0
    timeouts: int = 0

    def next_candidate(self, me_id: int) -> NodeRef | None:
        """The next node to ask (marked asked), or None when none is left."""
        while self.candidates:
            nxt = self.candidates.pop(0)
            if nxt.id == me_id or nxt.id in self.asked:
                continue
            self.asked.add(nxt.id)
            return nxt
        return None

    def found(self, successors: list[NodeRef]) -> None:
        """An answerer (or we) named the key's successors: ping them next."""
        self.successors = successors
        self.candidates = []

    def take_closer(
        self, sender: NodeRef, body: Closer, trusted: Callable[[Iterable[NodeRef]], list[NodeRef]]
    ) -> bool:
        """Fold in a `Closer` answer; True when it settles the successors to ping."""
        self.closers.append((sender, body))
        after = self.past_dead_successors(sender, body, trusted)
        if after:
            self.found(after)
            return True
        fresh = [
            c
            for c in trusted(body.candidates)
            if c.id not in self.asked and in_open(c.id, sender.id, self.key)
        ]
        # closest to the key first; the older candidates stay behind as fallbacks
        merged = {c.id: c for c in [*fresh, *self.candidates] if c.id not in self.asked}
        self.candidates = sorted(merged.values(), key=lambda c: distance(c.id, self.key))
        return False

    def route_around(
        self, dead: NodeRef, trusted: Callable[[Iterable[NodeRef]], list[NodeRef]]
    ) -> bool:
        """``dead`` (already in `dead`) did not answer; True when an earlier answer
        now settles the successors to ping."""
        # An earlier answerer whose successors before the key are now all known dead
        # is the key's live predecessor: take its first successor after the key.
        self.candidates = [c for c in self.candidates if c.id != dead.id]
        for sender, closer in sorted(self.closers, key=lambda sc: distance(sc[0].id, self.key)):
            after = self.past_dead_successors(sender, closer, trusted)
            if after:
                self.found(after)
                return True
        return False

    def past_dead_successors(
        self, sender: NodeRef, body: Closer, trusted: Callable[[Iterable[NodeRef]], list[NodeRef]]
    ) -> list[NodeRef]:
        # The answerer's successors that precede the key are all known dead to this
        # lookup: its first successor at or after the key is the answer (the answerer
        # has not noticed the failure yet; stabilisation would tell it).
        succs = trusted(body.successors)
        before = [s for s in succs if in_open(s.id, sender.id, self.key)]
        if not before or any(s.id not in self.dead for s in before):
            return []
        return [s for s in succs if not in_open(s.id, sender.id, self.key)]


class Lookups:
    """Lookups in progress by lookup id."""

    def __init__(self) -> None:
        self._by_id: dict[int, Lookup] = {}
        self._next_lookup = 1

    def start(self, lk: Lookup) -> int:
        lid = self._next_lookup
        self._next_lookup += 1
        self._by_id[lid] = lk
        return lid

    def get(self, lid: int) -> Lookup | None:
        return self._by_id.get(lid)

    def end(self, lid: int) -> None:
        del self._by_id[lid]

    def clear(self) -> None:
        self._by_id.clear()
