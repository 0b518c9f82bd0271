"""What a run measured: the paper's table, the SLB penalty, EBU, TTFB and completion.

- The table of 000_9aae53f3113e9bd8.txt (Tables 1-5): per machine the time-averaged
  CPU and RAM in use, average MB/s sent (10^6 bytes), clients sent there, clients
  served successfully; the "All" row averages the machines' averages (as the paper's
  does) and sums the client counts.
- SLB penalty (002_ac8183302b4db82b.txt, slide 10)::

      penalty = (response_mean / response_max) * (request_errors / requests_total)

  with the response time taken as time to first byte and an error a failed request.
- EBU, Eq. (10) of 003_fb4a16d3be88866e.txt::

      U = sum_i bandwidth_required(C_i) / (sum_j bandwidth(L_j) * T_c)

  over the successful play-throughs: bandwidth_required(C_i) is the asset's size (what
  the application needed, not what the links carried), bandwidth(L_j) each server's
  true link rate, T_c the time from the first request to the last successful end.
- Time to first byte and completion time (request to end of play-through) percentiles.
- The capacity bound: if the peak concurrent demand of the workload exceeds the sum of
  the servers' true capacities, not every client can be served whatever the
  algorithm; `capacity_bound` says so and how many clients a fluid admission in
  arrival order would fit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pressrun.sim.model import (
    CPU_REFERENCE_BYTES_PER_S,
    AssetSpec,
    Client,
    ClientState,
    ServerSpec,
)
from pressrun.sim.run import RunResult
from pressrun.sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class MachineRow:
    """One row of the paper's table."""

    name: str
    avg_cpu: float
    avg_ram: float
    avg_mb_per_s: float
    clients_total: int
    clients_ok: int
    crashes: int


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


def machine_rows(result: RunResult) -> list[MachineRow]:
    """The per-machine rows, then "All"."""
    span = max(result.end_s, 1e-9)
    totals: dict[str, int] = dict.fromkeys(result.servers, 0)
    ok: dict[str, int] = dict.fromkeys(result.servers, 0)
    for c in result.clients:
        if c.server is None:
            continue
        totals[c.server] += 1
        if c.state is ClientState.DONE:
            ok[c.server] += 1
    rows = [
        MachineRow(
            name,
            s.cpu_area / span,
            s.ram_area / span,
            s.bytes_out / span / 1e6,
            totals[name],
            ok[name],
            s.crashes,
        )
        for name, s in result.servers.items()
    ]
    n = len(rows)
    rows.append(
        MachineRow(
            "All",
            sum(r.avg_cpu for r in rows) / n,
            sum(r.avg_ram for r in rows) / n,
            sum(r.avg_mb_per_s for r in rows) / n,
            len(result.clients),
            sum(1 for c in result.clients if c.state is ClientState.DONE),
            sum(r.crashes for r in rows),
        )
    )
    return rows


def server_capacity_bytes_per_s(spec: ServerSpec, assets: Sequence[AssetSpec]) -> float:
    """A server's true capacity: its link, or what its free cores can send if less.

    CPU: cores left by the idle load and its noise, over the steady per-client cost,
    times the rate that cost is counted at (the lowest stream bitrate; 100 kB/s for
    downloads, see model.py).
    """
    rates = [a.bitrate_bytes_per_s for a in assets if not a.is_download]
    if any(a.is_download for a in assets):
        rates.append(CPU_REFERENCE_BYTES_PER_S)
    cpu_clients = (
        spec.cores * (1.0 - spec.cpu_idle - spec.cpu_noise) / max(spec.cpu_per_client_cores, 1e-12)
    )
    return min(spec.link_bytes_per_s, max(cpu_clients, 0.0) * min(rates))


