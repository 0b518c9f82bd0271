"""``class=`` of a directive request over HTTP (issue 33; docs/balancer.md, "Request
classes"): the balancer service passes it to the core."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from balancer.fake_origin import FakeOrigin, start_fake_origin
from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import OriginSpec, RequestClass

ISSUE = "weekly-2026-47"
INTERVAL_S = 0.2


@pytest.fixture
async def origins() -> AsyncIterator[list[FakeOrigin]]:
    started = [
        await start_fake_origin(name, [ISSUE], {ISSUE: f"{ISSUE}.pdf"})
        for name in ("origin-a", "origin-b", "origin-c")
    ]
    yield started
    for origin in started:
        await origin.stop()


async def get(http: aiohttp.ClientSession, url: str, status: int) -> dict[str, object]:
    async with http.get(url) as resp:
        assert resp.status == status, await resp.text()
        doc: dict[str, object] = await resp.json()
        return doc


async def test_a_small_object_is_placed_over_http_while_the_crowd_is_refused_full(
    origins: list[FakeOrigin],
) -> None:
    # Every origin sends its whole link: mist says FULL (503) for the crowd; a request
    # naming class=small is placed all the same, class=catalogue by round robin.
    for o in origins:
        o.stats["out_bytes_per_s"] = o.stats["capacity_bytes_per_s"]
    running = await start_balancer(
        BalancerServiceConfig(
            origins=tuple(OriginSpec(o.name, o.url) for o in origins),
            balancer=BalancerConfig(
                poll_interval_s=INTERVAL_S, stale_after_s=3.5 * INTERVAL_S, algorithm="mist"
            ),
        )
    )
    try:
        await running.wait_until_up(len(origins), timeout_s=5.0)
        base = f"{running.url}/v1/issues/{ISSUE}/directive"
        async with aiohttp.ClientSession() as http:
            await get(http, base, 503)
            doc = await get(http, f"{base}?class=small", 200)
            assert doc["mode"] == "origin" and doc["algorithm"] == "least-loaded"
            doc = await get(http, f"{base}?class=catalogue&failed=origin-a", 200)
            assert doc["algorithm"] == "gwrr"
            assert "origin-a" not in [o["name"] for o in doc["origins"]]  # type: ignore[attr-defined]
            doc = await get(http, f"{base}?class=huge", 400)
            assert "class= must be one of small, crowd, catalogue" in str(doc["error"])
        assert running.core.directives_by_class[RequestClass.SMALL] == 1
        assert running.core.directives_by_class[RequestClass.CATALOGUE] == 1
        assert running.core.directives_by_class[RequestClass.CROWD] == 0
    finally:
        await running.stop()
