"""Simulator speed: wall time and events per second for `burst` and a 50,000-client run.

Targets (issue 3): burst under 10 s of wall time; 50,000 clients on 20 servers under
2 minutes. Run: .venv/bin/python bench/sim.py [ALGORITHM ...]
"""

from __future__ import annotations

import sys
import time

from pressrun.sim.metrics import summarize
from pressrun.sim.run import run_scenario
from pressrun.sim.scenario import load_scenario

TARGETS_S = {"burst": 10.0, "big-50k": 120.0}


def main(argv: list[str]) -> int:
    algorithms = argv or ["alg2", "headroom"]
    ok = True
    for name, target in TARGETS_S.items():
        scenario = load_scenario(name)
        for algorithm in algorithms:
            start = time.perf_counter()
            result = run_scenario(scenario, algorithm, 1)
            wall = time.perf_counter() - start
            s = summarize(result)
            rate = result.events / wall if wall > 0 else float("inf")
            verdict = "ok" if wall < target else "TOO SLOW"
            ok = ok and wall < target
            print(
                f"{name:8} {algorithm:9} clients {s['clients']:6d} servers "
                f"{len(scenario.servers):2d}  wall {wall:6.2f} s (target < {target:.0f} s, "
                f"{verdict})  events {result.events:8d}  {rate:9.0f} events/s  "
                f"successful {s['successful']}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
