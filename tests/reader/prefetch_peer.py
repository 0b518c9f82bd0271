"""A desktop prefetcher holding the whole ciphertext of an embargoed issue, in its own
process until SIGTERM: `pressrun.clients.prefetch_swarm.PrefetchSwarm` (what
``pressrun get --prefetch`` joins), libtorrent with WebRTC through the torrent's
``ws://`` tracker, so browser readers reach it.

``python prefetch_peer.py WORK_DIR``, then the bundle's folder as a line on stdin (the
imports are done before the issue is published, so a test's short embargo is not
spent on them): the bundle's ciphertext is copied into WORK_DIR (the prefetcher's
partial file, whole); it prints ``ready`` once libtorrent has checked it. (A
libtorrent process with WebRTC peers can hang at exit: the test ends it with SIGTERM,
then SIGKILL, tests/tracker/webrtc_peer.py's `WebRTCPeer`.)
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
from pathlib import Path

from pressrun.clients.prefetch_swarm import PrefetchSwarm
from pressrun.content.manifest import SignedManifest


async def main(work: Path) -> None:
    """Seed the ciphertext of the bundle named on stdin until SIGTERM."""
    import libtorrent  # noqa: F401  (loaded before the bundle comes)

    line = await asyncio.to_thread(sys.stdin.readline)
    bundle = Path(line.strip())
    m = SignedManifest.from_json_bytes((bundle / "manifest.json").read_bytes()).manifest
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle / m.file_name, work / m.file_name)
    swarm = PrefetchSwarm(
        torrent=(bundle / f"{m.issue_id}.torrent").read_bytes(),
        manifest=m,
        partial_dir=work,
        listen_interfaces="127.0.0.1:0",
    )
    await swarm.start()
    assert swarm.on_disk == frozenset(range(m.num_pieces)), "the copy is not whole"
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await swarm.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
