"""One Chord node's protocol, pure: messages and ``now`` in, effects out.

Stoica et al., "Chord: a scalable peer-to-peer lookup protocol for Internet
applications" (SIGCOMM 2001; IEEE/ACM ToN 11(1), 2003), sections IV.C-IV.E:

- state: a successor list of r nodes (the first is *the* successor), a predecessor,
  and 160 fingers, finger[i] = successor(id + 2^i);
- lookups are *iterative*: the asking node sends `FindSuccessor(key)` to the best
  node it knows and follows the `Closer` answers (each answerer offers its fingers
  and successors that precede the key, closest to it first) until one answers
  `Found` (the key lies between it and its successor); the asker then pings the
  successors in turn and the first that answers is the result. A node that does not
  answer after the retries is routed around: the next candidate of the last answer;
- join: look up the node's own id through a bootstrap node, take the result as
  successor (predecessor unknown);
- stabilize (every ``stabilize_interval_s``): ask the successor for its predecessor p
  and successor list; if p lies between us and the successor, p becomes the
  successor; refresh our successor list from the successor's; notify the successor;
- notify: a node that lies between our predecessor and us becomes our predecessor;
- fix_fingers (every ``fix_fingers_interval_s``): look up one finger's start; the
  answer also fills the following fingers whose start precedes it;
- check_predecessor (every ``check_predecessor_interval_s``): a predecessor that does
  not answer is forgotten;
- graceful leave (ToN IV.E.4): tell the successor our predecessor (and hand over what
  we answered for) and the predecessor our successor list.

Membership: `restrict_to(ids)` makes the node drop every message from, and every
reference to, a node outside the set (the tracker's list of supernodes for the issue):
ring state from strangers is never trusted. Timers and request timeouts all go through
`next_deadline()` / `handle_timer(now)`.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from pressrun.chord.config import ChordConfig
from pressrun.chord.events import (
    Ack,
    Closer,
    DropReason,
    Effect,
    FindSuccessor,
    Found,
    GetState,
    HandoffReceived,
    Joined,
    Leaving,
    LookupDone,
    LookupFailed,
    MessageDropped,
    NodeFailed,
    Notify,
    Ping,
    PredecessorChanged,
    Reply,
    ReplyBody,
    Request,
    RequestBody,
    Send,
    State,
)
from pressrun.chord.ids import ID_BITS, RING, NodeRef, distance, in_half_open, in_open


class LocalProtocolError(Exception):
    """The caller used the core wrongly (e.g. a lookup before joining)."""


class Phase(Enum):
    NEW = "new"
    JOINING = "joining"
    ON_RING = "on_ring"
    LEFT = "left"


class _Purpose(Enum):
    LOOKUP_STEP = "lookup_step"
    LOOKUP_VERIFY = "lookup_verify"
    STABILIZE = "stabilize"
    CHECK_PREDECESSOR = "check_predecessor"
    FIRE_AND_FORGET = "fire_and_forget"


@dataclass(slots=True)
class _Pending:
    to: NodeRef
    body: RequestBody
    purpose: _Purpose
    deadline: float
    attempts: int = 1
    lookup_id: int | None = None


class _LookupKind(Enum):
    USER = "user"
    FINGER = "finger"
    JOIN = "join"
    REJOIN = "rejoin"


@dataclass(slots=True)
class _Lookup:
    key: int
    kind: _LookupKind
    finger: int = -1
    candidates: list[NodeRef] = field(default_factory=list)
    successors: list[NodeRef] = field(default_factory=list)
    asked: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    closers: list[tuple[NodeRef, Closer]] = field(default_factory=list)
    hops: int = 0
    timeouts: int = 0


_NO_DEADLINE = float("inf")


class ChordNode:
    """One node of the ring. See the module docstring for the protocol."""

    def __init__(self, me: NodeRef, config: ChordConfig, *, now: float, rng: random.Random) -> None:
        self.me = me
        self.config = config
        self.rng = rng
        self.phase = Phase.NEW
        self.predecessor: NodeRef | None = None
        self.successors: list[NodeRef] = []
        self.fingers: list[NodeRef | None] = [None] * ID_BITS
        self._routing: list[NodeRef] | None = None  # distinct fingers + successors, cached
        self._routing_ids: list[int] = []
        self._members: frozenset[int] | None = None
        self._pending: dict[int, _Pending] = {}
        self._lookups: dict[int, _Lookup] = {}
        self._next_rpc = 1
        self._next_lookup = 1
        self._next_finger = 0
        self._finger_lookup: int | None = None
        self._stabilizing = False
        self._checking_pred = False
        # the first rounds start at a random point of their interval, so nodes that
        # start together do not stabilise in lockstep
        self._stabilize_at = now + rng.uniform(0, config.stabilize_interval_s)
        self._fix_at = now + rng.uniform(0, config.fix_fingers_interval_s)
        self._check_at = now + rng.uniform(0, config.check_predecessor_interval_s)
        self.messages_sent = 0
        self.messages_dropped = 0

    # --- membership ----------------------------------------------------------

    def restrict_to(self, member_ids: Iterable[int] | None) -> list[Effect]:
        """Accept messages and references only from these node ids (None: anyone).

        Known nodes outside the set are forgotten at once.
        """
        self._members = None if member_ids is None else frozenset(member_ids) | {self.me.id}
        if self._members is None:
            return []
        keep = self._members
        self.successors = [s for s in self.successors if s.id in keep]
        if self.predecessor is not None and self.predecessor.id not in keep:
            self.predecessor = None
        self.fingers = [f if f is not None and f.id in keep else None for f in self.fingers]
        self._routing = None
        if not self.successors and self.phase is Phase.ON_RING:
            self.successors = [self.me]
        return []

    def _trusted(self, node: NodeRef) -> bool:
        return self._members is None or node.id in self._members

    def _filter(self, nodes: Iterable[NodeRef]) -> list[NodeRef]:
        return [n for n in nodes if self._trusted(n)]

    # --- starting and leaving --------------------------------------------------

    def create(self, *, now: float) -> list[Effect]:
        """Start a new ring with this node alone on it."""
        self._expect(Phase.NEW)
        self.phase = Phase.ON_RING
        self.successors = [self.me]
        self.predecessor = None
        self._routing = None
        return [Joined(self.me)]

    def join(self, bootstrap: Sequence[NodeRef], *, now: float) -> list[Effect]:
        """Join through any of ``bootstrap`` (asked in order while they do not answer)."""
        self._expect(Phase.NEW)
        nodes = [b for b in self._filter(bootstrap) if b.id != self.me.id]
        if not nodes:
            raise LocalProtocolError("join needs at least one other trusted node")
        self.phase = Phase.JOINING
        lk = _Lookup(key=self.me.id, kind=_LookupKind.JOIN, candidates=list(nodes))
        lid = self._new_lookup(lk)
        return self._lookup_next(lid, lk, now)

    def rejoin(self, bootstrap: Sequence[NodeRef], *, now: float) -> list[Effect]:
        """Find our successor again through ``bootstrap``: for a node that lost every
        neighbour (all timed out at once, e.g. on an overloaded host) while the
        membership list still names others. The node stays on the ring meanwhile."""
        self._expect(Phase.ON_RING)
        nodes = [b for b in self._filter(bootstrap) if b.id != self.me.id]
        if not nodes:
            return []
        lk = _Lookup(key=self.me.id, kind=_LookupKind.REJOIN, candidates=list(nodes))
        lid = self._new_lookup(lk)
        return self._lookup_next(lid, lk, now)

    @property
    def alone(self) -> bool:
        """On the ring with nobody else known (successor is itself)."""
        return self.phase is Phase.ON_RING and self.successor.id == self.me.id

    def leave(self, *, now: float, handoff: object = None) -> list[Effect]:
        """Leave gracefully: the successor gets our predecessor and ``handoff``."""
        if self.phase is not Phase.ON_RING:
            self.phase = Phase.LEFT
            return []
        out: list[Effect] = []
        succ = self.successor
        others = [s for s in self.successors if s.id != self.me.id]
        if succ.id != self.me.id:
            body = Leaving(self.predecessor, tuple(others), handoff)
            out.extend(self._send(succ, body, _Purpose.FIRE_AND_FORGET, now))
        pred = self.predecessor
        if pred is not None and pred.id != self.me.id and pred.id != succ.id:
            out.extend(
                self._send(pred, Leaving(pred, tuple(others), None), _Purpose.FIRE_AND_FORGET, now)
            )
        self.phase = Phase.LEFT
        self._pending.clear()
        self._lookups.clear()
        return out

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise LocalProtocolError(f"node is {self.phase.value}, expected {phase.value}")

    # --- state -----------------------------------------------------------------

    @property
    def successor(self) -> NodeRef:
        return self.successors[0] if self.successors else self.me

    def answers_for(self, key: int) -> bool:
        """Whether this node holds ``key`` by its own view: key in (predecessor, self]."""
        if self.phase is not Phase.ON_RING:
            return False
        if self.predecessor is None:
            return self.successor.id == self.me.id
        return in_half_open(key, self.predecessor.id, self.me.id)

    def adopt_state(
        self,
        *,
        predecessor: NodeRef | None,
        successors: Sequence[NodeRef],
        fingers: Sequence[NodeRef | None],
    ) -> None:
        """Take a converged state as is (simulators that start from a stable ring)."""
        if len(fingers) != ID_BITS:
            raise LocalProtocolError(f"fingers must have {ID_BITS} entries")
        self.phase = Phase.ON_RING
        self.predecessor = predecessor
        self.successors = list(successors)[: self.config.successor_list_size] or [self.me]
        self.fingers = list(fingers)
        self._routing = None

    def _routing_table(self) -> tuple[list[NodeRef], list[int]]:
        # Distinct fingers and successors sorted by clockwise distance from us.
        if self._routing is None:
            seen: dict[int, NodeRef] = {}
            for n in self.fingers:
                if n is not None and n.id != self.me.id:
                    seen[n.id] = n
            for n in self.successors:
                if n.id != self.me.id:
                    seen[n.id] = n
            nodes = sorted(seen.values(), key=lambda n: distance(self.me.id, n.id))
            self._routing = nodes
            self._routing_ids = [distance(self.me.id, n.id) for n in nodes]
        return self._routing, self._routing_ids

    def closest_preceding(self, key: int, limit: int) -> list[NodeRef]:
        """Known nodes in (self, key), closest to ``key`` first (at most ``limit``)."""
        nodes, dists = self._routing_table()
        # (key == our own id: every other node precedes it)
        cut = bisect.bisect_left(dists, distance(self.me.id, key) or RING)
        return nodes[max(0, cut - limit) : cut][::-1]

    def _forget(self, node: NodeRef) -> None:
        # A dead or departed node out of every table.
        if node.id == self.me.id:
            return
        self.successors = [s for s in self.successors if s.id != node.id]
        if not self.successors:
            # nothing left in the list: the closest finger, else alone
            nodes, _ = self._routing_table()
            alive = [n for n in nodes if n.id != node.id]
            self.successors = [alive[0]] if alive else [self.me]
        if self.predecessor is not None and self.predecessor.id == node.id:
            self.predecessor = None
        self.fingers = [None if f is not None and f.id == node.id else f for f in self.fingers]
        self._routing = None

    def _learn_successors(self, first: NodeRef, rest: Iterable[NodeRef]) -> None:
        lst = [first]
        for n in self._filter(rest):
            if n.id == self.me.id:
                break  # wrapped around the ring
            if all(n.id != m.id for m in lst):
                lst.append(n)
        self.successors = lst[: self.config.successor_list_size]
        self._routing = None

    # --- requests from other nodes ------------------------------------------------

    def handle_request(self, req: Request, *, now: float) -> list[Effect]:
        """Answer another node's request (the answer is a `Send` of a `Reply`)."""
        if not self._trusted(req.sender):
            self.messages_dropped += 1
            return [MessageDropped(req.sender, DropReason.NOT_A_MEMBER)]
        if self.phase is not Phase.ON_RING:
            self.messages_dropped += 1
            return [MessageDropped(req.sender, DropReason.NOT_ON_RING)]
        body = req.body
        out: list[Effect] = []
        answer: ReplyBody
        if isinstance(body, FindSuccessor):
            answer = self._find_step(body.key)
        elif isinstance(body, GetState):
            answer = State(self.predecessor, tuple(self.successors))
        elif isinstance(body, Notify):
            out.extend(self._on_notify(req.sender))
            answer = Ack()
        elif isinstance(body, Leaving):
            out.extend(self._on_leaving(req.sender, body))
            answer = Ack()
        else:
            answer = Ack()
        self.messages_sent += 1
        out.append(Send(req.sender, Reply(req.rpc_id, self.me, answer)))
        return out

    def _find_step(self, key: int) -> Found | Closer:
        if in_half_open(key, self.me.id, self.successor.id):
            return Found(key, tuple(self.successors))
        cands = self.closest_preceding(key, self.config.lookup_candidates)
        if not cands:
            return Found(key, tuple(self.successors))
        return Closer(key, tuple(cands), tuple(self.successors))

    def _on_notify(self, node: NodeRef) -> list[Effect]:
        if node.id == self.me.id:
            return []
        if self.predecessor is None or in_open(node.id, self.predecessor.id, self.me.id):
            self.predecessor = node
            if self.successor.id == self.me.id:
                # alone until now: the notifier is also our successor
                self.successors = [node]
            self._routing = None
            return [PredecessorChanged(node)]
        return []

    def _on_leaving(self, sender: NodeRef, body: Leaving) -> list[Effect]:
        out: list[Effect] = []
        pred_left = self.predecessor is not None and self.predecessor.id == sender.id
        succ_left = self.successor.id == sender.id
        self._forget(sender)
        if pred_left:
            new_pred = body.predecessor
            if new_pred is not None and (new_pred.id == self.me.id or not self._trusted(new_pred)):
                new_pred = None
            self.predecessor = new_pred
            out.append(PredecessorChanged(new_pred))
            if body.handoff is not None:
                out.append(HandoffReceived(sender, body.handoff))
        if succ_left:
            rest = [s for s in self._filter(body.successors) if s.id != sender.id]
            if rest:
                self._learn_successors(rest[0], rest[1:])
        return out

    # --- replies to our requests ----------------------------------------------------

    def handle_reply(self, rep: Reply, *, now: float) -> list[Effect]:
        """An answer to one of our requests."""
        pending = self._pending.get(rep.rpc_id)
        if pending is None or pending.to.id != rep.sender.id:
            self.messages_dropped += 1
            return [MessageDropped(rep.sender, DropReason.UNKNOWN_RPC)]
        del self._pending[rep.rpc_id]
        body = rep.body
        if pending.purpose is _Purpose.STABILIZE:
            self._stabilizing = False
            if isinstance(body, State):
                return self._on_state(rep.sender, body, now)
            return []
        if pending.purpose is _Purpose.CHECK_PREDECESSOR:
            self._checking_pred = False
            return []
        if pending.purpose is _Purpose.FIRE_AND_FORGET or pending.lookup_id is None:
            return []
        lk = self._lookups.get(pending.lookup_id)
        if lk is None:
            return []
        if pending.purpose is _Purpose.LOOKUP_VERIFY:
            lk.hops += 1  # the successor itself is the last node the lookup reaches
            return self._lookup_done(pending.lookup_id, lk, rep.sender, now)
        lk.hops += 1
        if isinstance(body, Found):
            lk.successors = self._filter(body.successors)
            lk.candidates = []
            return self._verify_next(pending.lookup_id, lk, now)
        if isinstance(body, Closer):
            lk.closers.append((rep.sender, body))
            after = self._past_dead_successors(rep.sender, body, lk)
            if after:
                lk.successors = after
                lk.candidates = []
                return self._verify_next(pending.lookup_id, lk, now)
            fresh = [
                c
                for c in self._filter(body.candidates)
                if c.id not in lk.asked and in_open(c.id, rep.sender.id, lk.key)
            ]
            # closest to the key first; the older candidates stay behind as fallbacks
            merged = {c.id: c for c in [*fresh, *lk.candidates] if c.id not in lk.asked}
            lk.candidates = sorted(merged.values(), key=lambda c: distance(c.id, lk.key))
            return self._lookup_next(pending.lookup_id, lk, now)
        return self._lookup_next(pending.lookup_id, lk, now)

    def _route_around(self, lid: int, lk: _Lookup, dead: NodeRef, now: float) -> list[Effect]:
        # An earlier answerer whose successors before the key are now all known dead
        # is the key's live predecessor: take its first successor after the key.
        lk.candidates = [c for c in lk.candidates if c.id != dead.id]
        for sender, closer in sorted(lk.closers, key=lambda sc: distance(sc[0].id, lk.key)):
            after = self._past_dead_successors(sender, closer, lk)
            if after:
                lk.successors = after
                lk.candidates = []
                return self._verify_next(lid, lk, now)
        return self._lookup_next(lid, lk, now)

    def _past_dead_successors(self, sender: NodeRef, body: Closer, lk: _Lookup) -> list[NodeRef]:
        # The answerer's successors that precede the key are all known dead to this
        # lookup: its first successor at or after the key is the answer (the answerer
        # has not noticed the failure yet; stabilisation would tell it).
        succs = self._filter(body.successors)
        before = [s for s in succs if in_open(s.id, sender.id, lk.key)]
        if not before or any(s.id not in lk.dead for s in before):
            return []
        return [s for s in succs if not in_open(s.id, sender.id, lk.key)]

    def _on_state(self, succ: NodeRef, body: State, now: float) -> list[Effect]:
        out: list[Effect] = []
        p = body.predecessor
        if (
            p is not None
            and self._trusted(p)
            and p.id != self.me.id
            and in_open(p.id, self.me.id, succ.id)
        ):
            # someone joined between us and our successor
            self._learn_successors(p, [succ, *body.successors])
        else:
            self._learn_successors(succ, body.successors)
        if self.successor.id != self.me.id:
            out.extend(self._send(self.successor, Notify(), _Purpose.FIRE_AND_FORGET, now))
        return out

    # --- lookups ---------------------------------------------------------------------

    def lookup(self, key: int, *, now: float) -> tuple[int, list[Effect]]:
        """Start a lookup of ``key``'s successor; (lookup id, effects).

        The result comes as `LookupDone` / `LookupFailed` with that id, maybe among
        these very effects (a key this node can answer from its own tables).
        """
        if self.phase is not Phase.ON_RING:
            raise LocalProtocolError(f"lookup on a node that is {self.phase.value}")
        lk = _Lookup(key=key % RING, kind=_LookupKind.USER)
        lid = self._new_lookup(lk)
        return lid, self._lookup_local(lid, lk, now)

    def _new_lookup(self, lk: _Lookup) -> int:
        lid = self._next_lookup
        self._next_lookup += 1
        self._lookups[lid] = lk
        return lid

    def _lookup_local(self, lid: int, lk: _Lookup, now: float) -> list[Effect]:
        step = self._find_step(lk.key)
        if isinstance(step, Found):
            lk.successors = list(step.successors)
            return self._verify_next(lid, lk, now)
        lk.candidates = list(step.candidates)
        return self._lookup_next(lid, lk, now)

    def _lookup_next(self, lid: int, lk: _Lookup, now: float) -> list[Effect]:
        if lk.hops + lk.timeouts >= self.config.max_lookup_hops:
            return self._lookup_failed(lid, lk, "too many hops", now)
        while lk.candidates:
            nxt = lk.candidates.pop(0)
            if nxt.id == self.me.id or nxt.id in lk.asked:
                continue
            lk.asked.add(nxt.id)
            return self._send(nxt, FindSuccessor(lk.key), _Purpose.LOOKUP_STEP, now, lid)
        return self._lookup_failed(lid, lk, "no node left to ask", now)

    def _verify_next(self, lid: int, lk: _Lookup, now: float) -> list[Effect]:
        # Ping the successors in turn: the first that answers is the key's successor.
        while lk.successors:
            cand = lk.successors.pop(0)
            if cand.id == self.me.id:
                return self._lookup_done(lid, lk, cand, now)
            return self._send(cand, Ping(), _Purpose.LOOKUP_VERIFY, now, lid)
        return self._lookup_failed(lid, lk, "every successor is down", now)

    def _lookup_done(self, lid: int, lk: _Lookup, succ: NodeRef, now: float) -> list[Effect]:
        del self._lookups[lid]
        if lk.kind is _LookupKind.JOIN or lk.kind is _LookupKind.REJOIN:
            if succ.id == self.me.id:
                return []  # (a rejoin that found only us: still alone)
            self.phase = Phase.ON_RING
            self.successors = [succ]
            self.predecessor = None
            self._routing = None
            out: list[Effect] = [Joined(succ)]
            if succ.id != self.me.id:
                out.extend(self._send(succ, Notify(), _Purpose.FIRE_AND_FORGET, now))
            return out
        if lk.kind is _LookupKind.FINGER:
            self._finger_lookup = None
            self._set_fingers_from(lk.finger, succ)
            return []
        return [LookupDone(lid, lk.key, succ, lk.hops, lk.timeouts)]

    def _lookup_failed(self, lid: int, lk: _Lookup, reason: str, now: float) -> list[Effect]:
        del self._lookups[lid]
        if lk.kind is _LookupKind.JOIN:
            self.phase = Phase.NEW  # the caller may join again through other nodes
            return [LookupFailed(lid, lk.key, lk.hops, lk.timeouts, f"join: {reason}")]
        if lk.kind is _LookupKind.FINGER:
            self._finger_lookup = None
            return []
        if lk.kind is _LookupKind.REJOIN:
            return []  # the caller tries again later
        return [LookupFailed(lid, lk.key, lk.hops, lk.timeouts, reason)]

    def _finger_start(self, i: int) -> int:
        return (self.me.id + (1 << i)) % RING

    def _set_fingers_from(self, i: int, succ: NodeRef) -> None:
        # finger[i] = succ, and every following finger whose start precedes succ too
        j = i
        while j < ID_BITS and (
            succ.id == self.me.id or in_half_open(self._finger_start(j), self.me.id, succ.id)
        ):
            self.fingers[j] = succ
            j += 1
            if succ.id == self.me.id:
                break
        self._next_finger = j % ID_BITS if j > i else (i + 1) % ID_BITS
        self._routing = None

    # --- sending, timers and timeouts ------------------------------------------------

    def _send(
        self,
        to: NodeRef,
        body: RequestBody,
        purpose: _Purpose,
        now: float,
        lookup_id: int | None = None,
    ) -> list[Effect]:
        rpc = self._next_rpc
        self._next_rpc += 1
        self._pending[rpc] = _Pending(
            to, body, purpose, now + self.config.rpc_timeout_s, lookup_id=lookup_id
        )
        self.messages_sent += 1
        return [Send(to, Request(rpc, self.me, body))]

    def next_deadline(self) -> float | None:
        """When `handle_timer` must next run (None: never, e.g. after leaving)."""
        if self.phase is Phase.LEFT or self.phase is Phase.NEW:
            return None
        t = min((p.deadline for p in self._pending.values()), default=_NO_DEADLINE)
        if self.phase is Phase.ON_RING:
            t = min(t, self._stabilize_at, self._fix_at, self._check_at)
        return None if t == _NO_DEADLINE else t

    def handle_timer(self, *, now: float) -> list[Effect]:
        """Resend or give up on overdue requests; run the periodic tasks that are due."""
        out: list[Effect] = []
        for rpc, p in sorted(self._pending.items()):
            if p.deadline <= now and rpc in self._pending:
                out.extend(self._on_timeout(rpc, p, now))
        if self.phase is not Phase.ON_RING:
            return out
        if now >= self._stabilize_at:
            self._stabilize_at = now + self.config.stabilize_interval_s
            out.extend(self._stabilize(now))
        if now >= self._fix_at:
            self._fix_at = now + self.config.fix_fingers_interval_s
            out.extend(self._fix_fingers(now))
        if now >= self._check_at:
            self._check_at = now + self.config.check_predecessor_interval_s
            out.extend(self._check_predecessor(now))
        return out

    def _on_timeout(self, rpc: int, p: _Pending, now: float) -> list[Effect]:
        if p.attempts <= self.config.rpc_retries:
            p.attempts += 1
            p.deadline = now + self.config.rpc_timeout_s
            self.messages_sent += 1
            return [Send(p.to, Request(rpc, self.me, p.body))]
        del self._pending[rpc]
        out: list[Effect] = []
        if self.phase is Phase.ON_RING:
            self._forget(p.to)
            out.append(NodeFailed(p.to))
        if p.purpose is _Purpose.STABILIZE:
            self._stabilizing = False
        elif p.purpose is _Purpose.CHECK_PREDECESSOR:
            self._checking_pred = False
            if self.predecessor is None:
                out.append(PredecessorChanged(None))
        elif p.lookup_id is not None:
            lk = self._lookups.get(p.lookup_id)
            if lk is not None:
                lk.timeouts += 1
                lk.dead.add(p.to.id)
                if p.purpose is _Purpose.LOOKUP_VERIFY:
                    out.extend(self._verify_next(p.lookup_id, lk, now))
                else:
                    out.extend(self._route_around(p.lookup_id, lk, p.to, now))
        return out

    def _stabilize(self, now: float) -> list[Effect]:
        succ = self.successor
        if succ.id == self.me.id:
            # alone, or our successor list ran dry: a known predecessor is a successor
            if self.predecessor is not None:
                self.successors = [self.predecessor]
                self._routing = None
                succ = self.predecessor
            else:
                return []
        if self._stabilizing:
            return []
        self._stabilizing = True
        return self._send(succ, GetState(), _Purpose.STABILIZE, now)

    def _fix_fingers(self, now: float) -> list[Effect]:
        if self._finger_lookup is not None:
            return []
        i = self._next_finger
        lk = _Lookup(key=self._finger_start(i), kind=_LookupKind.FINGER, finger=i)
        lid = self._new_lookup(lk)
        self._finger_lookup = lid
        return self._lookup_local(lid, lk, now)

    def _check_predecessor(self, now: float) -> list[Effect]:
        pred = self.predecessor
        if pred is None or self._checking_pred or pred.id == self.me.id:
            return []
        self._checking_pred = True
        return self._send(pred, Ping(), _Purpose.CHECK_PREDECESSOR, now)
