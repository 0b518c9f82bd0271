"""Weeks of uptime (issue 24): clock steps expire nobody, the stores stay bounded.

Findings 2 and 5: a forward step of the tracker's wall clock past the peer TTL expired
every peer of every swarm at once (the seeds then left: "nobody needs me"), and the
stores kept every peer ever seen, which a restart, a Redis refresh or every Redis
announce read back. These tests drive a real tracker (in-process with injected clocks,
and the real `pressrun serve tracker` under libfaketime) over HTTP, with real SQLite
and a real redis-server.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis
from live_tracker import OPERATOR_TOKEN, LiveTracker, announce_query, wait_for

from pressrun.bencode import bdecode
from pressrun.security import TOKEN_ENV, ServiceSecurity
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.codec import parse_announce_query
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.redis_store import RedisStore
from pressrun.tracker.sqlite_store import SqliteStore
from pressrun.tracker.store import TrackerStore

IH = bytes(range(20))
# Debian's faketime package, whatever the architecture
FAKETIME_LIB = next(
    iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))),
    Path("/usr/lib/faketime/libfaketime.so.1"),
)


def pid(n: int) -> bytes:
    return b"-PR0001-" + f"{n:012d}".encode()


class SteppedWallClock:
    """The host's wall clock plus an offset a test steps (NTP, an operator)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


async def start(
    store: TrackerStore, config: TrackerConfig, clock: Callable[[], float]
) -> tuple[TrackerService, int]:
    service = TrackerService(
        TrackerCore(config, random.Random(1)),
        store,
        clock=clock,
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )
    return service, await service.start("127.0.0.1", 0)


async def scrape_counts(live: LiveTracker) -> tuple[int, int]:
    status, body = await live.get_raw("/scrape?info_hash=" + "".join(f"%{b:02X}" for b in IH))
    assert status == 200
    decoded = bdecode(body)
    assert isinstance(decoded, dict)
    files = decoded[b"files"]
    assert isinstance(files, dict)
    entry = files.get(IH, {b"complete": 0, b"incomplete": 0})
    assert isinstance(entry, dict)
    seeds, leechers = entry[b"complete"], entry[b"incomplete"]
    assert isinstance(seeds, int) and isinstance(leechers, int)
    return seeds, leechers


async def announce_swarm(live: LiveTracker, seeds: int, leechers: int) -> None:
    for n in range(seeds + leechers):
        left = 0 if n < seeds else 100
        await live.announce(announce_query(IH, pid(n), 7000 + n, left=left, key=f"k{n}"))


