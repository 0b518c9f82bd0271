"""An origin reader's copy serves the swarm (issue 28, `pressrun.clients.origin_seed`),
on 127.0.0.1 with real libtorrent: a loopback swarm (tracker, one origin capped at
8 Mbit/s, a published issue), a balancer that answers ``origin`` (demand below the
swarm's threshold) naming the issue's swarm, a reader fetching through it, and a swarm
peer that joins once the reader holds a third of the file.

Before, an origin-mode copy never joined the swarm: in flash-crowd-50-desktops the
second reader (in the swarm 7.5 s after the first, which held 19 MB then) took its
whole copy from the origins' web seeds, 0 bytes from peers (session 22, runs E2, F1,
F2)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from pressrun.balancer.demand import DemandConfig
from pressrun.clients.aio import fetch_issue
from pressrun.clients.codec import decode_directive
from pressrun.clients.config import DESKTOP
from pressrun.peer.loopback import loopback_swarm

from .test_swarm_path import swarm_balancer

PIECE = 64 * 1024
SIZE = 6 * 1024 * 1024 + 321
#: the origins' answer whatever the demand: the swarm's threshold is never reached
NEVER_SWARM = DemandConfig(enter_downloaders=1e6, leave_downloaders=1e5, min_dwell_s=0)
READER = replace(
    DESKTOP,
    stall_timeout_s=5.0,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.5,
    swarm_max_seed_s=20.0,
)


class Watch:
    """The reader's progress: set once it holds ``at_bytes``."""

    def __init__(self, at_bytes: int) -> None:
        self.at_bytes = at_bytes
        self.reached = asyncio.Event()
        self.notices: list[str] = []

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        if done_bytes >= self.at_bytes:
            self.reached.set()

    def notice(self, text: str) -> None:
        self.notices.append(text)


async def test_an_origin_readers_copy_serves_the_next_readers_pieces(tmp_path: Path) -> None:
    pytest.importorskip("libtorrent")
    from pressrun.peer.config import desktop_profile

    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(8.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        balancer = await swarm_balancer(swarm, swarm.tracker_url, NEVER_SWARM)
        try:
            url = f"{balancer.url}/v1/issues/{swarm.issue_id}/directive"
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                directive = decode_directive(await resp.read())
            # an origin directive names the swarm the copy is to seed, and is not one
            # that sends the reader there
            assert directive.mode == "origin" and directive.swarm is None
            assert directive.seed_swarm is not None
            assert directive.seed_swarm.tracker_url == swarm.tracker_url

            watch = Watch(SIZE // 3)
            reading = asyncio.ensure_future(
                fetch_issue(
                    swarm.issue_id,
                    balancer_url=balancer.url,
                    library=tmp_path / "lib",
                    config=READER,
                    trusted_keys={swarm.manifest.publisher_key_bytes},
                    progress=watch,
                )
            )
            # the next reader joins the swarm once the first holds a third of the file;
            # its web seed is the origin the first reader is downloading from
            await asyncio.wait_for(watch.reached.wait(), 30.0)
            peer = swarm.new_peer(1, desktop_profile(max_seed_time_s=1.0))
            try:
                await peer.start()
                assert await asyncio.wait_for(peer.downloaded(), 60.0)
                other = await peer.stop()
            finally:
                await peer.close()
            reader = await asyncio.wait_for(reading, 60.0)
        finally:
            await balancer.stop()
        sent = swarm.origin_bytes_sent()

    # the reader: all of it from the origins, installed before its seeding
    assert reader.mode == "origin" and sum(reader.bytes_by_origin.values()) == SIZE
    path = tmp_path / "lib" / swarm.issue_id / swarm.manifest.file_name
    assert path.read_bytes() == swarm.data
    assert reader.seeding_s > 0 and reader.ready_s is not None
    assert reader.ready_s < reader.seconds
    # the next reader took pieces from it (0 before: nobody else was in the swarm) ...
    assert other.completed
    assert other.bytes_from_peers >= SIZE // 4, other
    # ... and the origin sent that much less: the reader's copy and the rest
    assert sent <= SIZE + (SIZE - other.bytes_from_peers) + 8 * PIECE, (sent, other)
    assert any("the origin copy in the swarm" in n for n in watch.notices), watch.notices
