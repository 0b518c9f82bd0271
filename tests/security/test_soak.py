"""The soak test with faults: thousands of clients' directives and downloads over a
bounded time while an origin is killed and restarted and the tracker is restarted.

Every service is a real ``pressrun serve`` child process (two origins, a balancer, a
tracker with an allowlist); this process runs the clients (``fetch_issue``, many at a
time) and a crowd of announcing peers with growing counters. It shows:

- no verified byte lost: every client that ends verified has the exact bytes in its
  library, and the tracker's totals after its restart are at least every peer's last
  announced counters (accounting survives the restart);
- every client ends verified or with a clear one-line error (no exception of any
  other kind, no hang);
- no service's memory grows without bound: each service's RSS at the end is within
  a bound of its RSS after warm-up.

Length and size are parameters (environment): ``PRESSRUN_SOAK_S`` (default 60) and
``PRESSRUN_SOAK_CLIENTS`` (default 2000). It prints its figures (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote_from_bytes

import aiohttp
import psutil
import pytest
from yarl import URL

from pressrun.clients.aio import FetchError, FetchResult, fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.processes import ServiceProcess
from pressrun.demo.testbed import OriginShape, origin_args
from pressrun.security import bearer

SOAK_S = float(os.environ.get("PRESSRUN_SOAK_S", "60"))
CLIENTS = int(os.environ.get("PRESSRUN_SOAK_CLIENTS", "2000"))
ISSUE = "soak-issue"
PIECE = 16 * 1024
SIZE = 4 * PIECE + 123  # five pieces, the last one short
PEERS = 100  # announcing peers (the tracker's load)
TOKEN = "soak-test-operator-token"
FAST = replace(
    DESKTOP,
    stall_timeout_s=2.0,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.5,
    max_attempts_without_progress=20,
)
#: a service's RSS may grow this much after warm-up (allocator slack, caches that fill)
RSS_SLACK = 1.5
RSS_SLACK_BYTES = 40 << 20


def _rss(proc: ServiceProcess) -> int:
    return int(psutil.Process(proc.proc.pid).memory_info().rss)


async def _start_origin(name: str, content: Path, port: int = 0) -> ServiceProcess:
    args = origin_args(OriginShape(name), content, 0.5)
    args[args.index("--port") + 1] = str(port)
    for attempt in range(20):  # the old socket may linger a moment after a SIGKILL
        try:
            return await ServiceProcess.start(name, args)
        except RuntimeError:
            if attempt == 19 or port == 0:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


async def _start_tracker(root: Path, content: Path, port: int = 0) -> ServiceProcess:
    args = [
        "tracker", "--port", str(port), "--db", str(root / "tracker.db"),
        "--content", str(content), "--interval-s", "5", "--min-interval-s", "1",
        "--flush-interval-s", "0.05",
    ]  # fmt: skip
    for attempt in range(20):
        try:
            return await ServiceProcess.start(
                "tracker", args, env={"PRESSRUN_OPERATOR_TOKEN": TOKEN}
            )
        except RuntimeError:
            if attempt == 19 or port == 0:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


def _port(proc: ServiceProcess) -> int:
    return int(proc.url.rsplit(":", 1)[1])


@pytest.mark.slow
async def test_soak_with_faults(tmp_path: Path) -> None:
    from pressrun.content.bundle import read_manifest
    from pressrun.content.publish import publish

    data = random.Random(2026).randbytes(SIZE)
    secret, public = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    content.mkdir()
    origins = {name: await _start_origin(name, content) for name in ("origin-a", "origin-b")}
    source = tmp_path / f"{ISSUE}.pdf"
    source.write_bytes(data)
    bundle = await asyncio.to_thread(
        publish, source, issue_id=ISSUE, title="Soak", key_path=secret,
        content_dir=content, web_seeds=[p.url for p in origins.values()], piece_size=PIECE,
    )  # fmt: skip
    info_hash = bytes.fromhex(read_manifest(bundle / "manifest.json").info_hash)
    tracker = await _start_tracker(tmp_path, content)
    listing = ",".join(f"{n}={p.url}" for n, p in origins.items())
    balancer = await ServiceProcess.start(
        "balancer",
        ["balancer", "--origins", listing, "--port", "0", "--poll-interval-s", "0.5",
         "--stale-after-s", "1.5", "--retry-after-s", "1"],
    )  # fmt: skip
    services = {"balancer": balancer, "tracker": tracker, **origins}
    trusted = {load_public_key(public)}
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + SOAK_S

    # -- the clients ----------------------------------------------------------------
    outcomes: list[FetchResult | str] = []
    started_clients = 0
    unexpected: list[BaseException] = []
    libraries = tmp_path / "libraries"
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(CLIENTS):
        queue.put_nowait(n)
    # spread the clients over the run: each worker takes the next one when it is due
    interval_s = SOAK_S * 0.85 / max(1, CLIENTS)

    async def client_worker() -> None:
        nonlocal started_clients
        while loop.time() < deadline:
            try:
                n = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            due = started + n * interval_s
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            started_clients += 1
            library = libraries / str(n)
            try:
                result = await fetch_issue(
                    ISSUE,
                    balancer_url=balancer.url,
                    library=library,
                    config=FAST,
                    trusted_keys=trusted,
                )
            except FetchError as err:
                message = str(err)
                assert message and "\n" not in message and "Traceback" not in message
                outcomes.append(message)
            except BaseException as err:  # anything else is a defect
                unexpected.append(err)
            else:
                # no verified byte lost: the library holds exactly the issue
                assert result.verified and result.path.read_bytes() == data
                outcomes.append(result)
            shutil.rmtree(library, ignore_errors=True)

    # -- the announcing peers ----------------------------------------------------------
    last_up: dict[int, int] = {}
    last_down: dict[int, int] = {}
    announce_failures = 0

    async def peer_crowd(http: aiohttp.ClientSession) -> None:
        nonlocal announce_failures
        rng = random.Random(5)
        step = 0
        while loop.time() < deadline:
            step += 1
            for n in range(PEERS):
                up = last_up.get(n, 0) + rng.randrange(0, 5000)
                down = last_down.get(n, 0) + rng.randrange(1, 5000)
                query = (
                    f"info_hash={quote_from_bytes(info_hash, safe='')}"
                    f"&peer_id={quote_from_bytes(n.to_bytes(20, 'big'), safe='')}"
                    f"&port={20000 + n}&uploaded={up}&downloaded={down}&left=100&key=k{n}"
                    + ("&event=started" if step == 1 else "")
                )
                try:
                    url = URL(f"{services['tracker'].url}/announce?{query}", encoded=True)
                    async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        body = await r.read()
                    if b"failure" not in body:
                        last_up[n], last_down[n] = up, down
                    else:
                        announce_failures += 1
                except (aiohttp.ClientError, TimeoutError, OSError):
                    announce_failures += 1  # the tracker is restarting: tried again later
            await asyncio.sleep(1.0)

    # -- faults and memory ----------------------------------------------------------------
    rss: dict[str, list[tuple[float, int]]] = {name: [] for name in services}
    faults: list[str] = []

    async def faults_and_memory() -> None:
        schedule = [
            (0.20, "kill origin-a"),
            (0.35, "restart origin-a"),
            (0.50, "restart tracker"),
        ]
        while schedule or loop.time() < deadline:
            elapsed = (loop.time() - started) / SOAK_S
            while schedule and elapsed >= schedule[0][0]:
                _, what = schedule.pop(0)
                faults.append(f"{loop.time() - started:5.1f} s {what}")
                if what == "kill origin-a":
                    with contextlib.suppress(ProcessLookupError):
                        services["origin-a"].proc.send_signal(signal.SIGKILL)
                    await services["origin-a"].proc.wait()
                    await services["origin-a"].stop()
                    rss["origin-a"].append((loop.time() - started, -1))
                elif what == "restart origin-a":
                    port = _port(services["origin-a"])
                    services["origin-a"] = await _start_origin("origin-a", content, port)
                    rss["origin-a"].clear()  # a new process: its own warm-up
                else:
                    port = _port(services["tracker"])
                    await services["tracker"].stop()  # SIGTERM: it flushes its store
                    services["tracker"] = await _start_tracker(tmp_path, content, port)
                    rss["tracker"].clear()
            for name, proc in services.items():
                if proc.proc.returncode is None:
                    with contextlib.suppress(psutil.Error):
                        rss[name].append((loop.time() - started, _rss(proc)))
            await asyncio.sleep(1.0)

    wall = time.perf_counter()
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(
                faults_and_memory(),
                peer_crowd(http),
                *(client_worker() for _ in range(40)),
            )
            # accounting survived the restart: the tracker has at least every peer's
            # last announced counters
            async with http.get(
                f"{services['tracker'].url}/v1/swarms/{info_hash.hex()}", headers=bearer(TOKEN)
            ) as resp:
                assert resp.status == 200
                swarm = await resp.json()
        wall = time.perf_counter() - wall
    finally:
        for proc in services.values():
            await proc.stop()
    peers = {int(p["peer_id"], 16): p for p in swarm["peers"]}
    lost = [
        n
        for n in last_up
        if peers[n]["uploaded_bytes"] < last_up[n] or peers[n]["downloaded_bytes"] < last_down[n]
    ]
    verified = [o for o in outcomes if isinstance(o, FetchResult)]
    errors = [o for o in outcomes if isinstance(o, str)]
    print(
        f"\nsoak: {SOAK_S:g} s asked, {wall:.1f} s run; faults: {'; '.join(faults)}\n"
        f"clients: {started_clients} of {CLIENTS} started within the soak "
        f"({started_clients / wall:.1f}/s), {len(outcomes)} ended: {len(verified)} verified "
        f"({sum(r.size_bytes for r in verified):,} bytes, every one the issue's), "
        f"{len(errors)} clear errors, {len(unexpected)} unexpected; "
        f"{sum(1 for r in verified if r.failures)} recovered from a failed origin\n"
        f"tracker: {len(last_up)} peers, {announce_failures} announces failed during the "
        f"restart and were retried, {len(lost)} peers' totals lost"
    )
    for message in sorted(set(errors))[:5]:
        print(f"  error: {message}")
    grew = []
    for name, series in rss.items():
        points = [b for _, b in series if b > 0]
        if len(points) < 4:
            continue
        warm = points[len(points) // 3]
        end = max(points[-3:])
        print(
            f"  {name:9s} RSS {points[0] / 1e6:6.1f} MB at start, {warm / 1e6:6.1f} after "
            f"warm-up, {end / 1e6:6.1f} at the end ({len(points)} samples)"
        )
        if end > max(RSS_SLACK * warm, warm + RSS_SLACK_BYTES):
            grew.append(name)
    assert not unexpected, unexpected[:3]
    assert not lost, lost[:5]
    assert not grew, grew
    assert len(outcomes) == started_clients, "every client that started ran to an end"
    assert len(verified) >= 0.9 * started_clients, errors[:5]
    assert len(faults) == 3
