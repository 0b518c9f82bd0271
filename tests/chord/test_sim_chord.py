"""`pressrun sim chord` at a small N: the numbers and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pressrun.cli import main
from pressrun.sim.chord_run import run_chord_sim


def test_hops_near_half_log2_n_and_lookups_survive_a_mass_failure() -> None:
    res = run_chord_sim(nodes=1024, fail_fraction=0.2, lookups=400, seed=3)
    assert res.healthy.success_rate == 1.0
    assert abs(res.healthy.mean_hops - 0.5 * math.log2(1024)) < 1.0
    assert res.failed is not None
    assert res.failed.success_rate >= 0.99
    assert res.failed.mean_timeouts > 0  # dead nodes were met and routed around
    # same seed, same run
    again = run_chord_sim(nodes=1024, fail_fraction=0.2, lookups=400, seed=3)
    assert again.healthy.hops == res.healthy.hops and again.failed is not None
    assert again.failed.hops == res.failed.hops


def test_cli_writes_json_and_histogram(tmp_path: Path, capsys: object) -> None:
    assert main(["sim", "chord", "--nodes", "200", "--lookups", "50", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "chord-200-seed1.json").read_text())
    assert summary["success_rate"] == 1.0
    assert (tmp_path / "chord-200-seed1-hops.png").stat().st_size > 1000
    assert main(["sim", "chord", "--nodes", "1"]) == 2
