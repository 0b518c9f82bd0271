"""Simulator speed: wall and CPU time per run, events per second, for every algorithm.

Targets (issues 3 and 10): `burst` under 10 s of wall time; no scenario of 10,000
clients over 30 s with any algorithm, failover on or off (`mixed-7`: issue 10's
cluster with a misconfigured, a failing and a busy server, 30 bitrates; with
`--failover-stall-s 2` an algorithm's mistakes become failover storms, which cost
events, not quadratic work); 50,000 clients on 20 servers (`big-50k`) under 2 minutes.

Run: .venv/bin/python bench/sim.py [ALGORITHM ...]   (default: every registered one)
Wall time depends on what else the machine runs; the CPU time of the process is
printed beside it, and the verdict is on wall time as the issue states it.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from pressrun.balancer.algorithms import algorithm_names
from pressrun.sim.run import run_scenario
from pressrun.sim.scenario import Scenario, load_scenario

#: (scenario, failover_stall_s or None for the scenario's own, wall-time target in s)
CASES: tuple[tuple[str, float | None, float], ...] = (
    ("burst", None, 10.0),
    ("mixed-7", 0.0, 30.0),
    ("mixed-7", 2.0, 30.0),
    ("big-50k", None, 120.0),
)


def with_failover(scenario: Scenario, stall_s: float | None) -> Scenario:
    """The scenario with its clients' failover stall replaced (None: unchanged)."""
    if stall_s is None:
        return scenario
    clients = dataclasses.replace(scenario.clients, failover_stall_s=stall_s)
    return dataclasses.replace(scenario, clients=clients)


def main(argv: list[str]) -> int:
    algorithms = argv or algorithm_names()
    ok = True
    walls: list[float] = []
    for name, stall, target in CASES:
        scenario = with_failover(load_scenario(name), stall)
        label = name if stall is None else f"{name}/fo{stall:g}"
        for algorithm in algorithms:
            start, cpu0 = time.perf_counter(), time.process_time()
            result = run_scenario(scenario, algorithm, 1)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
            walls.append(wall)
            ok_run = wall < target
            ok = ok and ok_run
            served = sum(1 for c in result.clients if c.state.value == "done")
            failovers = sum(c.failovers for c in result.clients)
            print(
                f"{label:13} {algorithm:9} clients {len(result.clients):6d} servers "
                f"{len(scenario.servers):2d}  wall {wall:6.2f} s  cpu {cpu:6.2f} s "
                f"(target < {target:.0f} s, {'ok' if ok_run else 'TOO SLOW'})  "
                f"events {result.events:8d} {result.events / max(cpu, 1e-9):8.0f}/cpu-s  "
                f"failovers {failovers:7d}  served {served}",
                flush=True,
            )
    print(f"median wall {statistics.median(walls):.2f} s, max {max(walls):.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
