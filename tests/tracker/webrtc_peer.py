"""A libtorrent 2.1.1 WebRTC peer in a process of its own, for the WebTorrent tests.

libtorrent with WebRTC peers can hang in libdatachannel's threads when the session is
destroyed (FIELD-NOTES.md, "WebTorrent"; docs/tracker.md): in a child process the test
ends it with SIGTERM/SIGKILL, and a hang never holds up the test process.

    python webrtc_peer.py TORRENT SAVE_DIR   # prints "complete" once it has every piece
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

SCRIPT = Path(__file__)


class WebRTCPeer:
    """The child process (``await start(...)``, ``await complete()``, ``await stop()``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, torrent: Path, save_dir: Path) -> WebRTCPeer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SCRIPT), str(torrent), str(save_dir), stdout=asyncio.subprocess.PIPE
        )
        return cls(proc)

    async def complete(self, timeout_s: float) -> bool:
        """Whether it reported every piece within ``timeout_s``."""
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        except TimeoutError:
            return False
        return line.strip() == b"complete"

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s (a hung libdatachannel thread)."""
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def main() -> None:
    import time

    import libtorrent as lt

    torrent, save = sys.argv[1:3]
    session = lt.session(
        {
            "listen_interfaces": "127.0.0.1:0",
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "webtorrent_stun_server": "",  # none: host candidates only
            "alert_mask": 0,
        }
    )
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(torrent)
    atp.save_path = save
    handle = session.add_torrent(atp)
    told = False
    while True:
        if not told and handle.status().is_seeding:
            print("complete", flush=True)
            told = True
        time.sleep(0.05)


if __name__ == "__main__":
    main()
