"""``pressrun serve origin`` as a process: flags, serving, SIGTERM/SIGINT, exit code."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pressrun.cli import build_parser

PRESSRUN = [sys.executable, "-m", "pressrun.cli"]


def _start(content: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [*PRESSRUN, "serve", "origin", "--content", str(content), "--port", "0", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    deadline = time.perf_counter() + 20
    seen = b""
    while time.perf_counter() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.2)
        if ready:
            line = proc.stderr.readline()
            seen += line
            m = re.search(rb"on (http://127\.0\.0\.1:\d+)", line)
            if m:
                return proc, m.group(1).decode()
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"origin did not start: {seen.decode(errors='replace')}")


def test_parser_has_every_flag() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "origin",
            "--content",
            "c",
            "--port",
            "8001",
            "--host",
            "0.0.0.0",
            "--name",
            "origin-a",
            "--capacity-mbps",
            "1000",
            "--egress-cap-mbps",
            "100",
            "--stats-interval-s",
            "0.5",
            "--cache-window-s",
            "60",
            "--shutdown-grace-s",
            "2",
            "--send-timeout-s",
            "30",
            "--stalled-after-s",
            "3",
        ]
    )
    assert (args.send_timeout_s, args.stalled_after_s) == (30.0, 3.0)
    defaults = build_parser().parse_args(
        ["serve", "origin", "--content", "c", "--port", "0", "--capacity-mbps", "1"]
    )
    assert (defaults.send_timeout_s, defaults.stalled_after_s) == (60.0, 5.0)
    assert (args.content, args.port, args.host, args.name) == ("c", 8001, "0.0.0.0", "origin-a")
    assert (args.capacity_mbps, args.egress_cap_mbps) == (1000.0, 100.0)
    assert (args.stats_interval_s, args.cache_window_s, args.shutdown_grace_s) == (0.5, 60.0, 2.0)
    assert callable(args.func)


def test_bad_flags_exit_2(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *PRESSRUN,
            "serve",
            "origin",
            "--content",
            str(tmp_path),
            "--port",
            "0",
            "--capacity-mbps",
            "-5",
        ],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert b"capacity_mbps must be a positive number" in out.stderr
    argv = ["serve", "origin", "--content", str(tmp_path), "--port", "0", "--capacity-mbps", "5"]
    out = subprocess.run(
        [*PRESSRUN, *argv, "--send-timeout-s", "0"],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert b"send_timeout_s must be a positive number" in out.stderr
    out = subprocess.run([*PRESSRUN, *argv, "--workers", "0"], capture_output=True, timeout=30)
    assert out.returncode == 2
    assert b"--workers must be at least 1" in out.stderr


def test_missing_content_dir_exits_1(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *PRESSRUN,
            "serve",
            "origin",
            "--content",
            str(tmp_path / "nope"),
            "--port",
            "0",
            "--capacity-mbps",
            "100",
        ],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert b"does not exist" in out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_then_stops_cleanly_on_a_signal_mid_transfer(
    tmp_path: Path, sig: signal.Signals
) -> None:
    content = tmp_path / "content"
    (content / "issue-1").mkdir(parents=True)
    (content / "issue-1" / "big.bin").write_bytes(os.urandom(4_000_000))
    proc, url = _start(
        content,
        "--name",
        "origin-x",
        "--capacity-mbps",
        "100",
        "--egress-cap-mbps",
        "8",  # 1 MB/s: the download below is still running at the signal
        "--shutdown-grace-s",
        "0.5",
    )
    try:
        with urllib.request.urlopen(f"{url}/stats", timeout=10) as resp:
            doc = json.load(resp)
        assert doc["name"] == "origin-x"
        assert doc["issues"] == ["issue-1"]
        assert doc["egress_cap_bytes_per_s"] == 1_000_000.0
        # start a slow download, then signal the origin while it runs
        slow = subprocess.Popen(
            ["curl", "-s", "-o", "/dev/null", f"{url}/content/issue-1/big.bin"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
        slow.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    log = proc.stderr.read().decode()
    assert rc == 0, log
    assert "signal received, stopping" in log
    assert "transfer cut at shutdown issue=issue-1 file=big.bin" in log
    assert "origin origin-x stopped: 1 transfer(s) running at stop, 1 cut" in log
    assert "Traceback" not in log
