"""The Chord core driven by hand with a stepped ``now`` (no sockets, no clock)."""

from __future__ import annotations

import hashlib
import random

import pytest

from pressrun.chord.config import ChordConfig
from pressrun.chord.core import ChordNode, LocalProtocolError, Phase
from pressrun.chord.events import (
    Ack,
    DropReason,
    FindSuccessor,
    GetState,
    HandoffReceived,
    Leaving,
    LookupDone,
    MessageDropped,
    NodeFailed,
    Ping,
    PredecessorChanged,
    Reply,
    Request,
    Send,
)
from pressrun.chord.ids import RING, NodeRef, in_half_open, in_open, node_id_for, piece_key
from pressrun.sim.chord_ring import RingNetwork, build_stable_ring, true_successor
from pressrun.sim.engine import EventLoop


def ref(i: int) -> NodeRef:
    return NodeRef(i, f"n{i}")


def test_intervals_wrap_around_the_ring() -> None:
    assert in_open(5, 3, 7) and not in_open(3, 3, 7) and not in_open(7, 3, 7)
    assert in_open(1, RING - 5, 3) and in_open(RING - 1, RING - 5, 3)
    assert in_half_open(7, 3, 7) and not in_half_open(3, 3, 7)
    assert in_half_open(3, 3, 3) and in_open(4, 3, 3) and not in_open(3, 3, 3)


def test_ids_are_sha1_and_piece_keys_differ_per_piece() -> None:
    assert node_id_for("127.0.0.1:7000") == int(hashlib.sha1(b"127.0.0.1:7000").hexdigest(), 16)
    ih = "ab" * 20
    assert piece_key(ih, 3) == int(
        hashlib.sha1(bytes.fromhex(ih) + b"\x00\x00\x00\x03").hexdigest(), 16
    )
    keys = {piece_key(ih, k) for k in range(100)}
    assert len(keys) == 100 and all(0 <= k < RING for k in keys)
    with pytest.raises(ValueError):
        piece_key(ih, -1)
    with pytest.raises(ValueError):
        NodeRef(RING, "x")


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        ChordConfig(successor_list_size=0)
    with pytest.raises(ValueError):
        ChordConfig(rpc_timeout_s=0)


def test_lookup_before_joining_is_a_local_error() -> None:
    node = ChordNode(ref(1), ChordConfig(), now=0.0, rng=random.Random(1))
    with pytest.raises(LocalProtocolError):
        node.lookup(5, now=0.0)
    with pytest.raises(LocalProtocolError):
        node.join([], now=0.0)


def test_a_request_times_out_is_sent_again_then_the_node_is_routed_around() -> None:
    cfg = ChordConfig(rpc_timeout_s=1.0, rpc_retries=1, stabilize_interval_s=100.0)
    a = ChordNode(ref(10), cfg, now=0.0, rng=random.Random(1))
    a.adopt_state(predecessor=ref(30), successors=[ref(20), ref(30)], fingers=[ref(20)] * 160)
    lid, effects = a.lookup(15, now=0.0)
    ping = [e for e in effects if isinstance(e, Send)]
    assert ping and ping[0].to == ref(20) and isinstance(ping[0].message, Request)
    assert isinstance(ping[0].message.body, Ping)
    # no answer: sent again after the timeout, same rpc id
    again = [e for e in a.handle_timer(now=1.0) if isinstance(e, Send) and e.to == ref(20)]
    assert again and isinstance(again[0].message, Request)
    assert again[0].message.rpc_id == ping[0].message.rpc_id
    # still nothing: 20 is dropped, the lookup goes on to 30
    out = a.handle_timer(now=2.0)
    assert NodeFailed(ref(20)) in out
    nxt = [e for e in out if isinstance(e, Send) and e.to == ref(30)]
    assert nxt and isinstance(nxt[0].message, Request)
    assert a.successor == ref(30)
    done = a.handle_reply(Reply(nxt[0].message.rpc_id, ref(30), Ack()), now=2.1)
    assert done == [LookupDone(lid, 15, ref(30), 1, 1)]


