"""A desktop peer on both trackers (its record has the port its HTTP announce gave)
reaches the other desktop peers over TCP through /announce: its WebRTC offers go only
to WebRTC-only peers (browsers), none into a DTLS connection that would duplicate a TCP
one. A browser's offers still go to desktop peers (that is how it reaches them)."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp
from live_tracker import LiveTracker, announce_query
from test_websocket_relay import CONFIG, announce, announce_text

from pressrun.tracker.websocket_codec import WsAnnounce, parse_frame
from pressrun.tracker.websocket_relay import WebTorrentRelay

IH = bytes(range(20))
DESKTOP_A, DESKTOP_B, BROWSER = (
    b"-PR0100-aaaaaaaaaaaa",
    b"-PR0100-bbbbbbbbbbbb",
    b"-WW0300-cccccccccccc",
)


def frame(peer: bytes, offers: int) -> str:
    return json.dumps(
        {
            "action": "announce",
            "info_hash": IH.decode("latin-1"),
            "peer_id": peer.decode("latin-1"),
            "event": "started",
            "uploaded": 0,
            "downloaded": 0,
            "left": 100,
            "numwant": offers,
            "offers": [
                {
                    "offer_id": (peer[:19] + bytes([i])).decode("latin-1"),
                    "offer": {"type": "offer", "sdp": "v=0"},
                }
                for i in range(offers)
            ],
        }
    )


async def offers_received(ws: aiohttp.ClientWebSocketResponse, wait_s: float) -> list[str]:
    """The peer_ids whose offers reached this socket within ``wait_s``."""
    got: list[str] = []
    try:
        while True:
            msg = await ws.receive(timeout=wait_s)
            doc: dict[str, Any] = json.loads(msg.data)
            if "offer" in doc:
                got.append(doc["peer_id"])
    except TimeoutError:
        return got


async def test_desktop_offers_go_to_browsers_only(
    tracker: LiveTracker, http: aiohttp.ClientSession
) -> None:
    url = f"http://127.0.0.1:{tracker.port}/webtorrent"
    for peer, port in ((DESKTOP_A, 7001), (DESKTOP_B, 7002)):
        await tracker.announce(announce_query(IH, peer, port, event="started"))
    sockets = {peer: await http.ws_connect(url) for peer in (DESKTOP_A, DESKTOP_B, BROWSER)}
    try:
        for peer in (DESKTOP_B, BROWSER):  # in the relay's swarm, no offers
            await sockets[peer].send_str(frame(peer, 0))
            await sockets[peer].receive(timeout=5)  # the reply
        # desktop A offers 5: only the browser can be given one
        await sockets[DESKTOP_A].send_str(frame(DESKTOP_A, 5))
        got_b, got_browser = await asyncio.gather(
            offers_received(sockets[DESKTOP_B], 0.5), offers_received(sockets[BROWSER], 0.5)
        )
        assert got_b == [] and got_browser == [DESKTOP_A.decode("latin-1")]
        # the browser's offers go to both desktop peers
        await sockets[BROWSER].send_str(frame(BROWSER, 5))
        got_a, got_b = await asyncio.gather(
            offers_received(sockets[DESKTOP_A], 0.5), offers_received(sockets[DESKTOP_B], 0.5)
        )
        assert BROWSER.decode("latin-1") in got_a and BROWSER.decode("latin-1") in got_b
    finally:
        for ws in sockets.values():
            await ws.close()


def test_the_relay_offers_to_no_peer_it_is_told_not_to() -> None:
    relay = WebTorrentRelay(CONFIG, random.Random(1), "one")
    for sock in (1, 2, 3):
        relay.open_socket(sock, now=0.0)
    a, b, c = b"A" * 20, b"B" * 20, b"C" * 20
    announce(relay, 1, a, 0.0)
    announce(relay, 2, b, 0.0)
    msg = parse_frame(announce_text(c, offers=5), CONFIG)
    assert isinstance(msg, WsAnnounce) and relay.join(3, msg, now=1.0) is None
    effects = relay.handle_announce(3, msg, now=1.0, not_to=frozenset({a}))
    assert [e.socket_id for e in effects] == [2]  # type: ignore[union-attr]
