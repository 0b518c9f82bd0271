"""Supernodes reconcile with the tracker's view (issue 24, item 3): a supernode the
tracker placed elsewhere after it lost its list (a restart on a new store) takes the
new id and rejoins; one expired by a silence keeps its id. Three real supernodes and
a real tracker on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp

from pressrun.chord.aio import Supernode
from pressrun.chord.codec import id_hex
from pressrun.chord.config import ChordConfig
from pressrun.chord.pieces import piece_keys
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

IH = "cd" * 20
PIECES = 40
FAST = ChordConfig(
    stabilize_interval_s=0.3, fix_fingers_interval_s=0.2, check_predecessor_interval_s=0.3
)


async def tracker(
    db: Path, port: int = 0, clock_offset: list[float] | None = None
) -> TrackerService:
    offset = clock_offset if clock_offset is not None else [0.0]
    loop = asyncio.get_running_loop()
    svc = TrackerService(
        TrackerCore(TrackerConfig(ring_supernodes=3), random.Random(1)),
        SqliteStore(db),
        clock=lambda: loop.time() + offset[0],
        monotonic=lambda: loop.time() + offset[0],
    )
    await svc.start("127.0.0.1", port)
    return svc


def port_of(svc: TrackerService) -> int:
    assert svc._runner is not None
    return int(svc._runner.addresses[0][1])


async def listed(http: aiohttp.ClientSession, port: int) -> dict[str, int]:
    async with http.get(f"http://127.0.0.1:{port}/v1/ring/{IH}") as r:
        if r.status != 200:
            return {}
        return {n["address"]: int(n["id"], 16) for n in (await r.json())["supernodes"]}


async def reconciled(nodes: list[Supernode], port: int, timeout_s: float = 30.0) -> None:
    """Until every supernode sits at the id the tracker lists for it, the successors
    form the sorted cycle, and all three name the same owner for every piece key."""
    keys = [id_hex(k) for k in piece_keys(IH, PIECES)]
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            ids = await listed(http, port)
            mine = {n.address: n.node.me.id for n in nodes if n.node is not None}
            ring = sorted(mine.values())
            cycle = all(
                n.node is not None
                and n.node.successor.id == ring[(ring.index(n.node.me.id) + 1) % len(ring)]
                for n in nodes
            )
            if ids == mine and cycle:
                owners = []
                for n in nodes:
                    url = f"http://{n.address}/chord/v1/lookup"
                    async with http.post(url, json={"keys": keys}) as r:
                        owners.append((await r.json()).get("owners") if r.status == 200 else None)
                if all(o is not None and o == owners[0] for o in owners):
                    return
            assert asyncio.get_running_loop().time() < deadline, (ids, mine)
            await asyncio.sleep(0.2)


async def test_supernodes_adopt_the_ids_of_a_tracker_that_lost_its_list(tmp_path: Path) -> None:
    svc = await tracker(tmp_path / "a.db")
    port = port_of(svc)
    nodes = [
        Supernode(
            tracker_base=f"http://127.0.0.1:{port}",
            info_hash=IH,
            num_pieces=PIECES,
            config=FAST,
            heartbeat_s=0.3,
            seed=i,
        )
        for i in range(3)
    ]
    try:
        for n in nodes:
            await n.start()
            await n.wait_on_ring()
        await reconciled(nodes, port)
        before = {n.address: n.node.me.id for n in nodes if n.node is not None}
        # the tracker restarts on a fresh store, and another supernode registers first
        # and leaves at once: the three are placed elsewhere than before
        await svc.close()
        svc = await tracker(tmp_path / "b.db", port)
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/v1/ring/{IH}/supernodes"
            async with http.post(url, json={"address": "127.0.0.1:9", "num_pieces": PIECES}) as r:
                assert r.status == 200
            await asyncio.sleep(1.5)  # (every supernode re-registered meanwhile)
            body = {"address": "127.0.0.1:9", "num_pieces": PIECES, "leaving": True}
            async with http.post(url, json=body) as r:
                assert r.status == 200
            moved = await listed(http, port)
        assert moved != before  # (the case this test is about)
        await reconciled(nodes, port)
    finally:
        for n in nodes:
            await n.close(graceful=False)
        await svc.close()


async def test_a_supernode_expired_by_a_silence_keeps_its_id(tmp_path: Path) -> None:
    offset = [0.0]
    svc = await tracker(tmp_path / "a.db", clock_offset=offset)
    port = port_of(svc)
    nodes = [
        Supernode(
            tracker_base=f"http://127.0.0.1:{port}",
            info_hash=IH,
            num_pieces=PIECES,
            config=FAST,
            heartbeat_s=0.3,
            seed=i,
        )
        for i in range(3)
    ]
    try:
        for n in nodes:
            await n.start()
            await n.wait_on_ring()
        await reconciled(nodes, port)
        before = {n.address: n.node.me.id for n in nodes if n.node is not None}
        offset[0] += 35.0  # 35 s without a heartbeat, as the tracker sees it
        await asyncio.sleep(1.0)
        await reconciled(nodes, port)
        assert {n.address: n.node.me.id for n in nodes if n.node is not None} == before
    finally:
        for n in nodes:
            await n.close(graceful=False)
        await svc.close()
