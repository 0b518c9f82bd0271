"""A supernode told the origins' rate and ``origin_fetch_s`` holds the pieces it hands out
to be brought in to what the origins complete in that long (off by default:
`ORIGIN_FETCH_S`).

The origins share their egress among every fetch at once, and a piece is of use to the
swarm only once whole: on the loopback bench at N = 40 forty first fetches, one a peer,
completed 1.4 to 2.9 s after the start and nobody had anything to trade until then.
Held to what the origins complete in a second (twenty at once there), the first pieces
came at 0.9 s; where that left ten or fewer at once the peers' feeds took the origins'
idle room and copies went up (docs/results/2026-11-28-swarm-limit.md, section 17), so
while the limit binds the supernode's answers say the origins are the ring's
(``origins_held``). A real supernode on a real tracker.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from pressrun.chord.aio import ORIGIN_FETCH_S, Supernode, fetches_at_once
from pressrun.chord.post import post_json
from pressrun.peer.loopback import loopback_swarm


async def test_a_supernode_told_the_origins_rate_and_a_fetch_time_holds_its_fetches(
    tmp_path: Path,
) -> None:
    async with loopback_swarm(
        tmp_path, size_bytes=2 << 20, origin_cap_mbps=(16.0,), piece_size=64 * 1024
    ) as swarm:
        assert swarm.tracker is not None
        swarm.tracker.ring.expected_supernodes = 1
        pieces = swarm.manifest.num_pieces
        # 100 kB/s for 32 pieces of 64 KiB: 1.5 pieces a second
        sn = Supernode(
            tracker_base=swarm.tracker_base,
            info_hash=swarm.manifest.info_hash,
            num_pieces=pieces,
            file_bytes=2 << 20,
            origin_bps=100_000,
            origin_fetch_s=1.0,
            seed=1,
        )
        try:
            await sn.start()
            await sn.wait_on_ring()
            # 1.5 pieces a second over one supernode: two at once (none by default)
            assert fetches_at_once(100_000, pieces, 2 << 20, 1, fetch_s=ORIGIN_FETCH_S) is None
            limit = fetches_at_once(100_000, pieces, 2 << 20, 1, fetch_s=1.0)
            assert limit == 2
            assert sn.directory.max_fetching == limit
            now = sn._now()  # (the supernode's clock: the HTTP answer below reads it)
            answers = [
                sn.directory.choose_uploader(k, peer_id=f"p{k}", address=f"p{k}:1", now=now)
                for k in range(limit + 2)
            ]
            assert [a.bring_in for a in answers] == [True] * limit + [False, False]
            assert answers[-1].wait
            # ... and its answers over HTTP say the origins are the ring's now: a
            # peer's feed takes no room of its own beside the ring's bringers
            async with aiohttp.ClientSession() as http:
                doc = await post_json(
                    http,
                    f"http://{sn.address}/chord/v1/pieces",
                    {"peer_id": "p9", "address": "127.0.0.1:9", "have": [], "want": [9]},
                    timeout_s=5.0,
                )
            assert doc is not None and doc["origins_held"] is True, doc
            assert doc["uploaders"][0]["wait"]
        finally:
            await sn.close()
