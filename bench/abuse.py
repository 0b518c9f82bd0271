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
6. Clients that stop reading (issue 25, finding 1): --stalled connections on each of
   two real 100 Mbit/s origins behind a real balancer; 20 readers (a directive, then
   1 MiB from the origin it names) before, while they sit, and after the origins'
   --send-timeout-s cut them (target: every reader served as before).
7. Anonymous demand (finding 7): 40 directive requests in 2 s then 2/s for 10 minutes
   from one address, against the demand policy: the estimate (target: no carousel).
   And headroom's picks on their way: a stranger asking for directives 50 times a
   second from 127.0.0.2 (no download) at a real balancer and 1 Gbit/s origin, 20
   readers from other addresses meanwhile: readers served (target: 20; was 10).

Ring (functions ring_*, their own section): one supernode's RSS and honest answer
before and after 20,000 forged reports and 20,000 random lookup keys from another
address (target: within 10 MB and 1.5x); a report plus a question at the directory
with 1,000 to 50,000 holders ever seen; a tracker that publishes one issue against a
forged registration and a 1,024-port flood (target: the real supernode registers).

WebTorrent (functions webtorrent_*, their own section): a live tracker's /webtorrent
after 10,000 bogus offers, 1,000 answers for peers that do not exist, a 20 KB SDP,
1,000 made-up info-hashes and a forged upload: RSS growth, state kept, what was
counted (target: bounded, 0), the honest announce's round trip before and after.

    .venv/bin/python bench/abuse.py [--runs 3] [--http 2000] [--stalled 300]
        [--send-timeout-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import socket
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
from pressrun.tracker.sqlite_store import SqliteStore

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


# --- clients that stop reading, and anonymous demand (issue 25, findings 1 and 7) ----
# (its own section: functions stalled_*, demand_*; imports are local)

STALLED_FILE_BYTES = 24 << 20  # more than a stalled socket's buffers hold


async def _stall(port: int, target: str, n: int) -> list[socket.socket]:
    """``n`` connections that ask for ``target`` and never read a byte."""
    loop = asyncio.get_running_loop()
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        await loop.sock_sendall(s, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(s)
    return socks


async def _readers(
    http: aiohttp.ClientSession, balancer_url: str, issue: str, n: int
) -> dict[str, float]:
    """``n`` readers, one every 0.2 s: a directive, then 1 MiB of the issue from the
    origin it names. Directives answered 200, ranges served whole, median seconds."""
    ok = served = 0
    directive_s, range_s = [], []
    for _ in range(n):
        began = time.perf_counter()
        async with http.get(f"{balancer_url}/v1/issues/{issue}/directive") as resp:
            doc = await resp.json() if resp.status == 200 else None
        directive_s.append(time.perf_counter() - began)
        if doc is not None:
            ok += 1
            url = f"{doc['origins'][0]['url']}/content/{issue}/{issue}.pdf"
            began = time.perf_counter()
            async with http.get(url, headers={"Range": "bytes=0-1048575"}) as resp:
                served += resp.status == 206 and len(await resp.read()) == 1 << 20
            range_s.append(time.perf_counter() - began)
        await asyncio.sleep(0.2)
    return {
        "directives_ok": ok,
        "served": served,
        "directive_ms": statistics.median(directive_s) * 1e3,
        "range_ms": statistics.median(range_s) * 1e3 if range_s else float("nan"),
    }


async def stalled_origins(folder: Path, per_origin: int, send_timeout_s: float) -> None:
    """Two origins of 100 Mbit/s and a real balancer (headroom, the default); readers
    before, while ``per_origin`` stalled connections sit on each origin, and after the
    send timeout cut them. Before issue 25 every directive was 503 'full' then."""
    import resource

    from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
    from pressrun.origin.aio import start_origin
    from pressrun.origin.config import OriginConfig

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 3 descriptors a socket
    issue = "weekly-1"
    (folder / issue).mkdir(parents=True)
    (folder / issue / f"{issue}.pdf").write_bytes(os.urandom(STALLED_FILE_BYTES))
    origins = [
        await start_origin(
            OriginConfig(
                content_dir=folder,
                name=f"origin-{i}",
                capacity_mbps=100.0,
                send_timeout_s=send_timeout_s,
            )
        )
        for i in range(2)
    ]
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=tuple(OriginSpec(o.name, o.url) for o in origins),
            balancer=BalancerConfig(poll_interval_s=0.5, stale_after_s=1.75),
        )
    )
    socks: list[socket.socket] = []
    readers = 20
    try:
        await balancer.wait_until_up(2, timeout_s=10.0)
        async with aiohttp.ClientSession() as http:
            before = await _readers(http, balancer.url, issue, readers)
            started = time.perf_counter()
            for o in origins:
                socks += await _stall(o.port, f"/content/{issue}/{issue}.pdf", per_origin)
            await asyncio.sleep(7.0)  # --stalled-after-s (5 s) and a poll
            stats = [o.service.stats_document() for o in origins]
            held = sum(d["stalled_transfers"] for d in stats)
            active = sum(d["active_transfers"] for d in stats)
            during = await _readers(http, balancer.url, issue, readers)
            still = sum(o.service.meter.stalled_transfers for o in origins)
            # the send timeout: wait until the origins hold none
            while any(o.service.meter.stalled_transfers for o in origins):
                if time.perf_counter() - started > send_timeout_s + 30:
                    break
                await asyncio.sleep(0.5)
            cut_s = time.perf_counter() - started
            left = sum(o.service.meter.stalled_transfers for o in origins)
            after = await _readers(http, balancer.url, issue, readers)
    finally:
        for s in socks:
            s.close()
        await balancer.stop()
        for o in origins:
            await o.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for label, r in (("before", before), (f"{per_origin} stalled/origin", during)):
        print(
            f"   {label:>18}: {r['directives_ok']:.0f}/{readers} directives 200, "
            f"{r['served']:.0f}/{readers} readers served 1 MiB; directive "
            f"{r['directive_ms']:.1f} ms, range {r['range_ms']:.1f} ms (medians)"
        )
    print(
        f"   7 s after opening them the origins counted {active} active and {held} "
        f"stalled transfers ({still} still stalled after the readers); the "
        f"{send_timeout_s:g} s send timeout cut them within {cut_s:.0f} s of opening "
        f"({left} left)"
    )
    print(
        f"   {'after the cut':>18}: {after['directives_ok']:.0f}/{readers} directives 200, "
        f"{after['served']:.0f}/{readers} readers served (target: every reader served as before)"
    )


