"""A small swarm must not make its reader slower than the origins would (issue 29,
point 3): whatever the policy, a peer takes from the origins what its peers cannot
give it yet while the origins have room, and its peers are an addition.

A real loopback swarm (pressrun.peer.loopback): one origin capped at 8 Mbit/s, the
tracker, a real Chord supernode for the issue, and one seed whose upload is capped at
256 KiB/s (a phone's uplink: the mobile profile's cap). A reader sent to the swarm
meets that one slow seed. The yardstick is the same file fetched from the same origin
in one HTTP request, as an origin client would, measured in the same test.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import aiohttp
import pytest

from pressrun.chord.aio import Supernode
from pressrun.chord.config import ChordConfig
from pressrun.peer.config import desktop_profile
from pressrun.peer.loopback import LoopbackSwarm, loopback_swarm

MiB = 1 << 20
SIZE = 2 * MiB
ORIGIN_MBPS = 8.0  # 1 MB/s: 2 MiB in 2.1 s from the origin alone
SLOW_SEED_BPS = 256 * 1024  # 2 MiB in 8.2 s from the seed alone
#: the issue's target for the emulated small scenario: a swarm client's download at
#: most 1.5x the origin client's; here the same ratio against the same origin
WITHIN = 1.5
#: what a swarm client pays before its first piece that the one request does not: a
#: status poll (the feed hears which pieces to fetch at the first one; the core's
#: ``status_interval_s``, 0.5 s), the tracker's answer and the ring's first round
START_S = 0.5
FAST_RING = ChordConfig(stabilize_interval_s=0.3, fix_fingers_interval_s=0.2)


async def origin_only_s(swarm: LoopbackSwarm, url: str) -> float:
    """The whole file in one request from the origin, as the origin client takes it."""
    began = time.monotonic()
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        body = await resp.read()
    took = time.monotonic() - began
    assert body == swarm.data
    return took


@pytest.mark.parametrize("policy", ["chord", "stripes"])
async def test_a_reader_with_one_slow_peer_is_as_fast_as_the_origin_would_be(
    tmp_path: Path, policy: str
) -> None:
    # On the code before, the reader took every piece from the slow seed (8.7 s and
    # 8.4 s against 2.05 s): the origins counted as having room only once a piece had
    # come from them (the feed's measure), and only for pieces no connected peer held,
    # while its peers gave it less than half of their best; a reader whose one peer
    # holds everything never fetched a piece from the origins, so never measured them.
    # Now it probes them (no upload limit, nothing from peers yet), and a peer slower
    # than half of what they give is an addition (`sources.peers_slow`).
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(ORIGIN_MBPS,), tracker_interval_s=1
    ) as swarm:
        assert swarm.tracker is not None
        swarm.tracker.ring.expected_supernodes = 1
        node = Supernode(
            tracker_base=swarm.tracker_base,
            info_hash=swarm.manifest.info_hash,
            num_pieces=swarm.manifest.num_pieces,
            config=FAST_RING,
            seed=1,
        )
        await node.start()
        try:
            await node.wait_on_ring()
            seed = swarm.new_peer(
                0,
                desktop_profile(upload_limit_bps=SLOW_SEED_BPS, seed_until_stopped=True),
                uploader_policy=policy,
            )
            seed.path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tmp_path / f"{swarm.issue_id}.pdf", seed.path)
            await seed.start()
            assert await asyncio.wait_for(seed.downloaded(), 10)  # a seed from the start
            yardstick = await origin_only_s(swarm, seed.web_seeds[0])
            sent_before = swarm.origin_bytes_sent()
            reader = swarm.new_peer(1, desktop_profile(max_seed_time_s=0.0), uploader_policy=policy)
            began = time.monotonic()
            result = await asyncio.wait_for(swarm.run_peer(reader), 4 * yardstick + 5)
            took = time.monotonic() - began
            await seed.stop()
        finally:
            await node.close(graceful=False)
    assert result.completed and result.path.read_bytes() == swarm.data
    # the slow seed is an addition, not a wait
    assert took <= WITHIN * yardstick + START_S, (took, yardstick, result)
    assert result.bytes_from_web_seeds > 0
    # and no piece came twice from the origin: at most the file, plus a piece in flight
    piece = swarm.manifest.piece_size_bytes
    assert swarm.origin_bytes_sent() - sent_before <= SIZE + 2 * piece
