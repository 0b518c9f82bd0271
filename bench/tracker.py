"""Tracker announces per second over HTTP on loopback, SQLite backend.

Starts `pressrun serve tracker` (SQLite, write-behind) as its own process; this process
is the load generator: aiohttp keep-alive connections, many distinct peers spread over
several swarms, each peer announcing with growing counters (a mix of regular updates
and `started`/`completed`). Each run measures for --seconds after a warm-up; prints the
median of --runs runs. Target: at least 2,000 announces/s on a 2-core machine.

    .venv/bin/python bench/tracker.py [--runs 3] [--seconds 5] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote_from_bytes

import aiohttp
from yarl import URL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def build_queries(peers: int, swarms: int, rng: random.Random) -> list[str]:
    """Announce queries for `peers` distinct peers; two announces per peer, so half
    the queries update an existing record."""
    hashes = [rng.randbytes(20) for _ in range(swarms)]
    queries = []
    for n in range(peers):
        info_hash = quote_from_bytes(hashes[n % swarms], safe="")
        peer_id = quote_from_bytes(b"-BN0001-" + rng.randbytes(12), safe="")
        base = f"info_hash={info_hash}&peer_id={peer_id}&port={10000 + n % 50000}&key=k{n}"
        queries.append(f"{base}&uploaded=0&downloaded=0&left=1000&event=started&compact=1")
        queries.append(f"{base}&uploaded={n}&downloaded=1000&left=0&event=completed&compact=1")
    return queries


async def load(base: str, queries: list[str], connections: int, seconds: float) -> float:
    """Announces per second answered (checked to be non-failures) during `seconds`."""
    counted = 0
    measuring = False
    failures = 0
    stop_at = 0.0
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        urls = [URL(f"{base}/announce?{q}", encoded=True) for q in queries]

        async def worker(offset: int) -> None:
            nonlocal counted, failures
            i = offset
            while time.perf_counter() < stop_at:
                async with http.get(urls[i % len(urls)]) as resp:
                    body = await resp.read()
                if b"failure reason" in body or resp.status != 200:
                    failures += 1
                elif measuring:
                    counted += 1
                i += connections

        warm_s = 1.0
        stop_at = time.perf_counter() + warm_s + seconds
        tasks = [asyncio.create_task(worker(k)) for k in range(connections)]
        await asyncio.sleep(warm_s)
        measuring = True
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - started
        await asyncio.gather(*tasks)
    if failures:
        raise SystemExit(f"{failures} announces failed; the benchmark is invalid")
    return counted / elapsed


async def start_tracker(store_args: list[str]) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pressrun.cli", "--log-level", "WARNING", "serve", "tracker",
        "--port", "0", "--max-numwant", "50", *store_args,
        # made-up swarms: an open tracker (the allowlist check is one set lookup)
        "--allow-any",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    return proc, port


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--peers", type=int, default=20000)
    parser.add_argument("--swarms", type=int, default=20)
    parser.add_argument(
        "--flush-interval-s", type=float, default=0.1, help="the tracker's SQLite write-behind"
    )
    parser.add_argument(
        "--redis",
        action="store_true",
        help="measure the Redis backend instead (starts a throwaway redis-server)",
    )
    args = parser.parse_args()
    queries = build_queries(args.peers, args.swarms, random.Random(1))
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        redis_proc = None
        if args.redis:
            redis_port = free_port()
            redis_proc = subprocess.Popen(
                ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", tmp],
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            await asyncio.sleep(0.5)
        for run in range(args.runs):
            if args.redis:
                store_args = ["--redis", redis_url, "--redis-prefix", f"bench{run}:"]
            else:
                db = Path(tmp) / f"run{run}.db"
                store_args = ["--db", str(db), "--flush-interval-s", str(args.flush_interval_s)]
            proc, port = await start_tracker(store_args)
            try:
                rate = await load(
                    f"http://127.0.0.1:{port}", queries, args.connections, args.seconds
                )
            finally:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
            rates.append(rate)
            print(f"run {run + 1}: {rate:,.0f} announces/s", flush=True)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()
    median = statistics.median(rates)
    backend = "Redis" if args.redis else f"SQLite, flush every {args.flush_interval_s} s"
    print(
        f"tracker announces/s ({backend}, HTTP loopback, {args.connections} keep-alive "
        f"connections, {args.peers} peers in {args.swarms} swarms): median {median:,.0f} "
        f"of {args.runs} runs; target >= 2,000"
    )


if __name__ == "__main__":
    asyncio.run(main())