def demand_one_address() -> tuple[float, float, bool]:
    """Finding 7 against the pure policy: 40 directive requests in 2 s, then 2 a second
    for 10 minutes, all from one address. The highest and the mean downloader estimate
    and whether a carousel was ever wanted (before: yes, within the first 2 s)."""
    from pressrun.balancer.demand import DemandConfig, DemandPolicy

    policy = DemandPolicy(DemandConfig(multicast_enter_downloaders=100.0), {})
    seen, wanted = [], False
    times = [i * 0.05 for i in range(40)] + [2.0 + i * 0.5 for i in range(1200)]
    for now in times:
        policy.decide("weekly-1", now=now, address="203.0.113.9")
        policy.review(now=now)
        wanted = wanted or bool(policy.carousels_wanted())
        seen.append(policy.estimate("weekly-1", now=now).downloaders)
    return max(seen), statistics.mean(seen), wanted


async def demand_pending_picks(folder: Path, rate_per_s: float = 50.0) -> tuple[int, int, int]:
    """A stranger asking for directives ``rate_per_s`` times a second from 127.0.0.2,
    downloading nothing, while 20 readers from 127.0.0.10 and up ask once each (one
    every 0.1 s), at a real balancer (headroom) and one 1 Gbit/s origin. Readers
    answered 200, the stranger's requests and how many of them were answered 200.
    Before its picks on their way counted once, 10 of 20 readers were refused."""
    from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
    from pressrun.balancer.demand import DemandConfig
    from pressrun.origin.aio import start_origin
    from pressrun.origin.config import OriginConfig

    issue = "weekly-1"
    (folder / issue).mkdir(parents=True)
    (folder / issue / f"{issue}.pdf").write_bytes(os.urandom(1 << 16))
    origin = await start_origin(OriginConfig(content_dir=folder, name="origin-0"))
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec(origin.name, origin.url),),
            balancer=BalancerConfig(poll_interval_s=0.5, stale_after_s=1.75),
            # 127.0.0.2 must not count as the operator's own host here
            demand=DemandConfig(count_every_request_from=()),
        )
    )
    target = f"{balancer.url}/v1/issues/{issue}/directive"
    stop = asyncio.Event()
    asked: list[int] = []

    async def stranger() -> None:
        one = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=one) as http:
            while not stop.is_set():
                async with http.get(target) as resp:
                    asked.append(resp.status)
                await asyncio.sleep(1.0 / rate_per_s)

    served = 0
    try:
        await balancer.wait_until_up(1, timeout_s=10.0)
        task = asyncio.create_task(stranger())
        await asyncio.sleep(1.0)
        for i in range(20):
            connector = aiohttp.TCPConnector(local_addr=(f"127.0.0.{10 + i}", 0))
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                http.get(target) as resp,
            ):
                served += resp.status == 200
            await asyncio.sleep(0.1)
        stop.set()
        await task
    finally:
        stop.set()
        await balancer.stop()
        await origin.stop()
    return served, len(asked), sum(status == 200 for status in asked)


