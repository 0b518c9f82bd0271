"""A flash crowd's first arrival is sent to the swarm when the demand says swarm.

bench/reader_swarm.py and `pressrun demo` (swarm threshold 1 in the bench): of two
desktop peers arriving together, the first to ask was sent to the origins and the
second to the swarm. The balancer learnt an issue's swarm (its manifest's info-hash)
in the background after answering the issue's first directive, so every request
answered before that fetch ended got ``origin`` whatever the demand. Real origins and
a real balancer on 127.0.0.1 (the tracker is named only: a directive does not ask it).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.demand import DemandConfig
from pressrun.balancer.events import OriginSpec
from pressrun.demo.testbed import OriginShape, Testbed

from .conftest import ISSUE, PIECE, Keys


async def test_the_first_directive_of_an_issue_at_swarm_demand_is_swarm(
    tmp_path: Path, keys: Keys, data: bytes
) -> None:
    shapes = (OriginShape("origin-a", 1000.0), OriginShape("origin-b", 1000.0))
    async with Testbed(tmp_path / "bed", shapes, poll_interval_s=0.3) as bed:
        await bed.publish(data, issue_id=ISSUE, key_path=keys.secret, piece_size=PIECE)
        balancer = await start_balancer(
            BalancerServiceConfig(
                origins=tuple(OriginSpec(n, url) for n, url in bed.urls.items()),
                balancer=BalancerConfig(poll_interval_s=0.3, stale_after_s=1.0),
                seed=47,
                tracker_url="http://127.0.0.1:9/announce",
                demand=DemandConfig(enter_downloaders=1.0, leave_downloaders=0.5),
            )
        )
        try:
            await balancer.wait_until_up(2, timeout_s=10.0)
            async with aiohttp.ClientSession() as http:
                modes = []
                for _ in range(2):
                    async with http.get(f"{balancer.url}/v1/issues/{ISSUE}/directive") as resp:
                        assert resp.status == 200, await resp.text()
                        modes.append((await resp.json())["mode"])
        finally:
            await balancer.stop()
    # one request is already a crowd at this threshold: both are sent to the swarm
    assert modes == ["swarm", "swarm"]
