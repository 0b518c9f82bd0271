"""The WebSocket tracker live: real libtorrent sessions move an issue over WebRTC
through it; a plain ``webtorrent`` page (no pressrun code) in Chromium downloads from a
libtorrent seed through it; two tracker instances on one Redis work as one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from live_tracker import LiveTracker, start_tracker, wait_for

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


def make_torrent(path: Path, trackers: list[str]) -> Any:
    return lt.torrent_info(lt.bdecode(torrent_bytes(path, trackers)))


def webrtc_session() -> Any:
    """A session that can only meet peers through the WebSocket tracker: no DHT, LSD,
    and the torrent names no HTTP tracker; no STUN server (offline)."""
    return lt.session(
        {
            "listen_interfaces": "127.0.0.1:0",
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "allow_multiple_connections_per_ip": True,
            "webtorrent_stun_server": "",
            "announce_to_all_trackers": True,
            "stop_tracker_timeout": 1,
            "aio_threads": 1,
            "alert_mask": 0,
        }
    )


def add(session: Any, info: Any, save: Path) -> Any:
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(info)
    atp.save_path = str(save)
    return session.add_torrent(atp)


async def end_sessions(*sessions: Any) -> None:
    """End libtorrent explicitly, bounded (FIELD-NOTES: libdatachannel threads once hung
    at exit)."""
    for s in sessions:
        for handle in s.get_torrents():
            s.remove_torrent(handle)
        await asyncio.wait_for(asyncio.to_thread(s.pause), 20)


def seed_dir(tmp_path: Path, mib: int = 4) -> tuple[Path, bytes]:
    d = tmp_path / "seed"
    d.mkdir()
    data = os.urandom(mib * 1024 * 1024)
    (d / "issue.pdf").write_bytes(data)
    return d, data


async def test_two_libtorrent_sessions_trade_over_webrtc_through_the_tracker(
    tracker: LiveTracker, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    sdir, data = seed_dir(tmp_path)
    ws_url = f"ws://127.0.0.1:{tracker.port}/webtorrent"
    info = make_torrent(sdir / "issue.pdf", [ws_url])
    leech_dir = tmp_path / "leech"
    leech_dir.mkdir()
    seeder, leecher = webrtc_session(), webrtc_session()
    try:
        add(seeder, info, sdir)
        handle = add(leecher, info, leech_dir)
        started = time.monotonic()

        async def done() -> bool:
            return bool(handle.status().is_seeding)

        assert await wait_for(done, timeout_s=60)
        elapsed = time.monotonic() - started
        assert (leech_dir / "issue.pdf").read_bytes() == data
        # the WebRTC peers' bytes are in the tracker's accounting like any peer's
        ih = bytes.fromhex(str(info.info_hash()))
        leecher.remove_torrent(handle)  # a stopped announce with its counters

        async def counted() -> bool:
            stats = tracker.service.core.stats(ih)
            return stats is not None and stats.downloaded_bytes >= len(data)

        assert await wait_for(counted, timeout_s=30), tracker.service.core.records(ih)
        print(f"4 MiB over WebRTC in {elapsed:.2f} s")
    finally:
        await end_sessions(seeder, leecher)


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
        seed_info = make_torrent(sdir / "issue.pdf", [urls[0]])
        leech_info = make_torrent(sdir / "issue.pdf", [urls[1]])
        assert str(seed_info.info_hash()) == str(leech_info.info_hash())
        leech_dir = tmp_path / "leech"
        leech_dir.mkdir()
        seeder, leecher = webrtc_session(), webrtc_session()
        try:
            add(seeder, seed_info, sdir)
            await asyncio.sleep(1.0)  # the seed is listed before the leecher offers
            handle = add(leecher, leech_info, leech_dir)

            async def done() -> bool:
                return bool(handle.status().is_seeding)

            assert await wait_for(done, timeout_s=60)
            assert (leech_dir / "issue.pdf").read_bytes() == data
            relays = [s.webtorrent.relay for s, _ in services]  # type: ignore[attr-defined]
            assert all(r.sockets >= 1 for r in relays)  # one peer on each instance
        finally:
            await end_sessions(seeder, leecher)
    finally:
        for service, _ in services:
            await service.close()