def capacity_bound(scenario: Scenario, result: RunResult) -> dict[str, Any]:
    """Peak demand against total true capacity, and the fluid arrival-order admission count.

    Each client reserves what it needs to succeed: a stream its bitrate for its
    duration, a download its size over its deadline for the deadline (a download whose
    access link is slower than that cannot succeed at all). Total capacity is the sum
    of the servers' true capacities (`server_capacity_bytes_per_s`), less the servers
    down at the time (scripted failures). If the peak demand fits and no server
    fails, every client can be served and the bound is the client count; else the
    bound is the number of clients a pooled fluid admission in arrival order holds: an
    estimate of the best any balancer can do (the pool ignores that a client sits on
    one server; a download served faster than its need frees room sooner, so an
    algorithm may pass it).
    """
    # The bound is a function of the servers, assets, failures and the workload (who
    # asked for what, when, on which access link) only, the same for every algorithm
    # run on a scenario: a tournament computes it once per scenario and process.
    key = (
        scenario.servers,
        scenario.assets,
        scenario.failures,
        tuple((c.requested_at, c.asset, c.access_bytes_per_s) for c in result.clients),
    )
    known = _BOUNDS.get(key)
    if known is None:
        known = _capacity_bound(scenario, result)
        if len(_BOUNDS) >= _BOUNDS_KEPT:
            del _BOUNDS[next(iter(_BOUNDS))]
        _BOUNDS[key] = known
    return dict(known)


#: capacity_bound's memo: the last few workloads' bounds (oldest dropped first)
_BOUNDS: dict[tuple[Any, ...], dict[str, Any]] = {}
_BOUNDS_KEPT = 16


def _capacity_bound(scenario: Scenario, result: RunResult) -> dict[str, Any]:
    """`capacity_bound`, computed."""
    clients = sorted(result.clients, key=lambda c: c.requested_at)
    caps = {s.name: server_capacity_bytes_per_s(s, scenario.assets) for s in scenario.servers}
    capacity = sum(caps.values())
    # capacity lost while servers are down: (start, end, bytes/s)
    outages = [
        (f.down_at_s, f.up_at_s if f.up_at_s is not None else math.inf, caps[f.server])
        for f in scenario.failures
    ]

    def capacity_at(t: float) -> float:
        return capacity - sum(c for start, end, c in outages if start <= t < end)

    def reservation(c: Client) -> tuple[float, float] | None:
        a = c.asset
        if not a.is_download:
            return a.bitrate_bytes_per_s, a.duration_s
        need = a.need_bytes_per_s
        if need > c.access_bytes_per_s * (1 + 1e-9):
            return None
        return need, a.deadline_s

    wants = [(c, reservation(c)) for c in clients]
    events: list[tuple[float, float]] = []
    for c, r in wants:
        if r is not None:
            events.append((c.requested_at, r[0]))
            events.append((c.requested_at + r[1], -r[0]))
    events.sort()
    load = peak = 0.0
    for _, d in events:
        load += d
        peak = max(peak, load)
    servable = sum(1 for _, r in wants if r is not None)
    admitted = servable
    all_servable = servable == len(clients) and not outages and peak <= capacity * (1 + 1e-9)
    if not all_servable:
        admitted = _pooled_admission(wants, capacity_at, [start for start, _, _ in outages])
    return {
        "peak_demand_mb_per_s": peak / 1e6,
        "capacity_mb_per_s": capacity / 1e6,
        "all_servable": all_servable,
        "bound_clients": admitted,
    }


