"""A download that began on the origins joins the swarm when a later section's
directive names it (issue 26, download.js joinsSwarmNow), in Debian's headless
Chromium. The stack (tracker, directive stand-in, reader service) is
tests/reader/test_swarm_browser.py's.

Before, only the first directive was asked about the swarm: a phone that began just
before its crowd reached the swarm level took the whole issue from the origins (the
flash-crowd-50 emulation: the 4 phones released before the swarm level, 50 MB each).
"""

from __future__ import annotations

import asyncio
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


async def test_a_download_on_the_origins_joins_the_swarm_at_its_next_section(
    swarm: SwarmStack,  # noqa: F811  (the fixture imported above)
    phone_factory: Any,
) -> None:
    # the origin sends 2 Mbit/s (the mobile profile's 3 sections of the 1.5 MB issue:
    # about 2 s each); the balancer says "origin" until the reader's first section is
    # under way, then "swarm" with a desktop peer (libtorrent) holding the issue and no
    # web seed. The reader ends that section from the origin, joins the swarm at its
    # next directive and takes the rest from the peer
    issue = await swarm.publish("swarm-rejoin")
    origin = await swarm.origin(egress_cap_mbps=2.0)
    swarm.direct(issue, origins=[origin], web_seeds=[])
    told_swarm = swarm.directives[issue.issue_id]
    swarm.directives[issue.issue_id] = {**told_swarm, "mode": "origin", "swarm": None}
    await swarm.desktop_seed(issue)
    phone = await open_phone(phone_factory, swarm.reader_url)
    asked = len(swarm.queries)
    await start(phone, issue)
    # the download's first directive (before its workers) and its first section's
    deadline = time.monotonic() + 20
    while len(swarm.queries) < asked + 2:
        assert time.monotonic() < deadline, swarm.queries[asked:]
        await asyncio.sleep(0.05)
    swarm.directives[issue.issue_id] = told_swarm
    result = await verified(phone, issue, issue.data)
    notices = await phone.notices()
    print(
        f"joined at a later section: {result['bytes_by_origin']} from the origin, "
        f"{result['bytes_from_peers']} from peers, {result['seconds']:.2f} s"
    )
    assert any("to the swarm now" in text for text in notices), notices
    assert 0 < result["bytes_by_origin"].get("origin-0", 0) < issue.transfer_bytes, result
    assert result["bytes_from_peers"] > 0, result
    assert not [c for c in phone.console if c.startswith("pageerror")], phone.console
