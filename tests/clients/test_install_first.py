"""A swarm peer's copy is in the library while the peer seeds it: the reader opens the
issue without waiting for the fair-exit rules (a desktop seeds for up to 30 min).
One client on 127.0.0.1: a loopback swarm (real tracker, an origin as web seed,
libtorrent), the balancer answering ``swarm``, `fetch_issue`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes

import aiohttp
import pytest

pytest.importorskip("libtorrent")

from integration.test_swarm_path import swarm_balancer
from pressrun.clients.aio import fetch_issue
from pressrun.clients.cli import result_document
from pressrun.clients.config import DESKTOP
from pressrun.peer.loopback import loopback_swarm

PIECE = 64 * 1024
SIZE = 1024 * 1024 + 333
SEED_S = 3.0
CONFIG = replace(
    DESKTOP,
    stall_timeout_s=3.0,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.5,
    swarm_stall_after_s=5.0,
    swarm_max_seed_s=SEED_S,
)


class Notices:
    """The progress object of `fetch_issue`: the notices, in order."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        pass

    def notice(self, text: str) -> None:
        self.lines.append(text)


async def test_the_copy_is_in_the_library_while_the_peer_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pressrun.peer.aio

    library = tmp_path / "lib"
    seen: list[bytes | None] = []  # the library's copy when the seeding ended
    real_finished = pressrun.peer.aio.SwarmPeer.finished

    async def finished(peer: Any) -> Any:
        result = await real_finished(peer)
        copies = list(library.glob("*/*.pdf"))
        seen.append(copies[0].read_bytes() if copies else None)
        return result

    monkeypatch.setattr(pressrun.peer.aio.SwarmPeer, "finished", finished)
    notices = Notices()
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(40.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        balancer = await swarm_balancer(swarm, swarm.tracker_url)
        try:
            async with aiohttp.ClientSession() as http:
                # a leecher that never connects: the tracker's counts keep the seed
                # needed (no `not_needed`), and no byte goes up (no `ratio`), so the
                # client seeds for its profile's time
                query = "&".join(
                    (
                        "info_hash=" + quote_from_bytes(bytes.fromhex(swarm.manifest.info_hash)),
                        "peer_id=" + quote_from_bytes(b"-XX0001-never-online"),
                        "port=9",
                        "uploaded=0",
                        "downloaded=0",
                        f"left={SIZE}",
                        "event=started",
                    )
                )
                async with http.get(f"{swarm.tracker_url}?{query}") as resp:
                    assert resp.status == 200
            result = await asyncio.wait_for(
                fetch_issue(
                    swarm.issue_id,
                    balancer_url=balancer.url,
                    library=library,
                    config=CONFIG,
                    trusted_keys={swarm.manifest.publisher_key_bytes},
                    progress=notices,
                ),
                30,
            )
        finally:
            await balancer.stop()
    assert result.mode == "swarm" and result.leave_rule is not None
    assert result.path.read_bytes() == swarm.data
    # the copy was whole in the library before the seeding ended (the code before
    # moved it there only afterwards), and the reader was told so
    assert seen == [swarm.data]
    ready = [line for line in notices.lines if "is in your library" in line]
    assert len(ready) == 1 and str(result.path) in ready[0], notices.lines
    assert result.ready_s is not None and result.ready_s <= result.download_s + 1.0
    assert result.seeding_s >= SEED_S - 0.5 and result.ready_s < result.seconds - SEED_S / 2
    # the seeded file in .partial went once the seeding ended
    assert not (library / ".partial" / swarm.issue_id).exists()
    # --json's `opened_at` is when the copy was ready, not when the seeding ended
    before = time.time()
    doc = result_document(result)
    assert doc["ready_s"] == result.ready_s
    assert doc["opened_at"] <= before - (result.seconds - result.ready_s) + 0.1
    print(
        f"ready {result.ready_s:.2f} s, seeded {result.seeding_s:.2f} s, all {result.seconds:.2f} s"
    )
