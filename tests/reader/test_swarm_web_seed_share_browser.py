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
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import StackFactory, browser_only

pytestmark = [browser_only, pytest.mark.asyncio(loop_scope="module")]

#: four readers' views of one swarm: 12 pieces no one holds, every reader connected
#: to the three others (webtorrent's hex peer ids, "-WW" first) and to a desktop peer
#: ("-LT", which fills from the origins by its own rule)
_OFFERS = """async (choking) => {
  const { SwarmFetch } = await import('./js/swarm.js');
  const PIECES = 12;
  const bits = (held) => {
    const s = new Set(held);
    return { get: (i) => s.has(i), set: (i, v) => (v ? s.add(i) : s.delete(i)) };
  };
  const hex = (text) =>
    Array.from(text, (c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join('');
  const ids = ['-WW3021-aaaaaaaaaaaa', '-WW3021-bbbbbbbbbbbb', '-WW3021-cccccccccccc',
               '-WW3021-dddddddddddd'].map(hex);
  const desktop = hex('-LT2110-eeeeeeeeeeee');
  const metered = hex('-WW3021-ffffffffffff'); // a reader that chokes everyone
  const offered = ids.map((self) => {
    const seed = {
      type: 'webSeed', destroyed: false, peerPieces: bits([]), failedUntil: new Map(),
    };
    const others = [...ids.filter((id) => id !== self), desktop, ...(choking ? [metered] : [])];
    const peers = others.map((peerId) => ({
      type: 'webrtc', destroyed: false, peerChoking: peerId === metered, peerId,
      peerPieces: bits([]),
    }));
    const torrent = {
      client: { peerId: self },
      wires: [seed, ...peers],
      bitfield: bits([]),
      pieces: Array.from({ length: PIECES }, () => ({ missing: 16384 })),
      _reservations: [],
      _update() {},
    };
    SwarmFetch.prototype.offerWebSeedPieces.call({ torrent }, false, 100);
    const mine = [];
    for (let i = 0; i < PIECES; i++) if (seed.peerPieces.get(i)) mine.push(i);
    return mine;
  });
  return { offered, pieces: PIECES };
}"""


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
