"""A swarm download's copy is read whole once: the peer's final check (every piece's
SHA-256, the whole file's and its size against the manifest) is the check; the client's
own final check does not read the same bytes again. One client on 127.0.0.1: a loopback
swarm (real tracker, an origin as web seed, libtorrent), the balancer answering
``swarm``, `fetch_issue`."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.importorskip("libtorrent")

from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.demand import DemandConfig
from pressrun.balancer.events import OriginSpec
from pressrun.clients.aio import fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.peer.loopback import loopback_swarm

PIECE = 64 * 1024
SIZE = 1024 * 1024 + 333
FAST = replace(
    DESKTOP,
    stall_timeout_s=3.0,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.5,
    swarm_stall_after_s=5.0,
    swarm_max_seed_s=0.5,
)


async def test_a_completed_swarm_copy_is_not_read_again_by_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pressrun.clients.aio
    import pressrun.peer.verify

    # every whole-file check: the peer's (`FinalVerification`) and the client's own
    reads: list[str] = []
    for module, who in ((pressrun.peer.verify, "peer"), (pressrun.clients.aio, "client")):
        real = module.check_file

        def counted(m: Any, path: Path, _real: Any = real, _who: str = who, **kw: Any) -> Any:
            reads.append(_who)
            return _real(m, path, **kw)

        monkeypatch.setattr(module, "check_file", counted)
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(40.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        balancer = await start_balancer(
            BalancerServiceConfig(
                origins=tuple(OriginSpec(o.name, o.url) for o in swarm.origins),
                balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=0.7),
                tracker_url=swarm.tracker_url,
                demand=DemandConfig(enter_downloaders=0.5, leave_downloaders=0.1, min_dwell_s=0),
            )
        )
        try:
            await balancer.wait_until_up(timeout_s=5.0)
            async with aiohttp.ClientSession() as http:
                # the first directive makes the balancer learn the issue's swarm
                url = f"{balancer.url}/v1/issues/{swarm.issue_id}/directive"
                async with http.get(url) as resp:
                    assert resp.status == 200
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while swarm.issue_id not in balancer.service.swarms:
                assert loop.time() < deadline
                await asyncio.sleep(0.02)
            result = await asyncio.wait_for(
                fetch_issue(
                    swarm.issue_id,
                    balancer_url=balancer.url,
                    library=tmp_path / "lib",
                    config=FAST,
                    trusted_keys={swarm.manifest.publisher_key_bytes},
                ),
                30,
            )
        finally:
            await balancer.stop()
        assert result.mode == "swarm" and not result.swarm_stalled
        assert result.path.read_bytes() == swarm.data
    # one whole-file read, the peer's; the code before read it again in the client
    assert reads == ["peer"]
