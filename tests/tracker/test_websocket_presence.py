"""A WebRTC peer is present while its WebSocket is open: libtorrent re-announces over
a WebSocket only once a minute, so the tracker keeps its record alive (without adding
a byte) and lets it expire once the socket is gone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from live_tracker import start_tracker

from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.sqlite_store import SqliteStore

IH = bytes(range(20))
PEER = b"P" * 20


async def test_an_open_socket_keeps_its_peer_and_a_closed_one_expires(tmp_path: Path) -> None:
    # interval 1 s: the peer TTL is 2.5 s, far shorter than libtorrent's 60 s
    service, port = await start_tracker(
        SqliteStore(tmp_path / "t.db", flush_interval_s=0.05),
        TrackerConfig(interval_s=1, min_interval_s=1),
    )
    try:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{port}/webtorrent")
            frame = {
                "action": "announce",
                "info_hash": IH.decode("latin-1"),
                "peer_id": PEER.decode("latin-1"),
                "event": "started",
                "uploaded": 0,
                "downloaded": 500,
                "left": 1000,
                "offers": [],
            }
            await ws.send_str(json.dumps(frame))
            assert "interval" in json.loads((await ws.receive(timeout=5)).data)
            await asyncio.sleep(4.0)  # past the TTL, with no announce from the peer
            (record,) = service.core.records(IH)
            assert record.active, record
            assert record.downloaded_total == 500  # heard again, nothing added
            await ws.close()
            await asyncio.sleep(4.0)
            (record,) = service.core.records(IH)
            assert not record.active and record.leave_rule is not None
            assert record.leave_rule.value == "expired"
    finally:
        await service.close()
