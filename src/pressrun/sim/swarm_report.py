"""`pressrun sim swarm`'s results: the choices side by side, per class, as a table and a plot.

`compare` runs each uploader choice of `swarm_model` on the same scenario and seed;
`SwarmComparison.rows` is what the CLI prints and writes as JSON: per choice the last
completion against the bound, the origin's share, when subscribers may leave fairly,
and the same per class of access link (completions, the ratio rule, upload use over the
run and over each tenth of it: where upload capacity sat idle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pressrun.sim.swarm_model import (
    CHOICES,
    DEFAULT_BLOCKS_PER_PIECE,
    SwarmRun,
    run_swarm,
)
from pressrun.sim.swarm_scenario import SwarmScenario, draw_subscribers, fluid_bound_s

#: the run is cut into this many equal spans for the per-class upload use over time
SPANS = 10


@dataclass(slots=True)
class SwarmComparison:
    scenario: SwarmScenario
    seed: int
    bound_s: float
    runs: list[SwarmRun]

    def class_rows(self, r: SwarmRun) -> list[dict[str, Any]]:
        """Per class of access link: completions, the ratio rule, upload use."""
        credit = np.array(r.class_upload_credit, dtype=np.float64).reshape(
            -1, len(self.scenario.classes)
        )
        uploaded = np.array(r.class_uploaded, dtype=np.float64).reshape(credit.shape)
        spans = np.array_split(np.arange(credit.shape[0]), SPANS)
        out: list[dict[str, Any]] = []
        for c, pc in enumerate(self.scenario.classes):
            mine = r.klass == c
            if not mine.any():
                continue
            done = r.done_at_s[mine]
            leave = _leave_times(r)[mine]
            out.append(
                {
                    "share": pc.share,
                    "upload_mbps": pc.upload_mbps,
                    "download_mbps": pc.download_mbps,
                    "median_done_s": round(float(np.median(done)), 1),
                    "last_done_s": round(float(done.max()), 1),
                    "ratio_by_end": round(float(np.isfinite(r.fair_at_s[mine]).mean()), 4),
                    "leave_median_s": round(float(np.median(leave)), 1),
                    "upload_use": round(_share(uploaded[:, c], credit[:, c]), 4),
                    # the run in SPANS equal spans of time: where this class's upload idled
                    "upload_use_by_span": [
                        round(_share(uploaded[sp, c], credit[sp, c]), 3) for sp in spans
                    ],
                }
            )
        return out

    def rows(self) -> list[dict[str, Any]]:
        unicast = self.scenario.subscribers * self.scenario.file_bytes
        block_bytes = self.scenario.piece_bytes / (
            self.runs[0].blocks_per_piece if self.runs else 1
        )
        out: list[dict[str, Any]] = []
        for r in self.runs:
            fair = r.fair_at_s[np.isfinite(r.fair_at_s)]
            leave = _leave_times(r)
            out.append(
                {
                    "choice": r.choice,
                    "last_done_s": round(r.last_done_s, 1),
                    "vs_bound": round(r.last_done_s / self.bound_s, 3),
                    "median_done_s": round(float(np.median(r.done_at_s)), 1),
                    "origin_share_of_unicast": round(r.origin_blocks * block_bytes / unicast, 6),
                    "origin_copies": round(r.origin_pieces / self.scenario.num_pieces, 2),
                    "ratio_by_end": round(fair.size / self.scenario.subscribers, 4),
                    "leave_median_s": round(float(np.median(leave)), 1),
                    "leave_p90_s": round(float(np.percentile(leave, 90)), 1),
                    # the subscribers' upload left unused, over the whole run (the ramp
                    # while the first pieces spread, and the tail)
                    "upload_idle_share": round(
                        1.0 - float(np.mean(r.upload_use_per_step or [0.0])), 4
                    ),
                    "leave_rule": r.leave,
                    # with a leave rule: how many left by each fair rule (the rest stayed
                    # to the end), and for how long subscribers allowed to leave stayed
                    # as the last holder of a needed piece (subscriber-seconds)
                    "left_by_ratio": r.left_by_ratio,
                    "left_by_not_needed": r.left_by_not_needed,
                    "last_holder_stayed_s": round(r.held_steps * r.step_s, 1),
                    "wall_s": round(r.wall_s, 1),
                    "classes": self.class_rows(r),
                }
            )
        return out


def _leave_times(r: SwarmRun) -> Any:
    """When each subscriber leaves: with no leave rule, when the ratio rule would let it
    (else when nobody needs it any more: the last one finished, not_needed); with one,
    when it left (else the end)."""
    if r.leave == "never":
        return np.minimum(r.fair_at_s, r.last_done_s)
    return np.minimum(r.left_at_s, r.last_done_s)


def _share(used: Any, credit: Any) -> float:
    total = float(np.sum(credit))
    return float(np.sum(used)) / total if total > 0 else 0.0


def compare(
    sc: SwarmScenario,
    choices: tuple[str, ...] = CHOICES,
    *,
    seed: int = 1,
    blocks_per_piece: int = DEFAULT_BLOCKS_PER_PIECE,
    progress: bool = False,
    leave: str = "never",
) -> SwarmComparison:
    """Run each choice on the same scenario and seed (the same subscribers) and leave
    rule (`swarm_leave`)."""
    bound = fluid_bound_s(sc, draw_subscribers(sc, np.random.default_rng(seed)))
    runs = []
    for c in choices:
        if progress:
            print(f"pressrun sim swarm: {sc.name}, uploader choice {c} ...", flush=True)
        run = run_swarm(sc, c, seed=seed, blocks_per_piece=blocks_per_piece, leave=leave)
        if progress:
            print(
                f"pressrun sim swarm: {c}: last done {run.last_done_s:.1f} s "
                f"({run.steps} steps of {run.step_s:.3f} s, {run.wall_s:.1f} s wall)",
                flush=True,
            )
        runs.append(run)
    return SwarmComparison(sc, seed, bound, runs)


def format_comparison(cmp: SwarmComparison) -> str:
    sc = cmp.scenario
    b = cmp.runs[0].blocks_per_piece if cmp.runs else DEFAULT_BLOCKS_PER_PIECE
    window = f", arrivals over {sc.arrival_window_s:g} s" if sc.arrival_window_s else ""
    bound_kind = (
        "fluid, upload counted from each arrival"
        if window
        else "fluid: max(F/u_s, F/d_min, N*F/(u_s + sum u_i))"
    )
    lines = [
        f"{sc.name}: {sc.subscribers} subscribers, {sc.file_bytes / 1e6:.1f} MB in "
        f"{sc.num_pieces} pieces of {b} blocks, origin {sc.origin_upload_mbps:g} Mbit/s"
        f"{window}, seed {cmp.seed}",
        f"lower bound ({bound_kind}) = {cmp.bound_s:.1f} s",
        f"{'choice':<8}{'last done':>11}{'x bound':>9}{'median':>9}{'origin/unicast':>16}"
        f"{'origin copies':>15}{'ratio>=1':>10}{'leave p50':>11}{'leave p90':>11}",
    ]
    for row in cmp.rows():
        lines.append(
            f"{row['choice']:<8}{row['last_done_s']:>10.1f}s{row['vs_bound']:>9.3f}"
            f"{row['median_done_s']:>8.1f}s{row['origin_share_of_unicast']:>16.4%}"
            f"{row['origin_copies']:>15.2f}{row['ratio_by_end']:>10.2%}"
            f"{row['leave_median_s']:>10.1f}s{row['leave_p90_s']:>10.1f}s"
        )
    leave_rule = cmp.runs[0].leave if cmp.runs else "never"
    if leave_rule == "never":
        lines.append(
            "ratio>=1: share that uploaded as much as it downloaded before the last finished; "
            "leave: then, or when nobody needs it any more (the last finished: not_needed)"
        )
    else:
        lines.append(
            f"ratio>=1: share that uploaded as much as it downloaded before the last finished; "
            f"leave: when it left by the fair rules (--leave {leave_rule}), else the end"
        )
        for row in cmp.rows():
            lines.append(
                f"  {row['choice']}: left by ratio {row['left_by_ratio']}, by not_needed "
                f"{row['left_by_not_needed']}; the last holder stayed "
                f"{row['last_holder_stayed_s']:g} subscriber-seconds"
            )
    lines.append(
        f"per class (share up/down Mbit/s): {'median':>8}{'last':>8}{'ratio>=1':>10}"
        f"{'leave p50':>11}{'upload use':>12}  upload use by tenth of the run"
    )
    for row in cmp.rows():
        for c in row["classes"]:
            name = f"{row['choice']} {c['share']:g}: {c['upload_mbps']:g}/{c['download_mbps']:g}"
            lines.append(
                f"  {name:<33}{c['median_done_s']:>7.1f}s{c['last_done_s']:>7.1f}s"
                f"{c['ratio_by_end']:>10.2%}{c['leave_median_s']:>10.1f}s{c['upload_use']:>12.3f}"
                f"  {' '.join(f'{u:.2f}' for u in c['upload_use_by_span'])}"
            )
    return "\n".join(lines)


def plot_comparison(cmp: SwarmComparison, path: Path) -> Path:
    """Completed subscribers over time per choice, the bound marked, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    n = cmp.scenario.subscribers
    for r in cmp.runs:
        ts = [(i + 1) * r.step_s for i in range(len(r.completed_per_step))]
        ax.step(
            ts,
            [c / n for c in r.completed_per_step],
            where="post",
            label=f"{r.choice} (last {r.last_done_s:.0f} s)",
        )
    ax.axvline(cmp.bound_s, color="k", linestyle="--", label=f"lower bound {cmp.bound_s:.0f} s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share of subscribers done")
    ax.set_title(f"{cmp.scenario.name}: uploader choices")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
