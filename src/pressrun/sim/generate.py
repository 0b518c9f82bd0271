"""Random scenarios beyond the paper's three machines, and a tournament over them.

`generate_scenarios(n, seed)` draws `n` scenarios, each from its own
`random.Random(seed, index)`, so scenario k of a seed is the same whatever `n`:

- 3 to 50 servers (log-uniform count), links from 100 Mbit/s to 40 Gbit/s, cores and
  per-client CPU cost such that the CPU can send 0.6x to 3x the link (some servers are
  CPU-bound), RAM 1 to 64 GiB, at least 1.5 MiB per MB/s of link (small ones crash when
  network overload fills it);
- some misconfigured (told 2x to 10x the link they have), some busy (20 to 60 % of
  their CPU taken by other work, with noise), in a third of the scenarios some failing
  mid-run and coming back 1 to 5 minutes later;
- 1 to 200 issues with Zipf popularity: downloads (half the scenarios: pressrun's own
  workload, issues of 20 to 500 MB, a deadline of 1 to 5 minutes), streams (a
  quarter: bitrates 64 kB/s to 2.5 MB/s, 1 to 5 minutes) or both;
- download clients on 10 Mbit/s, 50 Mbit/s, 100 Mbit/s or 1 Gbit/s access links;
- a trickle (Poisson), waves, a burst or a flash crowd (a step up then a decaying
  rate), sized so that the offered load is 0.2x to 2x the scenario's true capacity
  (the ones beyond 1x cannot all be served).

Clients are pressrun's (they fail over after 2 s of stall or a dropped connection and
give up after 8 failovers; a refused client retries after Retry-After for 16 s, the
8 attempts of `pressrun get`). The balancer is told each issue's need (its bitrate, or
size over deadline), as the real service can learn sizes from manifests.

`run_tournament` runs every scenario with every algorithm and `format_tournament`
prints, per algorithm, the mean and worst share of the capacity bound
(`metrics.capacity_bound`), the scenarios it won, those within 2 % of the best, and
those where it served fewer clients than alg2.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pressrun.sim.metrics import capacity_bound, server_capacity_bytes_per_s
from pressrun.sim.model import AssetSpec, ServerSpec
from pressrun.sim.run import run_scenario
from pressrun.sim.scenario import BalancerSetup, ClientModel, Failure, Scenario

MBIT = 125_000.0  # bytes/s in one Mbit/s
GIB = float(2**30)
MIB = float(2**20)
LINKS_BYTES_PER_S = (100 * MBIT, 1_000 * MBIT, 2_500 * MBIT, 10_000 * MBIT, 40_000 * MBIT)
LINK_WEIGHTS = (3.0, 4.0, 1.0, 2.0, 1.0)
ACCESS_BYTES_PER_S = (10 * MBIT, 50 * MBIT, 100 * MBIT, 1_000 * MBIT)
ACCESS_WEIGHTS = (0.1, 0.3, 0.4, 0.2)
BITRATES_BYTES_PER_S = (64e3, 250e3, 625e3, 1.25e6, 2.5e6)
DEADLINES_S = (60.0, 120.0, 180.0, 300.0)
PATTERNS = ("trickle", "waves", "burst", "flash")
#: most clients one generated scenario holds (keeps a tournament of 200 in minutes)
MAX_CLIENTS = 1500


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _servers(rng: random.Random) -> list[ServerSpec]:
    count = round(_log_uniform(rng, 3, 50))
    out: list[ServerSpec] = []
    for k in range(1, count + 1):
        link = rng.choices(LINKS_BYTES_PER_S, LINK_WEIGHTS)[0]
        cores = float(rng.choice((2, 4, 8, 16, 32, 64)))
        busy = rng.random() < 0.15
        cpu_idle = rng.uniform(0.2, 0.6) if busy else rng.uniform(0.01, 0.05)
        cpu_noise = rng.uniform(0.02, 0.1) if busy else 0.0
        # The CPU can send cpu_x times the link: cores * (1 - idle) / per_client * 100 kB/s.
        cpu_x = rng.uniform(0.6, 3.0)
        per_client = cores * (1.0 - cpu_idle - cpu_noise) * 1e5 / (cpu_x * link)
        # RAM: enough for a transfer per MB/s of link, 1.5 MiB each (a 40 Gbit/s
        # server with 1 GiB is not a machine anyone builds); small ones may crash.
        least = link / 1e6 * 1.5 * MIB
        ram = float(rng.choice([g for g in (1, 2, 4, 8, 16, 32, 64) if g * GIB >= least] or [64]))
        ram *= GIB
        small = ram <= 2 * GIB
        told = link * rng.uniform(2.0, 10.0) if rng.random() < 0.15 else None
        out.append(
            ServerSpec(
                name=f"s{k:02d}",
                cores=cores,
                cpu_idle=cpu_idle,
                cpu_noise=cpu_noise,
                cpu_per_client_cores=per_client,
                ram_bytes=ram,
                ram_idle=rng.uniform(0.3, 0.5) if busy else rng.uniform(0.03, 0.1),
                ram_per_client_bytes=rng.uniform(0.3, 1.0) * MIB,
                ram_backlog_bytes=MIB if small else 0.0,
                link_bytes_per_s=link,
                told_bytes_per_s=told,
                crash_ram_fraction=1.0 if small else None,
                recover_after_s=rng.uniform(60.0, 300.0),
            )
        )
    return out


def _assets(rng: random.Random, workload: str, deadline_s: float) -> list[AssetSpec]:
    count = round(_log_uniform(rng, 1, 200))
    zipf_s = rng.uniform(0.6, 1.2)
    out: list[AssetSpec] = []
    for k in range(1, count + 1):
        download = workload == "download" or (workload == "mixed" and rng.random() < 0.5)
        weight = 1.0 / k**zipf_s
        if download:
            size = _log_uniform(rng, 20e6, 500e6)
            out.append(
                AssetSpec(
                    f"issue-{k}", popularity=weight, download_bytes=size, deadline_s=deadline_s
                )
            )
        else:
            out.append(
                AssetSpec(
                    f"stream-{k}",
                    bitrate_bytes_per_s=rng.choice(BITRATES_BYTES_PER_S),
                    duration_s=rng.uniform(60.0, 300.0),
                    popularity=weight,
                )
            )
    return out


def _mean_bytes(assets: Sequence[AssetSpec]) -> float:
    total = sum(a.popularity for a in assets)
    return sum(a.popularity * a.size_bytes for a in assets) / total


def _mean_hold_s(assets: Sequence[AssetSpec]) -> float:
    """How long a client holds its reservation, on average (deadline or play-through)."""
    total = sum(a.popularity for a in assets)
    return sum(a.popularity * (a.deadline_s if a.is_download else a.duration_s) for a in assets) / (
        total
    )


def _arrivals(
    rng: random.Random, pattern: str, clients: int, start: float
) -> tuple[list[dict[str, Any]], float]:
    """Arrival specs for about `clients` requests, and when the last one comes."""
    if pattern == "trickle":
        span = rng.uniform(60.0, 300.0)
        rate = clients / span
        return [
            {
                "kind": "rate",
                "rate_per_s": rate,
                "start_s": start,
                "end_s": start + span,
                "poisson": True,
            }
        ], start + span
    if pattern == "waves":
        waves = rng.randint(5, 20)
        every = rng.uniform(5.0, 20.0)
        per = max(1, round(clients / waves))
        return [
            {
                "kind": "waves",
                "count": per,
                "every_s": every,
                "waves": waves,
                "start_s": start,
                "spread_s": rng.uniform(0.2, 2.0),
            }
        ], start + waves * every
    if pattern == "burst":
        spread = rng.uniform(0.5, 10.0)
        return [
            {"kind": "burst", "count": clients, "at_s": start, "spread_s": spread}
        ], start + spread
    # A flash crowd: a peak, then the rate halves every step (a Slashdot curve).
    step = rng.uniform(10.0, 40.0)
    peak = clients / (step * (1 + 0.5 + 0.25 + 0.125))
    specs = []
    t = start
    for k in range(4):
        specs.append(
            {
                "kind": "rate",
                "rate_per_s": peak / 2**k,
                "start_s": t,
                "end_s": t + step,
                "poisson": True,
            }
        )
        t += step
    return specs, t


def generate_scenario(seed: int, index: int) -> Scenario:
    """Scenario `index` of `seed` (the same whatever else is generated)."""
    rng = random.Random(f"pressrun-balancer-{seed}-{index}")
    servers = _servers(rng)
    roll = rng.random()
    workload = "download" if roll < 0.5 else "stream" if roll < 0.75 else "mixed"
    deadline = rng.choice(DEADLINES_S)
    assets = _assets(rng, workload, deadline)
    pattern = rng.choice(PATTERNS)
    load = _log_uniform(rng, 0.2, 2.0)
    capacity = sum(server_capacity_bytes_per_s(s, assets) for s in servers)
    # Offered load: clients x bytes over the time they hold them, against capacity.
    hold = _mean_hold_s(assets)
    per_client = _mean_bytes(assets) / hold
    clients = max(50, min(round(load * capacity / per_client), MAX_CLIENTS))
    load = clients * per_client / capacity
    start = 10.0
    arrival_specs, last = _arrivals(rng, pattern, clients, start)
    failures: list[Failure] = []
    if rng.random() < 1 / 3:
        for s in rng.sample(servers, max(1, len(servers) // 10)):
            down = rng.uniform(start, max(last, start + 60.0))
            failures.append(Failure(s.name, down, down + rng.uniform(60.0, 300.0)))
    longest = max(a.deadline_s if a.is_download else a.duration_s for a in assets)
    duration = last + longest + 60.0
    name = f"gen-{seed}-{index:03d}"
    kinds = sum(1 for s in servers if s.told_bytes_per_s is not None)
    busy = sum(1 for s in servers if s.cpu_idle >= 0.2)
    description = (
        f"{len(servers)} servers ({kinds} misconfigured, {busy} busy, {len(failures)} failing), "
        f"{len(assets)} {workload} assets, {pattern} of {clients} clients at {load:.2f}x capacity"
    )
    return Scenario(
        name=name,
        description=description,
        duration_s=duration,
        tick_s=max(1.0, duration / 300.0),
        servers=tuple(servers),
        assets=tuple(assets),
        arrival_specs=tuple(arrival_specs),
        failures=tuple(failures),
        balancer=BalancerSetup(),
        clients=ClientModel(
            failover_stall_s=2.0,
            # pressrun's client stops after 8 attempts without progress: 8 refusals
            # with the default Retry-After of 2 s.
            max_wait_s=16.0,
            access_bytes_per_s=ACCESS_BYTES_PER_S,
            access_weights=ACCESS_WEIGHTS,
        ),
        source=f"generated (seed {seed}, #{index})",
    )


def generate_scenarios(n: int, seed: int) -> list[Scenario]:
    """`n` random scenarios from one seed (docs/simulator.md, the generator)."""
    if n < 1:
        raise ValueError("the number of scenarios must be at least 1")
    return [generate_scenario(seed, i) for i in range(n)]


MapFn = Callable[
    [Callable[[tuple[Scenario, str]], "Entry"], Iterable[tuple[Scenario, str]]], Iterable["Entry"]
]


@dataclass(frozen=True, slots=True)
class Entry:
    """One algorithm on one scenario."""

    scenario: str
    description: str
    algorithm: str
    clients: int
    successful: int
    bound: int
    wall_s: float


def run_entry(scenario: Scenario, algorithm: str, seed: int) -> Entry:
    """Run one scenario with one algorithm; the bound comes with it."""
    start = time.perf_counter()
    result = run_scenario(scenario, algorithm, seed, stop_when_settled=True)
    wall = time.perf_counter() - start
    bound = capacity_bound(scenario, result)["bound_clients"]
    successful = sum(1 for c in result.clients if c.state.value == "done")
    return Entry(
        scenario.name,
        scenario.description,
        algorithm,
        len(result.clients),
        successful,
        int(bound),
        wall,
    )


def run_tournament(
    scenarios: Sequence[Scenario],
    algorithms: Sequence[str],
    map_fn: MapFn | None = None,
    progress: Callable[[Entry], None] | None = None,
) -> list[Entry]:
    """Every scenario with every algorithm (`map_fn`, e.g. a process pool's `imap`, may
    spread the runs over processes; results come back in order)."""
    jobs = [(sc, alg) for sc in scenarios for alg in algorithms]
    out: list[Entry] = []
    results = map(_run_job, jobs) if map_fn is None else map_fn(_run_job, jobs)
    for entry in results:
        out.append(entry)
        if progress is not None:
            progress(entry)
    return out


def _run_job(job: tuple[Scenario, str]) -> Entry:
    # Every run's master seed is 1: the scenario's randomness is the generator's seed.
    scenario, algorithm = job
    return run_entry(scenario, algorithm, 1)


@dataclass(frozen=True, slots=True)
class Standing:
    """One algorithm's line of the tournament table."""

    algorithm: str
    mean_share: float
    worst_share: float
    worst_scenario: str
    wins: int
    within_2pct: int
    below_alg2: int
    scenarios: int


