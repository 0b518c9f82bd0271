"""`pressrun sim balancer | chord | swarm`: the simulations (docs/simulator.md, docs/chord.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_seed_out_json(parser: argparse.ArgumentParser, *, out: str, printed: str) -> None:
    """`--seed`, `--out DIR` and `--json`, the same for every simulation.

    `out` says what DIR receives besides the JSON summary, `printed` what `--json`
    replaces ("a table", "tables").
    """
    parser.add_argument("--seed", type=int, default=1, help="master seed (default 1)")
    parser.add_argument("--out", type=Path, help=f"directory for the JSON summary and {out}")
    parser.add_argument("--json", action="store_true", help=f"print JSON instead of {printed}")


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON at `path` (its directory created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def report_with_plot(
    args: argparse.Namespace,
    stem: str,
    summary: dict[str, Any],
    table: str,
    plot: Callable[[Path], Path],
    plot_label: str,
) -> int:
    """End a simulation command: with `--out DIR`, `plot(DIR)` draws the figure and the
    summary (naming it) goes to DIR/`stem`.json; then print the JSON or the table."""
    if args.out is not None:
        summary["plot"] = str(plot(args.out))
        write_json(args.out / f"{stem}.json", summary)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(table)
        if args.out is not None:
            print(f"{plot_label}: {summary['plot']}")
    return 0


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
    what = bal.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--scenario",
        help="a built-in scenario (trickle, waves, burst, waves-2, burst-2, ...) or a TOML file",
    )
    what.add_argument(
        "--generate",
        type=int,
        metavar="N",
        help="draw N random scenarios from --seed (3-50 servers, 1-200 issues, downloads "
        "and streams, misconfigured, busy and failing servers) and run a tournament of "
        "--algorithm (default: all) over them",
    )
    what.add_argument(
        "--report",
        type=Path,
        metavar="RECORD",
        help="print the tournament table of a record written by --generate --out "
        "(e.g. docs/tournament-2026.json) without running anything",
    )
    bal.add_argument(
        "--generator",
        choices=("general", "crowd"),
        default="general",
        help="with --generate: which kind of scenario (general: 3-50 servers, downloads and "
        "streams, 0.2x-2x capacity; crowd: issue 33's flash crowds of 1,500-4,000 clients "
        "at 2x-5x capacity; docs/simulator.md)",
    )
    bal.add_argument(
        "--scenarios",
        metavar="A:B",
        help="with --generate: run only scenarios A to B-1 of the N (a slice, so a long "
        "tournament runs in parts); with --out, merged into the record already there",
    )
    bal.add_argument(
        "--algorithm",
        default=None,
        help="a registered algorithm, a comma-separated list, or 'all' (default: the "
        "service's default algorithm; with --generate: all)",
    )
    add_seed_out_json(bal, out="PNG plots", printed="tables")
    bal.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="with --generate: runs in parallel processes (default 1)",
    )
    bal.add_argument(
        "--classes",
        choices=("on", "off"),
        default=None,
        help="with --scenario: request classes told to the balancer and the origins (on) "
        "or not (off), whatever the scenario says (docs/simulator.md, 'Request classes')",
    )
    bal.add_argument(
        "--failover-stall-s",
        type=float,
        default=None,
        help="override the scenario's client model: 0 = the paper's harness (clients stay "
        "put), > 0 = pressrun clients re-ask naming the origin after this much stall",
    )
    bal.set_defaults(func=run_balancer)
    register_chord(sim_sub)
    register_swarm(sim_sub)


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
    add_seed_out_json(ch, out="hop histogram", printed="a table")
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
    stem = f"chord-{args.nodes}-seed{args.seed}"
    return report_with_plot(
        args,
        stem,
        result.summary(),
        format_chord(result),
        lambda out: plot_hops(result, out / f"{stem}-hops.png"),
        "histogram",
    )


def _algorithms(spec: str | None, default: list[str]) -> list[str] | str:
    """The algorithms named by --algorithm, or a message naming the choices."""
    from pressrun.balancer.algorithms import algorithm_names

    if spec is None:
        return default
    names = algorithm_names() if spec == "all" else [n for n in spec.split(",") if n]
    unknown = [n for n in names if n not in algorithm_names()]
    if unknown or not names:
        return (
            f"unknown algorithm {(unknown or [spec])[0]!r}; choose one of: "
            f"{', '.join(algorithm_names())} or all"
        )
    return names


def run_tournament_command(args: argparse.Namespace) -> int:
    """`pressrun sim balancer --generate N`: every algorithm over N random scenarios."""
    from pressrun.balancer.algorithms import algorithm_names
    from pressrun.sim.generate import (
        format_tournament,
        generate_scenarios,
        record_entries,
        run_tournament,
        share_of_bound,
        tournament_record,
    )

    if args.generate < 1 or args.jobs < 1:
        print("pressrun sim: --generate and --jobs must be at least 1", file=sys.stderr)
        return 2
    names = _algorithms(args.algorithm, algorithm_names())
    if isinstance(names, str):
        print(f"pressrun sim: {names}", file=sys.stderr)
        return 2
    if args.generator == "crowd":
        from pressrun.sim.generate_crowd import generate_crowd_scenarios

        scenarios = generate_crowd_scenarios(args.generate, args.seed)
        stem = f"tournament-crowd-{args.seed}"
    else:
        scenarios = generate_scenarios(args.generate, args.seed)
        stem = f"tournament-{args.seed}"
    if args.scenarios is not None:
        part = _slice(args.scenarios, len(scenarios))
        if part is None:
            print(
                f"pressrun sim: --scenarios wants A:B with 0 <= A < B <= {len(scenarios)}, "
                f"not {args.scenarios!r}",
                file=sys.stderr,
            )
            return 2
        scenarios = scenarios[part[0] : part[1]]
    out = None if args.out is None else args.out / f"{stem}.json"
    previous: dict[str, Any] | None = None
    if out is not None and out.exists():
        read = _read_record(out)
        if isinstance(read, str):
            print(f"pressrun sim: {read}", file=sys.stderr)
            return 2
        previous = read
        if previous.get("seed") != args.seed:
            print(f"pressrun sim: {out} is a record of another seed", file=sys.stderr)
            return 2
        if previous.get("generator", "general") != args.generator:
            print(f"pressrun sim: {out} is a record of another generator", file=sys.stderr)
            return 2
    total = len(scenarios) * len(names)
    done = 0

    def progress(entry: Any) -> None:
        nonlocal done
        done += 1
        print(
            f"[{done}/{total}] {entry.scenario} {entry.algorithm}: "
            f"{entry.successful}/{entry.clients} served, bound {entry.bound} "
            f"({share_of_bound(entry):.3f}), {entry.wall_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.Pool(args.jobs) as pool:
            entries = run_tournament(scenarios, names, pool.imap, progress)
    else:
        entries = run_tournament(scenarios, names, None, progress)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        record = tournament_record(entries, args.seed, previous)
        if args.generator != "general":
            record["generator"] = args.generator
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        tmp.replace(out)
        if previous is not None:
            entries = record_entries(record)
            print(f"merged into {out}: {len(record['scenarios'])} scenarios", file=sys.stderr)
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=1))
    else:
        print(format_tournament(entries, args.seed))
    return 0


def _slice(spec: str, n: int) -> tuple[int, int] | None:
    """`A:B` as (A, B) within 0..n, or None."""
    a, sep, b = spec.partition(":")
    try:
        lo, hi = int(a), int(b)
    except ValueError:
        return None
    return (lo, hi) if sep and 0 <= lo < hi <= n else None


def _read_record(path: Path) -> dict[str, Any] | str:
    """A tournament record, or a message saying why it cannot be read."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"cannot read the record {path}: {exc}"
    if not isinstance(record, dict) or not isinstance(record.get("scenarios"), dict):
        return f"{path} is not a tournament record (no 'scenarios')"
    return record


