"""A desktop peer announcing on both trackers (HTTP ``/announce`` and the WebSocket
``/webtorrent``, as libtorrent does for a torrent naming both) has its upload and
download counted once.

libtorrent sends the same BEP 7 ``key`` on both (hex digits, e.g. ``560F174A``; seen
with a capture of libtorrent 2.1.1's announces). The HTTP codec keeps the hex of the
key's bytes, the WebSocket codec kept the string itself, so the two never matched: each
announce on the other channel looked like a new client session and its whole session
totals were counted again. In bench/reader_swarm.py's N = 10 half (session 19) a desktop
that uploaded about 21 MB had 252.7 MB uploaded in the tracker's record."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from live_tracker import LiveTracker, announce_query

from pressrun.tracker.websocket_codec import WsAnnounce, parse_frame
from pressrun.tracker.websocket_relay import RelayConfig

IH = bytes(range(20))
DESKTOP = b"-PR0100-aaaaaaaaaaaa"
LEECHER = b"-PR0100-llllllllllll"
KEY = "560F174A"  # what libtorrent 2.1.1 sends, the same on both channels


def ws_frame(*, event: str | None, uploaded: int, downloaded: int, left: int) -> str:
    doc: dict[str, Any] = {
        "action": "announce",
        "info_hash": IH.decode("latin-1"),
        "peer_id": DESKTOP.decode("latin-1"),
        "uploaded": uploaded,
        "downloaded": downloaded,
        "left": left,
        "numwant": 0,
        "key": KEY,
        "offers": [],
    }
    if event is not None:
        doc["event"] = event
    return json.dumps(doc)


def test_the_websocket_key_is_kept_as_the_http_codec_keeps_it() -> None:
    msg = parse_frame(ws_frame(event="started", uploaded=0, downloaded=0, left=1), RelayConfig())
    assert isinstance(msg, WsAnnounce)
    assert msg.key == KEY.encode().hex()  # pressrun.tracker.codec: the key's bytes in hex


async def test_a_desktop_on_both_trackers_is_counted_once(
    tracker: LiveTracker, http: aiohttp.ClientSession
) -> None:
    # a leecher that can have downloaded what the desktop says it sent
    await tracker.announce(announce_query(IH, LEECHER, 7002, left=1_000_000, event="started"))

    async def on_http(uploaded: int, downloaded: int, left: int, event: str | None) -> None:
        extra: dict[str, str | int] = {"key": KEY}
        if event is not None:
            extra["event"] = event
        q = announce_query(
            IH, DESKTOP, 7001, uploaded=uploaded, downloaded=downloaded, left=left, **extra
        )
        await tracker.announce(q)

    ws = await http.ws_connect(f"http://127.0.0.1:{tracker.port}/webtorrent")
    try:

        async def on_ws(uploaded: int, downloaded: int, left: int, event: str | None) -> None:
            frame = ws_frame(event=event, uploaded=uploaded, downloaded=downloaded, left=left)
            await ws.send_str(frame)
            reply = json.loads((await ws.receive(timeout=5)).data)
            assert "failure reason" not in reply, reply

        # libtorrent's order: started on both, then each channel's own interval
        await on_http(0, 0, 5000, "started")
        await on_ws(0, 0, 5000, "started")
        await on_http(1000, 3000, 2000, None)
        await on_ws(1500, 4000, 1000, None)
        await on_http(2000, 5000, 0, "completed")
        await on_ws(2500, 5000, 0, "completed")
    finally:
        await ws.close()
    (record,) = [r for r in tracker.service.core.records(IH) if r.peer_id == DESKTOP]
    # on the code before: 1000 + 1500 + 2000 + 2500 uploaded, 3000 + 4000 + 5000 + 5000
    # downloaded (every announce on the other channel a new session)
    assert (record.uploaded_total, record.downloaded_total) == (2500, 5000)
