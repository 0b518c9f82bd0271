"""Balancer throughput: decisions/s of the scoring core, directives/s over HTTP.

1. Core: `BalancerCore.handle_directive_requested` with each registered algorithm at
   3, 100 and 1000 origins, every origin holding every one of 4 issues (the worst case
   for ranking), requests cycling over the issues. Status refreshes are interleaved as
   in real life at a request rate of 1,000 directives per second with every origin
   polled once a second: one refresh per origin per 1,000 decisions, spread evenly
   (3 origins: a refresh every 333 decisions; 1000 origins: one per decision). The
   statuses fed are pre-built (decoding is the adapter's cost, not the core's) and
   vary (CPU, RAM, outbound rate, cached issues, mean rates), so scores move. The
   refresh time counts in the elapsed time. A refusal ("full", which mist and
   headroom answer when the statuses say so) counts as a decision; the share of them
   is printed. Targets (alg2): 100,000/s at 3 origins, 5,000/s at 1000.

2. HTTP: `pressrun serve balancer` as a subprocess (alg2, 3 origins, polling every
   second), its origins three small aiohttp /stats servers in another subprocess, and
   the load generator in --clients processes, each an aiohttp keep-alive session with
   --connections concurrent requests to /v1/issues/<id>/directive, each answer
   checked to be a 200 directive. Target: 3,000 directives/s.

Each figure is the median of --runs runs.

    .venv/bin/python bench/balancer.py [--runs 5] [--seconds 5] [--skip-http] [--skip-core]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pressrun.balancer.algorithms import algorithm_names, make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    OriginSpec,
    OriginStatus,
    StatusReceived,
)

ISSUES = ("weekly-2026-45", "weekly-2026-46", "weekly-2026-47", "daily-2026-11-22")
CORE_TARGETS = {3: 100_000.0, 1000: 5_000.0}
HTTP_TARGET = 3_000.0
ROOT = Path(__file__).resolve().parent.parent


# --- 1. the scoring core ------------------------------------------------------------


def make_statuses(name: str, rng: random.Random, variants: int = 4) -> list[OriginStatus]:
    """A few plausible statuses of one origin, cycled through as its refreshes."""
    capacity = rng.choice([12.5e6, 125e6, 1250e6])
    out: list[OriginStatus] = []
    for _ in range(variants):
        cached = frozenset(i for i in ISSUES if rng.random() < 0.5)
        out.append(
            OriginStatus(
                name=name,
                cpu_fraction=rng.uniform(0.0, 0.9),
                ram_fraction=rng.uniform(0.1, 0.8),
                out_bytes_per_s=rng.uniform(0.0, capacity),
                capacity_bytes_per_s=capacity,
                active_transfers=rng.randrange(0, 200),
                issues=frozenset(ISSUES),
                cached_issues=cached,
                mean_transfer_bytes_per_s=rng.choice([None, rng.uniform(2e4, 3e6)]),
                mean_transfer_bytes_per_s_by_issue={
                    i: rng.uniform(2e4, 3e6) for i in ISSUES if rng.random() < 0.5
                },
            )
        )
    return out


def core_run(algorithm: str, n_origins: int, decisions: int, seed: int) -> tuple[float, int]:
    """Decisions per second of one run (refreshes included in the elapsed time), and
    how many of the decisions were refusals (algorithms that can answer "full")."""
    rng = random.Random(seed)
    specs = [
        OriginSpec(f"o{i:04d}", f"http://10.0.{i // 250}.{i % 250}:8000", rng.choice([1, 2, 5]))
        for i in range(n_origins)
    ]
    core = BalancerCore(
        BalancerConfig(algorithm=algorithm, stale_after_s=1e9, poll_interval_s=1.0),
        specs,
        make_algorithm(algorithm, specs, random.Random(seed)),
    )
    pools = [make_statuses(s.name, rng) for s in specs]
    for pool in pools:
        core.handle_status_received(StatusReceived(pool[0]), now=0.0)
    requests = [DirectiveRequested(i) for i in ISSUES]
    # One refresh per origin per 1,000 decisions, evenly spread.
    refresh_every = 1000.0 / n_origins
    schedule: list[StatusReceived] = []
    next_refresh = refresh_every
    refreshes_at: list[int] = []
    k = 0
    for d in range(decisions):
        while d >= next_refresh:
            pool = pools[k % n_origins]
            schedule.append(StatusReceived(pool[(k // n_origins + 1) % len(pool)]))
            refreshes_at.append(d)
            next_refresh += refresh_every
            k += 1
    handle = core.handle_directive_requested
    refresh = core.handle_status_received
    n_req = len(requests)
    r = 0
    nxt = refreshes_at[0] if refreshes_at else decisions + 1
    refused = 0
    started = time.perf_counter()
    for d in range(decisions):
        while d == nxt:
            refresh(schedule[r], now=d * 0.001)
            r += 1
            nxt = refreshes_at[r] if r < len(refreshes_at) else decisions + 1
        if handle(requests[d % n_req], now=d * 0.001).__class__ is not Directive:
            refused += 1
    elapsed = time.perf_counter() - started
    return decisions / elapsed, refused


def bench_core(runs: int) -> dict[tuple[str, int], float]:
    print(f"== scoring core: decisions/s (median of {runs} runs)")
    print(
        f"{'algorithm':<10}{'origins':>8}{'decisions/s':>14}{'refused':>9}"
        f"{'target':>10}{'ratio':>8}"
    )
    results: dict[tuple[str, int], float] = {}
    for n in (3, 100, 1000):
        for algorithm in algorithm_names():
            decisions = 60_000 if n < 1000 else 10_000
            runs_out = [core_run(algorithm, n, decisions, seed) for seed in range(runs)]
            median = statistics.median(rate for rate, _ in runs_out)
            refused = sum(r for _, r in runs_out) / (decisions * runs)
            results[(algorithm, n)] = median
            if algorithm == "alg2" and refused:
                raise SystemExit("alg2 refused a directive: the benchmark setup is wrong")
            target = CORE_TARGETS.get(n) if algorithm == "alg2" else None
            tail = f"{target:>10,.0f}{median / target:>8.2f}" if target else ""
            print(f"{algorithm:<10}{n:>8}{median:>14,.0f}{refused:>9.0%}{tail}", flush=True)
    return results


# --- 2. directives over HTTP --------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


FAKE_ORIGINS = """
import asyncio, json, sys
from aiohttp import web
ISSUES = json.loads(sys.argv[1])
ports = [int(p) for p in sys.argv[2:]]
def app_for(i):
    doc = {"name": f"bench-{i}", "cpu_percent": 10.0 + 20 * i, "ram_percent": 30.0,
           "out_bytes_per_s": 1e6 * (i + 1), "interval_s": 1.0,
           "capacity_bytes_per_s": 125e6, "egress_cap_bytes_per_s": None,
           "active_transfers": i, "issues": ISSUES, "cached_issues": ISSUES[:2],
           "mean_transfer_bytes_per_s": 5e5, "mean_transfer_bytes_per_s_by_issue": {},
           "bytes_sent_total": 0, "transfers_total": 0}
    body = json.dumps(doc).encode()
    async def stats(request):
        return web.Response(body=body, content_type="application/json")
    app = web.Application()
    app.router.add_get("/stats", stats)
    return app
