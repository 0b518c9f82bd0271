"""The ring's supernode list lives in the tracker's store: two instances on one real
redis-server share it, and a tracker restarted on its SQLite file gives ids back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from live_tracker import start_tracker

from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.redis_store import RedisStore
from pressrun.tracker.sqlite_store import SqliteStore

IH = "ab" * 20


async def register(
    http: aiohttp.ClientSession, port: int, address: str, *, leaving: bool = False
) -> dict[str, Any]:
    body: dict[str, object] = {"address": address, "num_pieces": 40}
    if leaving:
        body["leaving"] = True
    async with http.post(f"http://127.0.0.1:{port}/v1/ring/{IH}/supernodes", json=body) as r:
        assert r.status == 200, await r.text()
        doc: dict[str, Any] = await r.json()
        return doc


async def ring(http: aiohttp.ClientSession, port: int) -> dict[str, str]:
    """address -> id of the listed supernodes ({} on 404)."""
    async with http.get(f"http://127.0.0.1:{port}/v1/ring/{IH}") as r:
        if r.status == 404:
            return {}
        doc = await r.json()
        return {n["address"]: n["id"] for n in doc["supernodes"]}


async def test_two_instances_share_the_ring_list(redis_url: str) -> None:
    config = TrackerConfig(ring_supernodes=4)
    a, a_port = await start_tracker(RedisStore(redis_url, prefix="r:"), config, seed=1)
    b, b_port = await start_tracker(RedisStore(redis_url, prefix="r:"), config, seed=2)
    try:
        async with aiohttp.ClientSession() as http:
            # supernodes register alternately with either instance
            ids = {}
            for i, port in enumerate([a_port, b_port, a_port, b_port]):
                doc = await register(http, port, f"127.0.0.1:{7000 + i}")
                ids[f"127.0.0.1:{7000 + i}"] = doc["id"]
                # each answer lists every supernode so far, whichever instance took it
                assert {n["address"] for n in doc["supernodes"]} == set(ids)
            # four distinct equal-share slots: b placed knowing a's supernodes
            assert len(set(ids.values())) == 4
            assert await ring(http, a_port) == ids == await ring(http, b_port)
            # a heartbeat on the other instance keeps the id
            again = await register(http, a_port, "127.0.0.1:7001")
            assert again["id"] == ids["127.0.0.1:7001"]
            # a graceful leave through b is off a's list at once
            await register(http, b_port, "127.0.0.1:7002", leaving=True)
            del ids["127.0.0.1:7002"]
            assert await ring(http, a_port) == ids == await ring(http, b_port)
    finally:
        await a.close()
        await b.close()


async def test_restarted_tracker_keeps_the_ring(tmp_path: Path) -> None:
    config = TrackerConfig(ring_supernodes=3)
    t, port = await start_tracker(SqliteStore(tmp_path / "t.db"), config)
    async with aiohttp.ClientSession() as http:
        try:
            ids = {
                f"127.0.0.1:{7100 + i}": (await register(http, port, f"127.0.0.1:{7100 + i}"))["id"]
                for i in range(3)
            }
        finally:
            await t.close()
        t, port = await start_tracker(SqliteStore(tmp_path / "t.db"), config)
        try:
            assert await ring(http, port) == ids
        finally:
            await t.close()