async def stalled_and_demand_section(per_origin: int, send_timeout_s: float) -> None:
    """Print this section's figures."""
    print(
        f"6. clients that stop reading: {per_origin} stalled connections on each of two "
        "100 Mbit/s origins, 20 readers (directive + 1 MiB range) before, during, after"
    )
    with tempfile.TemporaryDirectory() as tmp:
        await stalled_origins(Path(tmp), per_origin, send_timeout_s)
    top, mean, wanted = demand_one_address()
    print(
        "7. anonymous demand: 40 directive requests in 2 s then 2/s for 10 min from one "
        f"address -> estimate at most {top:.2f} downloaders (mean {mean:.2f}), carousel "
        f"wanted: {wanted} (target: never; multicast at 100, swarm at 20)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        served, asked, answered = await demand_pending_picks(Path(tmp))
    print(
        "   headroom's picks on their way: a stranger at 50 directive requests/s from one "
        f"address, no download ({asked} requests, {answered} answered 200): {served}/20 "
        "readers from other addresses served while it asks (target: 20; was 10)"
    )


# --- the Chord ring and the tracker's ring administration (issue 25, findings 3-5;
# issue 24, item 6) --------------------------------------------------------------------
# (its own section: functions ring_*; imports are local so the section stands alone)

RING_FORGED = 20_000
RING_STRANGER = "127.0.0.2"  # all of 127/8 is the loopback: the stranger's own address


async def _ring_answer_s(http: aiohttp.ClientSession, address: str, n: int = 200) -> float:
    """Median seconds of an honest report plus question to the supernode at ``address``."""
    times = []
    for i in range(n):
        body = {
            "peer_id": f"honest-{i % 20}",
            "address": "127.0.0.1:5001",
            "have": [i % 40],
            "want": [(i + 1) % 40],
            "uploaded": i,
            "downloaded": 10 * i,
        }
        started = time.perf_counter()
        async with http.post(f"http://{address}/chord/v1/pieces", json=body) as resp:
            await resp.read()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def bench_ring_supernode(folder: Path) -> dict[str, float]:
    """One supernode (with the tracker, an open one) in this process: its memory and
    the median honest answer before and after RING_FORGED forged reports from another
    address (new peer ids; the honest holders' ids with other addresses; left: true)
    and RING_FORGED random lookup keys."""
    from pressrun.chord.aio import Supernode
    from pressrun.chord.codec import id_hex

    service = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1)), SqliteStore(folder / "ring.db")
    )
    port = await service.start("127.0.0.1", 0)
    node = Supernode(
        tracker_base=f"http://127.0.0.1:{port}", info_hash="ab" * 20, num_pieces=40, seed=1
    )
    await node.start()
    await node.wait_on_ring()
    figures: dict[str, float] = {}
    statuses: dict[int, int] = {}
    evil_connector = aiohttp.TCPConnector(local_addr=(RING_STRANGER, 0), limit=50)
    try:
        async with (
            aiohttp.ClientSession() as http,
            aiohttp.ClientSession(connector=evil_connector) as evil,
        ):
            await _ring_answer_s(http, node.address, 50)  # warm up
            figures["answer_before_s"] = await _ring_answer_s(http, node.address)
            mem = rss()
            url = f"http://{node.address}/chord/v1/pieces"

            async def forge(i: int) -> None:
                kind = i % 4
                body: dict[str, object]
                if kind == 0:  # an honest holder's peer id, the stranger's address
                    body = {
                        "peer_id": f"honest-{i % 20}",
                        "address": "127.0.0.1:5001",
                        "have": [i % 40],
                    }
                elif kind == 1:  # "it left"
                    body = {
                        "peer_id": f"honest-{i % 20}",
                        "address": "127.0.0.1:5001",
                        "left": True,
                    }
                else:  # a new peer id, an absurd rate
                    body = {
                        "peer_id": f"forged-{i}",
                        "address": f"{RING_STRANGER}:{i % 60000 + 1}",
                        "have": [i % 40],
                        "upload_bps": 10**10,
                        "downloaded": 10**9,
                    }
                async with evil.post(url, json=body) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1

            started = time.perf_counter()
            for chunk in range(0, RING_FORGED, 200):
                await asyncio.gather(*(forge(i) for i in range(chunk, chunk + 200)))
            figures["forged_s"] = time.perf_counter() - started
            rng = random.Random(7)
            lookup_status: dict[int, int] = {}
            for chunk in range(0, RING_FORGED, 4096):
                keys = [id_hex(rng.getrandbits(160)) for _ in range(min(4096, RING_FORGED - chunk))]
                async with evil.post(
                    f"http://{node.address}/chord/v1/lookup", json={"keys": keys}
                ) as resp:
                    await resp.read()
                    lookup_status[resp.status] = lookup_status.get(resp.status, 0) + 1
            figures["grown_bytes"] = rss() - mem
            figures["answer_after_s"] = await _ring_answer_s(http, node.address)
            figures["holders"] = len(node.directory.holders)
            figures["owners_cached"] = len(node._owners)
            figures["lookups_through_ring"] = node.stats.lookups
            # who is named for a piece the honest holders and forged ones hold
            named: dict[str, int] = {}
            for i in range(100):  # (askers from 127.0.0.1 count to its 128 holders)
                body = {"peer_id": f"asker-{i}", "address": "127.0.0.1:6000", "want": [i % 40]}
                async with http.post(url, json=body) as resp:
                    for up in (await resp.json())["uploaders"]:
                        who = "forged" if str(up["peer_id"]).startswith("forged") else "other"
                        named[who] = named.get(who, 0) + 1
            figures["forged_holders"] = sum(
                1 for pid in node.directory.holders if pid.startswith("forged")
            )
            figures["named_forged"] = named.get("forged", 0)
            figures["named_all"] = sum(named.values())
    finally:
        await node.close(graceful=False)
        await service.close()
    figures.update({f"status_{k}": v for k, v in statuses.items()})
    figures.update({f"lookup_status_{k}": v for k, v in lookup_status.items()})
    return figures