def _pooled_admission(
    wants: Sequence[tuple[Client, tuple[float, float] | None]],
    capacity_at: Callable[[float], float],
    outage_starts: Sequence[float],
) -> int:
    """How many clients a pooled admission in arrival order serves (fluid, clairvoyant).

    The pool is every server's true capacity at once (no client is stuck on one
    server). Streams reserve their bitrate for their duration while it fits.
    Downloads are sent first come first served with what the streams leave: each gets
    up to its access rate, in arrival order, until the pool is used up
    (work-conserving). A download is admitted only if it could finish by its deadline
    behind the downloads already queued; one that still misses it is dropped at its
    deadline. When a server goes down the pool shrinks: the latest admitted streams
    are dropped until the rest fit.
    """
    timeline: list[tuple[float, int, Client | None, tuple[float, float] | None]] = [
        (t, 0, None, None) for t in outage_starts
    ]
    timeline += [(c.requested_at, 1, c, r) for c, r in wants if r is not None]
    timeline.sort(key=lambda x: (x[0], x[1]))
    ends: list[tuple[float, int, float]] = []  # streams: (end, id, rate)
    live: dict[int, float] = {}
    # Downloads in arrival order: [bytes left, deadline, cap, live (1) or gone (0)].
    jobs: list[list[float]] = []
    # The same jobs by deadline (lazily cleaned): the earliest deadline without a scan.
    deadlines: list[tuple[float, int, list[float]]] = []
    stream_load = 0.0
    served = 0
    next_id = 0
    next_job = 0
    now = timeline[0][0] if timeline else 0.0

    def drain(until: float) -> None:
        # Only the head of the queue gets a rate (first come, first served, until the
        # pool is used up); the rest wait unchanged, so a step costs the served jobs
        # plus the deadlines that pass, not the whole queue (same arithmetic, same
        # result as a pass over every job).
        nonlocal now, stream_load, served, jobs
        while now < until and (jobs or ends):
            pool = max(capacity_at(now) - stream_load, 0.0)
            head: list[tuple[list[float], float]] = []
            for job in jobs:
                if pool <= 0.0:
                    break
                r = min(job[2], pool)
                head.append((job, r))
                pool -= r
            step = until - now
            if ends:
                step = min(step, ends[0][0] - now)
            for job, r in head:
                if r > 0:
                    step = min(step, job[0] / r)
            while deadlines and not deadlines[0][2][3]:
                heapq.heappop(deadlines)
            if deadlines:
                first = deadlines[0][0]
                if first > now:
                    step = min(step, first - now)
                else:  # not reached: every queued deadline is ahead of now
                    for job in jobs:
                        if job[1] > now:
                            step = min(step, job[1] - now)
            step = max(step, 0.0)
            now += step
            gone = False
            for job, r in head:
                job[0] -= r * step
                if job[0] <= 1e-6 * max(job[2], 1.0):
                    served += now <= job[1] + 1e-9
                    job[3] = 0.0
                    gone = True
                elif not now < job[1] - 1e-9:
                    job[3] = 0.0
                    gone = True
            # Waiting jobs whose deadline passed are dropped (their bytes did not move).
            while deadlines and not now < deadlines[0][0] - 1e-9:
                job = heapq.heappop(deadlines)[2]
                if job[3]:
                    job[3] = 0.0
                    gone = True
            if gone:
                jobs = [job for job in jobs if job[3]]
            while ends and ends[0][0] <= now:
                _, k, rate_k = heapq.heappop(ends)
                if live.pop(k, None) is not None:
                    stream_load -= rate_k
                    served += 1
        now = max(now, until)

    for t, kind, c, r in timeline:
        drain(t)
        cap_now = capacity_at(t) * (1 + 1e-9)
        if kind == 0:
            for k in sorted(live, reverse=True):
                if stream_load <= cap_now:
                    break
                stream_load -= live.pop(k)
            continue
        assert c is not None and r is not None
        if not c.asset.is_download:
            if stream_load + r[0] <= cap_now:
                stream_load += r[0]
                live[next_id] = r[0]
                heapq.heappush(ends, (t + r[1], next_id, r[0]))
                next_id += 1
            continue
        pool = max(cap_now - stream_load, 0.0)
        ahead = sum(job[0] for job in jobs)
        size = c.asset.size_bytes
        if pool > 0 and (ahead + size) / pool <= r[1]:
            job = [size, t + r[1], c.access_bytes_per_s, 1.0]
            jobs.append(job)
            heapq.heappush(deadlines, (job[1], next_job, job))
            next_job += 1
    drain(math.inf)
    return served


