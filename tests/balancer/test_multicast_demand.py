"""The demand core's third level: multicast at peak demand, the carousel wanted and
running, hysteresis on the way down, and the directive it gives."""

from __future__ import annotations

import pytest

from pressrun.balancer.codec import encode_directive
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import (
    DeliveryMode,
    Directive,
    DirectiveRequested,
    MulticastInfo,
    RankedOrigin,
)

SWARM = swarm_info_for("http://127.0.0.1:8001", "http://127.0.0.1:6969/announce", "w", "ab" * 20)
CAROUSEL = MulticastInfo("239.255.70.1:5400", "127.0.0.1")
CFG = DemandConfig(
    tau_s=10.0,
    typical_download_s=30.0,
    enter_downloaders=20.0,
    leave_downloaders=8.0,
    min_dwell_s=5.0,
    multicast_enter_downloaders=60.0,
    multicast_leave_downloaders=30.0,
)


def crowd(p: DemandPolicy, rate_per_s: float, seconds: float, start: float) -> list[DeliveryMode]:
    """``rate_per_s`` requests a second for ``seconds``; the modes answered."""
    modes = []
    now = start
    while now < start + seconds:
        modes.append(p.decide("w", now=now).mode)
        now += 1.0 / rate_per_s
    return modes


def test_peak_demand_wants_a_carousel_and_gets_multicast_once_it_runs() -> None:
    carousels: dict[str, MulticastInfo] = {}
    p = DemandPolicy(CFG, {"w": SWARM}, carousels)
    modes = crowd(p, 4.0, 40.0, 0.0)  # D -> 120
    assert DeliveryMode.SWARM in modes
    assert p.carousels_wanted() == {"w"}
    # the carousel is not running yet: the answer stays swarm
    assert modes[-1] is DeliveryMode.SWARM
    carousels["w"] = CAROUSEL
    decision = p.decide("w", now=40.0)
    assert decision.mode is DeliveryMode.MULTICAST
    assert decision.multicast == CAROUSEL and decision.swarm == SWARM


def test_multicast_leaves_with_hysteresis_and_review_stops_the_carousel() -> None:
    p = DemandPolicy(CFG, {"w": SWARM}, {"w": CAROUSEL})
    crowd(p, 4.0, 40.0, 0.0)
    assert p.carousels_wanted() == {"w"}
    # demand halves to D ~ 45: inside the band (30 <= D < 60): stays multicast
    modes = crowd(p, 1.5, 60.0, 40.0)
    assert modes[-1] is DeliveryMode.MULTICAST
    # nobody asks any more: D decays; review (the service's timer) moves it down
    p.review(now=101.0)
    assert p.carousels_wanted() == {"w"}  # D ~ 45 x e^-0.1 = 41: still in the band
    p.review(now=200.0)
    assert p.carousels_wanted() == frozenset()
    assert p.decide("w", now=200.0).mode is DeliveryMode.ORIGIN


def test_without_a_multicast_level_nothing_changes() -> None:
    cfg = DemandConfig(enter_downloaders=20.0, leave_downloaders=8.0, min_dwell_s=5.0)
    p = DemandPolicy(cfg, {"w": SWARM})
    modes = crowd(p, 10.0, 30.0, 0.0)
    assert DeliveryMode.MULTICAST not in modes and p.carousels_wanted() == frozenset()


def test_an_issue_without_a_swarm_goes_from_origin_straight_to_multicast() -> None:
    p = DemandPolicy(CFG, {}, {"w": CAROUSEL})
    modes = crowd(p, 4.0, 40.0, 0.0)
    assert DeliveryMode.SWARM not in modes
    assert modes[-1] is DeliveryMode.MULTICAST


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="multicast_leave_downloaders"):
        DemandConfig(
            enter_downloaders=20.0,
            leave_downloaders=8.0,
            multicast_enter_downloaders=30.0,
            multicast_leave_downloaders=40.0,
        )


def test_multicast_directive_has_the_carousel_and_the_fallbacks() -> None:
    import random

    from pressrun.balancer.algorithms import make_algorithm
    from pressrun.balancer.config import BalancerConfig
    from pressrun.balancer.events import OriginSpec, OriginStatus, StatusReceived

    origins = (OriginSpec("a", "http://127.0.0.1:8001"),)
    p = DemandPolicy(CFG, {"w": SWARM}, {"w": CAROUSEL})
    core = BalancerCore(
        BalancerConfig(),
        origins,
        make_algorithm("alg2", origins, random.Random(1), None),
        p,
        now=0.0,
    )
    status = OriginStatus("a", 0.1, 0.1, 0.0, 1.25e8, issues=frozenset({"w"}))
    core.handle_status_received(StatusReceived(status), now=0.0)
    result = None
    for i in range(200):
        result = core.handle_directive_requested(DirectiveRequested("w"), now=i * 0.2)
    assert isinstance(result, Directive)
    assert result.mode is DeliveryMode.MULTICAST
    doc = encode_directive(result)
    assert doc["multicast"] == {
        "control_group": "239.255.70.1:5400",
        "interface": "127.0.0.1",
        "source": None,
        "relays": [],
    }
    assert doc["fallbacks"] == ["swarm", "origin"]
    assert doc["swarm"]["torrent_url"] == SWARM.torrent_url
    assert isinstance(result.origins[0], RankedOrigin)
