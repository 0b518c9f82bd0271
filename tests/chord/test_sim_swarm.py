"""`pressrun sim swarm`: the piece-level model at a small N, scenario files, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pressrun.cli import main
from pressrun.sim.swarm_model import (
    SwarmScenarioError,
    compare,
    load_swarm_scenario,
    run_swarm,
)

SMALL = """
name = "small"
[swarm]
subscribers = 300
file_mb = 20
piece_kib = 1024
origin_upload_mbps = 10
[[swarm.classes]]
share = 0.5
upload_mbps = 1
download_mbps = 10
[[swarm.classes]]
share = 0.5
upload_mbps = 2
download_mbps = 20
"""


def test_every_choice_delivers_everything_and_never_beats_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    sc = load_swarm_scenario(str(path))
    cmp = compare(sc, seed=2)
    rows = {r["choice"]: r for r in cmp.rows()}
    assert set(rows) == {"ring", "random", "rarest"}
    for run in cmp.runs:
        assert np.isfinite(run.done_at_s).all()  # everyone finished
        assert run.last_done_s >= cmp.bound_s  # nobody beats the fluid bound
        # every byte came from somewhere: the origin sent at least one copy
        assert run.origin_pieces >= sc.num_pieces
    # the ring's choice is no slower than random here, within one slot
    assert rows["ring"]["last_done_s"] <= rows["random"]["last_done_s"] + cmp.runs[0].slot_s
    # same seed, same run
    again = run_swarm(sc, "ring", seed=2)
    assert np.array_equal(again.done_at_s, cmp.runs[0].done_at_s)


def test_bad_scenarios_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(SwarmScenarioError, match="built-in"):
        load_swarm_scenario("no-such")
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.replace("share = 0.5\nupload_mbps = 2", "share = 0.6\nupload_mbps = 2"))
    with pytest.raises(SwarmScenarioError, match="add up"):
        load_swarm_scenario(str(bad))
    bad.write_text("[swarm]\nsubscribers = 10\n")
    with pytest.raises(SwarmScenarioError, match="classes"):
        load_swarm_scenario(str(bad))
    assert load_swarm_scenario("flash-50k").subscribers == 50000


def test_cli_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    rc = main(["sim", "swarm", "--scenario", str(path), "--out", str(tmp_path), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert [c["choice"] for c in summary["choices"]] == ["ring", "random", "rarest"]
    assert (tmp_path / "swarm-small-seed1.png").stat().st_size > 1000
    assert main(["sim", "swarm", "--scenario", str(path), "--choices", "nope"]) == 2
