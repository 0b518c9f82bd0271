"""``PUT /v1/allowed/<hex>`` is kept by the store: a restart (SQLite) and the other
instances (Redis) allow it too; an open tracker stays open."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp
from live_tracker import OPERATOR, OPERATOR_TOKEN, LiveTracker, announce_query, start_tracker

from pressrun.security import ServiceSecurity
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.redis_store import RedisStore
from pressrun.tracker.sqlite_store import SqliteStore

PUBLISHED = bytes(range(20))
ADDED = bytes(range(100, 120))
PEER = b"-PR0001-000000000001"


async def _start(db: Path, allowed: list[bytes] | None) -> tuple[TrackerService, str]:
    service = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1), allowed=allowed),
        SqliteStore(db),
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )
    port = await service.start("127.0.0.1", 0)
    return service, f"http://127.0.0.1:{port}"


async def _allowed(http: aiohttp.ClientSession, base: str) -> list[str] | None:
    async with http.get(f"{base}/v1/allowed", headers=OPERATOR) as resp:
        assert resp.status == 200
        listed: list[str] | None = (await resp.json())["allowed"]
        return listed


async def test_an_added_info_hash_survives_a_restart(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    db = tmp_path / "tracker.db"
    service, base = await _start(db, [PUBLISHED])
    try:
        async with http.put(f"{base}/v1/allowed/{ADDED.hex()}", headers=OPERATOR) as resp:
            assert resp.status == 200 and (await resp.json())["added"] is True
    finally:
        await service.close()
    service, base = await _start(db, [PUBLISHED])
    try:
        assert await _allowed(http, base) == sorted([PUBLISHED.hex(), ADDED.hex()])
        live = LiveTracker(service, int(base.rsplit(":", 1)[1]), http)
        answer = await live.announce(announce_query(ADDED, PEER, 7001, event="started"))
        assert b"failure reason" not in answer
        # added twice: kept once, "added" false the second time
        async with http.put(f"{base}/v1/allowed/{ADDED.hex()}", headers=OPERATOR) as resp:
            assert (await resp.json())["added"] is False
    finally:
        await service.close()
    # an operator who starts it open (--allow-any) gets an open tracker
    service, base = await _start(db, None)
    try:
        assert await _allowed(http, base) is None
    finally:
        await service.close()


async def test_instances_sharing_redis_allow_what_either_was_told(
    redis_url: str, http: aiohttp.ClientSession
) -> None:
    config = TrackerConfig(interval_s=1, min_interval_s=1)
    stores = [RedisStore(redis_url, prefix="allow:") for _ in range(2)]
    started = [await start_tracker(s, config, seed=n) for n, s in enumerate(stores)]
    (a, a_port), (b, b_port) = started
    a.core.allow([PUBLISHED])
    b.core.allow([PUBLISHED])
    try:
        async with http.put(
            f"http://127.0.0.1:{a_port}/v1/allowed/{ADDED.hex()}", headers=OPERATOR
        ) as resp:
            assert resp.status == 200
        # b re-reads the shared set with its swarms, every interval
        for _ in range(60):
            if b.core.is_allowed(ADDED):
                break
            await asyncio.sleep(0.1)
        assert b.core.is_allowed(ADDED)
        assert await _allowed(http, f"http://127.0.0.1:{b_port}") == sorted(
            [PUBLISHED.hex(), ADDED.hex()]
        )
    finally:
        await a.close()
        await b.close()
