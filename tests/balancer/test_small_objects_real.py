"""A manifest from a real origin process saturated by bulk transfers (issue 33: small
objects never queue behind bulk ones; docs/balancer.md, "Request classes")."""

from __future__ import annotations

import asyncio
import json
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from balancer.helpers import MB

ISSUE = "weekly-2026-48"
#: the p99 time to a manifest's last byte on loopback, whatever the bulk load (an
#: origin with its egress cap fully taken by bulk transfers)
MANIFEST_P99_TARGET_S = 0.25
CAP_MBPS = 16.0  # 2 MB/s for every transfer together
BULK = 16
FETCHES = 40


def start_origin(content: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pressrun.cli",
            "serve",
            "origin",
            "--content",
            str(content),
            "--port",
            "0",
            "--capacity-mbps",
            str(CAP_MBPS),
            "--egress-cap-mbps",
            str(CAP_MBPS),
            "--stats-interval-s",
            "0.5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    deadline = time.perf_counter() + 30
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


@pytest.fixture
def content(tmp_path: Path) -> Path:
    issue = tmp_path / "content" / ISSUE
    issue.mkdir(parents=True)
    with open(issue / f"{ISSUE}.pdf", "wb") as f:
        f.truncate(64 * 2**20)  # 64 MiB: far more than the test sends
    (issue / "manifest.json").write_text(json.dumps({"pieces": ["0" * 64] * 60}))
    return tmp_path / "content"


async def test_a_manifest_answers_within_its_target_while_bulk_transfers_fill_the_cap(
    content: Path,
) -> None:
    proc, url = start_origin(content)
    try:
        async with aiohttp.ClientSession() as http:
            stop = asyncio.Event()

            async def bulk() -> int:
                got = 0
                async with http.get(f"{url}/content/{ISSUE}/{ISSUE}.pdf") as r:
                    assert r.status == 200
                    async for chunk in r.content.iter_chunked(65536):
                        got += len(chunk)
                        if stop.is_set():
                            break
                return got

            tasks = [asyncio.create_task(bulk()) for _ in range(BULK)]
            await asyncio.sleep(2.0)  # the cap is taken: every transfer waits its turn
            async with http.get(f"{url}/stats") as r:
                stats = await r.json()
            assert stats["active_transfers"] >= BULK
            took: list[float] = []
            for _ in range(FETCHES):
                start = time.perf_counter()
                async with http.get(f"{url}/content/{ISSUE}/manifest.json") as r:
                    assert r.status == 200
                    await r.read()
                took.append(time.perf_counter() - start)
                await asyncio.sleep(0.05)
            async with http.get(f"{url}/stats") as r:
                after = await r.json()
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # the bulk transfers kept the cap full meanwhile (the origin's last interval)
        assert after["out_bytes_per_s"] >= 0.8 * CAP_MBPS / 8 * MB
        took.sort()
        p99 = took[min(len(took) - 1, int(0.99 * len(took)))]
        print(f"manifest p99 {p99:.3f} s, median {took[len(took) // 2]:.3f} s")
        assert p99 <= MANIFEST_P99_TARGET_S, f"manifest p99 {p99:.3f} s; all: {took}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
