"""Ring invariants under random join / leave / fail sequences (Hypothesis stateful).

The real `ChordNode` cores on `pressrun.sim.chord_ring.RingNetwork` (virtual time, a
25 ms one-way latency). After every change the machine may let the ring stabilise
(30 virtual seconds, 30 stabilisation rounds); then every key has exactly one live node
that answers for it, and lookups of the same keys from every live node agree on that
node. At most r - 1 nodes fail between two stabilisations (a ring whose r consecutive
nodes all fail at once cannot be repaired by Chord: ToN IV.E.3).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pressrun.chord.config import ChordConfig
from pressrun.chord.core import ChordNode, Phase
from pressrun.chord.events import LookupDone
from pressrun.chord.ids import RING, NodeRef
from pressrun.sim.chord_ring import RingNetwork, true_successor
from pressrun.sim.engine import EventLoop

CONFIG = ChordConfig(
    successor_list_size=3,
    stabilize_interval_s=1.0,
    fix_fingers_interval_s=0.5,
    check_predecessor_interval_s=1.0,
    rpc_timeout_s=0.3,
)
MAX_NODES = 9


class RingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = EventLoop()
        self.net = RingNetwork(self.loop)
        self.rng = random.Random(7)
        self.count = 0
        self.failed_since_stable = 0
        self.stable = True
        first = self._new_node(self.rng.randrange(RING))
        self.net.apply(first, first.create(now=0.0))

    def _new_node(self, node_id: int) -> ChordNode:
        self.count += 1
        ref = NodeRef(node_id, f"n{self.count}")
        node = ChordNode(ref, CONFIG, now=self.loop.now, rng=random.Random(self.count))
        self.net.add(node)
        return node

    def _live(self) -> list[int]:
        return self.net.live_ids()

    @precondition(lambda self: len(self.net.live_ids()) < MAX_NODES)
    @rule(node_id=st.integers(0, RING - 1), via=st.integers(0, 1000))
    def join(self, node_id: int, via: int) -> None:
        live = self._live()
        if node_id in self.net.nodes:
            return
        node = self._new_node(node_id)
        boot = self.net.nodes[live[via % len(live)]]
        self.net.apply(node, node.join([boot.me], now=self.loop.now))
        self.stable = False

    @precondition(lambda self: len(self.net.live_ids()) > 2)
    @rule(which=st.integers(0, 1000))
    def leave(self, which: int) -> None:
        live = self._live()
        node = self.net.nodes[live[which % len(live)]]
        self.net.apply(node, node.leave(now=self.loop.now))
        self.stable = False

    @precondition(
        lambda self: (
            len(self.net.live_ids()) > 2
            and self.failed_since_stable < CONFIG.successor_list_size - 1
        )
    )
    @rule(which=st.integers(0, 1000))
    def fail(self, which: int) -> None:
        live = self._live()
        self.net.kill(live[which % len(live)])
        self.failed_since_stable += 1
        self.stable = False

    @rule()
    def stabilise(self) -> None:
        self.loop.run(self.loop.now + 30.0)
        self.failed_since_stable = 0
        self.stable = True

    @invariant()
    def ring_is_consistent_after_stabilisation(self) -> None:
        if not self.stable:
            return
        live = self._live()
        nodes = [self.net.nodes[i] for i in live]
        # successor and predecessor pointers form the sorted cycle of live nodes
        for pos, node in enumerate(nodes):
            assert node.phase is Phase.ON_RING
            want_succ = live[(pos + 1) % len(live)]
            assert node.successor.id == want_succ, (pos, len(live))
            if len(live) > 1:
                assert node.predecessor is not None
                assert node.predecessor.id == live[pos - 1]
        keys = [self.rng.randrange(RING) for _ in range(4)] + live[:2]
        for key in keys:
            owners = [n for n in nodes if n.answers_for(key)]
            assert [o.me.id for o in owners] == [true_successor(live, key)]
        # lookups from every live node agree
        asked = []
        for node in nodes:
            for key in keys:
                lid, effects = node.lookup(key, now=self.loop.now)
                self.net.apply(node, effects)
                asked.append((node.me.id, lid, key))
        self.loop.run(self.loop.now + 5.0)
        for nid, lid, key in asked:
            res = self.net.results[(nid, lid)]
            assert isinstance(res, LookupDone), res
            assert res.successor.id == true_successor(live, key)


RingMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRingInvariants = RingMachine.TestCase
