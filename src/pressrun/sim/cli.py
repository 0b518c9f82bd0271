"""`pressrun sim balancer | chord | swarm`: the simulations (docs/simulator.md, docs/chord.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `sim` and its sub-commands."""
    sim = subparsers.add_parser("sim", help="simulate pressrun with virtual time")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="WHAT", required=True)
    bal = sim_sub.add_parser(
        "balancer",
        help="the origin balancer against a scenario (the five tests of Viëtor 2016 built in)",
        description="Run a scenario through the real balancer core and print the paper's "
        "table (per machine: average CPU, RAM, MB/s, clients, successful) with the SLB "
        "penalty, EBU and TTFB/completion percentiles.",
    )
    bal.add_argument(
        "--scenario",
        required=True,
        help="a built-in scenario (trickle, waves, burst, waves-2, burst-2, ...) or a TOML file",
    )
    bal.add_argument(
        "--algorithm", default="alg2", help="a registered algorithm, or 'all' (default alg2)"
    )
    bal.add_argument("--seed", type=int, default=1, help="master seed (default 1)")
    bal.add_argument("--out", type=Path, help="directory for the JSON summary and PNG plots")
    bal.add_argument("--json", action="store_true", help="print JSON instead of tables")
    bal.add_argument(
        "--failover-stall-s",
        type=float,
        default=None,
        help="override the scenario's client model: 0 = the paper's harness (clients stay "
        "put), > 0 = pressrun clients re-ask naming the origin after this much stall",
    )
    bal.set_defaults(func=run_balancer)
    register_chord(sim_sub)


def register_chord(sim_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`pressrun sim chord` (docs/chord.md)."""
    ch = sim_sub.add_parser(
        "chord",
        help="lookups on a large Chord ring, before and after a mass failure",
        description="Build a converged Chord ring of N nodes (the real core), run random "
        "lookups, fail a fraction of the nodes at once and run them again before "
        "stabilisation repairs anything; print hops and success rates, plot a histogram.",
    )
    ch.add_argument("--nodes", type=int, required=True, help="ring size N")
    ch.add_argument(
        "--fail-fraction", type=float, default=0.0, help="share of nodes failed at once (0..1)"
    )
    ch.add_argument("--lookups", type=int, default=2000, help="lookups per phase (default 2000)")
    ch.add_argument(
        "--successor-list",
        type=int,
        default=None,
        help="successor list size r (default ceil(log2 N))",
    )
    ch.add_argument("--seed", type=int, default=1, help="master seed (default 1)")
    ch.add_argument("--out", type=Path, help="directory for the JSON summary and hop histogram")
    ch.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ch.set_defaults(func=run_chord)


def run_chord(args: argparse.Namespace) -> int:
    """Handler of `pressrun sim chord`."""
    from pressrun.sim.chord_run import format_chord, plot_hops, run_chord_sim

    try:
        result = run_chord_sim(
            nodes=args.nodes,
            fail_fraction=args.fail_fraction,
            lookups=args.lookups,
            seed=args.seed,
            successor_list_size=args.successor_list,
            progress=not args.json,
        )
    except ValueError as exc:
        print(f"pressrun sim chord: {exc}", file=sys.stderr)
        return 2
    summary = result.summary()
    if args.out is not None:
        png = plot_hops(result, args.out / f"chord-{args.nodes}-seed{args.seed}-hops.png")
        summary["plot"] = str(png)
        out = args.out / f"chord-{args.nodes}-seed{args.seed}.json"
        out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_chord(result))
        if args.out is not None:
            print(f"histogram: {summary['plot']}")
    return 0


def run_balancer(args: argparse.Namespace) -> int:
    """Handler of `pressrun sim balancer`."""
    from pressrun.balancer.algorithms import algorithm_names
    from pressrun.sim.metrics import format_comparison, format_table, summarize
    from pressrun.sim.run import run_scenario
    from pressrun.sim.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"pressrun sim: {exc}", file=sys.stderr)
        return 2
    if args.failover_stall_s is not None:
        if args.failover_stall_s < 0:
            print("pressrun sim: --failover-stall-s must be >= 0", file=sys.stderr)
            return 2
        clients = dataclasses.replace(scenario.clients, failover_stall_s=args.failover_stall_s)
        scenario = dataclasses.replace(scenario, clients=clients)
    names = algorithm_names() if args.algorithm == "all" else [args.algorithm]
    unknown = [n for n in names if n not in algorithm_names()]
    if unknown:
        print(
            f"pressrun sim: unknown algorithm {unknown[0]!r}; choose one of: "
            f"{', '.join(algorithm_names())} or all",
            file=sys.stderr,
        )
        return 2
    summaries: list[dict[str, Any]] = []
    for name in names:
        result = run_scenario(scenario, name, args.seed)
        summary = summarize(result)
        summaries.append(summary)
        if args.out is not None:
            from pressrun.sim.plots import plot_run

            png = args.out / f"{scenario.name}-{name}-seed{args.seed}.png"
            plot_run(result, png)
            summary["plot"] = str(png)
        if not args.json and len(names) == 1:
            print(format_table(summary))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / f"{scenario.name}-seed{args.seed}.json"
        out.write_text(json.dumps(summaries, indent=2, default=str) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(summaries if len(summaries) > 1 else summaries[0], indent=2, default=str))
    elif len(names) > 1:
        print(format_comparison(summaries))
    return 0
