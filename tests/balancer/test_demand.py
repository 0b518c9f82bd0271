"""The demand core: EWMA rate, Little's-law downloaders, hysteresis and dwell, with a
stepped clock and Hypothesis."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.balancer.core import ModePolicy
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import DeliveryMode

SWARM = swarm_info_for(
    "http://127.0.0.1:8001/", "http://127.0.0.1:6969/announce", "w-47", "ab" * 20
)
CFG = DemandConfig(
    tau_s=10.0,
    typical_download_s=30.0,
    enter_downloaders=20.0,
    leave_downloaders=8.0,
    min_dwell_s=30.0,
)


def policy(config: DemandConfig = CFG) -> DemandPolicy:
    return DemandPolicy(config, {"w-47": SWARM})


def test_it_is_a_mode_policy_and_builds_the_protocol_urls() -> None:
    p: ModePolicy = policy()
    assert p.decide("w-47", now=0.0).mode is DeliveryMode.ORIGIN
    assert SWARM.torrent_url == "http://127.0.0.1:8001/content/w-47/w-47.torrent"
    assert SWARM.tracker_url == "http://127.0.0.1:6969/announce"


def test_steady_rate_converges_to_the_arrival_rate() -> None:
    p = policy(DemandConfig(enter_downloaders=1e9, leave_downloaders=1.0))
    now = 0.0
    for _ in range(2000):  # 2 requests/s for 1000 s
        p.decide("w-47", now=now)
        now += 0.5
    est = p.estimate("w-47", now=now - 0.5)
    assert est.request_rate_per_s == pytest.approx(2.0, rel=0.05)
    assert est.downloaders == pytest.approx(60.0, rel=0.05)  # Little: 2/s x 30 s


def test_a_crowd_moves_the_issue_to_the_swarm_and_back_with_hysteresis() -> None:
    p = policy()
    now = 0.0
    # 1 request/s: D -> 30 > T_hi = 20, the swarm comes once the EWMA gets there.
    modes = []
    for _ in range(60):
        modes.append(p.decide("w-47", now=now).mode)
        now += 1.0
    first_swarm = modes.index(DeliveryMode.SWARM)
    assert 0 < first_swarm < 30  # r(t) = 1 - e^{-t/10} reaches 2/3 after ~11 s
    assert all(m is DeliveryMode.SWARM for m in modes[first_swarm:])
    decision = p.decide("w-47", now=now)
    assert decision.swarm == SWARM
    # Demand falls to 0.5/s: D -> 15, inside the band (8 <= D < 20): stays swarm.
    for _ in range(120):
        assert p.decide("w-47", now=now).mode is DeliveryMode.SWARM
        now += 2.0
    # Demand falls to one request per 20 s: D < 8 -> back to origin.
    for _ in range(10):
        last = p.decide("w-47", now=now)
        now += 20.0
    assert last.mode is DeliveryMode.ORIGIN and last.swarm == SWARM  # for the copy to seed
    assert p.mode_changes("w-47") == 2


def test_dwell_holds_the_swarm_after_a_short_burst() -> None:
    p = policy(DemandConfig(min_dwell_s=60.0))
    for i in range(30):  # 30 requests in one second: D = 90
        p.decide("w-47", now=i / 30)
    assert p.estimate("w-47", now=1.0).mode is DeliveryMode.SWARM
    since = p.estimate("w-47", now=1.0).mode_since
    assert since is not None
    # Silence: the estimate falls below T_lo long before the dwell ends ...
    assert p.estimate("w-47", now=since + 40.0).downloaders < CFG.leave_downloaders
    # ... but a request inside the dwell still gets the swarm, one after it the origin.
    assert p.decide("w-47", now=since + 40.0).mode is DeliveryMode.SWARM
    assert p.estimate("w-47", now=since + 40.0).downloaders < CFG.leave_downloaders
    assert p.decide("w-47", now=since + 61.0).mode is DeliveryMode.ORIGIN


def test_an_issue_without_a_torrent_stays_on_the_origins() -> None:
    p = DemandPolicy(CFG, {})
    for i in range(500):
        assert p.decide("other", now=i / 100).mode is DeliveryMode.ORIGIN
    assert p.estimate("other", now=5.0).downloaders > CFG.enter_downloaders


def test_issues_are_independent() -> None:
    swarms = {"a": SWARM, "b": SWARM}
    p = DemandPolicy(CFG, swarms)
    for i in range(100):
        p.decide("a", now=i / 100)
    assert p.decide("a", now=1.0).mode is DeliveryMode.SWARM
    assert p.decide("b", now=1.0).mode is DeliveryMode.ORIGIN


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tau_s": 0},
        {"typical_download_s": -1},
        {"enter_downloaders": 5, "leave_downloaders": 5},
        {"leave_downloaders": -1},
        {"min_dwell_s": math.inf},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DemandConfig(**kwargs)


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=40.0), min_size=1, max_size=300),
    dwell=st.floats(min_value=0.0, max_value=60.0),
    band=st.tuples(st.floats(0.0, 30.0), st.floats(0.1, 30.0)),
)
def test_no_flapping_a_step_down_comes_at_least_the_dwell_after_the_change_before(
    gaps: list[float], dwell: float, band: tuple[float, float]
) -> None:
    lo, width = band
    p = policy(DemandConfig(min_dwell_s=dwell, leave_downloaders=lo, enter_downloaders=lo + width))
    now = 0.0
    mode = DeliveryMode.ORIGIN
    changes: list[float] = []
    for gap in gaps:
        now += gap
        decided = p.decide("w-47", now=now)
        changed = decided.mode is not mode
        if changed:
            changes.append(now)
            mode = decided.mode
        # the answer agrees with the estimate, and carries the swarm (an origin answer
        # names it too: the origin copy seeds it, clients/origin_seed.py)
        assert decided.swarm == SWARM
        est = p.estimate("w-47", now=now)
        assert est.mode is decided.mode
        # hysteresis: a change happens only across the band's edge
        if changed:
            if mode is DeliveryMode.SWARM:
                assert est.downloaders >= lo + width
            else:
                assert est.downloaders < lo
    # the dwell holds a step down (to origin) only; a step up is taken at once
    # (test_demand_dwell.py)
    for i, (a, b) in enumerate(itertools.pairwise(changes)):
        if i % 2 == 0:  # changes alternate: to swarm, to origin, to swarm, ...
            assert b - a >= dwell
