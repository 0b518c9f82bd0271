"""A reserved start reaches the desktop client and is honoured (issue 33,
docs/balancer.md "Reserved starts"): the balancer's 503 names a reservation, the
client waits its Retry-After without counting a failure, then asks again naming it.

Real origins and a real balancer on 127.0.0.1 (`pressrun.demo.testbed`); an aiohttp
front answers the client's first section request with the 503 the balancer's adapter
sends for a reserved start (the same codec), and passes everything else through. The
real balancer then receives ``reservation=`` (unknown to it: placed anew)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from fronts import directive_front
from pressrun.balancer.codec import encode_refusal
from pressrun.balancer.events import NoDirective, Refusal
from pressrun.clients.aio import fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "reserved-2026-48"
PIECE = 64 * 1024
DATA = random.Random(33).randbytes(PIECE * 6 + 77)

#: one failure without progress ends the download: a reserved wait must not be one
IMPATIENT = replace(
    DESKTOP,
    stall_timeout_s=3.0,
    balancer_timeout_s=2.0,
    retry_backoff_s=0.1,
    retry_backoff_max_s=0.2,
    max_attempts_without_progress=1,
    give_up_after_s=0.0,
    concurrency=1,  # one worker: its requests in order
)


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[tuple[Testbed, set[bytes]]]:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    testbed = Testbed(tmp_path / "bed", (OriginShape("origin-a"),), poll_interval_s=0.3)
    await testbed.__aenter__()
    try:
        await testbed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        await testbed.start_balancer()
        yield testbed, {load_public_key(public)}
    finally:
        await testbed.close()


async def test_a_reserved_start_is_waited_for_and_named_when_the_client_asks_again(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    testbed, trusted = bed
    assert testbed.balancer is not None
    loop = asyncio.get_running_loop()
    asked: list[tuple[float, dict[str, str]]] = []
    refusal = NoDirective(ISSUE, Refusal.RESERVED, "busy; a start is reserved", 1.5, "r7")

    def reserve_the_first_section(request: web.Request) -> web.Response | None:
        asked.append((loop.time(), dict(request.query)))
        sections = [q for _, q in asked if "size" in q]
        if len(sections) == 1 and "size" in request.query:
            return web.json_response(
                encode_refusal(refusal), status=503, headers={"Retry-After": "2"}
            )
        return None

    async with directive_front(testbed.balancer.url, reserve_the_first_section) as url:
        result = await asyncio.wait_for(
            fetch_issue(
                ISSUE,
                balancer_url=url,
                library=tmp_path / "lib",
                config=IMPATIENT,
                trusted_keys=trusted,
            ),
            30,
        )
    assert result.path.read_bytes() == DATA
    sections = [(t, q) for t, q in asked if "size" in q]
    (refused_at, first), (back_at, second) = sections[0], sections[1]
    assert "reservation" not in first
    # it came back after the reserved start (1.5 s; the header rounds up to 2), naming it
    assert second.get("reservation") == "r7"
    assert back_at - refused_at >= 1.5