def bench_ring_directory() -> list[tuple[int, float]]:
    """A report plus a question at the pure directory, with this many holders ever
    seen (20 readers arriving a second, each reporting once): best of 20 (issue 24:
    1.1 ms at 1,000, 8.6 ms at 10,000, 137 ms at 50,000 before)."""
    from pressrun.chord.directory import PieceDirectory

    rows = []
    for ever in (1_000, 10_000, 50_000):
        d = PieceDirectory(rng=random.Random(1), order_askers=True, num_pieces=80)
        t = 0.0
        for i in range(ever):
            t = i / 20
            d.handle_report(
                peer_id=f"p{i}",
                address=f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:1",
                have=[i % 80],
                uploaded_bytes=0,
                downloaded_bytes=0,
                now=t,
            )
        best = float("inf")
        for k in range(20):
            now = t + 1 + k * 0.01
            started = time.perf_counter()
            d.handle_report(
                peer_id=f"q{k}",
                address=f"10.200.0.{k}:1",
                have=[k],
                uploaded_bytes=0,
                downloaded_bytes=0,
                now=now,
            )
            d.choose_uploader((k + 1) % 80, peer_id=f"q{k}", address=f"10.200.0.{k}:1", now=now)
            best = min(best, time.perf_counter() - started)
        rows.append((ever, best))
    return rows