def standings(entries: Sequence[Entry], reference: str = "alg2") -> list[Standing]:
    """Per algorithm: share of the bound (mean, worst), wins, within 2 % of the best."""
    by_scenario: dict[str, dict[str, Entry]] = {}
    for e in entries:
        by_scenario.setdefault(e.scenario, {})[e.algorithm] = e
    algorithms = sorted({e.algorithm for e in entries})
    out: list[Standing] = []
    for alg in algorithms:
        shares: list[tuple[float, str]] = []
        wins = near = below = 0
        for name, row in by_scenario.items():
            mine = row.get(alg)
            if mine is None:
                continue
            best = max(e.successful for e in row.values())
            shares.append((share_of_bound(mine), name))
            wins += mine.successful == best
            near += mine.successful >= 0.98 * best
            ref = row.get(reference)
            below += ref is not None and mine.successful < ref.successful
        worst = min(shares) if shares else (0.0, "-")
        out.append(
            Standing(
                alg,
                sum(s for s, _ in shares) / max(len(shares), 1),
                worst[0],
                worst[1],
                wins,
                near,
                below,
                len(shares),
            )
        )
    out.sort(key=lambda s: (-s.within_2pct, -s.mean_share, s.algorithm))
    return out


def share_of_bound(entry: Entry) -> float:
    """Successful clients over the capacity bound (1.0 when the bound is 0)."""
    return entry.successful / entry.bound if entry.bound > 0 else 1.0


