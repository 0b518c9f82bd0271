"""`pressrun seed` bridges the two worlds: a plain npm ``webtorrent`` page (no pressrun
code) in Debian's headless Chromium downloads a published issue from ``pressrun seed``
over WebRTC (the torrent names the HTTP tracker and its ws:// twin, as ``pressrun
publish`` writes it); SIGTERM then ends the seed within seconds with the page still
connected, and the tracker records one leave naming the rule ``user``."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from live_tracker import LiveTracker, wait_for
from test_webtorrent_browser import WEBTORRENT_JS, serve_page
from test_webtorrent_browser import chromium as chromium  # the fixture, re-exported

from pressrun.content.bundle import read_manifest
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish
from pressrun.reader.browser import PHONE, why_no_browser
from pressrun.tracker.sqlite_store import SqliteStore

PRESSRUN = str(Path(sys.executable).with_name("pressrun"))

pytestmark = pytest.mark.skipif(
    why_no_browser() is not None or not WEBTORRENT_JS.is_file(),
    reason=why_no_browser() or "npm webtorrent is not installed: run `make setup`",
)


async def test_a_plain_webtorrent_page_downloads_from_pressrun_seed_which_stops_on_sigterm(
    tracker: LiveTracker,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    chromium: Any,
) -> None:
    source = tmp_path / "w1.pdf"
    data = random.Random(9).randbytes(3 * 1024 * 1024 + 4321)
    source.write_bytes(data)
    secret, public = generate_keypair(tmp_path / "publisher.key")
    bundle = publish(
        source,
        issue_id="w1",
        title="w1",
        key_path=secret,
        content_dir=tmp_path / "content",
        trackers=[f"{tracker.base}/announce"],
        webtorrent=True,
    )
    manifest = read_manifest(bundle / "manifest.json")
    torrent = (bundle / "w1.torrent").read_bytes()
    copy = tmp_path / "library" / manifest.file_name
    copy.parent.mkdir()
    copy.write_bytes(data)
    seed = await asyncio.create_subprocess_exec(
        PRESSRUN, "seed", str(copy),
        "--torrent", str(bundle / "w1.torrent"), "--manifest", str(bundle / "manifest.json"),
        "--trusted-key", str(public), "--listen", "127.0.0.1:0", "--until-stopped",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    runner, url = await serve_page(torrent)
    try:
        assert seed.stdout is not None
        while b"seeding" not in (line := await asyncio.wait_for(seed.stdout.readline(), 30)):
            assert line, "pressrun seed ended before seeding"
        context = await chromium.new_context(**PHONE)
        page = await context.new_page()
        await page.goto(url)

        async def finished() -> Any:
            return await page.evaluate("window.result")

        result = await wait_for(finished, timeout_s=30, step_s=0.1)
        assert result, await page.evaluate("window.errors")
        assert result["sha256"] == hashlib.sha256(data).hexdigest()
        print(f"pressrun seed -> plain webtorrent page: {result['seconds']:.2f} s")
        # SIGTERM with the page still connected over WebRTC: ends within seconds
        started = time.monotonic()
        seed.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(seed.communicate(), 15)
        stopped_s = time.monotonic() - started
        await context.close()
    finally:
        if seed.returncode is None:
            seed.kill()
            await seed.wait()
        await runner.cleanup()
    assert seed.returncode == 0, err.decode()
    assert stopped_s < 5.0, stopped_s
    assert b"left the swarm by rule user" in out, out
    # what it sent the browser counts in its share ratio (the fair-exit rule's input)
    uploaded = re.search(rb"uploaded (\d+) bytes", out)
    assert uploaded is not None and int(uploaded.group(1)) >= len(data), out
    print(f"pressrun seed ended {stopped_s:.2f} s after SIGTERM")
    # the seed's record is its HTTP one, left once by the rule it named; the browser
    # is a WebRTC peer (port 0) of the same swarm
    info_hash = bytes.fromhex(manifest.info_hash)
    records = tracker.service.core.records(info_hash)
    (desktop,) = [r for r in records if r.port != 0]
    assert not desktop.active and desktop.leave_rule is not None
    assert desktop.leave_rule.value == "user"
    assert any(r.port == 0 for r in records)
    store = tracker.service.store
    assert isinstance(store, SqliteStore)
    await store.flush()
    stops = [
        e
        for e in await store.load_events(info_hash)
        if e.event == "stopped" and e.peer_id == desktop.peer_id
    ]
    assert len(stops) == 1, stops
