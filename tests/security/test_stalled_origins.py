"""Forty idle connections refused every reader (issue 25, finding 1): a stranger opened
20 connections to each of two origins, asked for a file and never read; the origins
counted them as load and the balancer answered 503 "full" for every issue. Real
origins, a real balancer, real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import aiohttp

from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import OriginSpec
from pressrun.origin.aio import start_origin
from pressrun.origin.config import OriginConfig
from stalled_clients import stall

ISSUE = "weekly-1"
#: per origin, as in the finding
STALLED = 20


async def test_stalled_connections_do_not_fill_the_origins(tmp_path: Path) -> None:
    issue = tmp_path / "content" / ISSUE
    issue.mkdir(parents=True)
    (issue / "weekly-1.pdf").write_bytes(os.urandom(24 << 20))
    origins = [
        await start_origin(
            OriginConfig(
                content_dir=tmp_path / "content",
                name=f"origin-{i}",
                capacity_mbps=100.0,  # 12.5 MB/s: 20 transfers at 1 MB/s looked full
                stats_interval_s=0.2,
                stalled_after_s=0.5,
            )
        )
        for i in range(2)
    ]
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=tuple(OriginSpec(o.name, o.url) for o in origins),
            balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=0.7),
        )
    )
    socks: list[socket.socket] = []
    try:
        await balancer.wait_until_up(2, timeout_s=5.0)
        for o in origins:
            socks += await stall(o.port, f"/content/{ISSUE}/weekly-1.pdf", STALLED)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0  # a loaded host may take long: a deadline, not a count
        while not all(o.service.meter.stalled_transfers == STALLED for o in origins):
            assert loop.time() < deadline, [o.service.meter.stalled_transfers for o in origins]
            await asyncio.sleep(0.05)
        # and polled by the balancer since: two statuses of each origin received after
        # that (the second was asked for after the first arrived, so after the stall)
        records = [balancer.core.origins[o.name] for o in origins]
        seen = [[r.last_status_at] for r in records]
        while not all(len(set(s)) >= 3 for s in seen):
            assert loop.time() < deadline, seen
            await asyncio.sleep(0.02)
            for r, s in zip(records, seen, strict=True):
                if r.last_status_at != s[-1]:
                    s.append(r.last_status_at)
        statuses = []
        async with aiohttp.ClientSession() as http:
            for _ in range(20):
                async with http.get(f"{balancer.url}/v1/issues/{ISSUE}/directive") as resp:
                    statuses.append(resp.status)
                    if resp.status != 200:
                        reason = await resp.text()
                await asyncio.sleep(0.05)
            assert statuses == [200] * 20, reason
            for o in origins:
                async with http.get(f"{o.url}/stats") as resp:
                    doc = await resp.json()
                assert doc["stalled_transfers"] == STALLED and doc["active_transfers"] == 0
    finally:
        for s in socks:
            s.close()
        await balancer.stop()
        for o in origins:
            await o.stop()