async def main():
    for i, port in enumerate(ports):
        runner = web.AppRunner(app_for(i), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _load_worker(base: str, connections: int, warm_s: float, seconds: float, queue: object) -> None:
    """One load-generator process: keep-alive requests until the time is up."""
    import aiohttp

    async def run() -> tuple[int, int]:
        counted = 0
        bad = 0
        measuring = False
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as http:
            urls = [f"{base}/v1/issues/{issue}/directive" for issue in ISSUES]
            stop_at = time.perf_counter() + warm_s + seconds

            async def worker(offset: int) -> None:
                nonlocal counted, bad
                i = offset
                while time.perf_counter() < stop_at:
                    async with http.get(urls[i % len(urls)]) as resp:
                        body = await resp.read()
                    if resp.status != 200 or not body.startswith(b'{"issue_id"'):
                        bad += 1
                    elif measuring:
                        counted += 1
                    i += 1

            tasks = [asyncio.create_task(worker(k)) for k in range(connections)]
            await asyncio.sleep(warm_s)
            measuring = True
            await asyncio.gather(*tasks)
        return counted, bad

    queue.put(asyncio.run(run()))  # type: ignore[attr-defined]


def http_run(base: str, clients: int, connections: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    warm_s = 1.0
    procs = [
        ctx.Process(target=_load_worker, args=(base, connections, warm_s, seconds, queue))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=warm_s + seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    bad = sum(b for _, b in results)
    if bad:
        raise SystemExit(f"{bad} answers were not 200 directives")
    return sum(c for c, _ in results) / seconds


def wait_http(url: str, timeout_s: float = 20.0) -> None:
    import urllib.request

    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.perf_counter() > deadline:
            raise SystemExit(f"{url} did not answer within {timeout_s:g} s")
        time.sleep(0.1)


def bench_http(
    runs: int, seconds: float, clients: int, connections: int, access_log: bool = False
) -> float:
    print(
        f"== HTTP: directives/s, `pressrun serve balancer` (alg2, 3 origins"
        f"{', --access-log' if access_log else ''}), "
        f"{clients} load processes x {connections} keep-alive connections, "
        f"{seconds:g} s per run, median of {runs} runs",
        flush=True,
    )
    origin_ports = [free_port() for _ in range(3)]
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    origins = subprocess.Popen(
        [sys.executable, "-c", FAKE_ORIGINS, json.dumps(list(ISSUES)), *map(str, origin_ports)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    balancer: subprocess.Popen[bytes] | None = None
    try:
        assert origins.stdout is not None
        if origins.stdout.readline().strip() != "ready":
            raise SystemExit("the fake origins did not start")
        spec = ",".join(f"http://127.0.0.1:{p}" for p in origin_ports)
        balancer = subprocess.Popen(
            [
                str(ROOT / ".venv" / "bin" / "pressrun"),
                "--log-level",
                "WARNING",
                "serve",
                "balancer",
                "--origins",
                spec,
                "--port",
                str(port),
                *(["--access-log"] if access_log else []),
            ],
            env=env,
            # the access log goes to stderr: a line per request, not for the terminal
            stderr=subprocess.DEVNULL if access_log else None,
        )
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz")
        deadline = time.perf_counter() + 10
        while True:  # until every origin is in rotation
            import urllib.request

            with urllib.request.urlopen(f"{base}/v1/origins") as resp:
                doc = json.load(resp)
            if all(o["state"] == "up" for o in doc["origins"]):
                break
            if time.perf_counter() > deadline:
                raise SystemExit(f"origins not up: {doc}")
            time.sleep(0.1)
        rates = []
        for run in range(runs):
            rate = http_run(base, clients, connections, seconds)
            rates.append(rate)
            print(f"  run {run + 1}: {rate:,.0f} directives/s", flush=True)
        median = statistics.median(rates)
        print(
            f"directives/s over HTTP: {median:,.0f}  target {HTTP_TARGET:,.0f}  "
            f"ratio {median / HTTP_TARGET:.2f}"
        )
        return median
    finally:
        for proc in (balancer, origins):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=5.0, help="HTTP run length")
    parser.add_argument("--clients", type=int, default=1, help="load-generator processes")
    parser.add_argument(
        "--connections", type=int, default=64, help="concurrent requests per process"
    )
    parser.add_argument(
        "--access-log", action="store_true", help="run the balancer with --access-log"
    )
    parser.add_argument("--skip-core", action="store_true", help="skip the core benchmark")
    parser.add_argument("--skip-http", action="store_true", help="skip the HTTP benchmark")
    args = parser.parse_args()
    # Other work on the machine halves these numbers: say how busy it was.
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    ok = True
    if not args.skip_core:
        core = bench_core(args.runs)
        ok &= all(core[("alg2", n)] >= t for n, t in CORE_TARGETS.items())
    if not args.skip_http:
        rate = bench_http(args.runs, args.seconds, args.clients, args.connections, args.access_log)
        ok &= rate >= HTTP_TARGET
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print("all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
