"""An origin reader takes from its swarm peers the pieces they hold (issue 28,
`pressrun.clients.swarm_take` through `pressrun.clients.origin_seed`), on 127.0.0.1
with real libtorrent: a loopback swarm (tracker, one origin capped at 8 Mbit/s, a
published issue), a seed that holds the whole issue, a balancer that answers
``origin`` (demand below the swarm's threshold) naming the issue's swarm, and a
reader fetching through it.

Before, the reader shared what it had but took nothing from the swarm: all 6 MB
from the origin beside a seed that held every piece (in flash-crowd-50-desktops the
first reader fetched its last 11-12 MB from the origins while the second reader
seeded the whole issue, session 25)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from clients.test_retry import Notices
from integration.test_origin_seed import NEVER_SWARM, PIECE, SIZE
from integration.test_origin_seed import READER as ORIGIN_READER
from integration.test_swarm_path import swarm_balancer
from pressrun.clients.aio import FetchResult, fetch_issue
from pressrun.peer.loopback import LoopbackSwarm, loopback_swarm

#: the origin reader of tests/integration/test_origin_seed.py, seeding 2 s at most
READER = replace(ORIGIN_READER, swarm_max_seed_s=2.0)


PRESSRUN = str(Path(sys.executable).with_name("pressrun"))


@contextlib.asynccontextmanager
async def seed_process(swarm: LoopbackSwarm, upload_kbps: float) -> AsyncIterator[None]:
    """`pressrun seed` of the whole issue in a process of its own (its libtorrent
    session's calls do not hold this event loop), uploading at most ``upload_kbps``
    kB/s (0: no limit), seeding until stopped; yields once it seeds."""
    work = swarm.work_dir
    bundle = work / "content" / swarm.issue_id
    copy = work / "seed" / swarm.manifest.file_name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(swarm.data)
    proc = await asyncio.create_subprocess_exec(
        PRESSRUN, "seed", str(copy),
        "--torrent", str(bundle / f"{swarm.issue_id}.torrent"),
        "--manifest", str(bundle / "manifest.json"),
        "--trusted-key", str(work / "publisher.key.pub"),
        "--tracker", swarm.tracker_url, "--listen", "127.0.0.1:0",
        "--upload-limit-kbps", str(upload_kbps), "--until-stopped",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seen: list[bytes] = []
        while not any(b"seeding " in line for line in seen):
            line = await asyncio.wait_for(proc.stdout.readline(), 30.0)
            assert line, b"".join(seen).decode()
            seen.append(line)
        yield
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def read_beside(
    swarm: LoopbackSwarm, library: Path, upload_kbps: float = 0
) -> tuple[FetchResult, Notices, int]:
    """With a seed in the swarm, a reader the balancer sends to the origins fetches the
    issue; its result, its notices and the bytes the origin sent."""
    async with seed_process(swarm, upload_kbps):
        balancer = await swarm_balancer(swarm, swarm.tracker_url, NEVER_SWARM)
        notes = Notices()
        try:
            result = await asyncio.wait_for(
                fetch_issue(
                    swarm.issue_id,
                    balancer_url=balancer.url,
                    library=library,
                    config=READER,
                    trusted_keys={swarm.manifest.publisher_key_bytes},
                    progress=notes,
                ),
                90.0,
            )
        finally:
            await balancer.stop()
    path = library / swarm.issue_id / swarm.manifest.file_name
    assert path.read_bytes() == swarm.data
    return result, notes, swarm.origin_bytes_sent()


async def test_an_origin_reader_takes_the_pieces_a_seed_holds(tmp_path: Path) -> None:
    """Before: 0 bytes from the seed, the whole file from the origin."""
    pytest.importorskip("libtorrent")
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(8.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        result, notes, sent = await read_beside(swarm, tmp_path / "lib")
    assert result.mode == "origin" and result.verified
    # every piece came once: from the origin's sections or from the seed
    assert sum(result.bytes_by_origin.values()) + result.bytes_from_peers == SIZE, result
    assert result.bytes_from_peers >= SIZE // 3, result
    # and the origin sent that much less (a cut section's bytes on their way aside)
    assert sent <= SIZE - result.bytes_from_peers + 16 * PIECE, (sent, result)
    assert any("taken from its peers" in n for n in notes.notices), notes.notices


async def test_a_slow_seed_gives_its_claims_back_to_the_origin(tmp_path: Path) -> None:
    """A seed uploading 40 kB/s beside an origin giving 1 MB/s: the pieces asked of it
    that it would bring later than the origins' rule allows go back to the origin, and
    the reader is done long before the seed alone could have brought the file."""
    pytest.importorskip("libtorrent")
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(8.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        loop = asyncio.get_running_loop()
        began = loop.time()
        result, notes, _sent = await read_beside(swarm, tmp_path / "lib", upload_kbps=40)
        took_s = loop.time() - began
    assert result.mode == "origin" and result.verified
    assert sum(result.bytes_by_origin.values()) + result.bytes_from_peers == SIZE, result
    # most of it from the origin, and done well before the seed's 160 s for the file
    assert sum(result.bytes_by_origin.values()) >= SIZE // 2, result
    assert took_s < SIZE / 40_000 / 2, took_s
    line = next(n for n in notes.notices if "taken from its peers" in n)
    assert " 0 given back to the origins" not in line, line
