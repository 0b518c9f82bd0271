"""A piece's owner that does not bring it into the swarm (issue 26), in the app's own
modules in Debian's headless Chromium.

The owner rule (ownsPiece, 43e5b73) gives a piece no connected peer holds to one reader
of those connected that lack it; the others wait for the owner. The owner set changes
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

#: one reader (A) beside a connected, unchoking reader (B) that lacks every piece and
#: never takes one: which of 12 pieces no peer holds A's web seeds are offered, held
#: back (`all` false), on ticks of `times` (seconds); B takes `bHas` at `bAt`
_WAIT = """async ({ times, bAt, bHas }) => {
  const { SwarmFetch } = await import('./js/swarm.js');
  const PIECES = 12;
  const bits = (held) => {
    const s = new Set(held);
    return { get: (i) => s.has(i), set: (i, v) => (v ? s.add(i) : s.delete(i)) };
  };
  const hex = (text) =>
    Array.from(text, (c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join('');
  const self = hex('-WW3021-aaaaaaaaaaaa');
  const seed = { type: 'webSeed', destroyed: false, peerPieces: bits([]), failedUntil: new Map() };
  const b = {
    type: 'webrtc', destroyed: false, peerChoking: false,
    peerId: hex('-WW3021-bbbbbbbbbbbb'), peerPieces: bits([]),
  };
  const torrent = {
    client: { peerId: self },
    wires: [seed, b],
    bitfield: bits([]),
    pieces: Array.from({ length: PIECES }, () => ({ missing: 16384 })),
    _reservations: [],
    _update() {},
  };
  const fetch = { torrent };
  const offered = [];
  for (const now of times) {
    if (now === bAt) for (const i of bHas) b.peerPieces.set(i, true);
    SwarmFetch.prototype.offerWebSeedPieces.call(fetch, false, now);
    const mine = [];
    for (let i = 0; i < PIECES; i++) if (seed.peerPieces.get(i)) mine.push(i);
    offered.push(mine);
  }
  return { offered, pieces: PIECES };
}"""


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
