"""A third-party client, aria2c, announces to the tracker (its own query format)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from live_tracker import LiveTracker, wait_for

lt = pytest.importorskip("libtorrent")
ARIA2C = shutil.which("aria2c")
pytestmark = pytest.mark.skipif(
    ARIA2C is None, reason="aria2c is not installed (scripts/setup-system.sh installs it)"
)


def free_ports(n: int) -> str:
    """A few ports free right now (aria2c takes a list and binds the first it can;
    it refuses port 0)."""
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(str(s.getsockname()[1]))
    return ",".join(ports)


async def test_aria2c_seeder_announces_and_stops(tracker: LiveTracker, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    payload = data_dir / "issue.pdf"
    payload.write_bytes(os.urandom(512 * 1024))
    ct = lt.create_torrent(lt.list_files(str(payload)), 256 * 1024, lt.create_torrent.v1_only)
    ct.add_tracker(f"{tracker.base}/announce")
    lt.set_piece_hashes(ct, str(data_dir))
    torrent = tmp_path / "issue.torrent"
    torrent.write_bytes(lt.bencode(ct.generate()))
    info_hash = str(lt.torrent_info(str(torrent)).info_hash())

    assert ARIA2C is not None
    proc = await asyncio.create_subprocess_exec(
        ARIA2C, f"--dir={data_dir}", "--check-integrity=true", "--seed-time=0.05",
        "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
        f"--listen-port={free_ports(3)}", "--quiet=true", str(torrent),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:

        async def aria2c_peer() -> dict[str, Any] | None:
            for swarm in await tracker.swarms():
                if swarm["info_hash"] == info_hash:
                    for peer in swarm["peers"]:  # type: ignore[attr-defined]
                        if bytes.fromhex(peer["peer_id"]).startswith(b"A2-"):
                            return peer  # type: ignore[no-any-return]
            return None

        peer = await wait_for(aria2c_peer, timeout_s=15)
        assert peer is not None, "aria2c should have announced"
        assert peer["state"] in ("seed", "left") and peer["left"] == 0
        # After its seed time aria2c exits and announces `stopped` (no pressrun rule).
        assert await asyncio.wait_for(proc.wait(), 30) == 0

        async def stopped() -> bool:
            p = await aria2c_peer()
            return p is not None and p["leave_rule"] == "unspecified"

        assert await wait_for(stopped, timeout_s=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
