"""Tracker announces per second over HTTP on loopback, SQLite backend.

Starts `pressrun serve tracker` (SQLite, write-behind) as its own process; this process
is the load generator: aiohttp keep-alive connections, many distinct peers spread over
several swarms, each peer announcing with growing counters (a mix of regular updates
and `started`/`completed`). Each run measures for --seconds after a warm-up; prints the
median of --runs runs. Target: at least 2,000 announces/s on a 2-core machine.

    .venv/bin/python bench/tracker.py [--runs 3] [--seconds 5] [--connections 32]

With ``--ever-seen 0,10000,50000`` it measures instead what peers that came and went
cost (issue 24): for each number, the store is filled with that many records of peers
that left a minute ago in one swarm (as weeks of downloads leave them), the tracker is
started on it (``--record-ttl-s 5``), and it prints the time to start, the announces/s
of 20 live peers in that swarm once the old records are past their TTL, and what the
store holds after. Run it with ``PYTHONPATH=<an older src>`` to measure that code.

    .venv/bin/python bench/tracker.py --ever-seen 0,10000,50000 [--redis]
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


async def load(
    base: str,
    queries: list[str],
    connections: int,
    seconds: float,
    answered: list[int] | None = None,
) -> float:
    """Announces per second answered (checked to be non-failures) during `seconds`;
    ``answered`` gets how many were answered in all, warm-up included."""
    counted = 0
    total = 0
    measuring = False
    failures = 0
    stop_at = 0.0
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        urls = [URL(f"{base}/announce?{q}", encoded=True) for q in queries]

        async def worker(offset: int) -> None:
            nonlocal counted, failures, total
            i = offset
            while time.perf_counter() < stop_at:
                async with http.get(urls[i % len(urls)]) as resp:
                    body = await resp.read()
                if b"failure reason" in body or resp.status != 200:
                    failures += 1
                else:
                    total += 1
                    counted += measuring
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
    if answered is not None:
        answered.append(total)
    return counted / elapsed


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def start_tracker(
    store_args: list[str], extra: tuple[str, ...] = ()
) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pressrun.cli", "--log-level", "WARNING", "serve", "tracker",
        "--port", "0", "--max-numwant", "50", *store_args, *extra,
        # made-up swarms: an open tracker (the allowlist check is one set lookup)
        "--allow-any",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    return proc, port


EVER_IH = bytes(range(20))


def left_records(count: int) -> list[object]:
    """``count`` records of peers that completed and left a minute ago (wall time)."""
    from pressrun.tracker.events import AddressFamily, LeaveRule, PeerRecord

    left_at = time.time() - 60.0  # what a store holds: wall time
    return [
        PeerRecord(
            info_hash=EVER_IH,
            peer_id=b"-BN0001-" + n.to_bytes(12, "big"),
            family=AddressFamily.IPV4,
            ip=f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}",
            port=6881,
            left=0,
            uploaded_total=1000,
            downloaded_total=1000,
            session_uploaded=1000,
            session_downloaded=1000,
            session_key=f"k{n}",
            active=False,
            session_stopped=True,
            completed_count=1,
            first_seen=left_at - 60.0,
            last_seen=left_at,
            leave_rule=LeaveRule.USER,
            left_at=left_at,
            version=3,
        )
        for n in range(count)
    ]


async def fill_store(store_args: list[str], count: int) -> None:
    """Write ``count`` left records the way the tracker's own store does."""
    records = left_records(count)
    if store_args[0] == "--redis":
        from pressrun.tracker.redis_store import RedisStore

        redis_store = RedisStore(store_args[1], prefix=store_args[3])
        for i in range(0, len(records), 1000):
            await redis_store.save(records[i : i + 1000])  # type: ignore[arg-type]
        await redis_store.close()
    else:
        from pressrun.tracker.sqlite_store import SqliteStore

        sqlite_store = SqliteStore(store_args[1])
        sqlite_store.queue(records)  # type: ignore[arg-type]
        await sqlite_store.close()


async def store_rows(store_args: list[str]) -> int:
    """Peer records the store holds."""
    if store_args[0] == "--redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(store_args[1])
        try:
            held: int = await client.hlen(f"{store_args[3]}peers:{EVER_IH.hex()}")
        finally:
            await client.aclose()
        return held
    import sqlite3

    with sqlite3.connect(store_args[1]) as conn:
        rows: int = conn.execute("SELECT count(*) FROM peers").fetchone()[0]
        return rows


async def ever_seen(
    args: argparse.Namespace, tmp: str, redis_url: str | None, redis_pid: int | None
) -> None:
    """The --ever-seen table (module docstring)."""
    rng = random.Random(2)
    queries = []
    for n in range(20):
        peer_id = quote_from_bytes(b"-BNLIVE-" + rng.randbytes(12), safe="")
        ih = quote_from_bytes(EVER_IH, safe="")
        base = f"info_hash={ih}&peer_id={peer_id}&port={20000 + n}&key=l{n}&compact=1"
        queries += [
            f"{base}&uploaded=0&downloaded=0&left=1000",
            f"{base}&uploaded=0&downloaded=0&left=0",
        ]
    print(
        "peers ever seen | start s | announces/s | tracker CPU ms/announce | Redis CPU "
        "ms/announce | records held after | restart s"
    )
    for count in [int(c) for c in args.ever_seen.split(",")]:
        if redis_url is not None:
            store_args = ["--redis", redis_url, "--redis-prefix", f"ever{count}:"]
        else:
            store_args = ["--db", str(Path(tmp) / f"ever{count}.db")]
        await fill_store(store_args, count)
        extra = ("--record-ttl-s", "5")
        started = time.perf_counter()
        proc, port = await start_tracker(store_args, extra)
        start_s = time.perf_counter() - started
        try:
            await asyncio.sleep(7.0)  # past the record TTL: what is forgotten is
            answered: list[int] = []
            cpu0 = cpu_s(proc.pid)
            redis0 = cpu_s(redis_pid) if redis_pid is not None else 0.0
            rate = await load(f"http://127.0.0.1:{port}", queries, 8, args.seconds, answered)
            tracker_ms = (cpu_s(proc.pid) - cpu0) * 1000 / answered[0]
            redis_ms = (
                (cpu_s(redis_pid) - redis0) * 1000 / answered[0] if redis_pid is not None else 0.0
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        held = await store_rows(store_args)
        started = time.perf_counter()
        proc, port = await start_tracker(store_args, extra)
        restart_s = time.perf_counter() - started
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
        print(
            f"{count:>15,} | {start_s:7.2f} | {rate:11,.0f} | {tracker_ms:23.3f} | "
            f"{redis_ms:21.3f} | {held:17,} | {restart_s:9.2f}",
            flush=True,
        )


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
    parser.add_argument(
        "--ever-seen",
        metavar="N,N,...",
        help="measure what this many peers that came and went cost (module docstring)",
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
        if args.ever_seen:
            try:
                await ever_seen(
                    args,
                    tmp,
                    redis_url if args.redis else None,
                    redis_proc.pid if redis_proc is not None else None,
                )
            finally:
                if redis_proc is not None:
                    redis_proc.terminate()
                    redis_proc.wait()
            return
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
