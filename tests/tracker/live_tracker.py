"""A live tracker for HTTP tests: query building, a client wrapper, start-up, polling."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import quote_from_bytes

import aiohttp
from yarl import URL

from pressrun.bencode import Bencoded, bdecode
from pressrun.security import ServiceSecurity, bearer
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.store import TrackerStore

T = TypeVar("T")
#: the operator token of every test tracker (/v1/swarms needs it)
OPERATOR_TOKEN = "test-operator-token-0123456789"
OPERATOR = bearer(OPERATOR_TOKEN)


def announce_query(
    info_hash: bytes,
    peer_id: bytes,
    port: int,
    *,
    uploaded: int = 0,
    downloaded: int = 0,
    left: int = 100,
    **extra: str | int,
) -> str:
    """A well-formed announce query string, binary values percent-encoded."""
    parts = [
        "info_hash=" + quote_from_bytes(info_hash, safe=""),
        "peer_id=" + quote_from_bytes(peer_id, safe=""),
        f"port={port}",
        f"uploaded={uploaded}",
        f"downloaded={downloaded}",
        f"left={left}",
    ]
    parts += [f"{k}={v}" for k, v in extra.items()]
    return "&".join(parts)


class LiveTracker:
    """A TrackerService listening on an ephemeral port, with a client session."""

    def __init__(self, service: TrackerService, port: int, http: aiohttp.ClientSession) -> None:
        self.service = service
        self.port = port
        self.http = http
        self.base = f"http://127.0.0.1:{port}"

    async def get_raw(self, path_and_query: str) -> tuple[int, bytes]:
        """GET exactly this target (no re-quoting), answer (status, body)."""
        async with self.http.get(URL(self.base + path_and_query, encoded=True)) as resp:
            return resp.status, await resp.read()

    async def announce(self, query: str) -> dict[bytes, Bencoded]:
        status, body = await self.get_raw("/announce?" + query)
        assert status == 200
        decoded = bdecode(body)
        assert isinstance(decoded, dict)
        return decoded

    async def swarms(self) -> list[dict[str, object]]:
        async with self.http.get(self.base + "/v1/swarms", headers=OPERATOR) as resp:
            assert resp.status == 200
            body = await resp.json()
        swarms: list[dict[str, object]] = body["swarms"]
        return swarms


async def start_tracker(
    store: TrackerStore, config: TrackerConfig | None = None, seed: int = 1
) -> tuple[TrackerService, int]:
    service = TrackerService(
        TrackerCore(config or TrackerConfig(), random.Random(seed)),
        store,
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )
    port = await service.start("127.0.0.1", 0)
    return service, port


async def wait_for(
    predicate: Callable[[], Awaitable[T]], timeout_s: float = 10.0, step_s: float = 0.05
) -> T:
    """Poll an async predicate until it answers something truthy (or time runs out)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await predicate()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(step_s)
