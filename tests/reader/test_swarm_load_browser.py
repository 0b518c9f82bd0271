"""What the reader's swarm costs the phone (issue 26, swarm-load.js), on a real
webtorrent torrent in Debian's headless Chromium.

A crowd of 10 readers on 2 cores (bench/reader_swarm.py, --profile) spent most of a
page's busy main thread in webtorrent's request pass and its rarest-first pick, and
each page sent 5 new WebRTC offers at every announce whatever it was connected to.
The torrent here is a page-made one (``client.seed``): its rarity map, its request
pass and its ``addPeer`` are webtorrent's own.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Phone, StackFactory, browser_only

pytestmark = [browser_only, pytest.mark.asyncio(loop_scope="module")]

#: a torrent of PIECES pieces of 16 KiB, seeded in the page, its bitfield then cleared
#: (a reader that holds nothing); the webtorrent client is destroyed after each script
_SEEDED = """
const PIECES = %d;
const { default: WebTorrent } = await import('webtorrent');
const load = await import('./js/swarm-load.js');
const client = new WebTorrent(
  { dht: false, lsd: false, utPex: false, natUpnp: false, natPmp: false, tracker: false });
const data = new Uint8Array(PIECES * 16384);
for (let i = 0; i < data.length; i += 4096) data[i] = i %% 251;
const torrent = await new Promise((resolve) =>
  client.seed(new File([data], 'x.bin'), { pieceLength: 16384, announce: [] }, resolve));
