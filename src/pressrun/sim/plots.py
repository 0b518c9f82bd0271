"""PNG plots of a run, like Figures 3-22 of 000_9aae53f3113e9bd8.txt.

One figure per run: client counts, CPU, RAM and network over time, one line per
machine. matplotlib is imported here (Agg backend) and only when plots are asked for.
"""

from __future__ import annotations

from pathlib import Path

from pressrun.sim.run import RunResult


def plot_run(result: RunResult, path: Path) -> Path:
    """Write the run's four panels to `path` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = (
        ("clients", "clients", 1.0),
        ("cpu", "CPU in use (%)", 100.0),
        ("ram", "RAM in use (%)", 100.0),
        ("out_bytes_per_s", "network out (MB/s)", 1e-6),
    )
    for ax, (attr, label, scale) in zip(axes, panels, strict=True):
        for name, samples in result.samples.items():
            ts = [s.t for s in samples]
            ys = [float(getattr(s, attr)) * scale for s in samples]
            ax.plot(ts, ys, label=name, linewidth=0.9)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time (s)")
    if len(result.samples) <= 12:
        axes[0].legend(loc="upper right", ncol=min(len(result.samples), 6), fontsize="small")
    fig.suptitle(
        f"{result.scenario.name}: {result.algorithm} (seed {result.seed})", fontsize="medium"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
