"""Interop: a plain npm ``webtorrent`` page (no pressrun code) in Debian's headless
Chromium announces to pressrun's WebSocket tracker and downloads an issue from a
libtorrent seed through it, over WebRTC (no STUN server, no HTTP tracker)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from live_tracker import LiveTracker, wait_for
from test_webtorrent_live import torrent_bytes
from webrtc_peer import WebRTCPeer

from pressrun.reader.browser import CHROMIUM, CHROMIUM_ARGS, PHONE, why_no_browser
from pressrun.reader.config import PACKAGE_DIR

lt = pytest.importorskip("libtorrent")
WEBTORRENT_JS = PACKAGE_DIR / "node_modules" / "webtorrent" / "dist" / "webtorrent.min.js"
PAGE = Path(__file__).parent / "webtorrent_page" / "index.html"

pytestmark = pytest.mark.skipif(
    why_no_browser() is not None or not WEBTORRENT_JS.is_file(),
    reason=why_no_browser() or "npm webtorrent is not installed: run `make setup`",
)


async def serve_page(torrent: bytes) -> tuple[web.AppRunner, str]:
    """The page, webtorrent.min.js and the torrent, on 127.0.0.1 (a secure context)."""

    async def page(_: web.Request) -> web.Response:
        return web.Response(body=PAGE.read_bytes(), content_type="text/html")

    async def script(_: web.Request) -> web.Response:
        return web.Response(body=WEBTORRENT_JS.read_bytes(), content_type="text/javascript")

    async def torrent_file(_: web.Request) -> web.Response:
        return web.Response(body=torrent, content_type="application/x-bittorrent")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/webtorrent.min.js", script)
    app.router.add_get("/issue.torrent", torrent_file)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/"


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), timeout=30_000
        )
        try:
            yield browser
        finally:
            await browser.close()


async def test_a_plain_webtorrent_page_downloads_from_a_libtorrent_seed(
    tracker: LiveTracker, tmp_path: Path, http: aiohttp.ClientSession, chromium: Any
) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    data = os.urandom(3 * 1024 * 1024 + 12345)
    (seed / "issue.pdf").write_bytes(data)
    torrent = torrent_bytes(seed / "issue.pdf", [f"ws://127.0.0.1:{tracker.port}/webtorrent"])
    info = lt.torrent_info(lt.bdecode(torrent))
    (tmp_path / "issue.torrent").write_bytes(torrent)
    seeder = await WebRTCPeer.start(tmp_path / "issue.torrent", seed)
    runner, url = await serve_page(torrent)
    try:
        assert await seeder.complete(30)
        context = await chromium.new_context(**PHONE)
        page = await context.new_page()
        await page.goto(url)

        async def finished() -> Any:
            return await page.evaluate("window.result")

        result = await wait_for(finished, timeout_s=60, step_s=0.2)
        assert result, await page.evaluate("window.errors")
        assert result["sha256"] == hashlib.sha256(data).hexdigest()
        assert result["downloaded"] >= len(data)
        # the browser is a peer of the swarm in the tracker's own accounting
        ih = bytes.fromhex(str(info.info_hash()))
        assert len(tracker.service.core.records(ih)) == 2
        print(f"libtorrent -> plain webtorrent page: {result['seconds']:.2f} s")
        await context.close()
    finally:
        await seeder.stop()
        await runner.cleanup()
