"""Offers a reader at its peers refuses before a WebRTC connection is built (issue 26,
swarm-load.js refuseOffers), in Debian's headless Chromium.

webtorrent's tracker client (bittorrent-tracker's websocket client) builds a peer, an
RTCPeerConnection with its ICE agent and an answer, for every offer the tracker relays,
and only then does webtorrent drop a duplicate, or the reader's boundPeers one past its
cap: connections built and torn down on a page already at its peers (bench/
reader_swarm.py N = 20 at 2dbd9e3: 44 refused at the cap after their connection was
made, on two cores saturated by WebRTC). The tracker here is a stand-in WebSocket that
relays OFFERS offers to the page as soon as it announces; the page counts the
RTCPeerConnections made.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import WSMsgType, web

from .conftest import StackFactory, browser_only

pytestmark = [browser_only, pytest.mark.asyncio(loop_scope="module")]

#: offers relayed to the page, from this many peers (the last ones again: duplicates)
OFFERS = 8
PEERS = 5
#: a real offer's SDP is not needed: the connection is built before the SDP is read
SDP = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"


@pytest_asyncio.fixture(loop_scope="module")
async def tracker() -> AsyncIterator[str]:
    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        relayed = False  # the offers once per page (webtorrent may announce again)
        async for msg in sock:
            if msg.type != WSMsgType.TEXT:
                continue
            doc = json.loads(msg.data)
            if doc.get("action") != "announce" or doc.get("answer") or relayed:
                continue
            relayed = True
            await sock.send_str(
                json.dumps({"action": "announce", "info_hash": doc["info_hash"], "interval": 120})
            )
            for k in range(OFFERS):
                await sock.send_str(
                    json.dumps(
                        {
                            "action": "announce",
                            "info_hash": doc["info_hash"],
                            "peer_id": f"-WW3021-{k % PEERS:012d}",
                            "offer_id": f"offer-{k:014d}",
                            "offer": {"type": "offer", "sdp": SDP},
                        }
                    )
                )
        return sock

    app = web.Application()
    app.router.add_get("/announce", ws)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"ws://127.0.0.1:{runner.addresses[0][1]}/announce"
    await runner.cleanup()


#: a page-made torrent announced to the stand-in tracker with the reader's boundPeers
#: (no offers of its own: maxPeers 0; room for `maxPeersIn` peers); every offer relayed
#: has come once the counters stop moving
_RUN = """async ([announce, maxPeersIn, offers]) => {
  // counted once for the page: simple-peer keeps the constructor it found first
  if (window.__rtcBuilt === undefined) {
    window.__rtcBuilt = 0;
    const Native = window.RTCPeerConnection;
    window.RTCPeerConnection = class extends Native {
      constructor(...args) { super(...args); window.__rtcBuilt += 1; }
    };
  }
  const before = window.__rtcBuilt;
  let built = 0;
  const { default: WebTorrent } = await import('webtorrent');
  const load = await import('./js/swarm-load.js');
  const options = { dht: false, lsd: false, utPex: false, natUpnp: false, natPmp: false };
  // the torrent file from another client (a torrent is added once per client)
  const maker = new WebTorrent({ ...options, tracker: false });
  const data = new Uint8Array(4 * 16384).fill(7);
  const torrentFile = await new Promise((resolve) => maker.seed(new File([data], 'y.bin'),
    { pieceLength: 16384, announce: [] }, (t) => resolve(t.torrentFile)));
  await new Promise((r) => maker.destroy(r));
  const client = new WebTorrent({ ...options, tracker: {} });
  try {
    // as the reader: boundPeers right after add (its discovery starts before 'ready')
    const torrent = client.add(torrentFile, { announce: [announce] });
    const counts = load.boundPeers(torrent, 0, maxPeersIn);
    const seen = () =>
      (built = window.__rtcBuilt - before) + counts.refused + (counts.offers_refused ?? 0);
    const deadline = performance.now() + 8000;
    while (seen() < offers && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 500)); // none after the last
    seen();
    return { built, refused: counts.refused, offers_refused: counts.offers_refused ?? 0 };
  } finally {
    await new Promise((r) => client.destroy(r));
  }
}"""


async def test_offers_past_the_cap_or_from_a_known_peer_build_no_connection(
    make_stack: StackFactory,
    phone_factory: Any,
    tracker: str,
) -> None:
    # at its cap (0 peers taken), none of the 8 offers builds a connection; before,
    # each built one (then refused at addPeer). With room for 2: the first two peers'
    # offers build theirs, the other 6 (peers past the cap, and the duplicates) none
    stack = await make_stack()
    phone = await phone_factory(stack.reader_url)
    await phone.open()
    full = await phone.evaluate(_RUN, [tracker, 0, OFFERS], what="offers at the cap")
    assert full["built"] == 0, full
    assert full["offers_refused"] == OFFERS, full
    room = await phone.evaluate(_RUN, [tracker, 2, OFFERS], what="offers with room for 2")
    assert room["built"] == 2, room
    assert room["offers_refused"] == OFFERS - 2, room
