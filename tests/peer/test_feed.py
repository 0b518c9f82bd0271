"""The owed-piece feed against a real HTTP origin on 127.0.0.1 (`pressrun.peer.feed`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from pressrun.content.codec import Manifest
from pressrun.peer.feed import PARALLEL_WITH_ROOM, OwedPieceFeed

PIECE = 16 * 1024
#: how long the origin holds each answer: a round trip and its first byte
ORIGIN_DELAY_S = 0.3


def _manifest(data: bytes) -> Manifest:
    hashes = tuple(
        hashlib.sha256(data[i : i + PIECE]).hexdigest() for i in range(0, len(data), PIECE)
    )
    return Manifest(
        format=1,
        issue_id="feed-test",
        title="feed test",
        file_name="issue.pdf",
        size_bytes=len(data),
        piece_size_bytes=PIECE,
        piece_sha256=hashes,
        sha256=hashlib.sha256(data).hexdigest(),
        info_hash="00" * 20,
        publisher_key="00" * 32,
        created_at="2026-11-28T00:00:00Z",
    )


class _Origin:
    """A range server that waits ``ORIGIN_DELAY_S`` before each answer and counts the
    requests it holds at once."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.now = 0
        self.most = 0
        self.served: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(ORIGIN_DELAY_S)
            spec = request.headers["Range"].removeprefix("bytes=")
            first, last = (int(x) for x in spec.split("-"))
            self.served.append(first // PIECE)
            return web.Response(status=206, body=self.data[first : last + 1])
        finally:
            self.now -= 1


class _Handle:
    """The torrent handle's two calls the feed makes."""

    def __init__(self) -> None:
        self.added: dict[int, bytes] = {}

    def get_download_queue(self) -> list[dict[str, int]]:
        return []

    def add_piece(self, piece: int, data: bytes, flags: int) -> None:
        self.added[piece] = data


@pytest.fixture
async def origin() -> AsyncIterator[tuple[_Origin, str]]:
    data = bytes(range(256)) * (6 * PIECE // 256)
    o = _Origin(data)
    app = web.Application()
    app.router.add_get("/issue.pdf", o.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield o, f"http://127.0.0.1:{port}/issue.pdf"
    finally:
        await runner.cleanup()


async def _feed_all(o: _Origin, url: str, parallel: int) -> _Handle:
    handle = _Handle()
    feed = OwedPieceFeed(
        manifest=_manifest(o.data),
        web_seeds=[url],
        retry_s=1.0,
        handle=lambda: handle,
        running=lambda: len(handle.added) < 6,
    )
    feed.parallel = parallel
    feed.start()
    feed.set_owed((0, 1, 2, 3, 4, 5))
    async with asyncio.timeout(10):
        while len(handle.added) < 6:
            await asyncio.sleep(0.02)
    feed.cancel()
    return handle


async def test_with_room_the_feed_keeps_two_requests_in_flight(
    origin: tuple[_Origin, str],
) -> None:
    # The first swarm client of `make emulate SCENARIO=small` took the whole issue from
    # the origins one request at a time: 3.1 s against the origin client's 2.0 s, a
    # round trip and a first byte between every two pieces. With room, two requests
    # at a time: six pieces in three round trips, not six (before: the origin never
    # held two at once). No bound on the time: on a loaded machine it says nothing
    o, url = origin
    handle = await _feed_all(o, url, PARALLEL_WITH_ROOM)
    assert o.most == 2
    assert sorted(handle.added) == [0, 1, 2, 3, 4, 5]
    assert all(handle.added[p] == o.data[p * PIECE : (p + 1) * PIECE] for p in range(6))
    assert sorted(o.served) == [0, 1, 2, 3, 4, 5]  # none fetched twice


async def test_without_room_the_feed_fetches_one_piece_at_a_time(
    origin: tuple[_Origin, str],
) -> None:
    # busy origins (the loopback bench: their egress shared among every fetch): a
    # second request would only split this peer's share, one at a time
    o, url = origin
    handle = await _feed_all(o, url, 1)
    assert o.most == 1
    assert sorted(handle.added) == [0, 1, 2, 3, 4, 5]