for (let i = 0; i < PIECES; i++) torrent.bitfield.set(i, false);
"""


async def _in_page(phone: Phone, pieces: int, body: str, what: str) -> Any:
    script = (
        "(async () => {"
        + _SEEDED % pieces
        + "try {"
        + body
        + "} finally { await new Promise((r) => client.destroy(r)); } })()"
    )
    return await phone.evaluate(script, what=what)


async def _phone(make_stack: StackFactory, phone_factory: Any) -> Phone:
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    return phone


async def test_a_pick_looks_at_each_piece_at_most_twice_and_takes_the_rarest(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # webtorrent's trySelectWire asks getRarestPiece(filter) again after each piece it
    # could not ask for (every block already asked of another wire: the usual case in
    # a crowd), the filter then refusing that piece. Its own pick scans every piece
    # each time: P (P + 1) / 2 filter calls for P pieces (80,200 for 400; the page's
    # busiest JavaScript in the bench). Ordered once, the walk is at most 2 P.
    phone = await _phone(make_stack, phone_factory)
    got = await _in_page(
        phone,
        400,
        """
        const rarity = torrent._rarityMap;
        const drive = () => {
          // as trySelectWire: the same filter until -1, each piece tried once
          let calls = 0;
          const tried = {};
          const filter = (i) => { calls += 1; return !(i in tried); };
          const picked = [];
          for (;;) {
            const piece = rarity.getRarestPiece(filter);
            if (piece < 0) break;
            picked.push(piece);
            tried[piece] = true;
          }
          return { calls, picked };
        };
        // pieces 0-99 held by 2 peers, 100-199 by 1, the rest by none; 0-9 held here
        for (let i = 0; i < 200; i++) rarity._pieces[i] = i < 100 ? 2 : 1;
        for (let i = 0; i < 10; i++) torrent.bitfield.set(i, true);
        const own = drive();
        load.orderedRarestPick(torrent);
        const ordered = drive();
        // a filter that refuses the first 10 it is asked (webtorrent's speed ranker
        // passes over pieces a faster wire holds, 10 times, then takes any): those come
        // after the end, once around
        let refusals = 10;
        const ranked = rarity.getRarestPiece((i) => (refusals > 0 ? (refusals--, false) : true));
        return { own: own.calls, ordered: ordered.calls, picked: ordered.picked,
                 ownPicked: own.picked.length, ranked };
        """,
        "the rarest-first pick",
    )
    print(f"filter calls, a pick of 390 missing: webtorrent {got['own']}, ordered {got['ordered']}")
    assert got["ownPicked"] == 400  # webtorrent's own pick offers the pieces held too
    picked = got["picked"]
    assert sorted(picked) == list(range(10, 400))  # every missing piece, none held
    # rarest first: the 200 nobody holds, then the 100 one peer holds, then the rest
    assert set(picked[:200]) == set(range(200, 400))
    assert set(picked[200:300]) == set(range(100, 200))
    assert set(picked[300:]) == set(range(10, 100))
    assert got["ordered"] <= 2 * 390, got
    assert got["own"] > 50 * got["ordered"], got  # what it was
    assert got["ranked"] >= 200  # the 11th rarest: still one nobody holds


async def test_calls_for_a_request_pass_while_one_waits_are_that_pass(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # webtorrent calls _update after every block received and every 'have' heard; each
    # call was its own idle callback and its own pass over every wire
    phone = await _phone(make_stack, phone_factory)
    got = await _in_page(
        phone,
        8,
        """
        let passes = 0;
        const pass = torrent._updateWireWrapper.bind(torrent);
        torrent._updateWireWrapper = () => { passes += 1; pass(); };
        const idle = () => new Promise((r) =>
          requestIdleCallback(() => setTimeout(r, 50), { timeout: 1000 }));
        for (let i = 0; i < 200; i++) torrent._update();
        await idle(); await idle();
        const own = passes;
        passes = 0;
        const counts = load.coalesceUpdates(torrent);
        for (let i = 0; i < 200; i++) torrent._update();
        await idle(); await idle();
        const first = passes;
        torrent._update();
        await idle(); await idle();
        return { own, first, second: passes, counts };
        """,
        "the request passes",
    )
    assert got["own"] == 200, got  # webtorrent's: a pass per call
    assert got["first"] == 1, got
    assert got["second"] == 2, got  # a call after the pass ran is a new pass
    assert got["counts"] == {"asked": 201, "passes": 2}, got


async def test_a_reader_stops_offering_at_max_peers_and_refuses_past_max_peers_in(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # 14 WebRTC peers come to a reader (offers answered, offers relayed to it):
    # webtorrent takes them all (its bound is 55) and its tracker client sends 5 new
    # offers at every announce whatever it has. Bounded: the announce asks for what is
    # missing up to MAX_PEERS (8), and a peer past MAX_PEERS_IN (12) is destroyed
    # before its connection is made
    phone = await _phone(make_stack, phone_factory)
    got = await _in_page(
        phone,
        8,
        """
        // a WebRTC connection not yet connected, as webtorrent's tracker client emits it
        const conn = (n) => {
          const handlers = {};
          return {
            id: `peer-${n}`, connected: false, destroyed: false,
            once(ev, f) { handlers[ev] = f; }, on(ev, f) { handlers[ev] = f; },
            removeListener(ev) { delete handlers[ev]; },
            destroy() { this.destroyed = true; },
          };
        };
        const numwant = () => torrent._getAnnounceOpts?.().numwant;
        const run = (bounded) => {
          const conns = [];
          const wants = [numwant()];
          for (let n = 0; n < 14; n++) {
            const c = conn(`${bounded}-${n}`);
            conns.push(c);
            torrent.addPeer(c, 'tracker');
            wants.push(numwant());
          }
          const taken = conns.filter((c) => !c.destroyed).length;
          for (const c of conns) torrent.removePeer(c.id);
          return { taken, wants };
        };
        const own = run(false);
        const counts = load.boundPeers(torrent);
        const bounded = run(true);
        return { own, bounded, counts, max: [load.MAX_PEERS, load.MAX_PEERS_IN] };
        """,
        "the peer bound",
    )
    assert got["max"] == [8, 12]
    assert got["own"]["taken"] == 14, got  # webtorrent's own: every one
    assert got["bounded"]["taken"] == 12, got
    assert got["counts"] == {"refused": 2, "offers_refused": 0, "offers": 30}, got
    # offers asked for: 5 while 3 or more are missing, then what is missing, none at 8
    assert got["bounded"]["wants"][:10] == [5, 5, 5, 5, 4, 3, 2, 1, 0, 0], got
    assert set(got["bounded"]["wants"][8:]) == {0}, got


async def test_offers_still_out_count_as_peers_coming(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # webtorrent's tracker client makes the offers an announce asks for (5 at most),
    # each a WebRTC connection kept 50 s until it is answered; an announce asked for 5
    # new ones whatever was still out. A reader with few peers at a busy tracker's
    # 2 s announces had up to 125 connections open for offers nobody answered (at
    # bench/reader_swarm.py's 2 readers: 2.5 made a second each). Now the offers out
    # count as peers coming: 5 new ones while 3 or fewer are out, then what is missing
    # up to MAX_PEERS (8), and again as they are answered or dropped
    phone = await _phone(make_stack, phone_factory)
    got = await _in_page(
        phone,
        8,
        """
        const counts = load.boundPeers(torrent);
        // a WebSocket tracker's offers out, by offer id (bittorrent-tracker's peers)
        const out = {};
        const real = torrent.discovery.tracker;
        torrent.discovery.tracker = { _trackers: [{ peers: out }] };
        try {
          const numwant = () => torrent._getAnnounceOpts().numwant;
          const wants = [numwant()];
          for (let k = 0; k < 9; k++) {
            out[`offer-${k}`] = {};
            wants.push(numwant());
          }
          delete out['offer-0'];
          delete out['offer-1'];
          wants.push(numwant());
          return { wants, pending: load.pendingOffers(torrent), made: counts.offers };
        } finally {
          torrent.discovery.tracker = real;
        }
        """,
        "the offers out",
    )
    assert got["wants"] == [5, 5, 5, 5, 4, 3, 2, 1, 0, 0, 1], got
    assert got["pending"] == 7, got
    assert got["made"] == 31, got


async def test_a_peer_destroyed_before_its_connection_came_leaves_no_listener_behind(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # webtorrent waits for a WebRTC connection's 'connect' or 'error' with listeners
    # that read peer.conn; a peer destroyed first (no connection within 25 s, the reader
    # leaving) set peer.conn to null and left them on: a late 'error' threw "Cannot read
    # properties of null (reading 'removeListener')" (once in a reader page of the bench)
    phone = await _phone(make_stack, phone_factory)
    got = await _in_page(
        phone,
        8,
        """
        // a WebRTC connection not yet connected, with EventEmitter's listener calls
        const conn = (id) => {
          const on = new Map();
          const list = (ev) => on.get(ev) ?? on.set(ev, []).get(ev);
          return {
            id, connected: false, destroyed: false,
            on(ev, f) { list(ev).push(f); return this; },
            once(ev, f) { list(ev).push(f); return this; },
            listeners(ev) { return [...list(ev)]; },
            removeListener(ev, f) { on.set(ev, list(ev).filter((g) => g !== f)); return this; },
            emit(ev, ...args) { for (const f of list(ev)) f(...args); },
            destroy() { this.destroyed = true; },
          };
        };
        const lateError = (c) => {
          torrent.addPeer(c, 'tracker');
          torrent._peers.get(c.id).destroy(new Error('connect timeout'));
          try {
            c.emit('error', new Error('late'));
            return null;
          } catch (err) {
            return err.message;
          }
        };
        const own = lateError(conn('own'));
        load.boundPeers(torrent);
        const c = conn('bounded');
        const bounded = lateError(c);
        return { own, bounded, left: c.listeners('error').length + c.listeners('connect').length };
        """,
        "a late error on a destroyed peer's connection",
    )
    assert got["own"] == "Cannot read properties of null (reading 'removeListener')", got
    assert got["bounded"] is None, got
    assert got["left"] == 1, got  # webtorrent's own no-op 'error' listener, added at destroy


async def test_writes_are_joined_into_messages_of_at_most_32_kib_in_order(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # the wire writes a block's 13-byte header and its 16 KiB apart, and each write was
    # a data-channel message of its own (its own packets, its own event at the peer)
    phone = await _phone(make_stack, phone_factory)
    got = await phone.evaluate(
        """(async () => {
          const { joinWrites, MESSAGE_BYTES } = await import('./js/swarm-load.js');
          const w = (n, v) => new Uint8Array(n).fill(v);
          const writes = [w(13, 1), w(16384, 2), w(9, 3), w(13, 4), w(16384, 5),
                          w(40000, 6), w(9, 7)];
          const messages = joinWrites(writes);
          const flat = (xs) => xs.flatMap((x) => Array.from(x));
          return {
            max: MESSAGE_BYTES,
            sizes: messages.map((m) => m.length),
            same: JSON.stringify(flat(writes)) === JSON.stringify(flat(messages)),
          };
        })()""",
        what="the joined writes",
    )
    assert got["max"] == 32768
    # in order while they fit 32 KiB (header, block, a have, the next header), then the
    # next block; a write longer than that alone; the rest
    assert got["sizes"] == [13 + 16384 + 9 + 13, 16384, 40000, 9], got
    assert got["same"], got