def run_report(args: argparse.Namespace) -> int:
    """`pressrun sim balancer --report RECORD`: the table of a recorded tournament."""
    from pressrun.sim.generate import format_tournament, record_entries

    record = _read_record(args.report)
    if isinstance(record, str):
        print(f"pressrun sim: {record}", file=sys.stderr)
        return 2
    try:
        entries = record_entries(record)
    except (KeyError, TypeError, AttributeError) as exc:
        print(f"pressrun sim: {args.report} is not a tournament record: {exc}", file=sys.stderr)
        return 2
    print(format_tournament(entries, int(record.get("seed", 0))))
    return 0


def run_balancer(args: argparse.Namespace) -> int:
    """Handler of `pressrun sim balancer`."""
    from pressrun.balancer.config import BalancerConfig
    from pressrun.sim.metrics import format_comparison, format_table, summarize
    from pressrun.sim.run import run_scenario
    from pressrun.sim.scenario import ScenarioError, load_scenario

    if args.generate is not None:
        return run_tournament_command(args)
    if args.report is not None:
        return run_report(args)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"pressrun sim: {exc}", file=sys.stderr)
        return 2
    if args.failover_stall_s is not None and args.failover_stall_s < 0:
        print("pressrun sim: --failover-stall-s must be >= 0", file=sys.stderr)
        return 2
    scenario = scenario.with_failover_stall(args.failover_stall_s)
    if args.classes is not None:
        scenario = scenario.with_classes(args.classes == "on")
    names = _algorithms(args.algorithm, [BalancerConfig().algorithm])
    if isinstance(names, str):
        print(f"pressrun sim: {names}", file=sys.stderr)
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
        write_json(args.out / f"{scenario.name}-seed{args.seed}.json", summaries)
    if args.json:
        print(json.dumps(summaries if len(summaries) > 1 else summaries[0], indent=2, default=str))
    elif len(names) > 1:
        print(format_comparison(summaries))
    return 0


