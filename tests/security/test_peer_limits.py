"""The peer's reads from the network: an origin's range answer is cut at the piece's
size and counts as fed only once it verified; a tracker's scrape answer is cut too."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pressrun.content.codec import Manifest
from pressrun.peer.feed import OwedPieceFeed
from pressrun.peer.scrape import MAX_SCRAPE_BYTES, TrackerScrape

PIECE = 16384
DATA = random.Random(4).randbytes(4 * PIECE)


def _manifest() -> Manifest:
    pieces = tuple(
        hashlib.sha256(DATA[i : i + PIECE]).hexdigest() for i in range(0, len(DATA), PIECE)
    )
    return Manifest(
        format=1,
        issue_id="limits",
        title="limits",
        file_name="limits.pdf",
        size_bytes=len(DATA),
        piece_size_bytes=PIECE,
        piece_sha256=pieces,
        sha256=hashlib.sha256(DATA).hexdigest(),
        info_hash="00" * 20,
        publisher_key="00" * 32,
        created_at="2026-11-23T00:00:00Z",
    )


async def _honest(request: web.Request) -> web.Response:
    start, end = request.headers["Range"].removeprefix("bytes=").split("-")
    return web.Response(status=206, body=DATA[int(start) : int(end) + 1])


async def _flood(request: web.Request) -> web.StreamResponse:
    """206 and then far more than the range asked for."""
    resp = web.StreamResponse(status=206)
    await resp.prepare(request)
    try:
        for _ in range(1000):
            await resp.write(b"\0" * 65536)
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def _corrupt(request: web.Request) -> web.Response:
    start, end = request.headers["Range"].removeprefix("bytes=").split("-")
    return web.Response(status=206, body=b"\1" * (int(end) - int(start) + 1))


async def _big_scrape(request: web.Request) -> web.Response:
    return web.Response(body=b"d5:filesd" + b"0" * (2 * MAX_SCRAPE_BYTES) + b"ee")


@pytest.fixture
async def origin() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/honest", _honest)
    app.router.add_get("/flood", _flood)
    app.router.add_get("/corrupt", _corrupt)
    app.router.add_get("/scrape", _big_scrape)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _feed() -> OwedPieceFeed:
    handle: Any = None
    return OwedPieceFeed(
        manifest=_manifest(), web_seeds=(), retry_s=0.1, handle=lambda: handle, running=lambda: True
    )


async def test_range_answers_are_cut_and_count_only_once_verified(
    origin: str, caplog: pytest.LogCaptureFixture
) -> None:
    feed = _feed()
    async with aiohttp.ClientSession() as http:
        assert await feed._fetch_piece(http, origin + "/flood", 1) is None
        assert "more than 16384 bytes (the limit); cut off" in caplog.text
        assert feed.fed_bytes == 0
        assert await feed._fetch_piece(http, origin + "/corrupt", 2) is None
        assert "not matching the manifest" in caplog.text
        assert feed.fed_bytes == 0 and feed.session_bytes == 0  # unverified: not counted
        assert await feed._fetch_piece(http, origin + "/honest", 3) == DATA[3 * PIECE :]
        assert feed.fed_bytes == PIECE and feed.session_bytes == PIECE


async def test_an_oversized_scrape_answer_is_cut(
    origin: str, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[object] = []
    scrape = TrackerScrape("00" * 20, got.append)
    try:
        await scrape._scrape(origin + "/scrape")
    finally:
        await scrape.close()
    assert got == []
    assert f"more than {MAX_SCRAPE_BYTES} bytes (the limit); cut off" in caplog.text


async def test_a_closing_scrape_starts_no_other(origin: str) -> None:
    # the peer's status polls go on while it closes: a scrape asked then found the
    # HTTP session closing under it ("Session is closed", an error nobody retrieved)
    scrape = TrackerScrape("00" * 20, lambda counts: None)
    scrape.ask([origin + "/announce"])  # (its /scrape: a session is opened)
    first = scrape._task
    assert first is not None
    await asyncio.gather(first, return_exceptions=True)
    closing = asyncio.ensure_future(scrape.close())
    await asyncio.sleep(0)  # close() is awaiting the session's close
    scrape.ask([origin + "/announce"])
    await closing
    scrape.ask([origin + "/announce"])
    assert scrape._task is first  # no scrape asked while or after it closed
