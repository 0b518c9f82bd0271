"""The emulation's pieces for a balancer killed mid-crowd (issue 30): the clients list
both balancers, the first in turn; a fault may start a killed service again; the
built-in scenario kills balancer-2 mid-burst and starts it later."""

from __future__ import annotations

import pytest

from pressrun.emulate.run import BALANCERS, balancers_for
from pressrun.emulate.scenario import Fault, ScenarioError, load_scenario, parse_scenario


def test_clients_list_both_balancers_the_first_in_turn() -> None:
    lists = [balancers_for(n).split(",") for n in range(6)]
    assert all(sorted(item) == sorted(BALANCERS) for item in lists)
    firsts = [item[0] for item in lists]
    assert firsts.count("http://balancer:8080") == firsts.count("http://balancer-2:8080") == 3


def test_the_built_in_scenario_kills_and_restarts_balancer_2() -> None:
    scenario = load_scenario("balancer-kill")
    assert scenario.faults == (
        Fault(8.0, "kill", "balancer-2"),
        Fault(40.0, "start", "balancer-2"),
    )
    plans = scenario.clients()
    assert len(plans) == 60
    # the kill falls in the burst: clients arrive before and after it
    assert min(p.at_s for p in plans) < 8.0 < max(p.at_s for p in plans)


def test_a_fault_action_or_service_not_known_is_refused() -> None:
    base = """
name = "x"
[[links]]
name = "l"
rate = "10mbit"
[[arrivals]]
kind = "burst"
count = 2
at_s = 0
[[faults]]
at_s = 1
"""
    with pytest.raises(ScenarioError, match="action"):
        parse_scenario(base + 'action = "pause"\nservice = "balancer-2"\n')
    with pytest.raises(ScenarioError, match="service"):
        parse_scenario(base + 'action = "start"\nservice = "balancer-3"\n')
    parsed = parse_scenario(base + 'action = "start"\nservice = "balancer-2"\n')
    assert parsed.faults == (Fault(1.0, "start", "balancer-2"),)
