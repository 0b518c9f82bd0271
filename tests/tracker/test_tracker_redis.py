"""Two tracker instances on one real redis-server share one view of each swarm."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import aiohttp
from live_tracker import OPERATOR, LiveTracker, announce_query, start_tracker

from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.redis_store import RedisStore

IH = bytes([0, 0xFF, 0x25, 0x26]) + bytes(range(16))


def pid(n: int) -> bytes:
    return b"-PR0001-" + f"{n:012d}".encode()


async def test_two_instances_share_swarms(redis_url: str, http: aiohttp.ClientSession) -> None:
    config = TrackerConfig(interval_s=30)
    a_service, a_port = await start_tracker(RedisStore(redis_url, prefix="t:"), config, seed=1)
    b_service, b_port = await start_tracker(RedisStore(redis_url, prefix="t:"), config, seed=2)
    a = LiveTracker(a_service, a_port, http)
    b = LiveTracker(b_service, b_port, http)
    try:
        await a.announce(announce_query(IH, pid(1), 7001, event="started", key="k1"))
        seen_on_b = await b.announce(announce_query(IH, pid(2), 7002, left=0, compact=1))
        assert seen_on_b[b"peers"] == bytes([127, 0, 0, 1]) + (7001).to_bytes(2, "big")
        seen_on_a = await a.announce(
            announce_query(IH, pid(1), 7001, uploaded=0, downloaded=50, key="k1", compact=1)
        )
        assert seen_on_a[b"peers"] == bytes([127, 0, 0, 1]) + (7002).to_bytes(2, "big")
        assert (seen_on_a[b"complete"], seen_on_a[b"incomplete"]) == (1, 1)

        # Peer 1 moves to the other instance mid-session: its totals continue there.
        await b.announce(announce_query(IH, pid(1), 7001, downloaded=80, left=0, key="k1"))
        await a.announce(
            announce_query(
                IH, pid(2), 7002, left=0, uploaded=80, event="stopped", leave_rule="not_needed"
            )
        )
        for live in (a, b):
            (swarm,) = await live.swarms()
            assert (swarm["seeds"], swarm["leechers"]) == (1, 0)
            assert (swarm["uploaded_bytes"], swarm["downloaded_bytes"]) == (80, 80)
            assert swarm["left_fairly"] == 1
            assert swarm["left_by_rule"]["not_needed"] == 1  # type: ignore[index]
        events = await a_service.store.load_events(IH)  # type: ignore[attr-defined]
        assert [e.event for e in events] == ["started", "stopped"]
    finally:
        await a_service.close()
        await b_service.close()


async def test_stale_write_is_refused(redis_url: str, http: aiohttp.ClientSession) -> None:
    """An instance with an old view cannot overwrite a newer record (versioned save)."""
    a_service, a_port = await start_tracker(RedisStore(redis_url, prefix="v:"))
    b_service, b_port = await start_tracker(RedisStore(redis_url, prefix="v:"))
    a = LiveTracker(a_service, a_port, http)
    b = LiveTracker(b_service, b_port, http)
    try:
        await a.announce(announce_query(IH, pid(1), 7001, uploaded=10, key="k"))
        stale = a_service.core.records(IH)[0]
        await b.announce(announce_query(IH, pid(1), 7001, uploaded=30, key="k"))
        refused = await a_service.store.save([replace(stale, version=stale.version + 1)])
        assert len(refused) == 1
        (swarm,) = await a.swarms()
        assert swarm["uploaded_bytes"] == 30
    finally:
        await a_service.close()
        await b_service.close()


async def test_redis_gone_gives_failure_reason_not_500(
    redis_url: str, http: aiohttp.ClientSession
) -> None:
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    service, port = await start_tracker(RedisStore(redis_url, prefix="g:"))
    live = LiveTracker(service, port, http)
    try:
        await live.announce(announce_query(IH, pid(1), 7001))
        admin = aioredis.Redis.from_url(redis_url)
        # The server closes the connection as it shuts down.
        with contextlib.suppress(RedisConnectionError):
            await admin.shutdown(nosave=True)
        await admin.aclose()
        status, body = await live.get_raw("/announce?" + announce_query(IH, pid(2), 7002))
        assert status == 200 and b"failure reason" in body
        async with http.get(live.base + "/v1/swarms", headers=OPERATOR) as resp:
            assert resp.status == 503
            assert "error" in await resp.json()
    finally:
        await service.close()
