"""Chord rings in virtual time: the real `ChordNode` cores on a modelled network.

`RingNetwork` plays the adapter's part for many nodes at once: every `Send` a core
returns is delivered to its target ``latency_s`` later (a request to a dead or departed
node is lost, so the asker's own timeout fires), and each node's timer is re-armed from
its `next_deadline()`. The same harness runs the Hypothesis ring test
(tests/chord/test_ring_invariants.py) and `pressrun sim chord`.

`build_stable_ring` starts from a converged ring (successor lists, predecessors and
fingers as stabilisation would leave them) without running 50,000 joins.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pressrun.chord.config import ChordConfig
from pressrun.chord.core import ChordNode, Phase
from pressrun.chord.events import Effect, LookupDone, LookupFailed, Reply, Request, Send
from pressrun.chord.ids import ID_BITS, RING, NodeRef, distance
from pressrun.sim.engine import EventLoop

LookupResult = LookupDone | LookupFailed


@dataclass(slots=True)
class RingNetwork:
    """Nodes by id on one event loop, a fixed one-way latency, the dead ones."""

    loop: EventLoop
    latency_s: float = 0.025
    nodes: dict[int, ChordNode] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    delivered: int = 0
    lost: int = 0
    results: dict[tuple[int, int], LookupResult] = field(default_factory=dict)
    on_effect: Callable[[ChordNode, Effect], None] | None = None
    _armed: dict[int, float] = field(default_factory=dict)

    def add(self, node: ChordNode) -> None:
        self.nodes[node.me.id] = node
        self.dead.discard(node.me.id)

    def live_ids(self) -> list[int]:
        """Sorted ids of the nodes on the ring, alive and not departed."""
        return sorted(
            i for i, n in self.nodes.items() if i not in self.dead and n.phase is Phase.ON_RING
        )

    def apply(self, node: ChordNode, effects: Sequence[Effect]) -> None:
        """Carry out a core's effects and re-arm its timer."""
        for eff in effects:
            if isinstance(eff, Send):
                self.loop.after(self.latency_s, self._deliver, eff.to.id, eff.message)
            elif isinstance(eff, LookupDone | LookupFailed):
                self.results[(node.me.id, eff.lookup_id)] = eff
            if self.on_effect is not None:
                self.on_effect(node, eff)
        self._rearm(node)

    def kill(self, node_id: int) -> None:
        """The node stops answering, without a word (a crash)."""
        self.dead.add(node_id)

    def _deliver(self, to: int, msg: Request | Reply) -> None:
        node = self.nodes.get(to)
        if node is None or to in self.dead or node.phase is Phase.LEFT:
            self.lost += 1
            return
        self.delivered += 1
        now = self.loop.now
        if isinstance(msg, Request):
            self.apply(node, node.handle_request(msg, now=now))
        else:
            self.apply(node, node.handle_reply(msg, now=now))

    def _rearm(self, node: ChordNode) -> None:
        if node.me.id in self.dead:
            return
        deadline = node.next_deadline()
        if deadline is None:
            return
        armed = self._armed.get(node.me.id)
        if armed is not None and armed <= deadline and armed >= self.loop.now:
            return  # an earlier wake-up is already queued; it re-arms after it runs
        self._armed[node.me.id] = deadline
        self.loop.at(deadline, self._wake, node.me.id, deadline)

    def _wake(self, node_id: int, deadline: float) -> None:
        if self._armed.get(node_id) != deadline:
            return
        del self._armed[node_id]
        node = self.nodes[node_id]
        if node_id in self.dead or node.phase is Phase.LEFT:
            return
        self.apply(node, node.handle_timer(now=self.loop.now))


def true_successor(live_sorted: Sequence[int], key: int) -> int:
    """The first live id at or after ``key`` on the ring."""
    i = bisect.bisect_left(live_sorted, key)
    return live_sorted[i % len(live_sorted)]


def build_stable_ring(
    refs: Sequence[NodeRef], config: ChordConfig, *, now: float, rng: random.Random
) -> list[ChordNode]:
    """Nodes in the state a converged ring leaves them: exact successor lists,
    predecessors and fingers (finger[i] = successor(id + 2^i))."""
    ordered = sorted(refs, key=lambda r: r.id)
    ids = [r.id for r in ordered]
    n = len(ordered)
    r = min(config.successor_list_size, max(1, n - 1))
    nodes: list[ChordNode] = []
    for pos, ref in enumerate(ordered):
        node = ChordNode(ref, config, now=now, rng=rng)  # one Random for all: cheaper
        succs = [ordered[(pos + k) % n] for k in range(1, r + 1)] if n > 1 else [ref]
        fingers: list[NodeRef | None] = [None] * ID_BITS
        i = 0
        while i < ID_BITS:
            start = (ref.id + (1 << i)) % RING
            s = ordered[bisect.bisect_left(ids, start) % n]
            # every finger whose start is in (id, s] is s too: up to 2^j <= distance
            d = distance(ref.id, s.id) or RING
            j = min(ID_BITS - 1, d.bit_length() - 1)
            if j >= i:
                fingers[i : j + 1] = [s] * (j + 1 - i)
            i = max(j + 1, i + 1)
        node.adopt_state(
            predecessor=ordered[(pos - 1) % n] if n > 1 else None,
            successors=succs,
            fingers=fingers,
        )
        nodes.append(node)
    return nodes
