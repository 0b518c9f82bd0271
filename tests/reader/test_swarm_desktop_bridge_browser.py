"""A desktop peer bridges to browser readers when the torrent names no tracker and
the directive does (issue 26), in Debian's headless Chromium. The stack (tracker,
directive stand-in, reader service) is tests/reader/test_swarm_browser.py's.

``bench/reader_swarm.py`` and the emulation publish their issues with no tracker in the
torrent (``pressrun publish`` without ``--tracker``): the balancer's directive names
the tracker, the HTTP announce to a desktop and its WebSocket twin to a browser. The
desktop peer announced only to the directive's HTTP tracker and to the torrent's
``ws://`` ones, of which there were none, so it never joined the WebSocket swarm: in
the bench's runs 14, 16 and 17 no reader took a byte from a desktop peer (libtorrent,
``-PR``), only from other readers (``-WW``).
"""

from __future__ import annotations

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
    verified,
)

pytest.importorskip("libtorrent")

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def test_a_desktop_sent_by_a_directive_serves_readers_when_the_torrent_names_no_tracker(
    swarm: SwarmStack,  # noqa: F811  (the fixture imported above)
    phone_factory: Any,
) -> None:
    # the torrent names no tracker; the desktop has the directive's HTTP announce (as
    # `pressrun get` has it from the balancer), the reader the WebSocket twin; the
    # origins are stopped, so every byte the reader gets is the desktop's
    issue = await swarm.publish("swarm-bridge", trackers=[])
    stopped = await swarm.origin(stopped=True)
    swarm.direct(issue, origins=[swarm.standin_url], web_seeds=[stopped])
    await swarm.desktop_seed(issue, tracker=swarm.announce_url)
    phone = await open_phone(phone_factory, swarm.reader_url)
    started = time.monotonic()
    await start(phone, issue)
    result = await verified(phone, issue, issue.data)
    print(
        f"pressrun seed --tracker (no tracker in the torrent) -> reader: "
        f"{time.monotonic() - started:.2f} s"
    )
    assert result["bytes_from_web_seeds"] == 0
    assert result["bytes_from_peers"] >= issue.transfer_bytes
    assert result["peers_seen"] == 1
