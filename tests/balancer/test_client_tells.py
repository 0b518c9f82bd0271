"""Issue 10: `pressrun get` tells the balancer what only it knows (``have=``, ``size=``,
``elapsed=`` once it has the manifest, ``rate=`` once a section has shown one), and the
default algorithm serves it (docs/balancer.md, "What a client tells").

A real balancer and origins on 127.0.0.1 (`pressrun.demo.testbed`), the real client,
and a front (`tests/fronts.py`) that keeps each directive request's query and forwards
it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from fronts import directive_front
from pressrun.clients.aio import fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "tells-2026-47"
PIECE = 64 * 1024
DATA = random.Random(10).randbytes(PIECE * 12 + 77)


async def test_pressrun_get_tells_its_rate_once_a_section_has_shown_one(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    bed = Testbed(tmp_path / "bed", (OriginShape("origin-a"),), poll_interval_s=0.3)
    await bed.__aenter__()
    queries: list[dict[str, str]] = []

    def keep_query(request: web.Request) -> None:
        queries.append(dict(request.query))

    try:
        await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        await bed.start_balancer()
        assert bed.balancer is not None

        # sections of two pieces: one directive request per section
        config = replace(DESKTOP, section_bytes=2 * PIECE, concurrency=1, give_up_after_s=30.0)
        async with directive_front(bed.balancer.url, keep_query) as url:
            result = await asyncio.wait_for(
                fetch_issue(
                    ISSUE,
                    balancer_url=url,
                    library=tmp_path / "lib",
                    config=config,
                    trusted_keys={load_public_key(public)},
                ),
                60,
            )
    finally:
        await bed.close()
    assert result.verified and result.path.read_bytes() == DATA
    told = [q for q in queries if "size" in q]
    assert told and all(q["size"] == str(len(DATA)) for q in told)
    assert all(float(q["elapsed"]) >= 0 and 0 <= int(q["have"]) <= len(DATA) for q in told)
    rates = [float(q["rate"]) for q in told if "rate" in q]
    assert rates and all(r > 0 for r in rates)  # the best rate a section showed
    assert "rate" not in told[0]  # none measured before the first section
