"""Chord core speed and stabilisation traffic.

1. Lookups per second of the core: a converged ring of N nodes (the real `ChordNode`s on
   the simulator's zero-cost network, `pressrun.sim.chord_ring`), random keys from
   random nodes; against a reference measured in the same run: the same answers from a
   sorted list of ids and `bisect` (what a node that knew the whole ring would do).
2. Messages per node per minute of stabilisation at the default intervals
   (`ChordConfig()`: stabilize, fix_fingers, check_predecessor): a converged ring of M
   nodes left alone for 10 virtual minutes; every request and reply counts.

    .venv/bin/python bench/chord.py [--nodes 10000] [--lookups 5000] [--stab-nodes 500]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from pressrun.chord.config import ChordConfig
from pressrun.chord.events import LookupDone
from pressrun.chord.ids import NodeRef, node_id_for
from pressrun.sim.chord_ring import RingNetwork, build_stable_ring, true_successor
from pressrun.sim.engine import EventLoop


def ring(n: int, config: ChordConfig, seed: int) -> tuple[RingNetwork, EventLoop]:
    rng = random.Random(seed)
    refs = [NodeRef(node_id_for(f"bench-{seed}-{i}"), f"n{i}") for i in range(n)]
    loop = EventLoop()
    net = RingNetwork(loop, latency_s=0.0)
    for node in build_stable_ring(refs, config, now=0.0, rng=rng):
        net.add(node)
    return net, loop


def lookups_per_s(n: int, count: int, seed: int) -> tuple[float, float, float]:
    never = 1e12  # periodic tasks off: lookups only
    cfg = ChordConfig(
        successor_list_size=8,
        stabilize_interval_s=never,
        fix_fingers_interval_s=never,
        check_predecessor_interval_s=never,
    )
    net, loop = ring(n, cfg, seed)
    rng = random.Random(seed + 1)
    live = net.live_ids()
    asks = [(net.nodes[live[rng.randrange(n)]], rng.getrandbits(160)) for _ in range(count)]
    t0 = time.monotonic()
    handles = []
    for node, key in asks:
        lid, eff = node.lookup(key, now=loop.now)
        net.apply(node, eff)
        handles.append((node.me.id, lid, key))
    loop.run(loop.now + 1.0)
    core_s = time.monotonic() - t0
    ok = sum(
        1
        for nid, lid, key in handles
        if isinstance(r := net.results[(nid, lid)], LookupDone)
        and r.successor.id == true_successor(live, key)
    )
    t0 = time.monotonic()
    for _, key in asks:
        true_successor(live, key)
    ref_s = time.monotonic() - t0
    hops = statistics.fmean(r.hops for r in net.results.values() if isinstance(r, LookupDone))
    if ok != count:
        raise SystemExit(f"{count - ok} lookups went wrong")
    return count / core_s, count / ref_s, hops


def stabilisation_messages(m: int, seed: int) -> float:
    cfg = ChordConfig()
    net, loop = ring(m, cfg, seed)
    for node in net.nodes.values():
        net.apply(node, [])  # arm every node's timer
    minutes = 10.0
    loop.run(minutes * 60.0)
    return (net.delivered + net.lost) / m / minutes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10000, help="ring size for lookups")
    p.add_argument("--lookups", type=int, default=5000, help="lookups per run")
    p.add_argument("--stab-nodes", type=int, default=500, help="ring size for stabilisation")
    p.add_argument("--runs", type=int, default=3, help="runs (medians printed)")
    args = p.parse_args()
    rates = [lookups_per_s(args.nodes, args.lookups, seed) for seed in range(args.runs)]
    core = statistics.median(r[0] for r in rates)
    ref = statistics.median(r[1] for r in rates)
    hops = statistics.median(r[2] for r in rates)
    print(
        f"lookups: N = {args.nodes}, {args.lookups} per run, {args.runs} runs: core "
        f"{core:,.0f} lookups/s (mean {hops:.2f} hops), bisect reference {ref:,.0f}/s, "
        f"core/reference = {core / ref:.4f}"
    )
    msgs = statistics.median(stabilisation_messages(args.stab_nodes, s) for s in range(args.runs))
    c = ChordConfig()
    print(
        f"stabilisation: {msgs:.1f} messages per node per minute (requests and replies; "
        f"N = {args.stab_nodes}; stabilize every {c.stabilize_interval_s:g} s, fix_fingers "
        f"every {c.fix_fingers_interval_s:g} s, check_predecessor every "
        f"{c.check_predecessor_interval_s:g} s)"
    )


if __name__ == "__main__":
    main()
