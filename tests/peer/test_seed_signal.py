"""`pressrun seed` stopped by SIGTERM leaves the swarm once: one `stopped` announce
naming the rule `user`, no second leave, no libtorrent error."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
from pathlib import Path

from pressrun.peer.loopback import loopback_swarm
from pressrun.tracker.sqlite_store import SqliteStore

MiB = 1 << 20
PRESSRUN = str(Path(sys.executable).with_name("pressrun"))


async def test_sigterm_leaves_the_swarm_once_by_user(tmp_path: Path) -> None:
    async with loopback_swarm(tmp_path, size_bytes=1 * MiB, origin_cap_mbps=(8.0,)) as swarm:
        bundle = tmp_path / "content" / swarm.issue_id
        copy = tmp_path / "library" / swarm.manifest.file_name
        copy.parent.mkdir()
        shutil.copy(bundle / swarm.manifest.file_name, copy)
        proc = await asyncio.create_subprocess_exec(
            PRESSRUN, "seed", str(copy),
            "--torrent", str(bundle / f"{swarm.issue_id}.torrent"),
            "--manifest", str(bundle / "manifest.json"),
            "--trusted-key", str(tmp_path / "publisher.key.pub"),
            "--listen", "127.0.0.1:0", "--until-stopped",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            while b"seeding" not in (line := await asyncio.wait_for(proc.stdout.readline(), 60)):
                assert line, "pressrun seed ended before seeding"
            await asyncio.sleep(1.0)  # it has announced `started`
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()
        assert b"left the swarm by rule user" in out, out
        assert b"invalid torrent handle" not in err and b"Traceback" not in err, err
        assert swarm.tracker is not None
        store = swarm.tracker.store
        assert isinstance(store, SqliteStore)
        await store.flush()
        info_hash = bytes.fromhex(swarm.manifest.info_hash)
        stops = [e for e in await store.load_events(info_hash) if e.event == "stopped"]
        assert len(stops) == 1, "\n".join(repr(e) for e in stops)
        assert stops[0].leave_rule is not None and stops[0].leave_rule.value == "user"
        (record,) = swarm.tracker.core.records(info_hash)
        assert not record.active and record.leave_rule is not None
        assert record.leave_rule.value == "user"
