"""A small emulation end to end: the images, the compose project, six client
containers on shaped links (one kind lossy), the report. Runs where a container engine can
start (root, docker.io installed) and skips with the reason otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pressrun.emulate.engine import why_no_engine

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def engine_reason() -> str | None:
    import os

    if os.environ.get("DOCKER_HOST"):
        return None
    return why_no_engine()


def test_small_emulation_delivers_every_file_verified(
    tmp_path: Path, engine_reason: str | None
) -> None:
    if engine_reason is not None:
        pytest.skip(f"no container engine can start here: {engine_reason}")
    out = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pressrun.cli",
            "emulate",
            "--scenario",
            "small",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    run = summary["variants"]["emulation"]
    assert run["clients"] == 6
    assert run["verified"] == 6
    clients = run["per_client"]
    assert {c["link"] for c in clients} <= {"dsl-20", "lossy-8"}
    assert all(c["seconds"] > 0 and c["exit_code"] == 0 for c in clients)
    # demand passed the balancer's low threshold: later clients were sent to the swarm
    assert "swarm" in run["modes"], run["modes"]
    # every origin was polled during the run and together they sent at least one copy
    assert set(run["origin_egress_bytes"]) == {"origin-a", "origin-b", "origin-c"}
    assert run["origin_egress_total_bytes"] >= summary["issue"]["size_bytes"]
    # the two tracker instances answer from the one Redis: the same swarm
    views = run["trackers"]
    assert views["tracker-1"]["completed"] == views["tracker-2"]["completed"] >= 1
    assert len(views["tracker-1"]["peers"]) == len(views["tracker-2"]["peers"])
    assert (out / "egress.png").stat().st_size > 10_000
    assert (out / "clients.png").stat().st_size > 10_000
    # the multicast sender was polled all along (its bytes are in the report)
    assert len(run["sender_series"]) >= 2
    assert "[emulation] tearing down" in done.stdout
    assert (out / "emulation-services.log").stat().st_size > 0
