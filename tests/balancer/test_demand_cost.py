"""The demand thresholds by the paper's cost model (`pressrun.balancer.demand_cost`):
the swarm from the second reader whose download overlaps another's, and the D above
which a carousel injects fewer bytes than unicast. Pure; stepped clock."""

from __future__ import annotations

import math

import pytest

from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.demand_cost import carousel_break_even, overlap_downloaders
from pressrun.balancer.events import DeliveryMode
from pressrun.emulate.scenario import load_scenario

SWARM = swarm_info_for("http://o:8001/", "http://t:6969/announce", "w-47", "ab" * 20)


def _modes(asks: list[float], enter: float) -> list[DeliveryMode]:
    """Each request's answer, every client from its own address."""
    policy = DemandPolicy(
        DemandConfig(enter_downloaders=enter, leave_downloaders=0.00001), {"w-47": SWARM}
    )
    return [
        policy.decide("w-47", now=at, address=f"10.0.0.{i + 1}").mode for i, at in enumerate(asks)
    ]


def test_the_swarm_from_the_second_overlapping_reader() -> None:
    config = DemandConfig()
    enter = overlap_downloaders(config.typical_download_s, config.tau_s)
    assert enter == pytest.approx(3 * (1 + math.exp(-3)))
    # one reader alone: the origins
    assert _modes([0.0], enter) == [DeliveryMode.ORIGIN]
    # a second within one typical download of the first: the swarm
    assert _modes([0.0, 7.5], enter) == [DeliveryMode.ORIGIN, DeliveryMode.SWARM]
    assert _modes([0.0, 29.0], enter) == [DeliveryMode.ORIGIN, DeliveryMode.SWARM]
    # a second after the first is done: the origins again
    assert _modes([0.0, 31.0], enter) == [DeliveryMode.ORIGIN, DeliveryMode.ORIGIN]


def test_carousel_break_even_by_the_cost_model() -> None:
    size = 50_021_716
    slowest = size * 8 / 5e6  # a reader on one 5 Mbit/s channel
    long_crowd = carousel_break_even(
        rate_bps=50e6, size_bytes=size, typical_download_s=30, slowest_s=slowest, burst_s=1e9
    )
    assert long_crowd == pytest.approx(6.25e6 * 30 / size, rel=1e-6)
    burst = carousel_break_even(
        rate_bps=50e6, size_bytes=size, typical_download_s=30, slowest_s=slowest, burst_s=8
    )
    assert 40 < burst < 42
    with pytest.raises(ValueError):
        carousel_break_even(
            rate_bps=0, size_bytes=size, typical_download_s=30, slowest_s=1, burst_s=8
        )
    with pytest.raises(ValueError):
        overlap_downloaders(0, 10)


def test_flash_crowd_50s_thresholds_are_the_cost_models() -> None:
    """The scenario's swarm threshold is the overlap threshold (rounded up to the
    hundredth), not a number fitted to its waves (it was 25, which served 13 desktops
    whole in the 15:33 run at bdd9429), and its multicast threshold is at least the
    carousel's break-even for an 8 s burst of its peak at its plan."""
    scenario = load_scenario("flash-crowd-50")
    env = scenario.env
    config = DemandConfig()
    enter = overlap_downloaders(config.typical_download_s, config.tau_s)
    assert float(env["PRESSRUN_SWARM_ENTER_DOWNLOADERS"]) == math.ceil(enter * 100) / 100
    rate = int(env["PRESSRUN_MULTICAST_CHANNELS"]) * float(env["PRESSRUN_MULTICAST_RATE_MBPS"])
    size = scenario.issue_mb * 1_000_000
    slowest = size * 8 / (float(env["PRESSRUN_MULTICAST_RATE_MBPS"]) * 1e6)
    even = carousel_break_even(
        rate_bps=rate * 1e6,
        size_bytes=size,
        typical_download_s=config.typical_download_s,
        slowest_s=slowest,
        burst_s=8.0,
    )
    assert float(env["PRESSRUN_MULTICAST_ENTER_DOWNLOADERS"]) >= even
