"""bench/reader_swarm.py --offers-cpu: what a relayed WebRTC offer costs a reader at its
peer cap, with the reader's refuseOffers and without."""

from __future__ import annotations

import asyncio
import json
import random
import statistics

# a sibling script: python puts bench/ first on the path when bench/reader_swarm.py runs
from chromium_cpu import chromium_cpu_now, loadavg
from pressrun.reader.aio import start_reader
from pressrun.reader.config import ReaderConfig

#: a page that makes a real WebRTC offer (a data channel, ICE gathered), its SDP
_MAKE_OFFER = """async () => {
  const pc = new RTCPeerConnection();
  pc.createDataChannel('x');
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((r) => {
    if (pc.iceGatheringState === 'complete') r();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && r();
    setTimeout(r, 3000);
  });
  const sdp = pc.localDescription.sdp;
  pc.close();
  return sdp;
}"""

#: a torrent at its peer cap (boundPeers(torrent, 0, 0)) announced to the stand-in
#: tracker, which relays it the offers; `on`: the reader's refuseOffers, else
#: webtorrent's tracker client as before (a connection built for each, then refused)
_AT_CAP = """async ([announce, offers, on]) => {
  const { default: WebTorrent } = await import('webtorrent');
  const load = await import('./js/swarm-load.js');
  const options = { dht: false, lsd: false, utPex: false, natUpnp: false, natPmp: false };
  const maker = new WebTorrent({ ...options, tracker: false });
  const data = new Uint8Array(4 * 16384).fill(7);
  const file = await new Promise((resolve) => maker.seed(new File([data], 'o.bin'),
    { pieceLength: 16384, announce: [] }, (t) => resolve(t.torrentFile)));
  await new Promise((r) => maker.destroy(r));
  const client = new WebTorrent({ ...options, tracker: {} });
  try {
    const torrent = client.add(file, { announce: [announce] });
    const counts = load.boundPeers(torrent, 0, 0);
    if (!on) torrent.once('ready', () => {
      for (const t of torrent.discovery?.tracker?._trackers ?? []) delete t._onAnnounceResponse;
    });
    const deadline = performance.now() + 60000;
    while (counts.refused + counts.offers_refused < offers && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 2000)); // the connections' own teardown
    return counts;
  } finally {
    await new Promise((r) => client.destroy(r));
  }
}"""


async def offers_cpu(offers: int, rounds: int) -> int:
    """--offers-cpu: what a relayed offer costs a reader at its peer cap, in Chromium
    CPU seconds, with the reader's refuseOffers (the offer dropped before a connection
    is built) and without (webtorrent's tracker client builds an RTCPeerConnection, the
    peer is then refused): one page, a stand-in WebSocket tracker relaying ``offers``
    offers (a real offer's SDP, distinct peer ids) at each announce; ``rounds`` of each,
    alternated. Light (a few CPU seconds); not the crowd."""
    from aiohttp import WSMsgType, web
    from playwright.async_api import async_playwright

    from pressrun.reader.browser import CHROMIUM, CHROMIUM_ARGS, open_app

    sdp: dict[str, str] = {}

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        relayed_once = False  # the offers at the first announce (webtorrent announces again)
        async for msg in sock:
            if msg.type != WSMsgType.TEXT:
                continue
            doc = json.loads(msg.data)
            if doc.get("action") != "announce" or doc.get("answer") or relayed_once:
                continue
            relayed_once = True
            reply = {"action": "announce", "info_hash": doc["info_hash"], "interval": 600}
            await sock.send_str(json.dumps(reply))
            for k in range(offers):
                relayed = {
                    "action": "announce",
                    "info_hash": doc["info_hash"],
                    "peer_id": f"-WW3021-{random.getrandbits(48):012x}",
                    "offer_id": f"o{k:019d}",
                    "offer": {"type": "offer", "sdp": sdp["sdp"]},
                }
                await sock.send_str(json.dumps(relayed))
        return sock

    app = web.Application()
    app.router.add_get("/announce", ws)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    announce = f"ws://127.0.0.1:{runner.addresses[0][1]}/announce"
    # the app's page only (its modules and webtorrent); no balancer answers
    config = ReaderConfig(balancer_url="http://127.0.0.1:9", trust_on_first_use=True)
    reader = await start_reader(config)
    try:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, args=list(CHROMIUM_ARGS)
            )
            try:
                page = await (await browser.new_context()).new_page()
                await open_app(page, reader.url, 60.0)
                sdp["sdp"] = await page.evaluate(_MAKE_OFFER)
                print(
                    f"bench/reader_swarm.py --offers-cpu {offers}: {rounds} rounds of each, "
                    f"alternated; load {loadavg()}",
                    flush=True,
                )
                spent: dict[bool, list[float]] = {True: [], False: []}
                delivered: list[int] = []
                for _ in range(rounds):
                    for on in (False, True):
                        await asyncio.sleep(1.0)
                        before = await asyncio.to_thread(chromium_cpu_now)
                        counts = await page.evaluate(_AT_CAP, [announce, offers, on])
                        cpu = await asyncio.to_thread(chromium_cpu_now) - before
                        spent[on].append(cpu)
                        delivered.append(counts["refused"] + counts["offers_refused"])
                        print(
                            f"  refuseOffers {'on ' if on else 'off'}: Chromium {cpu:.2f} CPU s "
                            f"for {offers} offers (refused after a connection {counts['refused']}, "
                            f"dropped before one {counts['offers_refused']}); load {loadavg()}",
                            flush=True,
                        )
            finally:
                await browser.close()
    finally:
        await reader.stop()
        await runner.cleanup()
    off, on_ = statistics.median(spent[False]), statistics.median(spent[True])
    each = min(delivered) if delivered else 0
    print(
        f"median: off {off:.2f} CPU s, on {on_:.2f} CPU s for {each} offers: "
        f"{(off - on_) / max(1, each) * 1000:.1f} CPU ms saved per relayed offer at the "
        f"cap; load {loadavg()}"
    )
    return 0 if each == offers and min(delivered) == max(delivered) else 1
