"""The simulator plays a flapping origin (issue 30): its /stats fails every other poll
while it keeps serving; with HAProxy's fall 3 it keeps its share, with one poll
deciding it is out half the time."""

from __future__ import annotations

import pytest

from pressrun.sim.run import Simulation
from pressrun.sim.scenario import ScenarioError, parse_scenario

FLAPPING = """
name = "flapping"
duration_s = 60
[balancer]
poll_interval_s = 1.0
stale_after_s = 4.5
{health}
[[servers]]
name = "a"
link_bytes_per_s = 50e6
cores = 64
[[servers]]
name = "b"
link_bytes_per_s = 50e6
cores = 64
[[assets]]
name = "issue"
size_bytes = 1e6
deadline_s = 30
[[arrivals]]
kind = "burst"
count = 600
at_s = 5.0
spread_s = 50.0
[[failures]]
server = "b"
down_at_s = 2.0
flap_every = 2
"""


def picks_and_downs(health: str) -> tuple[dict[str, int], int]:
    sim = Simulation(parse_scenario(FLAPPING.format(health=health)), "rr", 1)
    downs = 0
    take_down = sim.core._take_down

    def counting(rec, reason, *, now):  # type: ignore[no-untyped-def]
        nonlocal downs
        effects = take_down(rec, reason, now=now)
        downs += len(effects)
        return effects

    sim.core._take_down = counting  # type: ignore[method-assign]
    sim.run()
    return {n: r.picks for n, r in sim.core.origins.items()}, downs


def test_a_flapping_origin_keeps_its_share_with_fall_3() -> None:
    picks, downs = picks_and_downs("rise = 2\nfall = 3\nslowstart_s = 10")
    assert downs == 0
    assert picks["b"] == pytest.approx(picks["a"], abs=2)


def test_with_one_poll_deciding_a_flapping_origin_goes_in_and_out() -> None:
    picks, downs = picks_and_downs("")
    assert downs >= 15  # out on every failed poll (one per ~3 s: timeout, then interval)
    assert picks["b"] < 0.75 * picks["a"]


def test_flap_every_must_be_two_or_more() -> None:
    with pytest.raises(ScenarioError, match="flap_every"):
        parse_scenario(FLAPPING.format(health="").replace("flap_every = 2", "flap_every = 1"))
