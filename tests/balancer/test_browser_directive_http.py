"""``peer=webrtc`` over HTTP, with real origins serving a published issue: a browser
reader's swarm directive names the WebSocket route of the tracker instance it is sent
to and web seeds that serve the issue's file; a bad ``peer=`` is a 400."""

from __future__ import annotations

import aiohttp

from balancer.test_service import FILE, INTERVAL_S, ISSUE, get_json, wait_for
from balancer.test_service import http as http  # the fixtures, re-exported
from balancer.test_service import published as published
from balancer.test_service import real_origins as real_origins
from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.demand import DemandConfig
from pressrun.balancer.events import OriginSpec
from pressrun.origin import RunningOrigin

T1, T2 = "http://127.0.0.1:6969/announce", "https://tracker.example/announce"


async def test_a_browser_gets_the_websocket_tracker_of_its_instance_and_web_seeds(
    real_origins: list[RunningOrigin],
    published: tuple[object, bytes],
    http: aiohttp.ClientSession,
) -> None:
    _, data = published
    # each request adds 3 estimated downloaders: the 4th (about 12) passes 10
    demand = DemandConfig(
        tau_s=10.0,
        typical_download_s=30.0,
        enter_downloaders=10.0,
        leave_downloaders=2.0,
        min_dwell_s=0.0,
    )
    config = BalancerServiceConfig(
        origins=tuple(OriginSpec(o.name, o.url) for o in real_origins),
        balancer=BalancerConfig(poll_interval_s=INTERVAL_S, stale_after_s=3.5 * INTERVAL_S),
        tracker_url=T1,
        extra_tracker_urls=(T2,),
        demand=demand,
    )
    running = await start_balancer(config)
    try:
        await running.wait_until_up(3, timeout_s=5.0)
        base = f"{running.url}/v1/issues/{ISSUE}/directive"
        await get_json(http, f"{base}?peer=tcp", 400)
        for _ in range(3):
            doc, _ = await get_json(http, f"{base}?peer=webrtc")
            assert doc["mode"] == "origin" and doc["swarm"] is None
        await wait_for(lambda: ISSUE in running.service.swarms)
        swarms = []
        for _ in range(2):
            doc, _ = await get_json(http, f"{base}?peer=webrtc")
            assert doc["mode"] == "swarm" and doc["fallbacks"] == ["origin"]
            swarms.append(doc["swarm"])
        # the instances in turn, each with its own WebSocket route
        assert [(s["tracker_url"], s["webtorrent_url"]) for s in swarms] == [
            (T1, "ws://127.0.0.1:6969/webtorrent"),
            (T2, "wss://tracker.example/webtorrent"),
        ]
        urls = {o.url for o in real_origins}
        seeds = swarms[0]["web_seeds"]
        assert {s.split("/content/")[0] for s in seeds} == urls
        for seed in seeds:
            assert seed.endswith(f"/content/{ISSUE}/{FILE}")
            async with http.get(seed, headers={"Range": "bytes=0-99"}) as resp:
                assert resp.status == 206 and await resp.read() == data[:100]
        # a desktop client's directive has neither
        doc, _ = await get_json(http, base)
        assert doc["mode"] == "swarm" and set(doc["swarm"]) == {
            "torrent_url",
            "tracker_url",
            "info_hash",
        }
    finally:
        await running.stop()
