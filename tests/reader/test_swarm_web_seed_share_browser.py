"""What a crowd's readers take from the web seeds (issue 26), in the app's own modules in
Debian's headless Chromium.

bench/reader_swarm.py at 2dbd9e3 (20 MB, 2026-11-28 17:35, load 19.6 -> 34.0), traced
with the readers' own tally of what the web seeds were asked while a connected peer
held the piece (swarm-bytes.js): at N = 10 the readers took 52.2 MB from the origins,
1.4 MB of it pieces a connected peer held and the rest pieces no connected peer held,
2.6 copies where one enters the swarm (each reader took them all, the first arrivals
most: 5-11 MB each). At N = 20 readers 12-20 took 3.8-6.9 MB each of pieces a
connected peer held: their peers gave each about 250 kB/s, under the web seeds' 256 KiB/s
floor, so the web seeds offered every piece again.

A piece's owner that does not bring it into the swarm: the owner rule (ownsPiece,
43e5b73) gives a piece no connected peer holds to one reader of those connected that
lack it; the others wait for the owner. The owner set changes
when the owner disconnects (its wire is destroyed) or chokes (2181bec), not when it is
connected, unchoking and slow: a page without CPU (bench/reader_swarm.py N = 20 at
2181bec, 20:43-20:47, load 19.9 -> 33.0: readers whose apps came up at 32-37 s) or one
whose web seeds failed. Held back (its peers deliver other pieces), the waiting reader
took such a piece from its own web seeds only once it was starved or stalled. Now a
piece it has waited on for OWNER_WAIT_S of its running time is its own too.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import StackFactory, browser_only

pytestmark = [browser_only, pytest.mark.asyncio(loop_scope="module")]

#: what both harnesses below build in the page: 12 pieces no one holds, a web seed
#: wire, a reader's torrent of its wires, and the pieces its web seed is offered
_HARNESS = """
  const { SwarmFetch } = await import('./js/swarm.js');
  const PIECES = 12;
  const bits = (held) => {
    const s = new Set(held);
    return { get: (i) => s.has(i), set: (i, v) => (v ? s.add(i) : s.delete(i)) };
  };
  const hex = (text) =>
    Array.from(text, (c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join('');
  const webSeed = () => ({
    type: 'webSeed', destroyed: false, peerPieces: bits([]), failedUntil: new Map(),
  });
  const torrentOf = (self, wires) => ({
    client: { peerId: self },
    wires,
    bitfield: bits([]),
    pieces: Array.from({ length: PIECES }, () => ({ missing: 16384 })),
    _reservations: [],
    _update() {},
  });
  const offeredTo = (seed) => {
    const mine = [];
    for (let i = 0; i < PIECES; i++) if (seed.peerPieces.get(i)) mine.push(i);
    return mine;
  };
"""

#: four readers' views of one swarm: 12 pieces no one holds, every reader connected
#: to the three others (webtorrent's hex peer ids, "-WW" first) and to a desktop peer
#: ("-LT", which fills from the origins by its own rule)
_OFFERS = (
    "async (choking) => {"
    + _HARNESS
    + """  const ids = ['-WW3021-aaaaaaaaaaaa', '-WW3021-bbbbbbbbbbbb', '-WW3021-cccccccccccc',
               '-WW3021-dddddddddddd'].map(hex);
  const desktop = hex('-LT2110-eeeeeeeeeeee');
  const metered = hex('-WW3021-ffffffffffff'); // a reader that chokes everyone
  const offered = ids.map((self) => {
    const seed = webSeed();
    const others = [...ids.filter((id) => id !== self), desktop, ...(choking ? [metered] : [])];
    const peers = others.map((peerId) => ({
      type: 'webrtc', destroyed: false, peerChoking: peerId === metered, peerId,
      peerPieces: bits([]),
    }));
    const torrent = torrentOf(self, [seed, ...peers]);
    SwarmFetch.prototype.offerWebSeedPieces.call({ torrent }, false, 100);
    return offeredTo(seed);
  });
  return { offered, pieces: PIECES };
}"""
)


async def test_a_piece_no_peer_holds_is_offered_to_one_reader_of_those_connected(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # held back (the peers deliver), each reader's web seeds are offered the pieces no
    # connected peer holds. Before, every reader was offered all 12 (4 x 12 offers: 4
    # copies from the origins); now each piece goes to exactly one of the 4 readers
    stack = await make_stack()
    phone = await phone_factory(stack.reader_url)
    await phone.open()
    got = await phone.evaluate(_OFFERS, False, what="four readers' web seed offers")
    offered = got["offered"]
    every = sorted(i for mine in offered for i in mine)
    assert every == list(range(got["pieces"])), offered
    # and the pieces are spread (rendezvous hashing): no reader is offered all of them
    assert all(len(mine) < got["pieces"] for mine in offered), offered


async def test_the_peers_floor_and_the_web_seeds_rate_are_shared_among_the_leechers(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # a reader of a crowd of 10 whose peers give it 100 kB/s, the web seeds 1 MB/s:
    # the floor of 256 KiB/s and the web seeds' rate are the swarm's, shared among its
    # 10 downloading peers, so the web seeds hold back to what no peer holds. Before,
    # 100 kB/s was under the whole floor and the web seeds offered every piece for
    # good (the N = 20 crowd's readers 12-20). Alone (1 leecher), the same peers are
    # too slow, as before
    stack = await make_stack()
    phone = await phone_factory(stack.reader_url)
    await phone.open()
    got = await phone.evaluate(
        """async () => {
          const { WebSeedRule } = await import('./js/swarm.js');
          const drive = (leechers) => {
            const r = new WebSeedRule({ starvedS: 1, stallS: 2, holdS: 1, minPeerRate: 262144 });
            return [
              [0.0, null, null],
              [2.0, 100000, 1000000],   // a window on: held back, if delivering
              [3.0, 100000, 0],         // the same peers, web seeds on what no peer holds
              [4.0, 20000, 0],          // the peers fall under the shared floor
            ].map(([now, peerRate, webSeedRate]) =>
              r.step(now, {
                starved: false, lastPeerPayloadAt: now, peerRate, webSeedRate, leechers,
              }));
          };
          return { crowd: drive(10), alone: drive(1) };
        }""",
        what="the web seed rule with leechers",
    )
    assert got == {
        "crowd": [True, False, False, True],
        "alone": [True, True, True, True],
    }, got


async def test_a_reader_joining_peers_that_hold_pieces_takes_only_its_own_in_its_first_window(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # the web seeds are on for a reader's first window (2 s: its peers not judged yet);
    # while connected peers hold pieces it lacks they take only its own pieces no peer
    # holds (`widen` false), and beyond those once it is starved, or the window is
    # over and its peers do not deliver. Before, every piece (N = 10 at 43e5b73: each
    # reader joining the crowd took 1.6-5.2 MB from the origins)
    stack = await make_stack()
    phone = await phone_factory(stack.reader_url)
    await phone.open()
    got = await phone.evaluate(
        """async () => {
          const { WebSeedRule } = await import('./js/swarm.js');
          const r = new WebSeedRule({ starvedS: 1, stallS: 2, holdS: 1, minPeerRate: 1000 });
          return [
            [0.0, false, null],  // peers hold pieces it lacks: its own only
            [0.5, true, null],   // starved: beyond its own
            [1.0, false, null],  // its own only again
            [2.0, false, 500],   // the window over, the peers under the floor: beyond
          ].map(([now, starved, peerRate]) => {
            const on = r.step(now, {
              starved, lastPeerPayloadAt: now, peerRate, webSeedRate: 4000, leechers: 1,
            });
            return [on, r.widen];
          });
        }""",
        what="the web seed rule's first window",
    )
    assert got == [[True, False], [True, True], [True, False], [True, True]], got


async def test_a_reader_that_chokes_owns_no_piece(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # a fifth reader, connected to the four, chokes them (a metered one uploads
    # nothing): owner of a piece, it would hold it from them for good. It is no owner:
    # every piece is still offered to one of the four
    stack = await make_stack()
    phone = await phone_factory(stack.reader_url)
    await phone.open()
    got = await phone.evaluate(_OFFERS, True, what="the offers beside a choking reader")
    every = sorted(i for mine in got["offered"] for i in mine)
    assert every == list(range(got["pieces"])), got["offered"]


#: one reader (A) beside a connected, unchoking reader (B) that lacks every piece and
#: never takes one: which of 12 pieces no peer holds A's web seeds are offered, held
#: back (`all` false), on ticks of `times` (seconds); B takes `bHas` at `bAt`
_WAIT = (
    "async ({ times, bAt, bHas }) => {"
    + _HARNESS
    + """
  const self = hex('-WW3021-aaaaaaaaaaaa');
  const seed = webSeed();
  const b = {
    type: 'webrtc', destroyed: false, peerChoking: false,
    peerId: hex('-WW3021-bbbbbbbbbbbb'), peerPieces: bits([]),
  };
  const fetch = { torrent: torrentOf(self, [seed, b]) };
  const offered = [];
  for (const now of times) {
    if (now === bAt) for (const i of bHas) b.peerPieces.set(i, true);
    SwarmFetch.prototype.offerWebSeedPieces.call(fetch, false, now);
    offered.push(offeredTo(seed));
  }
  return { offered, pieces: PIECES };
}"""
)


async def test_a_piece_whose_owner_does_not_take_it_is_the_waiting_readers_after_a_while(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # ticks of 1 s from 100 s: at first A is offered its own pieces only (B owns the
    # rest); once it has waited OWNER_WAIT_S (8 s) of its running time, every piece.
    # Before, B's pieces were never offered to A while it was held back
    stack = await make_stack()
    phone = await phone_factory(stack.reader_url)
    await phone.open()
    times = [100.0 + k for k in range(11)]
    got = await phone.evaluate(
        _WAIT, {"times": times, "bAt": None, "bHas": []}, what="a slow owner's pieces"
    )
    offered, pieces = got["offered"], got["pieces"]
    first = offered[0]
    assert 0 < len(first) < pieces, first  # B owns some pieces
    assert all(mine == first for mine in offered[:8]), offered  # 100-107 s: waiting
    assert offered[8] == list(range(pieces)), offered  # 108 s: 8 s waited
    assert offered[10] == list(range(pieces)), offered
    # a page left without CPU for 20 s (one tick at 100 s, the next at 120 s) has not
    # waited 20 s on its peers: a tick counts at most 1 s, as the silent-peer rule
    # does. And a piece B takes (at 103 s) is no longer waited on: a peer holds it
    got = await phone.evaluate(
        _WAIT,
        {"times": [100.0, 120.0, 121.0], "bAt": None, "bHas": []},
        what="a page without CPU",
    )
    offered = got["offered"]
    assert offered[1] == offered[0] and offered[2] == offered[0], offered
    got = await phone.evaluate(
        _WAIT,
        {"times": [100.0 + k for k in range(10)], "bAt": 103.0, "bHas": list(range(12))},
        what="an owner that takes its pieces",
    )
    offered = got["offered"]
    # B holds every piece from 103 s: none is left for A's web seeds
    assert offered[3:] == [[]] * 7, offered
