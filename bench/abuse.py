"""What an attacker's traffic costs pressrun: the figures of the attack suite at full size.

1. Balancer: directive latency after 100,000 requests for made-up issue ids against
   an identical core that saw none ("before"; the best of 40 interleaved batches of
   50 real requests, statuses refreshed before each, median over --runs runs), the
   ratio, and the process's RSS growth (target: within 1.5x and 10 MB). Driven at the
   core, where the per-issue state lived; the HTTP layer keeps none.
2. Tracker: 100,000 made-up info-hashes at an allowlisting core, plus --http of them
   over HTTP to a live tracker: swarms created (target 0).
3. Forged fairness claims over HTTP: counted as fair (target 0).
4. Operator endpoints without their token: how many answer 401 (target all).
5. Oversized bodies (an endless body, a huge Content-Length) read by the shared reader
   the balancer, the clients and the peer use: bytes read before the cut.

    .venv/bin/python bench/abuse.py [--runs 3] [--http 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import quote_from_bytes

import aiohttp
import psutil
from aiohttp import web
from yarl import URL

from pressrun.balancer.algorithms import algorithm_names, make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    NoDirective,
    OriginSpec,
    OriginStatus,
    StatusReceived,
)
from pressrun.security import BodyTooLarge, ServiceSecurity, bearer, read_body_limited
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.store import SqliteStore

MADE_UP = 100_000
TOKEN = "bench-abuse-operator-token"
PUBLISHED = bytes.fromhex("11" * 20)


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def balancer_core(algorithm: str) -> BalancerCore:
    origins = [OriginSpec(f"o{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3)]
    core = BalancerCore(
        BalancerConfig(poll_interval_s=1.0, stale_after_s=1e9),
        origins,
        make_algorithm(algorithm, origins, random.Random(1)),
    )
    refresh(core)
    return core


def refresh(core: BalancerCore) -> None:
    """A fresh status from every origin (an algorithm that counts picks since the last
    status, like headroom, would otherwise call the origins full after many batches)."""
    issues = frozenset({"weekly-47", "weekly-48"})
    for spec in [rec.spec for rec in core.origins.values()]:
        status = OriginStatus(
            name=spec.name,
            cpu_fraction=0.1,
            ram_fraction=0.2,
            out_bytes_per_s=1e6,
            capacity_bytes_per_s=1e9,
            active_transfers=0,
            issues=issues,
            cached_issues=issues,
        )
        core.handle_status_received(StatusReceived(status), now=1.0)


class Refused(Exception):
    """The algorithm refuses the real issue (admission control) under the synthetic
    statuses: its latency is not measured here."""


def directive_batch_s(core: BalancerCore, n: int = 50) -> float:
    refresh(core)
    started = time.perf_counter()
    for _ in range(n):
        answer = core.handle_directive_requested(
            DirectiveRequested("weekly-47", frozenset()), now=1.0
        )
        if not isinstance(answer, Directive):
            raise Refused(answer.message)
    return (time.perf_counter() - started) / n


def compare(fresh: BalancerCore, attacked: BalancerCore) -> tuple[float, float]:
    """Best of 40 interleaved batches on a core that never saw the attack and on the
    attacked one (the machine's other load slows both alike)."""
    before = after = float("inf")
    for _ in range(40):
        before = min(before, directive_batch_s(fresh))
        after = min(after, directive_batch_s(attacked))
    return before, after


def bench_balancer(algorithm: str) -> tuple[float, float, int]:
    fresh, core = balancer_core(algorithm), balancer_core(algorithm)
    compare(fresh, core)  # warm up
    mem = rss()
    for i in range(MADE_UP):
        answer = core.handle_directive_requested(
            DirectiveRequested(f"made-up-{i}", frozenset()), now=1.0
        )
        assert isinstance(answer, NoDirective)
    grown = rss() - mem
    before, after = compare(fresh, core)
    return before, after, grown


def bench_tracker_core() -> tuple[int, int, float]:
    core = TrackerCore(TrackerConfig(), random.Random(1), allowed=[PUBLISHED])
    rng = random.Random(2)
    mem = rss()
    started = time.perf_counter()
    refused = 0
    for _ in range(MADE_UP):
        made_up = rng.randbytes(20)
        refused += core.refusal(made_up) == "unpublished"
        core.load_swarm(made_up, [])
    elapsed = time.perf_counter() - started
    return len(core.info_hashes()), rss() - mem, elapsed / MADE_UP * 1e6 if refused else 0.0


def query(info_hash: bytes, n: int, extra: str = "") -> str:
    return (
        f"info_hash={quote_from_bytes(info_hash, safe='')}"
        f"&peer_id={quote_from_bytes(n.to_bytes(20, 'big'), safe='')}"
        f"&port={7000 + n % 50000}&uploaded=0&downloaded=0&left=100{extra}"
    )


async def bench_tracker_http(n_http: int, folder: Path) -> dict[str, float]:
    service = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1), allowed=[PUBLISHED]),
        SqliteStore(folder / "t.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=TOKEN),
    )
    port = await service.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    rng = random.Random(3)
    figures: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as http:
            started = time.perf_counter()
            for n in range(n_http):
                target = URL(f"{base}/announce?{query(rng.randbytes(20), n)}", encoded=True)
                async with http.get(target) as resp:
                    await resp.read()
            figures["http_refusals_per_s"] = n_http / (time.perf_counter() - started)
            figures["swarms_after_http"] = len(service.core.info_hashes())
            forged = 0
            for n in range(100):
                q = query(PUBLISHED, n, "&event=stopped&leave_rule=ratio")
                q = q.replace("uploaded=0", "uploaded=999999999")
                async with http.get(URL(f"{base}/announce?{q}", encoded=True)) as resp:
                    await resp.read()
                forged += 1
            async with http.get(f"{base}/v1/swarms", headers=bearer(TOKEN)) as resp:
                (swarm,) = (await resp.json())["swarms"]
            figures["forged_claims"] = forged
            figures["forged_counted_fair"] = swarm["left_fairly"]
            calls = [
                ("GET", "/v1/swarms"),
                ("GET", f"/v1/swarms/{PUBLISHED.hex()}"),
                ("GET", "/v1/allowed"),
                ("PUT", f"/v1/allowed/{'22' * 20}"),
            ]
            unauthorized = 0
            for method, path in calls:
                async with http.request(method, base + path) as resp:
                    unauthorized += resp.status == 401
            figures["operator_endpoints"] = len(calls)
            figures["operator_401"] = unauthorized
    finally:
        await service.close()
    return figures