def format_tournament(entries: Sequence[Entry], seed: int) -> str:
    """The tournament table: one line per algorithm, best first."""
    rows = standings(entries)
    n = rows[0].scenarios if rows else 0
    lines = [
        f"tournament: {n} generated scenarios, seed {seed}; share = successful / capacity bound",
        f"{'algorithm':10} {'mean share':>10} {'worst share':>11} {'worst scenario':>16} "
        f"{'wins':>5} {'within 2%':>9} {'below alg2':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r.algorithm:10} {r.mean_share:10.3f} {r.worst_share:11.3f} "
            f"{r.worst_scenario:>16} {r.wins:5d} {r.within_2pct:9d} {r.below_alg2:10d}"
        )
    return "\n".join(lines)


def tournament_record(
    entries: Sequence[Entry], seed: int, previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The tournament as data (docs/tournament-SEED.json): per scenario its description,
    capacity bound and clients served by each algorithm. With `previous` (an earlier
    record of the same seed), the entries are merged into it: a tournament run in
    slices (`--scenarios A:B`) or an algorithm run again replaces only its own cells."""
    scenarios: dict[str, dict[str, Any]] = {}
    if previous is not None:
        if previous.get("seed") != seed:
            raise ValueError(f"the record is of seed {previous.get('seed')}, not {seed}")
        for name, row in previous["scenarios"].items():
            scenarios[name] = {**row, "served": dict(row["served"])}
    for e in entries:
        row = scenarios.setdefault(
            e.scenario,
            {"description": e.description, "clients": e.clients, "bound": e.bound, "served": {}},
        )
        row["served"][e.algorithm] = e.successful
    return {"seed": seed, "scenarios": dict(sorted(scenarios.items()))}


def record_entries(record: dict[str, Any]) -> list[Entry]:
    """A record's cells as entries (no wall time), for `format_tournament`."""
    return [
        Entry(name, row["description"], alg, row["clients"], served, row["bound"], 0.0)
        for name, row in record["scenarios"].items()
        for alg, served in sorted(row["served"].items())
    ]
