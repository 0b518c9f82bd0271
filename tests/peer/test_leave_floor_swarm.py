"""Seeds for the next readers, in a libtorrent swarm (issue 28): three readers get the
issue, nobody downloads for a few seconds (a lull between two waves), then the next
reader comes. With the floor (`profile_config`, as the programs run the peer) two seeds
are still there and the next reader takes the whole issue from them, the origins down;
with the rule before every seed had left in the lull (flash-crowd-50-desktops at
f1ea13d: the second wave took 130 MB from the web seeds)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pressrun.peer.aio import SwarmPeer, SwarmResult
from pressrun.peer.config import SEED_FLOOR, profile_config
from pressrun.peer.events import LeaveRule, PeerPhase
from pressrun.peer.loopback import LoopbackSwarm, loopback_swarm

MiB = 1 << 20
SIZE = 4 * MiB
#: nobody downloads this long: each seed reads the counts about 6 times (every 1 s)
LULL_S = 6.0
#: between two readers' arrivals: their copies, and so their scrapes (every 1 s from
#: the copy), about this far apart. Readers that get their copies in the same instant
#: scrape in step, read the same counts and each draw alone: then one seed of three
#: stayed in 2 of 7 runs (docs/results/2026-11-29-seed-leave.md)
ARRIVAL_GAP_S = 0.4


async def first_wave(
    swarm: LoopbackSwarm, floor: int
) -> tuple[list[SwarmPeer], list[asyncio.Future[SwarmResult]]]:
    """Three readers at once, every copy verified, then the lull; each leaves when a
    rule lets it (its ``stopped`` names the rule to the tracker), as a client does."""
    config = profile_config(
        "desktop", counts_interval_s=1.0, max_seed_time_s=120.0, not_needed_min_seeds=floor
    )
    peers = [swarm.new_peer(i, config) for i in range(3)]
    for p in peers:
        await p.open()
    for p in peers:  # a wave's readers come one after the other (ARRIVAL_GAP_S)
        await p.start()
        await asyncio.sleep(ARRIVAL_GAP_S)
    assert all(await asyncio.wait_for(asyncio.gather(*(p.downloaded() for p in peers)), 60))
    leaving = [asyncio.ensure_future(p.finished()) for p in peers]
    await asyncio.sleep(LULL_S)
    return peers, leaving


def seeding(peers: list[SwarmPeer]) -> int:
    return sum(p.core is not None and p.core.phase is PeerPhase.SEEDING for p in peers)


async def close_all(peers: list[SwarmPeer], leaving: list[asyncio.Future[SwarmResult]]) -> None:
    for p in peers:
        if p.core is not None and p.core.phase is not PeerPhase.LEFT:
            await p.stop()
    await asyncio.gather(*leaving)
    for p in peers:
        await p.close()


async def test_a_lull_leaves_two_seeds_for_the_next_reader(tmp_path: Path) -> None:
    pytest.importorskip("libtorrent")
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(16.0,), tracker_interval_s=2
    ) as swarm:
        peers, leaving = await first_wave(swarm, SEED_FLOOR)
        try:
            # SEED_FLOOR when each read the counts after the last one left; one at
            # least if two read the same counts (see ARRIVAL_GAP_S)
            assert seeding(peers) >= 1
            gone = [p.result().leave_rule for p in peers if p.core.phase is PeerPhase.LEFT]
            assert set(gone) <= {LeaveRule.NOT_NEEDED, LeaveRule.RATIO}  # (the first one
            # to arrive can have served the others its share)
            for origin in swarm.origins:  # only the seeds can give it now
                await origin.stop()
            reader = swarm.new_peer(3, profile_config("desktop", max_seed_time_s=0.0))
            peers.append(reader)
            await reader.open()
            await reader.start()
            assert await asyncio.wait_for(reader.downloaded(), 60)
            result = reader.result()
            assert result.completed and result.path.read_bytes() == swarm.data
            assert result.bytes_from_peers >= SIZE
        finally:
            await close_all(peers, leaving)


async def test_without_the_floor_the_lull_empties_the_swarm(tmp_path: Path) -> None:
    pytest.importorskip("libtorrent")
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(16.0,), tracker_interval_s=2
    ) as swarm:
        peers, leaving = await first_wave(swarm, 0)
        try:
            assert seeding(peers) == 0
            rules = [p.result().leave_rule for p in peers]
            assert LeaveRule.NOT_NEEDED in rules
            assert set(rules) <= {LeaveRule.NOT_NEEDED, LeaveRule.RATIO}
        finally:
            await close_all(peers, leaving)
