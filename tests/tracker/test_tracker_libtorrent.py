"""Real libtorrent 2.1.1 sessions announce to the tracker and find each other."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from live_tracker import LiveTracker, wait_for

lt = pytest.importorskip("libtorrent")

PIECE = 256 * 1024


def make_torrent(path: Path, tracker_url: str) -> Any:
    ct = lt.create_torrent(lt.list_files(str(path)), PIECE, lt.create_torrent.v1_only)
    ct.add_tracker(tracker_url)
    lt.set_piece_hashes(ct, str(path.parent))
    return lt.torrent_info(lt.bdecode(lt.bencode(ct.generate())))


def add_params(info: Any, save_path: Path) -> Any:
    atp = lt.add_torrent_params()
    atp.ti = info
    atp.save_path = str(save_path)
    return atp


def make_session() -> Any:
    return lt.session(
        {
            "listen_interfaces": "127.0.0.1:0",
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "allow_multiple_connections_per_ip": True,
            "min_announce_interval": 1,
            "stop_tracker_timeout": 2,
            "aio_threads": 1,
            "alert_mask": 0,
        }
    )


async def test_two_libtorrent_sessions_meet_through_the_tracker(
    tracker: LiveTracker, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    seed_dir, leech_dir = tmp_path / "seed", tmp_path / "leech"
    seed_dir.mkdir()
    leech_dir.mkdir()
    payload = seed_dir / "issue.pdf"
    payload.write_bytes(os.urandom(4 * PIECE))
    info = make_torrent(payload, f"{tracker.base}/announce")
    info_hash = bytes.fromhex(str(info.info_hash()))

    sessions = [make_session(), make_session()]
    try:
        seeder = sessions[0].add_torrent(add_params(info, seed_dir))
        leecher = sessions[1].add_torrent(add_params(lt.torrent_info(info), leech_dir))

        async def both_listed() -> list[dict[str, Any]]:
            swarms = await tracker.swarms()
            peers = [p for s in swarms if s["info_hash"] == info_hash.hex() for p in s["peers"]]  # type: ignore[attr-defined]
            return peers if len(peers) == 2 else []

        peers = await wait_for(both_listed, timeout_s=20)
        assert len(peers) == 2, "both libtorrent sessions should have announced"
        assert {p["ip"] for p in peers} == {"127.0.0.1"}
        assert len({p["port"] for p in peers}) == 2

        # The leecher got the seeder's address from the tracker and downloads from it.
        async def finished() -> bool:
            return bool(leecher.status().is_seeding)

        assert await wait_for(finished, timeout_s=30)
        assert (leech_dir / "issue.pdf").read_bytes() == payload.read_bytes()

        # The fair-exit extension: a client leaving by a rule names it in the stopped
        # announce (here through the tracker URL's query, which libtorrent keeps).
        # libtorrent sends `stopped` only to a tracker it has announced to: announce to
        # the new URL first, then remove the torrent.
        (seed_record,) = [
            r
            for r in tracker.service.core.records(info_hash)
            if r.left == 0 and r.downloaded_total == 0
        ]
        seeder.replace_trackers([lt.announce_entry(f"{tracker.base}/announce?leave_rule=ratio")])
        seeder.force_reannounce()

        async def reannounced() -> bool:
            record = tracker.service.core.record(info_hash, seed_record.peer_key)
            return record is not None and record.version > seed_record.version

        assert await wait_for(reannounced, timeout_s=15)
        sessions[0].remove_torrent(seeder)

        async def left_by_ratio() -> bool:
            (swarm,) = [s for s in await tracker.swarms() if s["info_hash"] == info_hash.hex()]
            return swarm["left_by_rule"]["ratio"] == 1  # type: ignore[index,no-any-return]

        assert await wait_for(left_by_ratio, timeout_s=15)
    finally:
        # The session destructor blocks while it announces `stopped` to this very event
        # loop's tracker: destroy it in a thread (FIELD-NOTES.md).
        await asyncio.to_thread(sessions.clear)
