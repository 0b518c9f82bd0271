"""The tracker's ring administration, pure (`RingAdmin` with an explicit ``now``): ids
kept across an expiry, the published piece count, per-address limits, nothing kept for
rings that are gone."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.ring import RingAdmin, RingError
from pressrun.tracker.sqlite_store import SqliteStore

IH = "ab" * 20


def test_a_supernode_expired_and_back_gets_its_ring_id_again() -> None:
    # (issue 24, item 3: B came back at a new id it never adopted)
    admin = RingAdmin(ttl_s=30.0, expected_supernodes=3)
    ids = {
        a: admin.register(IH, a, 40, now=0.0).id for a in ("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1")
    }
    # A and C keep heartbeating, B is silent for 35 s
    for t in (10.0, 20.0, 30.0, 40.0):
        admin.register(IH, "10.0.0.1:1", 40, now=t)
        admin.register(IH, "10.0.0.3:1", 40, now=t)
    view = admin.view(IH, now=40.0)
    assert view is not None and {n.address for n in view.supernodes} == {"10.0.0.1:1", "10.0.0.3:1"}
    assert admin.register(IH, "10.0.0.2:1", 40, now=41.0).id == ids["10.0.0.2:1"]
    # all three silent past the TTL (the tracker down): each its own id again
    for a in ("10.0.0.3:1", "10.0.0.2:1", "10.0.0.1:1"):
        assert admin.register(IH, a, 40, now=200.0).id == ids[a]


def test_the_piece_count_is_the_published_one() -> None:
    admin = RingAdmin(published_pieces={IH: 16}.get)
    with pytest.raises(RingError, match="16 pieces"):
        admin.register(IH, "10.0.0.9:1", 1 << 20, now=0.0)
    assert admin.members(IH) is None  # the forged registration left nothing behind
    admin.register(IH, "10.0.0.1:1", 16, now=1.0)
    view = admin.view(IH, now=1.0)
    assert view is not None and view.num_pieces == 16 and len(view.piece_keys) == 16


def test_an_unpublished_count_is_fixed_only_while_the_ring_lives() -> None:
    # (an open tracker, or an issue allowed by hand: no torrent to read the count from)
    admin = RingAdmin(ttl_s=30.0)
    admin.register(IH, "10.0.0.9:1", 1000, now=0.0)
    with pytest.raises(RingError):
        admin.register(IH, "10.0.0.1:1", 16, now=10.0)
    # the first one silent past the TTL: the real count takes over
    assert admin.register(IH, "10.0.0.1:1", 16, now=40.0).address == "10.0.0.1:1"
    with pytest.raises(RingError, match="pieces"):
        admin.register(IH, "10.0.0.2:1", 70_000, now=41.0)  # (more than any issue has)


def test_one_address_takes_a_few_places_on_a_ring() -> None:
    admin = RingAdmin(max_per_host=8)
    taken = 0
    for port in range(1024):
        try:
            admin.register(IH, f"10.0.0.9:{10000 + port}", 40, now=0.0)
            taken += 1
        except RingError as err:
            assert "10.0.0.9" in str(err)
    assert taken == 8
    assert admin.register(IH, "10.0.0.1:7000", 40, now=0.0).address == "10.0.0.1:7000"


def test_rings_that_are_gone_are_forgotten() -> None:
    admin = RingAdmin(ttl_s=30.0, forget_ids_s=600.0)
    for i in range(200):
        admin.register(f"{i:040x}", "10.0.0.1:1", 4, now=0.0)
    admin.register(IH, "10.0.0.1:1", 4, now=1000.0)
    assert admin.issues() == [IH]


# --- over HTTP: the ring's clocks and its rows in the store ---------------------------


async def _ring_tracker(
    db: Path, wall: list[float], mono: list[float]
) -> tuple[TrackerService, str]:
    svc = TrackerService(
        TrackerCore(TrackerConfig(ring_supernodes=3), random.Random(1)),
        SqliteStore(db),
        clock=lambda: wall[0],
        monotonic=lambda: mono[0],
    )
    port = await svc.start("127.0.0.1", 0)
    return svc, f"http://127.0.0.1:{port}"


async def _register(http: aiohttp.ClientSession, base: str, ih: str, address: str) -> str:
    url = f"{base}/v1/ring/{ih}/supernodes"
    async with http.post(url, json={"address": address, "num_pieces": 40}) as r:
        assert r.status == 200, await r.text()
        return str((await r.json())["id"])


async def _listed(http: aiohttp.ClientSession, base: str, ih: str) -> dict[str, str]:
    async with http.get(f"{base}/v1/ring/{ih}") as r:
        if r.status == 404:
            return {}
        return {n["address"]: n["id"] for n in (await r.json())["supernodes"]}


async def test_a_step_of_the_wall_clock_neither_expires_nor_keeps_supernodes(
    tmp_path: Path,
) -> None:
    # (issue 24: the ring's TTL ran on the wall clock)
    wall, mono = [1.8e9], [100.0]
    svc, base = await _ring_tracker(tmp_path / "t.db", wall, mono)
    try:
        async with aiohttp.ClientSession() as http:
            ids = {
                a: await _register(http, base, IH, a)
                for a in ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")
            }
            wall[0] += 3600  # NTP steps the clock an hour forward
            mono[0] += 5
            assert await _listed(http, base, IH) == ids
            wall[0] -= 7200  # ... and two hours back
            for _ in range(4):  # 7001 and 7002 keep beating; 7003 went silent
                mono[0] += 10
                for a in ("127.0.0.1:7001", "127.0.0.1:7002"):
                    assert await _register(http, base, IH, a) == ids[a]
            assert set(await _listed(http, base, IH)) == {"127.0.0.1:7001", "127.0.0.1:7002"}
    finally:
        await svc.close()


async def test_the_rows_of_a_forgotten_ring_leave_the_store(tmp_path: Path) -> None:
    wall, mono = [1.8e9], [100.0]
    svc, base = await _ring_tracker(tmp_path / "t.db", wall, mono)
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(50):  # rings for 50 made-up issues (an open tracker)
                await _register(http, base, f"{i:040x}", "127.0.0.1:7001")
            wall[0] += 4000
            mono[0] += 4000  # every one silent past the TTL and the ids kept
            await _register(http, base, IH, "127.0.0.1:7001")
    finally:
        await svc.close()
    with sqlite3.connect(tmp_path / "t.db") as db:
        rows = db.execute("SELECT DISTINCT info_hash FROM ring_supernodes").fetchall()
    assert rows == [(IH,)]