async def bench_ring_registrations(folder: Path) -> dict[str, object]:
    """A tracker that allows one published issue (16 pieces): a forged registration
    naming 1,048,576 pieces, 1,024 registrations from one other address on different
    ports, then the real supernode (127.0.0.1) starts."""
    import json

    from pressrun.chord.aio import Supernode
    from pressrun.content.bundle import read_manifest
    from pressrun.content.keys import generate_keypair, load_public_key
    from pressrun.content.publish import publish

    secret, pub = generate_keypair(folder / "publisher.key")
    (folder / "issue.pdf").write_bytes(random.Random(1).randbytes(16 * 65536))
    content = folder / "content"
    content.mkdir()
    bundle = publish(
        folder / "issue.pdf",
        issue_id="weekly-47",
        title="Weekly 47",
        key_path=secret,
        content_dir=content,
        piece_size=65536,
    )
    manifest = read_manifest(bundle / "manifest.json")
    service = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1), allowed=[]),
        SqliteStore(folder / "pub.db"),
        content_dirs=[content],
        trusted_keys={load_public_key(pub)},
    )
    port = await service.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/ring/{manifest.info_hash}/supernodes"
    out: dict[str, object] = {}
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(RING_STRANGER, 0))
        ) as evil:
            body = {"address": f"{RING_STRANGER}:7000", "num_pieces": 1 << 20}
            started = time.perf_counter()
            async with evil.post(url, json=body) as resp:
                out["forged_count"] = resp.status
            out["forged_count_ms"] = (time.perf_counter() - started) * 1e3
            flood: dict[int, int] = {}
            for p in range(1024):
                body = {
                    "address": f"{RING_STRANGER}:{10000 + p}",
                    "num_pieces": manifest.num_pieces,
                }
                async with evil.post(url, json=body) as resp:
                    flood[resp.status] = flood.get(resp.status, 0) + 1
            out["flood"] = flood
        node = Supernode(
            tracker_base=base, info_hash=manifest.info_hash, num_pieces=manifest.num_pieces, seed=1
        )
        try:
            me = await node.start()
            out["real"] = f"registered at {me.id:040x}"[:24]
        except Exception as err:  # (the figure: refused, and why)
            out["real"] = f"refused: {err}"
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{base}/v1/ring/{manifest.info_hash}") as resp,
        ):
            raw = await resp.read()
            view = json.loads(raw) if resp.status == 200 else {}
        out["view_bytes"] = len(raw)
        out["view_pieces"] = view.get("num_pieces")
        out["view_supernodes"] = len(view.get("supernodes", []))
        out["real_listed"] = node.address in {s["address"] for s in view.get("supernodes", [])}
        await node.close(graceful=False)
    finally:
        await service.close()
    return out