async def step_while_announcing(
    live: LiveTracker, step: Callable[[], None]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """A swarm of (3, 7) announcing every 1 s (TTL 2 s) and one peer gone silent; the
    wall clock is stepped 1.5 s in, and the timer fires at 2 s for the silent peer.
    Answers the counts at 2.4 s (after the timer) and at 3.6 s (nobody announced since
    1 s: the TTL has run out on any clock)."""
    t0 = asyncio.get_running_loop().time()

    async def until(t: float) -> None:
        await asyncio.sleep(max(0.0, t0 + t - asyncio.get_running_loop().time()))

    await live.announce(announce_query(IH, pid(50), 7050, key="silent"))
    await announce_swarm(live, 3, 7)
    await until(1.0)
    await announce_swarm(live, 3, 7)
    await until(1.5)
    step()  # NTP steps the host's clock forward an hour
    await until(2.4)
    after_step = await scrape_counts(live)
    await until(3.6)

    async def emptied() -> tuple[int, int] | None:
        counts = await scrape_counts(live)
        return counts if counts == (0, 0) else None

    # (polled a few seconds more: a loaded machine delays the announces above)
    return after_step, await wait_for(emptied, timeout_s=4) or await scrape_counts(live)


# -- finding 2: a step of the wall clock -------------------------------------------


async def test_a_wall_clock_step_past_the_ttl_expires_nobody(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """(3, 7) stays (3, 7) when the wall clock jumps an hour and the timer fires; the
    peers still expire after the TTL of the monotonic clock."""
    wall = SteppedWallClock()
    config = TrackerConfig(interval_s=1, min_interval_s=1, peer_ttl_s=2.0)
    service, port = await start(SqliteStore(tmp_path / "t.db", flush_interval_s=0.05), config, wall)
    try:

        def step() -> None:
            wall.offset_s += 3600.0

        after_step, later = await step_while_announcing(LiveTracker(service, port, http), step)
        assert after_step == (3, 7)  # was (0, 0): every peer expired at once
        assert later == (0, 0)
    finally:
        await service.close()


async def test_a_restart_under_a_stepped_clock_keeps_every_peer(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Stored wall times are never compared with a stepped clock: after a restart an
    hour ahead (or behind) every stored peer is there, with a full TTL."""
    config = TrackerConfig(interval_s=1, min_interval_s=1, peer_ttl_s=2.0)
    for step_s in (3600.0, -3600.0):
        db = tmp_path / f"t{step_s}.db"
        wall = SteppedWallClock()
        service, port = await start(SqliteStore(db, flush_interval_s=0.05), config, wall)
        await announce_swarm(LiveTracker(service, port, http), 3, 7)
        await service.close()
        wall.offset_s = step_s
        service, port = await start(SqliteStore(db, flush_interval_s=0.05), config, wall)
        try:
            live = LiveTracker(service, port, http)
            await asyncio.sleep(0.3)
            assert await scrape_counts(live) == (3, 7)
            await asyncio.sleep(2.2)  # nobody announced: the TTL after the restart

            async def emptied(live: LiveTracker = live) -> bool:
                return await scrape_counts(live) == (0, 0)

            assert await wait_for(emptied, timeout_s=4)
        finally:
            await service.close()


@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="Debian's faketime is not installed")
async def test_the_real_tracker_process_under_faketime_survives_a_step(tmp_path: Path) -> None:
    """`pressrun serve tracker` with libfaketime preloaded: its wall clock (only:
    CLOCK_MONOTONIC is left alone, as NTP does) jumps +1 h while peers announce."""
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        TOKEN_ENV: OPERATOR_TOKEN,
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pressrun.cli", "serve", "tracker", "--port", "0",
        "--db", str(tmp_path / "t.db"), "--allow", IH.hex(),
        "--interval-s", "1", "--min-interval-s", "1", "--peer-ttl-s", "2",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        port = int(line.decode().rsplit(":", 1)[1].split("/")[0])
        async with aiohttp.ClientSession() as http:
            live = LiveTracker(None, port, http)  # type: ignore[arg-type]

            def step() -> None:  # the process's time.time() jumps an hour ahead
                offset.write_text("+3600\n")

            after_step, later = await step_while_announcing(live, step)
        assert after_step == (3, 7)
        assert later == (0, 0)
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 20) == 0


# -- finding 5: the stores are pruned ---------------------------------------------


def sqlite_rows(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("peers", "events")
        }


async def test_sqlite_forgets_peers_that_left_and_keeps_their_totals(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """200 downloads come and go: the file keeps the live peers' rows and one row of
    totals, not a row per peer ever seen; a restart still shows the totals."""
    db = tmp_path / "t.db"
    config = TrackerConfig(interval_s=1, min_interval_s=1, peer_ttl_s=2.0, record_ttl_s=0.5)
    service, port = await start(SqliteStore(db, flush_interval_s=0.05), config, time.time)
    live = LiveTracker(service, port, http)
    try:
        await live.announce(announce_query(IH, pid(999), 7999, left=0, key="seed"))
        for n in range(200):
            q = announce_query(IH, pid(n), 8000 + n, downloaded=100, left=0, key=f"k{n}")
            await live.announce(q + "&event=completed")
            await live.announce(q + "&event=stopped&leave_rule=user")

        async def pruned() -> bool:
            await service.store.flush()
            return sqlite_rows(db)["peers"] == 1

        assert await wait_for(pruned, timeout_s=5)
    finally:
        await service.close()
    service, port = await start(SqliteStore(db, flush_interval_s=0.05), config, time.time)
    try:
        (swarm,) = await LiveTracker(service, port, http).swarms()
        assert swarm["downloaded_bytes"] == 200 * 100
        assert swarm["completed"] == 200
        left_by_rule = swarm["left_by_rule"]
        assert isinstance(left_by_rule, dict) and left_by_rule["user"] == 200
        assert len(service.core.records(IH)) == 1
    finally:
        await service.close()


async def test_sqlite_forgets_a_dead_swarm_with_its_events(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    db = tmp_path / "t.db"
    config = TrackerConfig(interval_s=1, min_interval_s=1, peer_ttl_s=2.0, record_ttl_s=0.3)
    service, port = await start(SqliteStore(db, flush_interval_s=0.05), config, time.time)
    live = LiveTracker(service, port, http)
    try:
        for n in range(20):
            q = announce_query(IH, pid(n), 8000 + n, left=0, key=f"k{n}")
            await live.announce(q + "&event=started")
            await live.announce(q + "&event=stopped")

        async def gone() -> bool:
            await service.store.flush()
            return sqlite_rows(db) == {"peers": 0, "events": 0}

        assert await wait_for(gone, timeout_s=5)
        assert service.core.info_hashes() == []
    finally:
        await service.close()


async def test_an_open_tracker_full_of_dead_swarms_takes_new_ones(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """max_swarms counts live swarms: once as many swarms as it allows have been seen
    (all now without a peer), a new swarm still gets in."""
    config = TrackerConfig(max_swarms=5)
    service, port = await start(SqliteStore(tmp_path / "t.db"), config, time.time)
    live = LiveTracker(service, port, http)
    try:
        for i in range(5):
            ih = i.to_bytes(20, "big")
            q = announce_query(ih, pid(i), 8000 + i, key="k")
            await live.announce(q + "&event=started")
            await live.announce(q + "&event=stopped")
        answer = await live.announce(announce_query(IH, pid(9), 8009, key="k"))
        assert b"failure reason" not in answer
        assert IH in service.core.info_hashes() and len(service.core.info_hashes()) == 5
        for i in range(4):  # four more live swarms: the tracker is full of live ones
            await live.announce(announce_query((100 + i).to_bytes(20, "big"), pid(i), 9000 + i))
        full = await live.announce(announce_query(bytes(20), pid(50), 9050))
        assert full[b"failure reason"] == b"the tracker holds as many swarms as it may; retry later"
    finally:
        await service.close()


async def redis_output_bytes(url: str) -> int:
    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("stats")
        return int(info["total_net_output_bytes"])
    finally:
        await client.aclose()


async def test_redis_announce_costs_what_changed_not_every_peer_ever_seen(
    redis_url: str, http: aiohttp.ClientSession
) -> None:
    """A swarm with 3,000 records in Redis: an announce of one of its peers must not
    read them all back (the store's output per announce, measured by Redis itself)."""
    seeded = RedisStore(redis_url)
    service, port = await start(RedisStore(redis_url), TrackerConfig(), time.time)
    live = LiveTracker(service, port, http)
    try:
        # 3,000 peers another instance saw and that left a few minutes ago
        await live.announce(announce_query(IH, pid(0), 7000, key="k0"))
        (record,) = service.core.records(IH)
        others = [
            replace(record, peer_id=pid(n), port=7000 + n % 50000, active=False, version=2)
            for n in range(1, 3001)
        ]
        await seeded.save(others)
        await live.announce(announce_query(IH, pid(0), 7000, key="k0"))  # reads them once
        before = await redis_output_bytes(redis_url)
        for _ in range(20):
            await live.announce(announce_query(IH, pid(0), 7000, key="k0"))
        per_announce = (await redis_output_bytes(redis_url) - before) / 20
        assert per_announce < 5_000, per_announce  # 3,000 records are about 1.2 MB
    finally:
        await seeded.close()
        await service.close()


async def test_redis_forgotten_records_stay_forgotten(
    redis_url: str, http: aiohttp.ClientSession
) -> None:
    """Records the tracker forgot leave Redis too (their totals stay): a refresh, an
    announce or another instance does not bring them back, and Redis holds nothing of
    a swarm that died."""
    config = TrackerConfig(interval_s=1, min_interval_s=1, peer_ttl_s=2.0, record_ttl_s=0.5)
    a, a_port = await start(RedisStore(redis_url), config, time.time)
    live = LiveTracker(a, a_port, http)
    try:
        await live.announce(announce_query(IH, pid(999), 7999, left=0, key="seed"))
        for n in range(30):
            q = announce_query(IH, pid(n), 8000 + n, downloaded=100, left=0, key=f"k{n}")
            await live.announce(q + "&event=completed")
            await live.announce(q + "&event=stopped&leave_rule=user")
        await asyncio.sleep(1.5)  # forgotten; then the refresh runs (interval 1 s)
        await live.announce(announce_query(IH, pid(999), 7999, left=0, key="seed"))
        assert [r.peer_id for r in a.core.records(IH)] == [pid(999)]
        client = aioredis.Redis.from_url(redis_url)
        try:
            assert await client.hlen(f"pressrun:tracker:peers:{IH.hex()}") == 1
        finally:
            await client.aclose()
        (swarm,) = await live.swarms()
        assert swarm["downloaded_bytes"] == 30 * 100 and swarm["completed"] == 30
        # a second instance starting now sees the live peer and the totals only
        b, b_port = await start(RedisStore(redis_url), config, time.time)
        try:
            (swarm_b,) = await LiveTracker(b, b_port, http).swarms()
            assert len(b.core.records(IH)) == 1 and swarm_b["completed"] == 30
        finally:
            await b.close()
    finally:
        await a.close()


async def test_a_failed_write_behind_flush_is_retried_by_itself(tmp_path: Path) -> None:
    """The file locked by another process for a while (a backup, sqlite3 in a shell):
    the flush that failed is tried again, with no new announce to trigger it."""
    db = tmp_path / "t.db"
    store = SqliteStore(db, flush_interval_s=0.05)
    await store.open()
    service, _port = await start(store, TrackerConfig(), time.time)
    try:
        locker = sqlite3.connect(db, timeout=0.1, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        core = service.core
        q = announce_query(IH, pid(1), 7001, left=0, key="k1")
        handled = core.handle_announce(parse_announce_query(q), remote="127.0.0.1", now=1.0)
        store.queue([handled.record])
        await asyncio.sleep(6.0)  # the flush waits 5 s for the lock, then fails
        locker.execute("ROLLBACK")
        locker.close()

        async def written() -> bool:
            return sqlite_rows(db)["peers"] == 1

        assert await wait_for(written, timeout_s=4)
    finally:
        await service.close()


async def test_an_instance_that_expired_a_peer_alone_adopts_its_later_announce(
    redis_url: str, http: aiohttp.ClientSession
) -> None:
    """Instance A expired a peer on its own (its write to Redis never made it) while
    the peer's next announce reached B with the same version number: A must take B's
    record, not keep its own expired copy because the versions match."""
    config = TrackerConfig(interval_s=30)
    a, a_port = await start(RedisStore(redis_url), config, time.time)
    b, b_port = await start(RedisStore(redis_url), config, time.time)
    try:
        live_a, live_b = LiveTracker(a, a_port, http), LiveTracker(b, b_port, http)
        q = announce_query(IH, pid(1), 7001, left=0, key="k1")
        await live_b.announce(q)
        assert await scrape_counts(live_a) == (1, 0)
        a.core.handle_timer(now=a.monotonic() + 1000)  # expired in A's memory only
        assert await scrape_counts(live_a) == (0, 0)
        await live_b.announce(q)  # the peer announces again, through B
        assert await scrape_counts(live_a) == (1, 0)
    finally:
        await a.close()
        await b.close()
