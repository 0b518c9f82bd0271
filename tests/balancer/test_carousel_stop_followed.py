"""A balancer that does not order the carousels follows the holder's stop (several
balancers): it leaves multicast when the sender no longer runs a carousel it answered,
and never wants (or, taking the lease later, restarts) a carousel for nobody.

Pure: the policy and `reconcile_carousels` with explicit ``now`` and a sender whose
list the test sets (the real sender's API is tested in test_carousels.py). The
thresholds are the flash-crowd emulation's (leave thresholds at 1e-5: only a demand
that has faded to nothing leaves multicast there), where the lease holder stopped the
carousel at 301 s and the other balancer stayed in multicast until 701 s.
"""

from __future__ import annotations

import asyncio
from typing import cast

import aiohttp

from pressrun.balancer.carousels import CarouselClient, CarouselReconciler, reconcile_carousels
from pressrun.balancer.demand import DemandConfig, DemandPolicy
from pressrun.balancer.events import DeliveryMode, MulticastInfo, SwarmInfo

#: the flash-crowd emulation's thresholds (summary.json, 28 Nov 23:07)
EMULATION = DemandConfig(
    tau_s=10.0,
    typical_download_s=30.0,
    enter_downloaders=25.0,
    leave_downloaders=1e-5,
    min_dwell_s=20.0,
    multicast_enter_downloaders=70.0,
    multicast_leave_downloaders=1e-5,
)
SWARM = SwarmInfo(torrent_url="http://o/t", tracker_url="http://t/announce", info_hash="ab" * 20)
INFO = MulticastInfo(control_group="239.255.70.1:5400")


class ListedSender(CarouselClient):
    """A sender whose list is what the test says; the orders it gets are kept."""

    def __init__(self) -> None:
        super().__init__(http=cast(aiohttp.ClientSession, None), url="http://sender", token="t")
        self.listed: set[str] = set()
        self.started: list[str] = []
        self.stopped: list[str] = []

    async def running(self) -> set[str]:
        return set(self.listed)

    async def start(self, issue_id: str) -> None:
        self.started.append(issue_id)
        self.listed.add(issue_id)

    async def stop(self, issue_id: str) -> None:
        self.stopped.append(issue_id)
        self.listed.discard(issue_id)


def peak(policy: DemandPolicy, *, until: float) -> float:
    """Four requests a second (D = 120 at the steady rate) from 0 to ``until``; the
    time of the last one."""
    t = 0.0
    while t < until:
        policy.decide("w", now=t)
        t += 0.25
    return t


def test_the_mode_below_once_the_holder_stopped_the_carousel() -> None:
    policy = DemandPolicy(EMULATION, {"w": SWARM})
    t = peak(policy, until=30.0)
    assert policy.estimate("w", now=t).mode is DeliveryMode.MULTICAST
    # the carousel was answered, the holder stopped it; a residue of demand (D about
    # 0.0007 here; 0.003 on the balancer that stayed) is above the 1e-5 leave threshold
    t += 120.0
    assert policy.estimate("w", now=t).downloaders > EMULATION.multicast_leave_downloaders
    policy.leave_stopped_carousels({"w"}, set(), now=t)
    assert policy.estimate("w", now=t).mode is DeliveryMode.SWARM
    assert policy.carousels_wanted() == frozenset()
    assert policy.decide("w", now=t + 1.0).mode is DeliveryMode.SWARM
    # without a swarm: origin
    bare = DemandPolicy(EMULATION, {})
    t = peak(bare, until=30.0)
    bare.leave_stopped_carousels({"w"}, set(), now=t + 120.0)
    assert bare.estimate("w", now=t + 120.0).mode is DeliveryMode.ORIGIN


def test_a_carousel_still_starting_or_running_is_left_alone() -> None:
    policy = DemandPolicy(EMULATION, {"w": SWARM})
    t = peak(policy, until=30.0)
    policy.leave_stopped_carousels(set(), set(), now=t)  # wanted, never answered: starting
    policy.leave_stopped_carousels({"w"}, {"w"}, now=t)  # still running
    assert policy.carousels_wanted() == frozenset({"w"})


def test_a_balancer_without_the_lease_follows_the_stop_and_never_restarts_it() -> None:
    """Through the reconciliation rounds: on the old code the balancer stayed in
    multicast after the stop (wanting the carousel) and, taking the lease, started
    it again for a demand of about 0.0007 downloaders."""
    carousels: dict[str, MulticastInfo] = {}  # what the balancer answers multicast for
    policy = DemandPolicy(EMULATION, {"w": SWARM}, carousels)
    sender = ListedSender()
    reconciler = CarouselReconciler(retry_s=1.0)
    clock = [peak(policy, until=30.0)]
    leader = [False]

    async def round_() -> None:
        await reconcile_carousels(
            policy,
            carousels,
            sender,
            INFO,
            reconciler,
            now=lambda: clock[0],
            is_leader=lambda: leader[0],
        )

    async def scenario() -> None:
        sender.listed.add("w")  # the holder started it
        await round_()
        assert "w" in carousels
        assert policy.decide("w", now=clock[0]).mode is DeliveryMode.MULTICAST
        clock[0] += 120.0
        sender.listed.clear()  # the holder stopped it (its total under 1e-5)
        await round_()
        assert carousels == {}
        assert policy.estimate("w", now=clock[0]).mode is not DeliveryMode.MULTICAST
        assert policy.carousels_wanted() == frozenset()
        assert policy.decide("w", now=clock[0]).mode is DeliveryMode.SWARM
        # this balancer takes the lease: no carousel for nobody
        leader[0] = True
        clock[0] += 1.0
        await round_()
        assert sender.started == []
        assert policy.decide("w", now=clock[0]).mode is not DeliveryMode.MULTICAST

    asyncio.run(scenario())
