"""`pressrun seed` as a user runs it: verifies a library copy, serves a leecher, and
leaves by a rule once it has uploaded the file."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from pathlib import Path

from pressrun.peer.config import desktop_profile
from pressrun.peer.loopback import loopback_swarm

MiB = 1 << 20
PRESSRUN = str(Path(sys.executable).with_name("pressrun"))


async def test_pressrun_seed_serves_a_reader_and_leaves_by_ratio(tmp_path: Path) -> None:
    size = 2 * MiB
    async with loopback_swarm(tmp_path, size_bytes=size, origin_cap_mbps=(8.0,)) as swarm:
        for origin in swarm.origins:  # the seed is the only source
            await origin.stop()
        bundle = tmp_path / "content" / swarm.issue_id
        library = tmp_path / "library"
        library.mkdir()
        copy = library / swarm.manifest.file_name
        shutil.copy(bundle / swarm.manifest.file_name, copy)
        # A reader is waiting (a leecher: the seed is needed), then the seed starts.
        reader = swarm.new_peer(1, desktop_profile(max_seed_time_s=0.0))
        reading = asyncio.ensure_future(swarm.run_peer(reader))
        while reader.listen_port is None:
            await asyncio.sleep(0.05)
        proc = await asyncio.create_subprocess_exec(
            PRESSRUN, "seed", str(copy),
            "--torrent", str(bundle / f"{swarm.issue_id}.torrent"),
            "--manifest", str(bundle / "manifest.json"),
            "--trusted-key", str(tmp_path / "publisher.key.pub"),
            "--listen", "127.0.0.1:0", "--max-seed-time-s", "60",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            result = await asyncio.wait_for(reading, 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert result.completed and result.path.read_bytes() == swarm.data
    assert result.bytes_from_peers >= size
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "listening on port" in text and "seeding swarm-issue" in text
    # it served the whole file, then a rule let it go: ratio (uploaded its size) or
    # not_needed (the reader became a seed and nobody else wants the issue)
    match = re.search(r"left the swarm by rule (\w+): uploaded (\d+) bytes", text)
    assert match is not None, text
    assert match.group(1) in ("ratio", "not_needed")
    assert int(match.group(2)) >= size


async def test_pressrun_seed_refuses_a_misnamed_file(tmp_path: Path) -> None:
    async with loopback_swarm(tmp_path, size_bytes=MiB, origin_cap_mbps=(8.0,)) as swarm:
        bundle = tmp_path / "content" / swarm.issue_id
        wrong = tmp_path / "other.pdf"
        wrong.write_bytes(swarm.data)
        proc = await asyncio.create_subprocess_exec(
            PRESSRUN, "seed", str(wrong),
            "--torrent", str(bundle / f"{swarm.issue_id}.torrent"),
            "--manifest", str(bundle / "manifest.json"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert "is not named" in err.decode()
