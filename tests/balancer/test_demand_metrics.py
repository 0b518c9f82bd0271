"""The demand policy on /metrics (issue 28): D, the rates, the mode, the carousel answered,
the lease and the thresholds, as Prometheus reads them (the text format, parsed)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.demand_burst import burst_downloaders
from pressrun.balancer.demand_metrics import DemandCollector
from pressrun.balancer.events import MulticastInfo

SWARM = swarm_info_for("http://o:8001/", "http://t:6969/announce", "w-47", "ab" * 20)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_policy_s_demand_mode_and_thresholds_are_scraped() -> None:
    cfg = DemandConfig(
        enter_downloaders=20.0,
        leave_downloaders=8.0,
        min_dwell_s=30.0,
        multicast_enter_downloaders=60.0,
        multicast_leave_downloaders=40.0,
    )
    carousels: dict[str, MulticastInfo] = {}
    policy = DemandPolicy(cfg, {"w-47": SWARM}, carousels)
    # 10 requests at t = 0..0.9 from 10 addresses: the EWMA's D about 29, the burst
    # term's (10 - 1.5 sqrt(10)) / 3 s x 30 s = 52.6
    for i in range(10):
        policy.decide("w-47", now=i / 10, address=f"10.0.0.{i}")
    policy.decide("w-47", now=1.0, address="10.0.0.1")  # the same client: not counted
    policy.set_remote_rates({"w-47": 0.5}, now=1.0)  # the other balancers: +15
    clock = [1.0]
    leader = [False]
    registry = CollectorRegistry()
    registry.register(DemandCollector(policy, carousels, lambda: clock[0], lambda: leader[0]))
    got = _samples(registry)
    d = got[("pressrun_balancer_demand_downloaders", (("issue", "w-47"),))]
    local = got[
        ("pressrun_balancer_demand_requests_per_second", (("issue", "w-47"), ("source", "local")))
    ]
    others = got[
        ("pressrun_balancer_demand_requests_per_second", (("issue", "w-47"), ("source", "others")))
    ]
    assert others == pytest.approx(0.5)
    recent = got[("pressrun_balancer_demand_recent_requests", (("issue", "w-47"),))]
    assert recent == 10.0  # the others' first hearing adds none (no known time)
    burst = burst_downloaders(recent, window_s=3.0, z=1.5, typical_download_s=30.0)
    assert 40.0 < (local + others) * 30.0 < 50.0 < burst
    assert d == pytest.approx(burst)  # the larger
    mode = {
        m: got[("pressrun_balancer_demand_mode", (("issue", "w-47"), ("mode", m)))]
        for m in ("origin", "swarm", "multicast")
    }
    assert mode == {"origin": 0.0, "swarm": 1.0, "multicast": 0.0}
    assert got[("pressrun_balancer_demand_mode_changes_total", (("issue", "w-47"),))] == 1.0
    assert got[("pressrun_balancer_carousel_answered", (("issue", "w-47"),))] == 0.0
    assert got[("pressrun_balancer_carousel_leader", ())] == 0.0
    assert got[("pressrun_balancer_demand_requests_not_counted_total", ())] == 1.0
    thresholds = {
        dict(labels)["threshold"]: value
        for (name, labels), value in got.items()
        if name == "pressrun_balancer_demand_threshold"
    }
    assert thresholds == {
        "swarm_enter": 20.0,
        "swarm_leave": 8.0,
        "multicast_enter": 60.0,
        "multicast_leave": 40.0,
        "min_dwell_s": 30.0,
        "tau_s": 10.0,
        "typical_download_s": 30.0,
        "client_window_s": 30.0,
        "burst_window_s": 3.0,
        "burst_z": 1.5,
    }
    # the peak: multicast, the carousel answered, this balancer the leader
    for i in range(40):
        policy.decide("w-47", now=1.0 + i / 40, address=f"10.0.1.{i}")
    carousels["w-47"] = MulticastInfo(control_group="239.255.70.1:5400")
    clock[0], leader[0] = 5.0, True
    got = _samples(registry)
    assert got[("pressrun_balancer_demand_mode", (("issue", "w-47"), ("mode", "multicast")))] == 1
    assert got[("pressrun_balancer_carousel_answered", (("issue", "w-47"),))] == 1.0
    assert got[("pressrun_balancer_carousel_leader", ())] == 1.0
    since = got[("pressrun_balancer_demand_mode_since_seconds", (("issue", "w-47"),))]
    # from the peak's first request at 1.0: the burst term's 11 requests in 1.1 s read
    # 60.3 (the EWMA's D reached 60 later in the peak)
    assert since == pytest.approx(4.0)


async def test_a_balancer_with_a_demand_policy_serves_its_families() -> None:
    import aiohttp

    from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
    from pressrun.balancer.events import OriginSpec

    running = await start_balancer(
        BalancerServiceConfig(
            origins=[OriginSpec("o1", "http://127.0.0.1:9")],
            port=0,
            tracker_url="http://127.0.0.1:9/announce",
        )
    )
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{running.url}/metrics") as resp:
            text = await resp.text()
    finally:
        await running.stop()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {
        "pressrun_balancer_demand_threshold",
        "pressrun_balancer_carousel_leader",
        "pressrun_balancer_demand_requests_not_counted",
    } <= names
