"""`pressrun sim chord`: lookups on a large Chord ring, before and after mass failure.

The experiment of Stoica et al. (ToN 2003, IV.E, Figs. 10-12) with the real
`ChordNode` core: N nodes with SHA-1 ids start from a converged ring (successor lists
of r = ceil(log2 N) by default); random nodes look up random keys. Then a fraction F of
the nodes fails at once, and the same number of lookups runs *before stabilisation
repairs anything* (the periodic tasks are switched off for the run): a lookup succeeds
when it returns the key's true live successor. Hops count the nodes a lookup reached
(every node that answered a `FindSuccessor`, and the successor itself); timeouts the
requests that went unanswered (each after ``rpc_retries + 1`` tries). The paper reports
a mean path length of about (1/2) log2 N.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pressrun.chord.config import ChordConfig
from pressrun.chord.events import LookupDone
from pressrun.chord.ids import NodeRef, node_id_for
from pressrun.sim.chord_ring import RingNetwork, build_stable_ring, true_successor
from pressrun.sim.engine import EventLoop

#: far beyond any run: stabilisation never runs during the experiment
_NEVER_S = 1e12
#: a bound well above any sane lookup's hops on 2^160 (the core's safety net)
_HOP_BOUND = 160


@dataclass(slots=True)
class LookupPhase:
    """The lookups of one phase (all nodes up, or after the failure)."""

    lookups: int = 0
    succeeded: int = 0
    hops: list[int] = field(default_factory=list)
    timeouts: list[int] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.lookups if self.lookups else 0.0

    @property
    def mean_hops(self) -> float:
        return statistics.fmean(self.hops) if self.hops else 0.0

    @property
    def mean_timeouts(self) -> float:
        return statistics.fmean(self.timeouts) if self.timeouts else 0.0


@dataclass(slots=True)
class ChordSimResult:
    nodes: int
    successor_list_size: int
    fail_fraction: float
    seed: int
    healthy: LookupPhase
    failed: LookupPhase | None
    messages: int

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {
            "nodes": self.nodes,
            "successor_list_size": self.successor_list_size,
            "seed": self.seed,
            "lookups": self.healthy.lookups,
            "mean_hops": round(self.healthy.mean_hops, 3),
            "half_log2_n": round(0.5 * math.log2(self.nodes), 3),
            "p99_hops": _pct(self.healthy.hops, 0.99),
            "success_rate": self.healthy.success_rate,
            "messages": self.messages,
        }
        if self.failed is not None:
            out["fail_fraction"] = self.fail_fraction
            out["after_failure"] = {
                "lookups": self.failed.lookups,
                "success_rate": self.failed.success_rate,
                "mean_hops": round(self.failed.mean_hops, 3),
                "mean_timeouts": round(self.failed.mean_timeouts, 3),
                "failures": dict(self.failed.failures),
            }
        return out


def _pct(xs: list[int], q: float) -> int:
    if not xs:
        return 0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_chord_sim(
    *,
    nodes: int,
    fail_fraction: float = 0.0,
    lookups: int = 2000,
    seed: int = 1,
    successor_list_size: int | None = None,
    latency_s: float = 0.025,
    progress: bool = False,
) -> ChordSimResult:
    """Run the experiment (module docstring) and return its numbers."""
    if nodes < 2:
        raise ValueError("--nodes must be at least 2")
    if not 0.0 <= fail_fraction < 1.0:
        raise ValueError("--fail-fraction must be in [0, 1)")
    if lookups < 1:
        raise ValueError("--lookups must be at least 1")
    r = successor_list_size or max(1, math.ceil(math.log2(nodes)))
    config = ChordConfig(
        successor_list_size=r,
        stabilize_interval_s=_NEVER_S,
        fix_fingers_interval_s=_NEVER_S,
        check_predecessor_interval_s=_NEVER_S,
        max_lookup_hops=_HOP_BOUND,
    )
    rng = random.Random(seed)
    refs = [NodeRef(node_id_for(f"node-{seed}-{i}"), f"node-{i}") for i in range(nodes)]
    _say(progress, f"building a converged ring of {nodes} nodes (r = {r})")
    loop = EventLoop()
    net = RingNetwork(loop, latency_s=latency_s)
    for node in build_stable_ring(refs, config, now=0.0, rng=rng):
        net.add(node)
    _say(progress, f"{lookups} lookups on the healthy ring")
    healthy = _lookups(net, loop, rng, lookups)
    failed: LookupPhase | None = None
    if fail_fraction > 0:
        ids = sorted(net.nodes)
        for victim in rng.sample(ids, int(fail_fraction * nodes)):
            net.kill(victim)
        _say(progress, f"{int(fail_fraction * nodes)} nodes failed at once; {lookups} lookups")
        failed = _lookups(net, loop, rng, lookups)
    return ChordSimResult(
        nodes=nodes,
        successor_list_size=r,
        fail_fraction=fail_fraction,
        seed=seed,
        healthy=healthy,
        failed=failed,
        messages=net.delivered + net.lost,
    )


def _lookups(net: RingNetwork, loop: EventLoop, rng: random.Random, count: int) -> LookupPhase:
    live = net.live_ids()
    net.results.clear()
    asked: list[tuple[int, int, int]] = []
    for _ in range(count):
        src = net.nodes[live[rng.randrange(len(live))]]
        key = rng.getrandbits(160)
        lid, effects = src.lookup(key, now=loop.now)
        net.apply(src, effects)
        asked.append((src.me.id, lid, key))
    loop.run(loop.now + 3600.0)
    phase = LookupPhase(lookups=count)
    for nid, lid, key in asked:
        res = net.results.get((nid, lid))
        if isinstance(res, LookupDone):
            phase.hops.append(res.hops)
            phase.timeouts.append(res.timeouts)
            if res.successor.id == true_successor(live, key):
                phase.succeeded += 1
            else:
                phase.failures["wrong successor"] += 1
        elif res is None:
            phase.failures["unfinished"] += 1
        else:
            phase.timeouts.append(res.timeouts)
            phase.failures[res.reason] += 1
    return phase


def _say(on: bool, msg: str) -> None:
    if on:
        print(f"pressrun sim chord: {msg}", flush=True)


def format_chord(result: ChordSimResult) -> str:
    """The result as a small table."""
    h = result.healthy
    lines = [
        f"Chord ring: {result.nodes} nodes, successor lists of {result.successor_list_size}, "
        f"seed {result.seed}",
        f"{'phase':<22}{'lookups':>8}{'success':>10}{'mean hops':>11}{'p99 hops':>10}"
        f"{'timeouts':>10}",
        f"{'all nodes up':<22}{h.lookups:>8}{h.success_rate:>10.2%}{h.mean_hops:>11.2f}"
        f"{_pct(h.hops, 0.99):>10}{h.mean_timeouts:>10.2f}",
    ]
    f = result.failed
    if f is not None:
        lines.append(
            f"{f'{result.fail_fraction:.0%} failed at once':<22}{f.lookups:>8}"
            f"{f.success_rate:>10.2%}{f.mean_hops:>11.2f}{_pct(f.hops, 0.99):>10}"
            f"{f.mean_timeouts:>10.2f}"
        )
    lines.append(
        f"(1/2) log2 N = {0.5 * math.log2(result.nodes):.2f} (the Chord paper's mean path length)"
    )
    return "\n".join(lines)


def plot_hops(result: ChordSimResult, path: Path) -> Path:
    """A histogram of lookup hops (healthy ring, and after the failure if any) as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    phases = [("all nodes up", result.healthy)]
    if result.failed is not None:
        phases.append((f"{result.fail_fraction:.0%} failed", result.failed))
    top = max(max(p.hops, default=0) for _, p in phases)
    bins = [b - 0.5 for b in range(top + 2)]
    for label, phase in phases:
        ax.hist(
            phase.hops,
            bins=bins,
            alpha=0.6,
            density=True,
            label=f"{label} (mean {phase.mean_hops:.2f})",
        )
    ax.axvline(0.5 * math.log2(result.nodes), color="k", linestyle="--", label="(1/2) log2 N")
    ax.set_xlabel("hops per lookup")
    ax.set_ylabel("share of lookups")
    ax.set_title(f"Chord lookups, N = {result.nodes}, r = {result.successor_list_size}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