def register_swarm(sim_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`pressrun sim swarm` (docs/chord.md)."""
    sw = sim_sub.add_parser(
        "swarm",
        help="a flash crowd on one issue: the ring's uploader choice, random, rarest-first",
        description="Block-level swarm model in steps (numpy): completion against the "
        "fluid bound, the origin's share of unicast, when subscribers may leave fairly, "
        "for each uploader choice, in one table and one plot.",
    )
    sw.add_argument(
        "--scenario",
        default="flash-50k",
        help="a built-in swarm scenario (flash-50k, flash-1k) or a TOML file (default flash-50k)",
    )
    sw.add_argument(
        "--choices",
        default="ring,random,rarest",
        help="comma-separated uploader choices (default ring,random,rarest)",
    )
    sw.add_argument(
        "--blocks-per-piece",
        type=int,
        default=16,
        help="resolution: blocks per piece; a step is one block at the slowest upload "
        "rate (default 16)",
    )
    sw.add_argument(
        "--leave",
        choices=("never", "fair", "last-holder"),
        default="never",
        help="when finished subscribers leave: never (everyone seeds to the end, as the "
        "bound assumes; default), fair (the client's ratio and not_needed rules), "
        "last-holder (fair, but the last holder of a piece someone lacks stays)",
    )
    add_seed_out_json(sw, out="the plot", printed="a table")
    sw.set_defaults(func=run_swarm_sim)


def run_swarm_sim(args: argparse.Namespace) -> int:
    """Handler of `pressrun sim swarm`."""
    from pressrun.sim.swarm_model import CHOICES
    from pressrun.sim.swarm_report import compare, format_comparison, plot_comparison
    from pressrun.sim.swarm_scenario import SwarmScenarioError, load_swarm_scenario

    choices = tuple(c.strip() for c in args.choices.split(",") if c.strip())
    bad = [c for c in choices if c not in CHOICES]
    if bad or not choices:
        print(
            f"pressrun sim swarm: unknown choice {bad[0] if bad else ''!r}; "
            f"choose from {', '.join(CHOICES)}",
            file=sys.stderr,
        )
        return 2
    try:
        scenario = load_swarm_scenario(args.scenario)
        result = compare(
            scenario,
            choices,
            seed=args.seed,
            blocks_per_piece=args.blocks_per_piece,
            progress=not args.json,
            leave=args.leave,
        )
    except (SwarmScenarioError, ValueError) as exc:
        print(f"pressrun sim swarm: {exc}", file=sys.stderr)
        return 2
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "subscribers": scenario.subscribers,
        "file_bytes": scenario.file_bytes,
        "pieces": scenario.num_pieces,
        "seed": args.seed,
        "leave": args.leave,
        "fluid_bound_s": round(result.bound_s, 2),
        "choices": result.rows(),
    }
    stem = f"swarm-{scenario.name}-seed{args.seed}"
    if args.leave != "never":
        stem += f"-leave-{args.leave}"
    return report_with_plot(
        args,
        stem,
        summary,
        format_comparison(result),
        lambda out: plot_comparison(result, out / f"{stem}.png"),
        "plot",
    )