async def _endless(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    try:
        while True:
            await resp.write(b"x" * 65536)
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def _declared(request: web.Request) -> web.Response:
    return web.Response(body=b"{}", headers={"Content-Length": str(10**12)})


async def bench_bodies(limit: int) -> list[tuple[str, int, float]]:
    app = web.Application()
    app.router.add_get("/endless", _endless)
    app.router.add_get("/declared", _declared)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    rows = []
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/endless", "/declared"):
                started = time.perf_counter()
                async with http.get(base + path) as resp:
                    try:
                        await read_body_limited(resp, limit, path)
                        raise SystemExit(f"{path} was not cut off")
                    except BodyTooLarge as err:
                        rows.append((str(err), limit, time.perf_counter() - started))
    finally:
        await runner.cleanup()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per balancer figure")
    parser.add_argument("--http", type=int, default=2000, help="made-up announces over HTTP")
    args = parser.parse_args()

    print(f"1. balancer: {MADE_UP:,} made-up issue ids (median of {args.runs} runs)")
    for algorithm in algorithm_names():
        try:
            runs = [bench_balancer(algorithm) for _ in range(args.runs)]
        except Refused as err:
            print(f"   {algorithm:9s} not measured: under synthetic statuses it refuses ({err})")
            continue
        before = statistics.median(r[0] for r in runs)
        after = statistics.median(r[1] for r in runs)
        grown = max(r[2] for r in runs)
        print(
            f"   {algorithm:9s} directive {before * 1e6:6.2f} µs before, {after * 1e6:6.2f} µs "
            f"after: {after / before:4.2f}x (target <= 1.5x); RSS {grown / 1e6:+.2f} MB "
            "(target < 10)"
        )
    swarms, grown, per_us = bench_tracker_core()
    print(
        f"2. tracker core: {MADE_UP:,} made-up info-hashes -> {swarms} swarms created "
        f"(target 0), RSS {grown / 1e6:+.2f} MB, {per_us:.2f} µs each"
    )
    with tempfile.TemporaryDirectory() as tmp:
        figures = await bench_tracker_http(args.http, Path(tmp))
    print(
        f"   tracker HTTP: {args.http:,} made-up announces refused at "
        f"{figures['http_refusals_per_s']:,.0f}/s -> {figures['swarms_after_http']:.0f} swarms"
    )
    print(
        f"3. forged fairness: {figures['forged_claims']:.0f} stopped announces with "
        f"uploaded=999999999&leave_rule=ratio -> {figures['forged_counted_fair']:.0f} counted "
        "fair (target 0)"
    )
    print(
        f"4. operator endpoints: {figures['operator_401']:.0f} of "
        f"{figures['operator_endpoints']:.0f} answer 401 without the token (target all)"
    )
    print("5. oversized bodies (limit 1 MiB):")
    for message, _, seconds in await bench_bodies(1 << 20):
        print(f"   {message} ({seconds * 1e3:.1f} ms)")


if __name__ == "__main__":
    asyncio.run(main())