def summarize(result: RunResult) -> dict[str, Any]:
    """The run's table and metrics as plain data (what --json writes)."""
    rows = machine_rows(result)
    clients = result.clients
    total = len(clients)
    errors = sum(1 for c in clients if c.state is not ClientState.DONE)
    ttfb = [c.first_byte_at - c.requested_at for c in clients if c.first_byte_at is not None]
    mean = sum(ttfb) / len(ttfb) if ttfb else 0.0
    peak = max(ttfb) if ttfb else 0.0
    penalty = (mean / peak if peak > 0 else 0.0) * (errors / total if total else 0.0)
    done = [c for c in clients if c.state is ClientState.DONE and c.ended_at is not None]
    completion = [c.ended_at - c.requested_at for c in done if c.ended_at is not None]
    # Eq. (10) counts the connections transferred: the successful play-throughs.
    required = sum(c.asset.size_bytes for c in done)
    links = sum(s.link_bytes_per_s for s in result.scenario.servers)
    first = min((c.requested_at for c in clients), default=0.0)
    last = max((c.ended_at for c in done if c.ended_at is not None), default=first)
    t_c = max(last - first, 1e-9)
    ebu = required / (links * t_c)
    stalls = [c.stall_s for c in clients if c.first_server is not None]
    return {
        "scenario": result.scenario.name,
        "algorithm": result.algorithm,
        "seed": result.seed,
        "machines": [
            {
                "name": r.name,
                "avg_cpu": r.avg_cpu,
                "avg_ram": r.avg_ram,
                "avg_mb_per_s": r.avg_mb_per_s,
                "clients_total": r.clients_total,
                "clients_successful": r.clients_ok,
                "crashes": r.crashes,
            }
            for r in rows
        ],
        "clients": total,
        "successful": total - errors,
        "failed": errors,
        "failovers": sum(c.failovers for c in clients),
        "refusals": result.refusals,
        "slb_penalty": penalty,
        "ebu": ebu,
        "ttfb_s": {q: percentile(ttfb, q) for q in (50, 90, 99)},
        "completion_s": {q: percentile(completion, q) for q in (50, 90, 99)},
        "stall_s_p99": percentile(stalls, 99),
        "capacity": capacity_bound(result.scenario, result),
        "events": result.events,
        **({"classes": class_rows(result)} if _has_classes(result) else {}),
    }


def _has_classes(result: RunResult) -> bool:
    return any(a.request_class is not None for a in result.scenario.assets)


def class_rows(result: RunResult) -> dict[str, dict[str, Any]]:
    """Per request class (the assets' `request_class`): requests, successful, refused
    until they gave up, time to first byte p50/p90/p99 and completion p99 (s), and the
    clients sent to an origin that does not hold their asset."""
    by_class: dict[str, list[Client]] = {}
    for c in result.clients:
        by_class.setdefault(c.asset.request_class or "none", []).append(c)
    out: dict[str, dict[str, Any]] = {}
    for klass in sorted(by_class):
        clients = by_class[klass]
        ttfb = [c.first_byte_at - c.requested_at for c in clients if c.first_byte_at is not None]
        done = [
            c.ended_at - c.requested_at
            for c in clients
            if c.state is ClientState.DONE and c.ended_at is not None
        ]
        out[klass] = {
            "requests": len(clients),
            "successful": len(done),
            "gave_up_refused": sum(1 for c in clients if c.reason.startswith("refused")),
            "ttfb_s": {q: percentile(ttfb, q) for q in (50, 90, 99)},
            "completion_s_p99": percentile(done, 99),
            "outside_holders": sum(1 for c in clients if c.non_holder),
        }
    return out


