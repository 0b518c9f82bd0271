"""A desktop peer that vanishes mid-download does not hold the readers back (issue 26),
in Debian's headless Chromium. The stack (tracker, directive stand-in, reader service)
is tests/reader/test_swarm_browser.py's.

A desktop peer gone without closing its WebRTC connection (its process killed or hung,
a laptop asleep or off the Wi-Fi) stays, for the reader, a connected peer that
unchokes it and holds every piece, until the silent-peer rule disconnects it (3 x its
timeout: 9 s at the least) or WebRTC's consent check fails. Held back (the other
readers deliver), the readers' web seeds were offered nothing, since a peer held every
piece, and the blocks asked of the desktop, asked again after request_timeout_s, went
back to it (webtorrent gives a failed block to the first wire with room): every reader
waited for the disconnect. With three readers and a 10 MB issue, the desktop killed
once a reader had 3 MB from it: the readers ended at 10.9-11.2 s, each after
disconnecting the desktop as silent; now at 2.8-5.4 s, none disconnecting it
(swarm-peers.js silentPeer: from the re-ask until it sends again a peer is asked for
nothing and holds nothing for the web seeds' rule).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from typing import Any

import pytest

from .conftest import browser_only
from .test_swarm_browser import (  # noqa: F401  (stack and swarm are fixtures)
    SwarmStack,
    open_phone,
    stack,
    start,
    swarm,
    swarm_status,
    verified,
)

pytest.importorskip("libtorrent")

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

MB = 1_000_000
#: a desktop peer's id prefix ("-PR") in hex, as the reader's byte tally names a peer
DESKTOP = "peer " + b"-PR".hex()


async def test_readers_whose_desktop_peer_vanishes_take_its_pieces_elsewhere_at_once(
    swarm: SwarmStack,  # noqa: F811  (the fixture imported above)
    phone_factory: Any,
) -> None:
    # a desktop seed (pressrun seed, libtorrent) and the origin as a web seed (64
    # Mbit/s); three readers; the desktop is killed (SIGKILL: no goodbye on its
    # connections) once a reader has 3 MB from it, all three still downloading
    data = random.Random("swarm-silent-desktop").randbytes(10 * MB)
    issue = await swarm.publish("swarm-silent-desktop", data=data, trackers=[])
    origin = await swarm.origin(egress_cap_mbps=64.0)
    swarm.direct(issue, origins=[origin], web_seeds=[origin])
    desktop = await swarm.desktop_seed(issue, tracker=swarm.announce_url)
    phones = [await open_phone(phone_factory, swarm.reader_url) for _ in range(3)]
    started = time.monotonic()
    killed: list[tuple[float, list[Any]]] = []

    async def kill_the_desktop() -> None:
        while not killed:
            states = [await swarm_status(p, issue) for p in phones]
            for s in states:
                by_source = (s.get("bytes") or {}).get("by_source") or {}
                got = sum(v["received"] for k, v in by_source.items() if k.startswith(DESKTOP))
                if got >= 3 * MB:
                    os.kill(desktop.proc.pid, signal.SIGKILL)
                    killed.append((time.monotonic() - started, [x.get("state") for x in states]))
                    break
            await asyncio.sleep(0.1)

    killer = asyncio.create_task(kill_the_desktop())
    await asyncio.gather(*(start(p, issue) for p in phones))
    try:
        results = await asyncio.gather(*(verified(p, issue, data) for p in phones))
    finally:
        killer.cancel()
    done = time.monotonic() - started
    notices = [await p.notices() for p in phones]
    print(
        f"a desktop killed at {killed[0][0] if killed else None} s: readers at "
        + ", ".join(f"{r['seconds']:.1f} s" for r in results)
        + f" (all done {done:.1f} s after the first start)"
    )
    assert killed, "no reader took 3 MB from the desktop"
    assert killed[0][1] == ["downloading"] * 3, killed  # killed mid-download
    for result, said in zip(results, notices, strict=True):
        assert result["bytes_by_origin"] == {}, result  # the swarm's path throughout
        # its pieces came from the web seeds and the other readers before the
        # silent-peer rule's disconnect (before: every reader waited for it)
        assert not any("answers no request" in t for t in said), said
