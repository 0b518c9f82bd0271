"""A download asks the balancer for the directives it uses, no more.

Each directive the balancer answers counts at the origin it names as a transfer on its
way (headroom dispatch: for `pick_timeout_s`, and in the places its probe floor gives
an origin per status; alg2: in the origin's bandwidth inflation), so one asked for and
not used is an origin's room taken for nothing. Before, a download's two workers whose
sections ended together both asked for its last section, and one of the five
directives of every 65 kB download in the security soak test went unused (five
answered, four transfers). And a download being refused asks with one worker at a
time: its two workers, woken together by the refusal's Retry-After, asked the same
question at the same instant, and each refusal counted twice toward giving up.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from fronts import directive_front
from pressrun.clients.aio import fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "used-2026-48"
PIECE = 16 * 1024
DATA = random.Random(48).randbytes(4 * PIECE + 123)  # five pieces: three sections


async def test_every_directive_a_download_is_answered_starts_a_transfer(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    shapes = (OriginShape("origin-a"), OriginShape("origin-b"))
    async with Testbed(tmp_path / "bed", shapes, poll_interval_s=0.3) as bed:
        await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        balancer = await bed.start_balancer()
        for n in range(3):
            answered = balancer.core.directives_answered
            started = sum(o.service.meter.transfers_total for o in bed.origins.values())
            result = await fetch_issue(
                ISSUE,
                balancer_url=balancer.url,
                library=tmp_path / f"library-{n}",
                config=DESKTOP,
                trusted_keys={load_public_key(public)},
            )
            assert result.verified and result.path.read_bytes() == DATA
            answered = balancer.core.directives_answered - answered
            started = sum(o.service.meter.transfers_total for o in bed.origins.values()) - started
            # the manifest and three sections; before: five directives for four
            assert (answered, started) == (4, 4), (answered, started)


async def test_a_refused_download_asks_again_with_one_request_not_two(tmp_path: Path) -> None:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    async with Testbed(tmp_path / "bed", (OriginShape("origin-a"),), poll_interval_s=0.3) as bed:
        await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        balancer = await bed.start_balancer()
        loop = asyncio.get_running_loop()
        refused: list[float] = []

        def full_six_times(request: web.Request) -> web.Response | None:
            if "size" not in request.query or len(refused) >= 6:
                return None  # the manifest's directive, and the sections after six
            refused.append(loop.time())
            return web.json_response(
                {"error": "every origin is full"}, status=503, headers={"Retry-After": "0.2"}
            )

        config = replace(  # concurrency 2; the Retry-After is the longer wait
            DESKTOP, max_attempts_without_progress=20, retry_backoff_s=0.05, retry_backoff_max_s=0.1
        )
        async with directive_front(balancer.url, full_six_times) as url:
            result = await fetch_issue(
                ISSUE,
                balancer_url=url,
                library=tmp_path / "library",
                config=config,
                trusted_keys={load_public_key(public)},
            )
    assert result.verified and result.path.read_bytes() == DATA
    assert len(refused) == 6
    # the first two together (one per section), then one request a Retry-After: before,
    # the two workers asked again within a millisecond of each other, every time
    gaps = [b - a for a, b in itertools.pairwise(refused)]
    assert min(gaps[1:]) >= 0.2, gaps
