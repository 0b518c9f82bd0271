"""A client held at the start line: ready before its release, runs only after it,
and records when it began (the times on the clock the host's event loop reads)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from pressrun.emulate.held import go_path, ready_path, started_path


def test_held_command_runs_only_after_its_release(tmp_path: Path) -> None:
    release = tmp_path / "release"
    release.mkdir()
    key = tmp_path / "publisher.key"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pressrun.emulate.held", "--release-dir", str(release),
         "--name", "7", "--", "keys", "new", "--out", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.perf_counter() + 60
        while not ready_path(release, "7").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.perf_counter() < deadline, "never ready"
            time.sleep(0.05)
        time.sleep(0.5)
        # ready, held: the command has not run
        assert proc.poll() is None
        assert not key.exists()
        released_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        go_path(release, "7").touch()
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert key.exists()
    started = json.loads(started_path(release, "7").read_text())
    assert started["ready"] < released_at <= started["released"] + 0.01
    assert started["released"] - released_at < 5


def test_held_refuses_a_missing_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pressrun.emulate.held", "--release-dir", str(tmp_path),
         "--name", "1"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no pressrun command given" in done.stderr
    assert not ready_path(tmp_path, "1").exists()
