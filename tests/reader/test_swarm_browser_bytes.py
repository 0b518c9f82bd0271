"""The web reader in a swarm takes each block once (issue 26), in Debian's headless Chromium.

The reader's ``swarm()`` readout classes every byte its wires delivered
(``bytes``: received, needed, wasted by cause and source; webtorrent's hotswaps;
swarm-bytes.js). A flash crowd of 10 readers took 230 MB for a 200 MB issue
(bench/reader_swarm.py, docs/results/2026-11-28-reader-swarm.md, run 9). The stack
(tracker, stand-in, reader service) is tests/reader/test_swarm_browser.py's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from .conftest import browser_only
from .test_swarm_browser import (  # noqa: F401  (stack and swarm are fixtures)
    PIECE,
    SwarmStack,
    open_phone,
    plain_peer,
    prestore,
    stack,
    start,
    swarm,
    swarm_status,
    verified,
)

pytest.importorskip("libtorrent")

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def test_blocks_asked_again_of_others_are_cancelled_at_the_silent_peer(
    swarm: SwarmStack,  # noqa: F811  (the fixture imported above)
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # the reader's sources: a plain webtorrent peer that answers 16 blocks and then
    # holds every request for 4 s (busy), and an origin at 4 Mbit/s as web seed. The
    # reader asks the silent peer's blocks again of others after request_timeout_s
    # (3 s) and cancels each at the peer (a BitTorrent cancel) as the web seed is asked
    # for it, so the peer does not send them when it wakes, and the web seed is never
    # asked for a block a peer was
    # asked for (no hotswap over a peer; an ask ends before such a block). Before, the
    # requests were failed here only: the peer sent those it held when it woke, each a
    # block received meanwhile (16-271 kB wasted, "reask", in 6 of 6 runs at 2 and
    # 4 Mbit/s); with the cancel alone, 3 blocks still came from both (the web seed's
    # ask ran to the piece's end over a block the peer had been asked for again)
    issue = await swarm.publish("bytes-silent-peer")
    origin = await swarm.origin(egress_cap_mbps=4.0)
    swarm.direct(issue, origins=[swarm.standin_url], web_seeds=[origin])
    busy = await open_phone(phone_factory, swarm.reader_url)
    await plain_peer(busy, swarm, issue, origin, stall_after_blocks=16, stall_s=4.0)
    phone = await open_phone(phone_factory, swarm.reader_url)
    await start(phone, issue)
    result = await verified(phone, issue, issue.data)
    await asyncio.sleep(2.0)  # the busy peer wakes (4 s after its 16th block): it sends nothing
    status: dict[str, Any] = await swarm_status(phone, issue)
    tally = status["bytes"]
    print(
        f"a silent peer: {result['seconds']:.2f} s, {status['reasked_requests']} asked again, "
        f"received {tally['received']} B for {issue.transfer_bytes}, wasted "
        f"{tally['wasted_by_cause']}, hotswaps {tally['hotswaps']}"
    )
    assert status["reasked_requests"] > 0, status  # the silence was seen
    assert tally["hotswaps"]["web_seed_over_peer"] == 0, tally
    assert tally["wasted"] == 0, tally


async def test_a_silent_peer_asked_again_for_the_blocks_it_holds_sends_each_once(
    swarm: SwarmStack,  # noqa: F811  (the fixture imported above)
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # the reader holds all but the last piece (4 blocks); its one source is a plain
    # webtorrent peer that answers 1 block, then holds the other 3 for 7 s and answers
    # them in the order asked (the web seed is stopped, the origins lack the issue).
    # After request_timeout_s (3 s) the reader asks the 3 again, and the only source,
    # the same peer, gets them. Before, they were cancelled at the peer and asked for
    # again: the peer's answer to each cancelled request, when it woke, took the new
    # request of the same block from its list (bittorrent-protocol matches by piece,
    # offset and length), found it was not its own and sent nothing, so no block came,
    # and 10 s after its start the reader left the swarm for the origins (the flaky
    # busy-peer test of test_swarm_browser.py, 3 of 5 CI runs). Now the peer is sent
    # nothing: the request it holds is put back, and answered once
    issue = await swarm.publish("bytes-held-blocks")
    origin = await swarm.origin()
    stopped = await swarm.origin(stopped=True)
    swarm.direct(issue, origins=[swarm.standin_url], web_seeds=[stopped])
    busy = await open_phone(phone_factory, swarm.reader_url)
    await plain_peer(busy, swarm, issue, origin, stall_after_blocks=1, stall_s=7.0)
    phone = await open_phone(phone_factory, swarm.reader_url)
    n = -(-issue.transfer_bytes // PIECE)
    await prestore(phone, issue, 0, n - 1)
    await start(phone, issue)
    result = await verified(phone, issue, issue.data)
    status: dict[str, Any] = await swarm_status(phone, issue)
    tally = status["bytes"]
    print(
        f"blocks held by a silent peer: {result['seconds']:.2f} s, "
        f"{status['reasked_requests']} asked again, received {tally['received']} B, "
        f"wasted {tally['wasted_by_cause']}"
    )
    missing = issue.transfer_bytes - (n - 1) * PIECE
    assert status["reasked_requests"] > 0, status  # the silence was seen, and asked again
    assert result["bytes_by_origin"] == {}, result
    assert tally["received"] == tally["needed"] == missing, tally
    assert tally["wasted"] == 0, tally


async def test_a_slow_store_keeps_the_reader_in_the_swarm_and_loses_no_piece(
    swarm: SwarmStack,  # noqa: F811  (the fixture imported above)
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # the reader's one source is a plain webtorrent peer with every piece (the web seed
    # stopped; the directive's origin is up, for the origin path); the device is slow:
    # the first run of the swarm's pieces takes 11 s to write, past stall_timeout_s
    # (10 s here) while the peer has sent every piece and each is verified. The reader
    # stays in the swarm and writes them: no byte through the origin path. Before, only
    # a stored piece counted as the swarm's progress: "no piece came through the swarm
    # for 10 s", the verified pieces waiting were dropped and the origin path fetched
    # them again (a reader of bench/reader_swarm.py's crowd, on a host with both cores
    # busy, took 18 MB from peers and then all 20 MB from the origins)
    issue = await swarm.publish("bytes-slow-store")
    origin = await swarm.origin()
    stopped = await swarm.origin(stopped=True)
    swarm.direct(issue, origins=[origin], web_seeds=[stopped])
    peer = await open_phone(phone_factory, swarm.reader_url)
    await plain_peer(peer, swarm, issue, origin)
    phone = await open_phone(phone_factory, swarm.reader_url)
    await phone.evaluate(
        """async () => {
            const { Download } = await import('./js/download.js');
            const store = Download.prototype.storeRun;
            let slowed = false;
            Download.prototype.storeRun = async function (first, chunks, source, opts) {
              if (source === 'peers' && !slowed) {
                slowed = true;
                await new Promise((r) => setTimeout(r, 11000));
              }
              return store.call(this, first, chunks, source, opts);
            };
        }""",
        what="the slow store",
    )
    await start(phone, issue)
    result = await verified(phone, issue, issue.data)
    notices = await phone.notices()
    print(f"a slow store: {result['seconds']:.2f} s, from origins {result['bytes_by_origin']}")
    assert not any("no piece came through the swarm" in t for t in notices), notices
    assert result["bytes_by_origin"] == {}, result
    assert result["bytes_from_peers"] == issue.transfer_bytes, result
