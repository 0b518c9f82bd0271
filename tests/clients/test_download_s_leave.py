"""A swarm client's ``download_s`` is the seconds to its verified copy in the library,
whatever comes after: here a tracker that never answers the announce naming the leave
rule makes the peer's leave after its seeding slow, and that leave is in ``seconds``
and ``leave_s``, not in ``download_s`` (before this change ``download_s`` was
``seconds - seeding_s`` and counted it). One client on 127.0.0.1: a loopback swarm
(real tracker, an origin as web seed, libtorrent), the balancer answering ``swarm``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("libtorrent")

from clients.test_install_first import CONFIG, PIECE, SIZE
from integration.test_swarm_path import swarm_balancer
from pressrun.clients.aio import fetch_issue
from pressrun.clients.cli import result_document
from pressrun.peer.leave import LEAVE_ANNOUNCE_TIMEOUT_S
from pressrun.peer.loopback import loopback_swarm


async def test_a_slow_leave_is_not_in_download_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pressrun.peer.leave

    def silent(self: Any, tracker_url: str) -> None:
        """The tracker's answer to the leave's announce never comes."""

    monkeypatch.setattr(pressrun.peer.leave.LeaveSequence, "tracker_replied", silent)
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(40.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        balancer = await swarm_balancer(swarm, swarm.tracker_url)
        try:
            result = await asyncio.wait_for(
                fetch_issue(
                    swarm.issue_id,
                    balancer_url=balancer.url,
                    library=tmp_path / "lib",
                    config=CONFIG,
                    trusted_keys={swarm.manifest.publisher_key_bytes},
                ),
                40,
            )
        finally:
            await balancer.stop()
    assert result.mode == "swarm" and result.leave_rule is not None
    assert result.path.read_bytes() == swarm.data
    assert result.leave_steps is not None
    # the leave waited for the tracker's answer (its bound, within the leave's budget)
    assert result.leave_steps["tracker"] >= LEAVE_ANNOUNCE_TIMEOUT_S - 0.5, result.leave_steps
    assert result.leave_s >= sum(result.leave_steps.values()) - 0.01
    # download_s is the copy in the library, not the run less its seeding
    assert result.ready_s is not None and result.download_s == result.ready_s
    assert result.download_s <= result.seconds - result.seeding_s - result.leave_s + 0.5
    assert result.download_s < result.seconds - result.seeding_s - (LEAVE_ANNOUNCE_TIMEOUT_S - 1)
    doc = result_document(result)
    assert doc["download_s"] == result.ready_s and doc["leave_s"] == result.leave_s
    assert doc["leave_steps"] == result.leave_steps
    print(
        f"download {result.download_s:.2f} s, seeded {result.seeding_s:.2f} s, "
        f"left in {result.leave_s:.2f} s {result.leave_steps}, all {result.seconds:.2f} s"
    )