async def ring_section() -> None:
    """Print the ring's figures (called at the end of main)."""
    with tempfile.TemporaryDirectory() as tmp:
        f = await bench_ring_supernode(Path(tmp))
    grown_mb = f["grown_bytes"] / 1e6
    ratio = f["answer_after_s"] / f["answer_before_s"]
    statuses = ", ".join(f"{k[7:]}: {int(v)}" for k, v in f.items() if k.startswith("status_"))
    lookups = ", ".join(
        f"{k[14:]}: {int(v)}" for k, v in f.items() if k.startswith("lookup_status_")
    )
    print(
        f"ring 1. supernode: {RING_FORGED:,} forged reports from {RING_STRANGER} in "
        f"{f['forged_s']:.1f} s (answers {statuses}) and {RING_FORGED:,} random lookup "
        f"keys ({lookups}): RSS {grown_mb:+.2f} MB (target < 10), honest answer "
        f"{f['answer_before_s'] * 1e3:.2f} ms before, {f['answer_after_s'] * 1e3:.2f} ms "
        f"after: {ratio:.2f}x (target <= 1.5x); holders kept {int(f['holders'])}, owners "
        f"cached {int(f['owners_cached'])}, lookups through the ring "
        f"{int(f['lookups_through_ring'])}; forged holders named in "
        f"{int(f['named_forged'])} of {int(f['named_all'])} answers (they are "
        f"{int(f['forged_holders'])} of the {int(f['holders'])} holders; each claims 10^10 B/s)"
    )
    rows = bench_ring_directory()
    print(
        "ring 2. directory: a report + a question with "
        + ", ".join(f"{ever:,} holders ever seen {s * 1e3:.3f} ms" for ever, s in rows)
        + " (before, ae172ce~1: 0.10, 0.37, 1.76 ms; issue 24 over HTTP: 1.1, 8.6, 137 ms)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        r = await bench_ring_registrations(Path(tmp))
    print(
        f"ring 3. tracker: a registration naming 1,048,576 pieces -> HTTP {r['forged_count']} "
        f"({r['forged_count_ms']:.1f} ms); 1,024 ports from one address -> {r['flood']}; "
        f"the real supernode {r['real']}, listed: {r['real_listed']} "
        f"(the ring: {r['view_supernodes']} supernodes, {r['view_pieces']} pieces, "
        f"{r['view_bytes']:,} bytes)"
    )


# --- the WebTorrent tracker (issue 26): /webtorrent under attack ----------------------
# (its own section: functions webtorrent_*; imports are local so the section stands alone)


async def webtorrent_flood(n_offers: int) -> dict[str, float]:
    """A live tracker publishing one issue: an honest WebSocket peer's announce round
    trip before and after ``n_offers`` bogus offers (10 an announce, 8 peer ids on each
    of 25 sockets), 1,000 answers for peers that do not exist, a 20 KB SDP, 1,000
    made-up info-hashes and a forged upload of 10^15 bytes; the RSS growth and what
    was counted."""
    import json
    import os
    import random as random_module

    from pressrun.tracker.aio import TrackerService
    from pressrun.tracker.config import TrackerConfig
    from pressrun.tracker.core import TrackerCore
    from pressrun.tracker.sqlite_store import SqliteStore
    from pressrun.tracker.websocket_relay import Fault

    ih = bytes(range(20))

    def frame(peer: bytes, *, info_hash: bytes = ih, offers: int = 0, **extra: object) -> str:
        body: dict[str, object] = {
            "action": "announce",
            "info_hash": info_hash.decode("latin-1"),
            "peer_id": peer.decode("latin-1"),
            "uploaded": 0,
            "downloaded": 0,
            "left": 1000,
            "numwant": offers,
            "offers": [
                {
                    "offer_id": os.urandom(20).decode("latin-1"),
                    "offer": {"type": "offer", "sdp": "v=0 " + "a" * 1000},
                }
                for _ in range(offers)
            ],
        }
        body.update(extra)
        return json.dumps(body)

    async def round_trip(ws: aiohttp.ClientWebSocketResponse, n: int = 20) -> float:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await ws.send_str(frame(b"H" * 20))
            while True:
                reply = json.loads((await ws.receive(timeout=5)).data)
                if "interval" in reply:
                    break
            times.append(time.perf_counter() - started)
            await asyncio.sleep(0.1)  # within the socket's rate
        return statistics.median(times)

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        service = TrackerService(
            TrackerCore(TrackerConfig(), random_module.Random(1), allowed=[ih]),
            SqliteStore(Path(tmp) / "t.db", flush_interval_s=0.05),
        )
        port = await service.start("127.0.0.1", 0)
        url = f"ws://127.0.0.1:{port}/webtorrent"
        relay = service.webtorrent.relay  # type: ignore[attr-defined]
        try:
            async with aiohttp.ClientSession() as http:
                honest = await http.ws_connect(url)
                out["before_s"] = await round_trip(honest)
                rss_before = rss()
                sockets = [await http.ws_connect(url) for _ in range(25)]

                async def drain(ws: aiohttp.ClientWebSocketResponse) -> None:
                    # the attackers read what they are sent: this process's RSS is
                    # then the tracker's, not the clients' unread frames
                    async for _ in ws:
                        pass

                drains = [asyncio.create_task(drain(ws)) for ws in sockets]
                started = time.perf_counter()
                sent = 0
                while sent < n_offers:
                    for i, ws in enumerate(sockets):
                        if not ws.closed and sent < n_offers:
                            await ws.send_str(frame(bytes([i, sent % 8]) * 10, offers=10))
                            sent += 10
                    await asyncio.sleep(0.05)
                out["flood_s"] = time.perf_counter() - started
                liar = await http.ws_connect(url)
                await liar.send_str(frame(b"X" * 20))
                for _ in range(1000):
                    if liar.closed:
                        break
                    answer = {
                        "action": "announce",
                        "info_hash": ih.decode("latin-1"),
                        "peer_id": "X" * 20,
                        "to_peer_id": "H" * 20,
                        "offer_id": os.urandom(20).decode("latin-1"),
                        "answer": {"type": "answer", "sdp": "v=0"},
                    }
                    await liar.send_str(json.dumps(answer))
                big = await http.ws_connect(url)
                await big.send_str(frame(b"B" * 20, offers=1).replace("v=0 ", "x" * 20_000))
                strangers = await http.ws_connect(url)
                for _ in range(1000):
                    if strangers.closed:
                        break
                    await strangers.send_str(frame(os.urandom(20), info_hash=os.urandom(20)))
                forger = await http.ws_connect(url)
                await forger.send_str(frame(b"F" * 20, left=0, uploaded=10**15))
                await asyncio.sleep(1.0)
                out["rss_grown_bytes"] = rss() - rss_before
                out["pending_offers"] = relay.pending_offers()
                out["swarm_peers"] = relay.swarm_size(ih)
                out["records"] = len(service.core.records(ih))
                out["swarms"] = len(service.core.info_hashes())
                out["answers_refused"] = relay.faults[Fault.ANSWER_UNKNOWN]
                stats = service.core.stats(ih)
                out["uploaded_counted"] = stats.uploaded_bytes if stats else 0
                out["after_s"] = await round_trip(honest)
                for ws in [*sockets, liar, big, strangers, forger, honest]:
                    await ws.close()
                await asyncio.gather(*drains, return_exceptions=True)
        finally:
            await service.close()
    return out


async def webtorrent_section() -> None:
    """Print the WebTorrent tracker's figures."""
    f = await webtorrent_flood(10_000)
    print(
        f"webtorrent: 10,000 bogus offers in {f['flood_s']:.1f} s, 1,000 answers for peers "
        f"that do not exist ({f['answers_refused']:.0f} refused before the socket closed), "
        f"a 20 KB SDP, 1,000 made-up info-hashes, an upload of 10^15 B: RSS "
        f"{f['rss_grown_bytes'] / 1e6:+.2f} MB (target < 10); unanswered offers kept "
        f"{f['pending_offers']:.0f}, WebRTC peers in the swarm {f['swarm_peers']:.0f}, records "
        f"{f['records']:.0f}, swarms {f['swarms']:.0f} (target 1), upload counted "
        f"{f['uploaded_counted']:.0f} (target 0); the honest announce "
        f"{f['before_s'] * 1e3:.2f} ms before, {f['after_s'] * 1e3:.2f} ms after"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per balancer figure")
    parser.add_argument("--http", type=int, default=2000, help="made-up announces over HTTP")
    parser.add_argument(
        "--stalled", type=int, default=300, help="stalled connections on each origin"
    )
    parser.add_argument(
        "--send-timeout-s", type=float, default=20.0, help="the origins' send timeout"
    )
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
    await stalled_and_demand_section(args.stalled, args.send_timeout_s)
    await ring_section()  # (the Chord ring's section, above)
    await webtorrent_section()  # (the WebTorrent tracker's section, above)


if __name__ == "__main__":
    asyncio.run(main())
