"""The emulation's pieces for a balancer killed mid-crowd (issue 30): the clients list
both balancers, the first in turn; a fault may start a killed service again; the
built-in scenario kills balancer-2 mid-burst and starts it later."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pressrun.emulate.balancer_kill import (
    balancer_events,
    carousel_start_demand,
    compare_modes,
    mode_change_clients,
    mode_change_demand,
)
from pressrun.emulate.issue import BALANCERS, balancers_for
from pressrun.emulate.scenario import Fault, ScenarioError, load_scenario, parse_scenario


def test_clients_list_both_balancers_the_first_in_turn() -> None:
    lists = [balancers_for(n).split(",") for n in range(6)]
    assert all(sorted(item) == sorted(BALANCERS) for item in lists)
    firsts = [item[0] for item in lists]
    assert firsts.count("http://balancer:8080") == firsts.count("http://balancer-2:8080") == 3


def test_the_built_in_scenario_kills_and_restarts_balancer_2() -> None:
    scenario = load_scenario("balancer-kill")
    assert scenario.faults == (
        Fault(3.0, "kill", "balancer-2"),
        Fault(40.0, "start", "balancer-2"),
    )
    plans = scenario.clients()
    assert len(plans) == 60
    # the kill falls in the burst: clients arrive before and after it
    assert min(p.at_s for p in plans) < 3.0 < max(p.at_s for p in plans)


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


def test_the_scenario_runs_a_one_balancer_twin_naming_only_the_first() -> None:
    assert load_scenario("balancer-kill").one_balancer_twin
    assert not load_scenario("fault").one_balancer_twin
    assert {balancers_for(n, single=True) for n in range(4)} == {"http://balancer:8080"}


def test_the_demand_at_each_mode_change_is_the_first_directive_of_that_mode() -> None:
    directives = [
        (0.0, {"origin": 0}),
        (1.0, {"origin": 3}),
        (2.0, {"origin": 4, "swarm": 2}),  # the first swarm one: 5th or 6th
        (3.0, {"origin": 4, "swarm": 6, "multicast": 0}),
        (4.0, {"origin": 4, "swarm": 9, "multicast": 1}),  # the 14th
    ]
    assert mode_change_demand(directives) == {
        "swarm": {"lo": 4, "hi": 5, "at_s": 2.0},
        "multicast": {"lo": 11, "hi": 14, "at_s": 4.0},
    }
    assert mode_change_demand([(0.0, {"origin": 5})]) == {}
    two = {"mode_change_demand": {"swarm": {"lo": 4, "hi": 5, "at_s": 2.0}},
           "mode_change_clients": {"swarm": 5, "multicast": 15}}  # fmt: skip
    one = {
        "mode_change_demand": {
            "swarm": {"lo": 7, "hi": 9, "at_s": 2.5},
            "multicast": {"lo": 14, "hi": 15, "at_s": 5},
        },
        "mode_change_clients": {"swarm": 5, "multicast": 17},
    }
    compared = compare_modes(two, one)
    assert compared["swarm"]["directive_gap"] == 2
    assert compared["swarm"]["client_gap"] == 0
    assert compared["multicast"]["client_gap"] == 2
    assert compared["multicast"]["directive_gap"] is None


def test_the_first_client_answered_each_mode_in_the_order_they_began() -> None:
    rows = [
        {"started_s": 0.4, "mode": "origin"},
        {"started_s": 0.1, "mode": "origin"},
        {"started_s": None, "mode": "swarm"},  # never began: not ranked
        {"started_s": 1.5, "mode": "multicast", "left_swarm_for_carousel": True},
        {"started_s": 1.9, "mode": "swarm"},
        {"started_s": 4.0, "mode": "multicast"},
    ]
    # the third to begin was answered swarm (it left the swarm for the carousel later)
    assert mode_change_clients(rows) == {"swarm": 3, "multicast": 5}


def test_each_balancers_lease_and_carousel_events_from_the_services_log() -> None:
    t0 = datetime(2026, 11, 28, 3, 0, 0, tzinfo=UTC).timestamp()
    log = "\n".join([
        # the service's own time first (docker's stamp is when the engine read the line)
        "balancer-2 | 2026-11-28T02:59:50.123456789Z 2026-11-28 02:59:48,500 INFO pressrun."
        "balancer.shared: this balancer (x-8-aa) now orders the carousels",
        "balancer-2 | 2026-11-28T03:00:04.500000000Z 2026-11-28 03:00:04,5 INFO pressrun."
        "balancer.carousels: peak demand: i-1 moves to multicast (carousel started)",
        "balancer | 2026-11-28T03:00:09.900000000Z 2026-11-28 03:00:09,9 INFO pressrun."
        "balancer.shared: this balancer (y-8-bb) now orders the carousels",
        "balancer | 2026-11-28T03:00:10.000000000Z GET /v1/directive 200",
        "origin-a | 2026-11-28T03:00:11.000000000Z the carousel of i-1 is stopped (not wanted)",
        "balancer | 2026-11-28T03:01:00.000000000Z INFO pressrun.balancer.carousels: the "
        "carousel of i-1 is stopped (not wanted)",
    ])  # fmt: skip
    assert balancer_events(log, t0) == {
        "balancer-2": [[-11.5, "took the carousel lease"], [4.5, "started the carousel"]],
        "balancer": [[9.9, "took the carousel lease"], [60.0, "stopped the carousel"]],
    }


def test_a_kill_is_sigkill_to_the_containers_process_and_spares_a_reused_pid() -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from pressrun.emulate.container_kill import kill_container_process

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # a pid whose cgroup does not name the container (freed and reused): left alone
        assert not kill_container_process(proc.pid, "f963cdc9dfc0" * 5)
        assert proc.poll() is None
        # its cgroup names it (as /proc/<pid>/cgroup names a container's id): killed
        own = Path(f"/proc/{proc.pid}/cgroup").read_text().splitlines()[0]
        assert kill_container_process(proc.pid, own)
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert not kill_container_process(proc.pid, own)  # gone: nothing sent
    finally:
        proc.kill()
        proc.wait()


def test_the_directives_answered_when_the_carousel_started() -> None:
    directives = [
        (6.0, {"origin": 13, "swarm": 20}),
        (7.0, {"origin": 13, "swarm": 21}),
        (8.0, {"origin": 13, "swarm": 21, "multicast": 6}),
    ]
    events = {
        "balancer": [[-64.0, "took the carousel lease"], [6.6, "started the carousel"]],
        "balancer-2": [[30.0, "started the carousel"]],  # a later one is not the first
    }
    assert carousel_start_demand(directives, events) == {"lo": 33, "hi": 34, "at_s": 6.6}
    assert carousel_start_demand(directives, {"balancer": []}) is None
    late = {"balancer": [[9.5, "started the carousel"]]}  # after the series: not known
    assert carousel_start_demand(directives, late) is None
