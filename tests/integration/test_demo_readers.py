"""``pressrun demo --readers N``: browser readers (the web reader in headless Chromium,
phone profile) beside the demo's clients, and their rows in the report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pressrun.demo.readers import outcome_from_result
from pressrun.reader.browser import why_no_browser

ROOT = Path(__file__).resolve().parents[2]


def test_outcome_counts_sections_and_web_seeds_as_origins_and_peers_apart() -> None:
    result = {
        "status": "complete",
        "seconds": 2.5,
        "bytes_by_origin": {"origin-b": 300, "origin-a": 700},
        "bytes_from_web_seeds": 1000,
        "bytes_from_peers": 3000,
        "mode": "swarm",
    }
    out = outcome_from_result(4, result, sha_ok=True, wall_s=3.0, wave=2)
    assert (out.bytes_from_origins, out.bytes_from_peers) == (2000, 3000)
    assert out.bytes_by_origin == (("origin-a", 700), ("origin-b", 300))
    assert (out.mode, out.seconds, out.wall_s, out.wave, out.verified) == (
        "swarm",
        2.5,
        3.0,
        2,
        True,
    )
    # an app that only downloads from origins: no peer bytes, origin mode
    plain = outcome_from_result(
        1, {"status": "complete", "seconds": 1.0, "bytes_by_origin": {"origin-a": 5}},
        sha_ok=True, wall_s=1.0,
    )  # fmt: skip
    assert (plain.bytes_from_origins, plain.bytes_from_peers, plain.mode) == (5, 0, "origin")
    # a stored file whose SHA-256 is not the publisher's is not verified
    assert not outcome_from_result(1, result, sha_ok=False, wall_s=1.0).verified


def test_negative_readers_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pressrun.cli", "demo", "--readers", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--readers" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(why_no_browser() is not None, reason=str(why_no_browser()))
def test_demo_with_browser_readers_reports_each_reader_verified() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pressrun.cli",
            "demo",
            "--clients",
            "1",
            "--readers",
            "2",
            "--size-mib",
            "2",
            "--waves",
            "1",
            "--no-swarm",
            "--no-multicast",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 clients and 2 browser readers" in done.stdout
    rows = re.findall(
        r"│\s+(\d)\s+│\s+1\s+│\s+(\w+)\s+│\s+[\d.]+\s+│\s+([\d.]+)\s+│\s+([\d.]+)\s+│\s+(\w+)",
        done.stdout,
    )
    readers = [r for r in rows if r[0] in "12" and r[4] == "yes"]
    # each reader took the whole 2 MiB issue (2.1 MB) from the origins (no swarm here)
    assert len(readers) == 2, done.stdout
    for _, mode, origins_mb, peers_mb, _ in readers:
        assert (mode, float(origins_mb), float(peers_mb)) == ("origin", 2.1, 0.0)
    assert "2/2 browser readers verified" in done.stdout
