"""The WebSocket tracker live: real libtorrent sessions move an issue over WebRTC
through it; a plain ``webtorrent`` page (no pressrun code) in Chromium downloads from a
libtorrent seed through it; two tracker instances on one Redis work as one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest
from live_tracker import LiveTracker, start_tracker
from webrtc_peer import WebRTCPeer

from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.redis_store import RedisStore

lt = pytest.importorskip("libtorrent")

PIECE = 256 * 1024


def torrent_bytes(path: Path, trackers: list[str]) -> bytes:
    """A v1 torrent of one file naming ``trackers`` (each its own tier)."""
    ct = lt.create_torrent(lt.list_files(str(path)), PIECE, lt.create_torrent.v1_only)
    for tier, url in enumerate(trackers):
        ct.add_tracker(url, tier)
    lt.set_piece_hashes(ct, str(path.parent))
    raw: bytes = lt.bencode(ct.generate())
    return raw


def seed_dir(tmp_path: Path, mib: int = 4) -> tuple[Path, bytes]:
    d = tmp_path / "seed"
    d.mkdir()
    data = os.urandom(mib * 1024 * 1024)
    (d / "issue.pdf").write_bytes(data)
    return d, data


async def written(path: Path, data: bytes, timeout_s: float = 10.0) -> bool:
    """Whether ``path`` holds ``data`` within ``timeout_s``: libtorrent says finished
    once every piece passed its hash check, and the last may still be on its way to
    the file (in a parallel run of the suite the file read at once began with zeros)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while path.read_bytes() != data:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_two_libtorrent_sessions_trade_over_webrtc_through_the_tracker(
    tracker: LiveTracker, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    sdir, data = seed_dir(tmp_path)
    ws_url = f"ws://127.0.0.1:{tracker.port}/webtorrent"
    torrent = tmp_path / "issue.torrent"
    torrent.write_bytes(torrent_bytes(sdir / "issue.pdf", [ws_url]))
    leech_dir = tmp_path / "leech"
    leech_dir.mkdir()
    seeder = await WebRTCPeer.start(torrent, sdir)
    leecher = await WebRTCPeer.start(torrent, leech_dir)
    try:
        assert await seeder.complete(30)
        started = time.monotonic()
        assert await leecher.complete(60)
        elapsed = time.monotonic() - started
        assert await written(leech_dir / "issue.pdf", data)
        # the leecher is a peer of the swarm in the tracker's own accounting
        ih = bytes.fromhex(str(lt.torrent_info(str(torrent)).info_hash()))
        assert len(tracker.service.core.records(ih)) == 2
        print(f"4 MiB over WebRTC in {elapsed:.2f} s")
    finally:
        await seeder.stop()
        await leecher.stop()


async def test_two_trackers_on_one_redis_connect_peers_on_either(
    redis_url: str, tmp_path: Path
) -> None:
    services = []
    try:
        for _ in range(2):
            service, port = await start_tracker(
                RedisStore(redis_url, prefix="ws-test:"), TrackerConfig(max_numwant=20)
            )
            services.append((service, port))
        sdir, data = seed_dir(tmp_path)
        urls = [f"ws://127.0.0.1:{port}/webtorrent" for _, port in services]
        seed_torrent, leech_torrent = tmp_path / "seed.torrent", tmp_path / "leech.torrent"
        seed_torrent.write_bytes(torrent_bytes(sdir / "issue.pdf", [urls[0]]))
        leech_torrent.write_bytes(torrent_bytes(sdir / "issue.pdf", [urls[1]]))
        leech_dir = tmp_path / "leech"
        leech_dir.mkdir()
        seeder = await WebRTCPeer.start(seed_torrent, sdir)
        leecher = None
        try:
            assert await seeder.complete(30)
            await asyncio.sleep(1.0)  # the seed is listed before the leecher offers
            leecher = await WebRTCPeer.start(leech_torrent, leech_dir)
            assert await leecher.complete(60)
            assert await written(leech_dir / "issue.pdf", data)
            relays = [s.webtorrent.relay for s, _ in services]  # type: ignore[attr-defined]
            assert all(r.sockets >= 1 for r in relays)  # one peer on each instance
        finally:
            await seeder.stop()
            if leecher is not None:
                await leecher.stop()
    finally:
        for service, _ in services:
            await service.close()