def format_classes(summary: dict[str, Any]) -> str:
    """The per-class lines of a run with request classes (empty without)."""
    rows = summary.get("classes")
    if not rows:
        return ""
    lines = [
        f"{'class':10} {'requests':>8} {'successful':>10} {'gave up':>7} {'TTFB p50':>8} "
        f"{'TTFB p99':>8} {'done p99':>8} {'outside holders':>15}"
    ]
    for klass, r in rows.items():
        lines.append(
            f"{klass:10} {r['requests']:8d} {r['successful']:10d} {r['gave_up_refused']:7d} "
            f"{_fmt(r['ttfb_s'][50]):>8} {_fmt(r['ttfb_s'][99]):>8} "
            f"{_fmt(r['completion_s_p99']):>8} {r['outside_holders']:15d}"
        )
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def format_table(summary: dict[str, Any]) -> str:
    """The paper's table for one run, plus the run's metrics, as text."""
    lines = [
        f"scenario {summary['scenario']}, algorithm {summary['algorithm']}, seed {summary['seed']}",
        f"{'Machine':8} {'Avg CPU':>8} {'Avg RAM':>8} {'Avg MB/s':>9} {'Clients':>8} "
        f"{'Successful':>10} {'Crashes':>7}",
    ]
    for m in summary["machines"]:
        lines.append(
            f"{m['name']:8} {_pct(m['avg_cpu']):>8} {_pct(m['avg_ram']):>8} "
            f"{m['avg_mb_per_s']:9.2f} {m['clients_total']:8d} {m['clients_successful']:10d} "
            f"{m['crashes']:7d}"
        )
    lines.append(_metrics_line(summary))
    if summary.get("classes"):
        lines.append(format_classes(summary))
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _metrics_line(s: dict[str, Any]) -> str:
    cap = s["capacity"]
    bound = (
        "capacity serves all"
        if cap["all_servable"]
        else f"capacity bound {cap['bound_clients']} clients"
        f" (peak {cap['peak_demand_mb_per_s']:.1f} > {cap['capacity_mb_per_s']:.1f} MB/s)"
    )
    return (
        f"successful {s['successful']}/{s['clients']}, failovers {s['failovers']}, "
        f"refusals {s['refusals']}, SLB penalty {s['slb_penalty']:.4f}, EBU {s['ebu']:.3f}, "
        f"TTFB p50/p90/p99 {_fmt(s['ttfb_s'][50])}/{_fmt(s['ttfb_s'][90])}/"
        f"{_fmt(s['ttfb_s'][99])} s, completion p50/p99 {_fmt(s['completion_s'][50])}/"
        f"{_fmt(s['completion_s'][99])} s; {bound}"
    )


def format_comparison(summaries: list[dict[str, Any]]) -> str:
    """One line per algorithm: clients per machine (ok/total), crashes, metrics."""
    if not summaries:
        return ""
    # Per-machine cells (successful/total) only while they fit on a line.
    names = [m["name"] for m in summaries[0]["machines"][:-1]]
    if len(names) > 6:
        names = []
    head = f"{'algorithm':10} " + " ".join(f"{n:>11}" for n in names)
    head += (
        f" {'successful':>11} {'crashes':>7} {'failover':>8} {'refused':>7}"
        f" {'SLB pen':>8} {'EBU':>6} {'TTFB p99':>8} {'stall p99':>9} {'CPU':>5}"
    )
    lines = [f"scenario {summaries[0]['scenario']}, seed {summaries[0]['seed']}", head]
    for s in summaries:
        cells = " ".join(
            f"{m['clients_successful']:>5}/{m['clients_total']:<5}"
            for m in s["machines"][: len(names)]
        )
        all_row = s["machines"][-1]
        lines.append(
            f"{s['algorithm']:10} {cells} {s['successful']:>5}/{s['clients']:<5} "
            f"{all_row['crashes']:>7} {s['failovers']:>8} {s['refusals']:>7} "
            f"{s['slb_penalty']:8.4f} {s['ebu']:6.3f} {_fmt(s['ttfb_s'][99]):>8} "
            f"{_fmt(s['stall_s_p99']):>9} {_pct(all_row['avg_cpu']):>5}"
        )
    cap = summaries[0]["capacity"]
    lines.append(
        f"capacity: peak demand {cap['peak_demand_mb_per_s']:.1f} MB/s vs "
        f"{cap['capacity_mb_per_s']:.1f} MB/s of true capacity; "
        + (
            "every client can be served"
            if cap["all_servable"]
            else f"at most about {cap['bound_clients']} clients can be served"
        )
    )
    return "\n".join(lines)