def test_messages_from_nodes_outside_the_list_are_dropped() -> None:
    a = ChordNode(ref(10), ChordConfig(), now=0.0, rng=random.Random(1))
    a.create(now=0.0)
    a.restrict_to([20, 30])
    out = a.handle_request(Request(1, ref(99), FindSuccessor(5)), now=0.0)
    assert out == [MessageDropped(ref(99), DropReason.NOT_A_MEMBER)]
    # a listed node is answered, and strangers in answers are not learned
    ok = a.handle_request(Request(2, ref(20), GetState()), now=0.0)
    assert any(isinstance(e, Send) for e in ok)
    a.adopt_state(predecessor=None, successors=[ref(20), ref(99)], fingers=[None] * 160)
    a.restrict_to([20, 30])
    assert [s.id for s in a.successors] == [20]
    # a reply to a request never sent is dropped too
    assert a.handle_reply(Reply(77, ref(20), Ack()), now=0.0) == [
        MessageDropped(ref(20), DropReason.UNKNOWN_RPC)
    ]


def test_graceful_leave_hands_over_to_the_successor() -> None:
    loop = EventLoop()
    net = RingNetwork(loop)
    cfg = ChordConfig(successor_list_size=3)
    nodes = build_stable_ring(
        [ref(i * 100) for i in range(1, 6)], cfg, now=0.0, rng=random.Random(1)
    )
    for n in nodes:
        net.add(n)
    seen: list[object] = []
    net.on_effect = lambda node, eff: seen.append((node.me.id, eff))
    leaving = nodes[1]  # id 200
    net.apply(leaving, leaving.leave(now=0.0, handoff={"pieces": [1, 2]}))
    loop.run(1.0)
    assert leaving.phase is Phase.LEFT
    assert (300, HandoffReceived(ref(200), {"pieces": [1, 2]})) in seen
    assert (300, PredecessorChanged(ref(100))) in seen
    assert nodes[2].predecessor == ref(100)
    assert nodes[0].successor == ref(300)
    # a Leaving from a node that is not our neighbour changes nothing but the fingers
    stranger = nodes[3].handle_request(Request(9, ref(500), Leaving(None, ())), now=1.0)
    assert any(isinstance(e, Send) for e in stranger)


def test_a_node_that_joins_answers_for_its_keys_at_once() -> None:
    # no stabilisation in the test's time (every minute): the joined node learns its
    # predecessor from the lookup of its own id, the successor gives those keys up on
    # its notify, and every key has exactly one node answering for it. Before, the
    # joined node answered for none until its predecessor's next stabilisation (up to
    # 2 s with the defaults: five supernodes answered for 32, 32, 32, 32 and 0 of 160
    # piece keys right after the last joined)
    loop = EventLoop()
    net = RingNetwork(loop)
    cfg = ChordConfig(
        successor_list_size=3,
        stabilize_interval_s=60.0,
        fix_fingers_interval_s=60.0,
        check_predecessor_interval_s=60.0,
    )
    nodes = build_stable_ring(
        [ref(i * 100) for i in range(1, 6)], cfg, now=0.0, rng=random.Random(1)
    )
    for n in nodes:
        net.add(n)
    new = ChordNode(ref(250), cfg, now=0.0, rng=random.Random(2))
    net.add(new)
    net.apply(new, new.join([nodes[0].me], now=0.0))
    loop.run(0.5)
    assert new.phase is Phase.ON_RING and new.successor == ref(300)
    assert new.predecessor == ref(200) and nodes[2].predecessor == ref(250)
    everyone = [*nodes, new]
    for key in (201, 249, 250, 251, 300, 301, 50, 550):
        owners = [n.me.id for n in everyone if n.answers_for(key)]
        assert owners == [true_successor(net.live_ids(), key)], key


def test_a_converged_ring_answers_every_lookup_correctly() -> None:
    rng = random.Random(3)
    refs = [NodeRef(rng.randrange(RING), f"n{i}") for i in range(300)]
    loop = EventLoop()
    net = RingNetwork(loop)
    nodes = build_stable_ring(refs, ChordConfig(), now=0.0, rng=rng)
    for n in nodes:
        net.add(n)
    live = net.live_ids()
    asked = []
    for _ in range(200):
        src = rng.choice(nodes)
        key = rng.randrange(RING)
        lid, effects = src.lookup(key, now=0.0)
        net.apply(src, effects)
        asked.append((src.me.id, lid, key))
    loop.run(2.0)
    for nid, lid, key in asked:
        res = net.results[(nid, lid)]
        assert isinstance(res, LookupDone) and res.successor.id == true_successor(live, key)
        assert res.hops <= 2 * 9
