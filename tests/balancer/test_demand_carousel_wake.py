"""The carousel is ordered when a request takes demand over the multicast level, not at
the next reconciliation round (issue 28): the loop against a sender that records when
it was asked, on the event loop's clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from pressrun.balancer.carousels import CarouselClient, keep_carousels
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import DeliveryMode, MulticastInfo

SWARM = swarm_info_for("http://o:8001/", "http://t:6969/announce", "w", "ab" * 20)
INFO = MulticastInfo("239.255.70.1:5400", "127.0.0.1")
CFG = DemandConfig(
    enter_downloaders=20.0,
    leave_downloaders=5.0,
    multicast_enter_downloaders=60.0,
    multicast_leave_downloaders=30.0,
)


@dataclass
class RecordingSender(CarouselClient):
    """A sender that starts what it is asked at once and notes when (loop time)."""

    started_at: dict[str, float] = field(default_factory=dict)
    lists: int = 0
    #: when each round asked for the running list (loop time)
    listed_at: list[float] = field(default_factory=list)

    async def running(self) -> set[str]:
        self.lists += 1
        self.listed_at.append(asyncio.get_running_loop().time())
        return set(self.started_at)

    async def start(self, issue_id: str) -> None:
        self.started_at.setdefault(issue_id, asyncio.get_running_loop().time())

    async def stop(self, issue_id: str) -> None:
        self.started_at.pop(issue_id, None)


async def test_a_request_over_the_level_gets_its_carousel_before_the_next_round() -> None:
    loop = asyncio.get_running_loop()
    policy = DemandPolicy(CFG, {"w": SWARM})
    carousels: dict[str, MulticastInfo] = {}
    async with aiohttp.ClientSession() as http:
        sender = RecordingSender(http, "http://127.0.0.1:9", "token")
        task = asyncio.ensure_future(
            keep_carousels(policy, carousels, sender, INFO, interval_s=2.0, now=loop.time)
        )
        try:
            await asyncio.sleep(0.2)  # the first round has run: nothing wanted
            assert sender.lists == 1 and sender.started_at == {}
            crossed_at = None
            for i in range(30):  # a crowd: 30 clients in 0.3 s
                now = loop.time()
                policy.decide("w", now=now, address=f"10.0.0.{i}")
                if crossed_at is None and policy.estimate("w", now=now).mode is (
                    DeliveryMode.MULTICAST
                ):
                    crossed_at = now
                await asyncio.sleep(0.01)
            assert crossed_at is not None
            deadline = loop.time() + 5.0
            while "w" not in carousels and loop.time() < deadline:
                await asyncio.sleep(0.01)
            started = sender.started_at["w"]
            print(f"started {started - crossed_at:.3f} s after the crossing")
            # before: at the next round, 2 s after the first (1.6-1.8 s after it here)
            assert started - crossed_at < 0.5
            assert "w" in carousels  # answered multicast from the same round
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_without_a_new_multicast_issue_the_rounds_keep_their_interval() -> None:
    loop = asyncio.get_running_loop()
    policy = DemandPolicy(CFG, {"w": SWARM})
    async with aiohttp.ClientSession() as http:
        sender = RecordingSender(http, "http://127.0.0.1:9", "token")
        task = asyncio.ensure_future(
            keep_carousels(policy, {}, sender, INFO, interval_s=0.5, now=loop.time)
        )
        try:
            for i in range(6):  # swarm-level demand only (D about 20), over 1.2 s
                policy.decide("w", now=loop.time(), address=f"10.0.1.{i}")
                await asyncio.sleep(0.2)
            # rounds at 0, 0.5 and 1.0 s: none woken early (the gaps, not the count: on
            # a loaded host the sleeps above run long and more rounds fit in them)
            gaps = [b - a for a, b in zip(sender.listed_at, sender.listed_at[1:], strict=False)]
            assert len(gaps) >= 1 and sender.started_at == {}
            assert min(gaps) >= 0.5 - 0.01, gaps
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
