"""Simulator speed: wall and CPU time, events per second, per algorithm x scenario.

Targets (issues 3 and 10): `burst` under 10 s of wall time; no scenario of 10,000
clients over 30 s with any algorithm, failover on or off (`mixed-7`: issue 10's
cluster with a misconfigured, a failing and a busy server, 30 bitrates; with
`--failover-stall-s 2` an algorithm's mistakes become failover storms, which cost
events, not quadratic work); 50,000 clients on 20 servers (`big-50k`) under 2 minutes.

Every figure is the median over `--runs` runs (default 3; the spread is printed as
min-max). Two references, measured in the same run of this script:

- the empty event loop: events per second of `EventLoop` whose events do nothing but
  schedule the next one (the most a simulation can process); each run's events per
  CPU second is printed as a share of the empty loop's ("of empty");
- the cheapest algorithm of each scenario (the lowest median wall time): each
  algorithm's wall time is printed as a multiple of it, which is what the algorithm's
  mistakes cost the simulator.

Run: .venv/bin/python bench/sim.py [--runs N] [--case NAME ...] [ALGORITHM ...]
(default: every case, every registered algorithm). Figures for the docs are taken
under the heavy lock (`flock /work/heavy.lock ...`) with the load average printed at
the start and the end. Exit status 1 if a median wall time misses its target.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time

from pressrun.balancer.algorithms import algorithm_names
from pressrun.sim.engine import EventLoop
from pressrun.sim.run import run_scenario
from pressrun.sim.scenario import load_scenario


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
    """One scenario of the bench, with its client model override and wall-time target."""

    scenario: str
    failover_stall_s: float | None  # None: the scenario's own
    target_s: float

    @property
    def label(self) -> str:
        """The name printed in the tables (`mixed-7/fo2` for a 2 s failover stall)."""
        if self.failover_stall_s is None:
            return self.scenario
        return f"{self.scenario}/fo{self.failover_stall_s:g}"


CASES: tuple[Case, ...] = (
    Case("burst", None, 10.0),
    Case("mixed-7", 0.0, 30.0),
    Case("mixed-7", 2.0, 30.0),
    Case("big-50k", None, 120.0),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Measure:
    """One algorithm on one case: medians over the runs."""

    case: Case
    algorithm: str
    clients: int
    servers: int
    walls: tuple[float, ...]
    cpus: tuple[float, ...]
    events: int
    failovers: int
    served: int

    @property
    def wall_s(self) -> float:
        """Median wall time."""
        return statistics.median(self.walls)

    @property
    def cpu_s(self) -> float:
        """Median CPU time of the process."""
        return statistics.median(self.cpus)


def empty_loop_run(events: int) -> tuple[float, float]:
    """One run of the event loop with empty events: (events per wall s, per CPU s).

    1,000 events pending at any time (a simulation's heap is of that order); each one,
    when it runs, only schedules the next at a random time up to 1 s later: a heap
    push, a pop and a call per event, nothing simulated.
    """
    loop = EventLoop()
    draw = random.Random(1).random
    left = [events]

    def tick() -> None:
        left[0] -= 1
        if left[0] > 0:
            loop.after(draw(), tick)

    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(1000):
        loop.at(draw(), tick)
    loop.run(float("inf"))
    wall, cpu = time.perf_counter() - start, max(time.process_time() - cpu0, 1e-9)
    return loop.events_processed / wall, loop.events_processed / cpu


def empty_loop_events_per_s(events: int = 300_000, runs: int = 3) -> tuple[float, float]:
    """Median over `runs` of `empty_loop_run`: (events per wall s, per CPU s)."""
    rates = [empty_loop_run(events) for _ in range(runs)]
    return statistics.median(r[0] for r in rates), statistics.median(r[1] for r in rates)


def measure(case: Case, algorithm: str, runs: int) -> Measure:
    """Run `algorithm` on `case` `runs` times (the same seed: the same run each time)."""
    scenario = load_scenario(case.scenario).with_failover_stall(case.failover_stall_s)
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(runs):
        start, cpu0 = time.perf_counter(), time.process_time()
        result = run_scenario(scenario, algorithm, 1)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu0)
    return Measure(
        case,
        algorithm,
        len(result.clients),
        len(scenario.servers),
        tuple(walls),
        tuple(cpus),
        result.events,
        sum(c.failovers for c in result.clients),
        sum(1 for c in result.clients if c.state.value == "done"),
    )


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithms", nargs="*", help="algorithms (default: every registered)")
    parser.add_argument("--runs", type=int, default=3, help="runs per pair (default 3)")
    parser.add_argument(
        "--case",
        action="append",
        choices=[c.label for c in CASES],
        help="only this case (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    unknown = [a for a in args.algorithms if a not in algorithm_names()]
    if unknown:
        parser.error(f"unknown algorithm {unknown[0]!r}; choose from {algorithm_names()}")
    algorithms = args.algorithms or algorithm_names()
    cases = [c for c in CASES if args.case is None or c.label in args.case]
    print(f"load average at start: {load_average()}", flush=True)
    empty_wall, empty_cpu = empty_loop_events_per_s()
    print(
        f"reference: the empty event loop, {empty_wall:,.0f} events per wall second, "
        f"{empty_cpu:,.0f} per CPU second (median of 3)",
        flush=True,
    )
    ok = True
    for case in cases:
        rows = [measure(case, algorithm, args.runs) for algorithm in algorithms]
        cheapest = min(rows, key=lambda m: m.wall_s)
        print(
            f"\n{case.label}: {rows[0].clients} clients, {rows[0].servers} servers, target "
            f"< {case.target_s:.0f} s wall; median of {args.runs} runs; reference: the "
            f"cheapest algorithm here ({cheapest.algorithm}, {cheapest.wall_s:.2f} s)"
        )
        print(
            f"{'algorithm':9} {'wall s':>7} {'(min-max)':>13} {'cpu s':>6} {'x cheapest':>10} "
            f"{'events':>8} {'ev/wall-s':>9} {'ev/cpu-s':>9} {'of empty':>8} {'failovers':>9} "
            f"{'served':>7}  verdict"
        )
        for m in rows:
            met = m.wall_s < case.target_s
            ok = ok and met
            rate = m.events / m.wall_s
            cpu_rate = m.events / max(m.cpu_s, 1e-9)
            print(
                f"{m.algorithm:9} {m.wall_s:7.2f} {min(m.walls):6.2f}-{max(m.walls):<6.2f} "
                f"{m.cpu_s:6.2f} {m.wall_s / cheapest.wall_s:10.2f} {m.events:8d} "
                f"{rate:9.0f} {cpu_rate:9.0f} {cpu_rate / empty_cpu:8.3f} {m.failovers:9d} "
                f"{m.served:7d}  "
                f"{'ok' if met else 'TOO SLOW'}",
                flush=True,
            )
        worst = max(rows, key=lambda m: m.wall_s)
        print(
            f"{case.label}: median wall over algorithms "
            f"{statistics.median(m.wall_s for m in rows):.2f} s, worst {worst.algorithm} "
            f"{worst.wall_s:.2f} s ({worst.wall_s / cheapest.wall_s:.2f}x the cheapest)",
            flush=True,
        )
    print(f"\nload average at end: {load_average()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
