"""Issue 10: `pressrun get` tells the balancer what only it knows (``have=``, ``size=``,
``elapsed=`` once it has the manifest, ``rate=`` once a section has shown one), and the
default algorithm serves it (docs/balancer.md, "What a client tells").

A real balancer and origins on 127.0.0.1 (`pressrun.demo.testbed`), the real client,
and an aiohttp front that keeps each directive request's query and forwards it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web

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
    runner: web.AppRunner | None = None
    try:
        await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        await bed.start_balancer()
        assert bed.balancer is not None
        real = bed.balancer.url

        async def directive(request: web.Request) -> web.Response:
            queries.append(dict(request.query))
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{real}{request.path_qs}") as resp,
            ):
                return web.Response(
                    body=await resp.read(), status=resp.status, content_type="application/json"
                )

        app = web.Application()
        app.router.add_get("/v1/issues/{issue}/directive", directive)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        # sections of two pieces: one directive request per section
        config = replace(DESKTOP, section_bytes=2 * PIECE, concurrency=1, give_up_after_s=30.0)
        result = await asyncio.wait_for(
            fetch_issue(
                ISSUE,
                balancer_url=f"http://127.0.0.1:{runner.addresses[0][1]}",
                library=tmp_path / "lib",
                config=config,
                trusted_keys={load_public_key(public)},
            ),
            60,
        )
    finally:
        if runner is not None:
            await runner.cleanup()
        await bed.close()
    assert result.verified and result.path.read_bytes() == DATA
    told = [q for q in queries if "size" in q]
    assert told and all(q["size"] == str(len(DATA)) for q in told)
    assert all(float(q["elapsed"]) >= 0 and 0 <= int(q["have"]) <= len(DATA) for q in told)
    rates = [float(q["rate"]) for q in told if "rate" in q]
    assert rates and all(r > 0 for r in rates)  # the best rate a section showed
    assert "rate" not in told[0]  # none measured before the first section
