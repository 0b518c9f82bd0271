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
  successor and the node that answered `Found` (the id lies between it and its
  successor) as predecessor, and notify the successor (both answer for their keys at
  once: the paper leaves the predecessor unknown until that node stabilises);
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

The tables themselves live in `pressrun.chord.routing` (`RoutingTable`), the open
requests and lookups in progress in `pressrun.chord.inflight`; this module decides.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
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
from pressrun.chord.ids import ID_BITS, RING, NodeRef, in_half_open, in_open
from pressrun.chord.inflight import Lookup, LookupKind, Lookups, Pending, PendingRequests, Purpose
from pressrun.chord.routing import RoutingTable


class LocalProtocolError(Exception):
    """The caller used the core wrongly (e.g. a lookup before joining)."""


class Phase(Enum):
    NEW = "new"
    JOINING = "joining"
    ON_RING = "on_ring"
    LEFT = "left"


_NO_DEADLINE = float("inf")


class ChordNode:
    """One node of the ring. See the module docstring for the protocol."""

    def __init__(self, me: NodeRef, config: ChordConfig, *, now: float, rng: random.Random) -> None:
        self.me = me
        self.config = config
        self.rng = rng
        self.phase = Phase.NEW
        self.table = RoutingTable(me, config.successor_list_size)
        self._pending = PendingRequests()
        self._lookups = Lookups()
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

    # --- state (read-only views of the routing table) ---------------------------------

    @property
    def predecessor(self) -> NodeRef | None:
        return self.table.predecessor

    @property
    def successors(self) -> list[NodeRef]:
        return self.table.successors

    @property
    def fingers(self) -> list[NodeRef | None]:
        return self.table.fingers

    @property
    def successor(self) -> NodeRef:
        return self.table.successor

    def closest_preceding(self, key: int, limit: int) -> list[NodeRef]:
        """Known nodes in (self, key), closest to ``key`` first (at most ``limit``)."""
        return self.table.closest_preceding(key, limit)

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
        self.table.adopt(predecessor, successors, fingers)

    # --- membership ----------------------------------------------------------

    def restrict_to(self, member_ids: Iterable[int] | None) -> list[Effect]:
        """Accept messages and references only from these node ids (None: anyone).

        Known nodes outside the set are forgotten at once.
        """
        self.table.restrict_to(member_ids)
        if not self.table.successors and self.phase is Phase.ON_RING:
            self.table.successors = [self.me]
        return []

    # --- starting and leaving --------------------------------------------------

    def create(self, *, now: float) -> list[Effect]:
        """Start a new ring with this node alone on it."""
        self._expect(Phase.NEW)
        self.phase = Phase.ON_RING
        self.table.successors = [self.me]
        self.table.predecessor = None
        return [Joined(self.me)]

    def join(self, bootstrap: Sequence[NodeRef], *, now: float) -> list[Effect]:
        """Join through any of ``bootstrap`` (asked in order while they do not answer)."""
        self._expect(Phase.NEW)
        nodes = [b for b in self.table.filter(bootstrap) if b.id != self.me.id]
        if not nodes:
            raise LocalProtocolError("join needs at least one other trusted node")
        self.phase = Phase.JOINING
        lk = Lookup(key=self.me.id, kind=LookupKind.JOIN, candidates=list(nodes))
        return self._lookup_next(self._lookups.start(lk), lk, now)

    def rejoin(self, bootstrap: Sequence[NodeRef], *, now: float) -> list[Effect]:
        """Find our successor again through ``bootstrap``: for a node that lost every
        neighbour (all timed out at once, e.g. on an overloaded host) while the
        membership list still names others. The node stays on the ring meanwhile."""
        self._expect(Phase.ON_RING)
        nodes = [b for b in self.table.filter(bootstrap) if b.id != self.me.id]
        if not nodes:
            return []
        lk = Lookup(key=self.me.id, kind=LookupKind.REJOIN, candidates=list(nodes))
        return self._lookup_next(self._lookups.start(lk), lk, now)

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
            out.extend(self._send(succ, body, Purpose.FIRE_AND_FORGET, now))
        pred = self.predecessor
        if pred is not None and pred.id != self.me.id and pred.id != succ.id:
            out.extend(
                self._send(pred, Leaving(pred, tuple(others), None), Purpose.FIRE_AND_FORGET, now)
            )
        self.phase = Phase.LEFT
        self._pending.clear()
        self._lookups.clear()
        return out

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise LocalProtocolError(f"node is {self.phase.value}, expected {phase.value}")

    # --- requests from other nodes ------------------------------------------------

    def handle_request(self, req: Request, *, now: float) -> list[Effect]:
        """Answer another node's request (the answer is a `Send` of a `Reply`)."""
        if not self.table.trusted(req.sender):
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
        cands = self.table.closest_preceding(key, self.config.lookup_candidates)
        if not cands:
            return Found(key, tuple(self.successors))
        return Closer(key, tuple(cands), tuple(self.successors))

    def _on_notify(self, node: NodeRef) -> list[Effect]:
        if node.id == self.me.id:
            return []
        if self.predecessor is None or in_open(node.id, self.predecessor.id, self.me.id):
            self.table.predecessor = node
            if self.successor.id == self.me.id:
                # alone until now: the notifier is also our successor
                self.table.successors = [node]
            return [PredecessorChanged(node)]
        return []

    def _on_leaving(self, sender: NodeRef, body: Leaving) -> list[Effect]:
        out: list[Effect] = []
        pred_left = self.predecessor is not None and self.predecessor.id == sender.id
        succ_left = self.successor.id == sender.id
        self.table.forget(sender)
        if pred_left:
            new_pred = body.predecessor
            if new_pred is not None and (
                new_pred.id == self.me.id or not self.table.trusted(new_pred)
            ):
                new_pred = None
            self.table.predecessor = new_pred
            out.append(PredecessorChanged(new_pred))
            if body.handoff is not None:
                out.append(HandoffReceived(sender, body.handoff))
        if succ_left:
            rest = [s for s in self.table.filter(body.successors) if s.id != sender.id]
            if rest:
                self.table.learn_successors(rest[0], rest[1:])
        return out

    # --- replies to our requests ----------------------------------------------------

    def handle_reply(self, rep: Reply, *, now: float) -> list[Effect]:
        """An answer to one of our requests."""
        pending = self._pending.take(rep.rpc_id, rep.sender.id)
        if pending is None:
            self.messages_dropped += 1
            return [MessageDropped(rep.sender, DropReason.UNKNOWN_RPC)]
        body = rep.body
        if pending.purpose is Purpose.STABILIZE:
            self._stabilizing = False
            if isinstance(body, State):
                return self._on_state(rep.sender, body, now)
            return []
        if pending.purpose is Purpose.CHECK_PREDECESSOR:
            self._checking_pred = False
            return []
        if pending.purpose is Purpose.FIRE_AND_FORGET or pending.lookup_id is None:
            return []
        lid = pending.lookup_id
        lk = self._lookups.get(lid)
        if lk is None:
            return []
        lk.hops += 1
        if pending.purpose is Purpose.LOOKUP_VERIFY:
            # the successor itself is the last node the lookup reaches
            return self._lookup_done(lid, lk, rep.sender, now)
        if isinstance(body, Found):
            lk.finder = rep.sender
            lk.found(self.table.filter(body.successors))
            return self._verify_next(lid, lk, now)
        if isinstance(body, Closer) and lk.take_closer(rep.sender, body, self.table.filter):
            return self._verify_next(lid, lk, now)
        return self._lookup_next(lid, lk, now)

    def _on_state(self, succ: NodeRef, body: State, now: float) -> list[Effect]:
        out: list[Effect] = []
        p = body.predecessor
        if (
            p is not None
            and self.table.trusted(p)
            and p.id != self.me.id
            and in_open(p.id, self.me.id, succ.id)
        ):
            # someone joined between us and our successor
            self.table.learn_successors(p, [succ, *body.successors])
        else:
            self.table.learn_successors(succ, body.successors)
        if self.successor.id != self.me.id:
            out.extend(self._send(self.successor, Notify(), Purpose.FIRE_AND_FORGET, now))
        return out

    # --- lookups ---------------------------------------------------------------------

    def lookup(self, key: int, *, now: float) -> tuple[int, list[Effect]]:
        """Start a lookup of ``key``'s successor; (lookup id, effects).

        The result comes as `LookupDone` / `LookupFailed` with that id, maybe among
        these very effects (a key this node can answer from its own tables).
        """
        if self.phase is not Phase.ON_RING:
            raise LocalProtocolError(f"lookup on a node that is {self.phase.value}")
        lk = Lookup(key=key % RING, kind=LookupKind.USER)
        lid = self._lookups.start(lk)
        return lid, self._lookup_local(lid, lk, now)

    def _lookup_local(self, lid: int, lk: Lookup, now: float) -> list[Effect]:
        step = self._find_step(lk.key)
        if isinstance(step, Found):
            lk.found(list(step.successors))
            return self._verify_next(lid, lk, now)
        lk.candidates = list(step.candidates)
        return self._lookup_next(lid, lk, now)

    def _lookup_next(self, lid: int, lk: Lookup, now: float) -> list[Effect]:
        if lk.hops + lk.timeouts >= self.config.max_lookup_hops:
            return self._lookup_failed(lid, lk, "too many hops", now)
        nxt = lk.next_candidate(self.me.id)
        if nxt is None:
            return self._lookup_failed(lid, lk, "no node left to ask", now)
        return self._send(nxt, FindSuccessor(lk.key), Purpose.LOOKUP_STEP, now, lid)

    def _verify_next(self, lid: int, lk: Lookup, now: float) -> list[Effect]:
        # Ping the successors in turn: the first that answers is the key's successor.
        if not lk.successors:
            return self._lookup_failed(lid, lk, "every successor is down", now)
        cand = lk.successors.pop(0)
        if cand.id == self.me.id:
            return self._lookup_done(lid, lk, cand, now)
        return self._send(cand, Ping(), Purpose.LOOKUP_VERIFY, now, lid)

    def _lookup_done(self, lid: int, lk: Lookup, succ: NodeRef, now: float) -> list[Effect]:
        self._lookups.end(lid)
        if lk.kind is LookupKind.JOIN or lk.kind is LookupKind.REJOIN:
            if succ.id == self.me.id:
                return []  # (a rejoin that found only us: still alone)
            self.phase = Phase.ON_RING
            self.table.successors = [succ]
            # The node that answered the lookup of our own id has it between itself
            # and its successor: it is our predecessor, and we answer for the keys
            # between it and us at once (the successor, notified now, gives them up
            # at once). Left unknown until that node's next stabilisation notified
            # us, a supernode that had just joined answered for no key for up to
            # ``stabilize_interval_s``: a fifth of a 160-piece issue's keys `not_mine`
            # with five supernodes (docs/chord.md). A node that joined between it and
            # us meanwhile notifies us at its next stabilisation, as in Chord.
            pred = lk.finder
            if pred is not None and (
                pred.id == self.me.id or not in_open(self.me.id, pred.id, succ.id)
            ):
                pred = None
            self.table.predecessor = pred
            out: list[Effect] = [Joined(succ)]
            if pred is not None:
                out.append(PredecessorChanged(pred))
            return [*out, *self._send(succ, Notify(), Purpose.FIRE_AND_FORGET, now)]
        if lk.kind is LookupKind.FINGER:
            self._finger_lookup = None
            self._next_finger = self.table.set_fingers_from(lk.finger, succ)
            return []
        return [LookupDone(lid, lk.key, succ, lk.hops, lk.timeouts)]

    def _lookup_failed(self, lid: int, lk: Lookup, reason: str, now: float) -> list[Effect]:
        self._lookups.end(lid)
        if lk.kind is LookupKind.JOIN:
            self.phase = Phase.NEW  # the caller may join again through other nodes
            return [LookupFailed(lid, lk.key, lk.hops, lk.timeouts, f"join: {reason}")]
        if lk.kind is LookupKind.FINGER:
            self._finger_lookup = None
            return []
        if lk.kind is LookupKind.REJOIN:
            return []  # the caller tries again later
        return [LookupFailed(lid, lk.key, lk.hops, lk.timeouts, reason)]

    # --- sending, timers and timeouts ------------------------------------------------

    def _send(
        self,
        to: NodeRef,
        body: RequestBody,
        purpose: Purpose,
        now: float,
        lookup_id: int | None = None,
    ) -> list[Effect]:
        rpc = self._pending.open(to, body, purpose, now + self.config.rpc_timeout_s, lookup_id)
        self.messages_sent += 1
        return [Send(to, Request(rpc, self.me, body))]

    def next_deadline(self) -> float | None:
        """When `handle_timer` must next run (None: never, e.g. after leaving)."""
        if self.phase is Phase.LEFT or self.phase is Phase.NEW:
            return None
        t = self._pending.next_deadline()
        if self.phase is Phase.ON_RING:
            t = min(t, self._stabilize_at, self._fix_at, self._check_at)
        return None if t == _NO_DEADLINE else t

    def handle_timer(self, *, now: float) -> list[Effect]:
        """Resend or give up on overdue requests; run the periodic tasks that are due."""
        out: list[Effect] = []
        for rpc, p in self._pending.overdue(now):
            # (an earlier timeout's effects may have closed it already)
            if self._pending.still_open(rpc):
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

    def _on_timeout(self, rpc: int, p: Pending, now: float) -> list[Effect]:
        if p.attempts <= self.config.rpc_retries:
            p.attempts += 1
            p.deadline = now + self.config.rpc_timeout_s
            self.messages_sent += 1
            return [Send(p.to, Request(rpc, self.me, p.body))]
        self._pending.close(rpc)
        out: list[Effect] = []
        if self.phase is Phase.ON_RING:
            self.table.forget(p.to)
            out.append(NodeFailed(p.to))
        if p.purpose is Purpose.STABILIZE:
            self._stabilizing = False
        elif p.purpose is Purpose.CHECK_PREDECESSOR:
            self._checking_pred = False
            if self.predecessor is None:
                out.append(PredecessorChanged(None))
        elif p.lookup_id is not None:
            lk = self._lookups.get(p.lookup_id)
            if lk is not None:
                lk.timeouts += 1
                lk.dead.add(p.to.id)
                # (a dead successor: ping the next; a dead step: route around it)
                if p.purpose is Purpose.LOOKUP_VERIFY or lk.route_around(p.to, self.table.filter):
                    out.extend(self._verify_next(p.lookup_id, lk, now))
                else:
                    out.extend(self._lookup_next(p.lookup_id, lk, now))
        return out

    def _stabilize(self, now: float) -> list[Effect]:
        succ = self.successor
        if succ.id == self.me.id:
            # alone, or our successor list ran dry: a known predecessor is a successor
            if self.predecessor is None:
                return []
            succ = self.predecessor
            self.table.successors = [succ]
        if self._stabilizing:
            return []
        self._stabilizing = True
        return self._send(succ, GetState(), Purpose.STABILIZE, now)

    def _fix_fingers(self, now: float) -> list[Effect]:
        if self._finger_lookup is not None:
            return []
        i = self._next_finger
        lk = Lookup(key=self.table.finger_start(i), kind=LookupKind.FINGER, finger=i)
        lid = self._lookups.start(lk)
        self._finger_lookup = lid
        return self._lookup_local(lid, lk, now)

    def _check_predecessor(self, now: float) -> list[Effect]:
        pred = self.predecessor
        if pred is None or self._checking_pred or pred.id == self.me.id:
            return []
        self._checking_pred = True
        return self._send(pred, Ping(), Purpose.CHECK_PREDECESSOR, now)
