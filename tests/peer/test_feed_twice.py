"""No byte fetched twice: a swarm client that takes from the origins what its peer
cannot give it yet, and from its peer the rest (issue 29, `pressrun.peer.feed`).

A real loopback swarm (pressrun.peer.loopback) staggered like the first two swarm
clients of `make emulate SCENARIO=small`: one origin capped at 20 Mbit/s, peers whose
libtorrent download is capped at 2.5 MB/s (their 20 Mbit/s link), the second arriving
1.3 s after the first, which takes the whole issue from the origin. The second then
has room at the origin and a peer that holds more and more of the issue.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pressrun.peer.config import desktop_profile
from pressrun.peer.loopback import loopback_swarm

SIZE = 4_000_000  # the small scenario's issue
PIECE = 128 * 1024
LINK_BPS = 2_500_000
SECOND_AFTER_S = 1.3


async def test_the_second_peer_fetches_no_piece_twice(tmp_path: Path) -> None:
    # On the code before, the feed picked pieces libtorrent was not fetching yet, and
    # libtorrent then asked the first peer for them too (and, at the end, the feed took
    # pieces that peer had queued): the second peer received 0.52-1.31 MB of its 4 MB
    # twice in 8 runs (29 Nov, load 2-3). Now the pieces on their way from the origin
    # are held from libtorrent: none in 14 of 15 runs, one piece in one.
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(20.0,), piece_size=PIECE
    ) as swarm:
        config = desktop_profile(download_limit_bps=LINK_BPS)
        first, second = (swarm.new_peer(i, config, uploader_policy="stripes") for i in range(2))
        for peer in (first, second):
            await peer.open()
        results = await asyncio.gather(
            swarm.run_peer(first), swarm.run_peer(second, delay_s=SECOND_AFTER_S)
        )
    assert all(r.completed for r in results)
    got = results[1].downloaded_bytes  # from the peer (libtorrent's payload) and the origin
    assert results[1].bytes_from_web_seeds > 0  # the origin had room: it gave some
    assert got - SIZE <= PIECE, f"{got - SIZE} bytes received twice"
