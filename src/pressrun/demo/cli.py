"""``pressrun demo``: three origins, a balancer and about twenty clients on 127.0.0.1.

The origins (`pressrun.demo.testbed`: machines A, B and C of 000_9aae53f3113e9bd8.txt, B
with a real CPU burner beside it, C with a real 3 MB/s egress cap), a tracker and a
balancer (the service's default algorithm unless ``--algorithm``) are ``pressrun serve``
child processes started with ``--port 0`` (their URLs read from their start-up lines: no
fixed ports), each with its own event loop as on separate machines. A fresh Ed25519 key
signs a generated sample issue (32 MiB) published into the content folder all three
serve; then the clients run `pressrun.clients.aio.fetch_issue` concurrently in the
demo's process, each into its own library. The demo prints the tables of
`pressrun.demo.report` and exits 0; anything that fails ends it with a one-line message
and exit code 1. Temp folders and the burner process are removed in every case. On one
host the origins' ``cpu_percent`` is system-wide, so B's burner raises the CPU figure
all three report (docs/demo.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pressrun.demo.processes import ServiceProcess, cpu_seconds, start_cpu_burner, stop_process
from pressrun.demo.readers import WIFI_PHONE, BrowserReaders, ReaderOutcome, start_reader_service
from pressrun.demo.report import ClientRow, print_reader_table, print_tables
from pressrun.demo.sender_bytes import sender_bytes_watched
from pressrun.demo.testbed import (
    DEMO_ISSUE,
    DEMO_MULTICAST_ENTER,
    DEMO_SHAPES,
    DEMO_SWARM_ENTER,
    balancer_args,
    default_algorithm,
    multicast_args,
    origin_args,
    tracker_args,
    wait_for_directive,
)
from pressrun.multicast.config import TOKEN_ENV

MIB = 1024 * 1024


async def run_demo(
    *,
    clients: int,
    size_mib: int,
    stagger_s: float,
    keep: Path | None,
    waves: int = 3,
    wave_gap_s: float = 4.0,
    swarm: bool = True,
    multicast: bool = True,
    algorithm: str | None = None,
    readers: int = 0,
) -> tuple[list[ClientRow], list[ReaderOutcome], list[dict[str, Any]], float, float, float | None]:
    """Run the demo; returns the client rows, the browser readers' outcomes, the
    origins' /stats, the wall time, the CPU seconds B's background burner used and the
    multicast sender's bytes (None without the sender).

    Origins and balancer are ``pressrun serve`` child processes (each its own event
    loop, as on separate machines); the clients run in this process. ``readers``
    browser readers (`pressrun.demo.readers`: the web reader in headless Chromium,
    phone profile, served by a ``pressrun serve reader`` child process) arrive in the
    same waves as the clients.
    """
    from dataclasses import replace

    import aiohttp

    from pressrun.clients.aio import FetchError, fetch_issue
    from pressrun.clients.config import DESKTOP
    from pressrun.content.keys import generate_keypair, load_public_key
    from pressrun.content.manifest import file_sha256
    from pressrun.content.publish import publish

    root = Path(tempfile.mkdtemp(prefix="pressrun-demo-")) if keep is None else keep
    content = root / "content"
    content.mkdir(parents=True, exist_ok=True)
    burner = start_cpu_burner()
    services: list[ServiceProcess] = []
    stack = contextlib.AsyncExitStack()
    # Chromium starts beside the services (seconds on a loaded host)
    fleet_up = (
        asyncio.create_task(stack.enter_async_context(BrowserReaders(before_start=WIFI_PHONE)))
        if readers > 0
        else None
    )
    try:
        # side by side: an origin takes seconds to come up on a loaded host (4.3 s each
        # at load 9, one after the other 13 s of a 22 s demo)
        starts = [
            ServiceProcess.start(shape.name, origin_args(shape, content, 0.5))
            for shape in DEMO_SHAPES
        ]
        outcomes = await asyncio.gather(*starts, return_exceptions=True)
        services.extend(o for o in outcomes if isinstance(o, ServiceProcess))  # all stopped
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        origins = services[:]
        key, pub = generate_keypair(root / "publisher.key")
        source = root / "source" / f"{DEMO_ISSUE}.pdf"
        source.parent.mkdir(exist_ok=True)
        if readers > 0:
            # the phones draw the issue's cover with pdf.js after the download: a real
            # PDF of the same size (a cover, text pages, a page of random pixels)
            from pressrun.reader.sample import write_sample_pdf

            write_sample_pdf(source, title="Weekly, issue 47", pad_to_bytes=size_mib * MIB)
            data = source.read_bytes()
        else:
            data = random.Random(2026).randbytes(size_mib * MIB)
            source.write_bytes(data)
        want_sha = hashlib.sha256(data).hexdigest()
        del data
        await asyncio.to_thread(
            publish,
            source,
            issue_id=DEMO_ISSUE,
            title="Weekly, issue 47 (generated sample)",
            key_path=key,
            content_dir=content,
            web_seeds=[o.url for o in origins],
        )
        tracker_url: str | None = None
        if swarm:
            tracker = await ServiceProcess.start(
                "tracker", tracker_args(root / "tracker.db", content, pub)
            )
            services.append(tracker)
            tracker_url = tracker.url
        sender: ServiceProcess | None = None
        sender_env = {TOKEN_ENV: secrets.token_hex(16)}
        mc: tuple[str, str] | None = None
        if multicast:
            control_group, group_base = _random_groups()
            sender = await ServiceProcess.start(
                "multicast",
                multicast_args(content, key, control_group, group_base),
                env=sender_env,
            )
            services.append(sender)
            mc = (sender.url, control_group)
        balancer = await ServiceProcess.start(
            "balancer",
            balancer_args({o.name: o.url for o in origins}, tracker_url, mc, algorithm=algorithm),
            env=sender_env,
        )
        services.append(balancer)
        await wait_for_directive(balancer.url, DEMO_ISSUE, timeout_s=15.0)
        fleet: BrowserReaders | None = None
        reader_url = ""
        if readers > 0:
            reader = await start_reader_service(balancer.url, pub)
            services.append(reader)
            reader_url = reader.url
            assert fleet_up is not None
            fleet = await fleet_up
        trusted = {load_public_key(pub)}
        loop = asyncio.get_running_loop()
        started = loop.time()

        # a swarm peer seeds after its download only until a rule lets it go: at most
        # 10 s here; a swarm quiet for 8 s hands over to origin sections
        config = replace(
            DESKTOP,
            swarm_max_seed_s=10.0,
            swarm_stall_after_s=8.0,
            multicast_deadline_s=30.0,
            multicast_interface="127.0.0.1",
        )
        per_wave = -(-clients // max(1, waves))
        last_wave = (clients - 1) // per_wave
        carousel_up: asyncio.Task[bool] | None = None
        if sender is not None and last_wave > 0:
            # the last wave is the peak: it comes once the balancer has had the sender
            # start the carousel (encoding the issue takes seconds on a loaded host)
            carousel_up = asyncio.create_task(_carousel_running(sender.url, timeout_s=30.0))

        async def one(number: int) -> ClientRow:
            wave, place = divmod(number - 1, per_wave)
            await asyncio.sleep(wave * wave_gap_s + place * stagger_s)
            if wave == last_wave and carousel_up is not None:
                await carousel_up
            try:
                result = await fetch_issue(
                    DEMO_ISSUE,
                    balancer_url=balancer.url,
                    library=root / f"library-{number:02d}",
                    config=config,
                    trusted_keys=trusted,
                )
            except FetchError as err:
                return ClientRow(number, None, str(err), False, wave + 1)
            sha = await asyncio.to_thread(file_sha256, result.path)
            return ClientRow(number, result, None, sha == want_sha, wave + 1)

        async def phone(number: int) -> ReaderOutcome:
            # the readers come in the clients' waves, after that wave's clients
            assert fleet is not None
            wave = (number - 1) % max(1, waves)
            place = per_wave + (number - 1) // max(1, waves)
            await asyncio.sleep(wave * wave_gap_s + place * stagger_s)
            if wave == last_wave and carousel_up is not None:
                await carousel_up
            return await fleet.read(number, reader_url, DEMO_ISSUE, want_sha, wave=wave + 1)

        async with contextlib.AsyncExitStack() as watching:
            # the sender is read all along: it drops a carousel's counters when the
            # balancer stops the carousel, before the crowd is done (sender_bytes.py)
            sent = (
                None
                if sender is None
                else await watching.enter_async_context(sender_bytes_watched(sender.url))
            )
            both = await asyncio.gather(
                asyncio.gather(*(one(n) for n in range(1, clients + 1))),
                asyncio.gather(*(phone(n) for n in range(1, readers + 1))),
            )
        rows, phones = both
        wall = loop.time() - started
        burner_cpu_s = cpu_seconds(burner.pid)
        stats: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http:
            for origin in origins:
                async with http.get(f"{origin.url}/stats") as resp:
                    stats.append(await resp.json())
        sender_bytes = None if sent is None else sent.total
        return list(rows), list(phones), stats, wall, burner_cpu_s, sender_bytes
    finally:
        if fleet_up is not None and not fleet_up.done():
            fleet_up.cancel()
        if fleet_up is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await fleet_up  # its error, if any, is the run's already
        await stack.aclose()  # Chromium first: its pages are peers of the services
        await asyncio.gather(*(service.stop() for service in services))
        stop_process(burner)
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _random_groups() -> tuple[str, str]:
    """A control group (``GROUP:PORT``, a free UDP port) and a channel group base in
    239.255.0.0/16, random, so demos and tests on one host do not hear each other."""
    from pressrun.multicast.net import free_udp_port

    rng = random.Random()
    a, b = rng.randrange(1, 255), rng.randrange(1, 200)
    return f"239.255.{a}.{b}:{free_udp_port()}", f"239.255.{a}.{b + 1}"


async def _carousel_running(url: str, timeout_s: float) -> bool:
    """Until the sender at ``url`` runs a carousel (its /healthz), at most
    ``timeout_s``; whether it does."""
    import aiohttp

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, ValueError, KeyError):
                async with http.get(f"{url}/healthz") as resp:
                    if (await resp.json())["carousels"] > 0:
                        return True
            await asyncio.sleep(0.2)
    return False


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun demo``."""
    p = subparsers.add_parser(
        "demo",
        help="three origins (machines A, B, C), a balancer and 20 clients on 127.0.0.1",
        description="Start three origins shaped like machines A, B and C of "
        "000_9aae53f3113e9bd8.txt (B with a real CPU burner beside it, C with a 3 MB/s "
        "egress cap), a balancer with the service's default algorithm, publish a generated "
        "sample issue, run concurrent clients and print per-origin and per-client tables.",
    )
    p.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
    p.add_argument(
        "--readers",
        type=int,
        default=0,
        metavar="N",
        help="also N browser readers: the web reader in headless Chromium (phone profile), "
        "arriving in the clients' waves (default 0)",
    )
    p.add_argument(
        "--algorithm",
        default=None,
        metavar="NAME",
        help=f"the balancer's algorithm, also for --egress (default: the service's default, "
        f"{default_algorithm()})",
    )
    p.add_argument("--size-mib", type=int, default=32, help="sample issue size (default 32)")
    p.add_argument(
        "--stagger-s",
        type=float,
        default=0.05,
        help="delay between client starts, seconds (default 0.05: a burst)",
    )
    p.add_argument(
        "--waves",
        type=int,
        default=3,
        help="clients arrive in this many waves, --wave-gap-s apart (default 3)",
    )
    p.add_argument(
        "--wave-gap-s",
        type=float,
        default=4.0,
        help="seconds between waves (default 4)",
    )
    p.add_argument(
        "--no-multicast",
        action="store_true",
        help="no multicast sender (the demo before the carousel)",
    )
    p.add_argument(
        "--no-swarm",
        action="store_true",
        help="no tracker, origin mode only (the demo before the swarm)",
    )
    egress = p.add_argument_group(
        "egress check",
        "--egress runs the balancer's egress check instead of the demo (docs/demo.md): "
        "origins of different egress caps, two issues of different sizes, clients behind "
        "1 MB/s access links; exit 0 when no origin ran above its cap for more than one "
        "poll interval",
    )
    egress.add_argument("--egress", action="store_true", help="run the egress check")
    egress.add_argument(
        "--egress-caps-mbps",
        default=None,
        metavar="LIST",
        help="the origins' egress caps, Mbit/s, comma-separated (default 32,64,128)",
    )
    egress.add_argument(
        "--egress-clients",
        type=int,
        default=None,
        metavar="N",
        help="clients (default 48, arriving over 12 s)",
    )
    egress.add_argument(
        "--egress-arrive-s",
        type=float,
        default=None,
        metavar="S",
        help="the clients arrive at random times over S seconds (default 12)",
    )
    egress.add_argument(
        "--egress-client-mbps",
        type=float,
        default=None,
        metavar="MBPS",
        help="each client's access link, Mbit/s (default 8: 1 MB/s)",
    )
    egress.add_argument(
        "--egress-decisions",
        action="store_true",
        help="log every balancer decision and status to KEEP/balancer.log (needs --keep)",
    )
    egress.add_argument(
        "--egress-small",
        action="store_true",
        help="the small version the test suite runs (2 origins, 20 clients)",
    )
    p.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="work in DIR and keep it (default: a temp folder, removed at the end)",
    )
    p.set_defaults(func=run)


def run_egress(args: argparse.Namespace) -> int:
    """Run the egress check; 0 when it holds."""
    from dataclasses import replace

    from pressrun.demo.egress import SMALL_SCENARIO, EgressScenario, parse_caps, run_egress_check

    try:
        scenario = SMALL_SCENARIO if args.egress_small else EgressScenario()
        changes: dict[str, Any] = {"algorithm": args.algorithm}
        if args.egress_caps_mbps is not None:
            changes["caps_mbps"] = parse_caps(args.egress_caps_mbps)
        if args.egress_clients is not None:
            changes["clients"] = args.egress_clients
        if args.egress_arrive_s is not None:
            changes["arrive_s"] = args.egress_arrive_s
        if args.egress_client_mbps is not None:
            changes["client_bytes_per_s"] = args.egress_client_mbps * 1e6 / 8
        scenario = replace(scenario, **changes)
        if args.egress_decisions and not args.keep:
            raise ValueError("--egress-decisions writes KEEP/balancer.log: give --keep DIR")
    except ValueError as err:
        print(f"pressrun demo --egress: {err}", file=sys.stderr)
        return 2
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    print(
        f"pressrun demo --egress: {len(scenario.caps_mbps)} origins (caps "
        f"{', '.join(f'{c:g}' for c in scenario.caps_mbps)} Mbit/s), a balancer, "
        f"{scenario.clients} clients; starting ...",
        flush=True,
    )
    try:
        result = asyncio.run(
            run_egress_check(
                scenario, keep=keep, progress=True, log_decisions=args.egress_decisions
            )
        )
    except Exception as err:  # every failure ends in one line and exit code 1
        print(f"pressrun demo --egress: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print("\n".join(result.lines()))
    return 0 if result.holds() else 1


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every client ends with a verified file."""
    import logging

    if args.egress:
        return run_egress(args)

    if (
        args.clients < 1
        or args.readers < 0
        or args.size_mib < 1
        or args.stagger_s < 0
        or args.waves < 1
        or args.wave_gap_s < 0
    ):
        print(
            "pressrun demo: --clients, --size-mib and --waves must be positive, "
            "--readers, --stagger-s and --wave-gap-s not negative",
            file=sys.stderr,
        )
        return 2
    # the services' per-transfer INFO lines would drown the tables
    for name in (
        "pressrun.origin",
        "pressrun.balancer",
        "pressrun.clients",
        "pressrun.peer",
        "pressrun.multicast",
        "aiohttp.access",
        "fontTools",  # the sample PDF's font subsetting (--readers)
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    algorithm = args.algorithm or default_algorithm()
    services = (
        f"balancer ({algorithm})"
        if args.no_swarm
        else f"tracker, balancer ({algorithm}, swarm from {DEMO_SWARM_ENTER:g} downloaders)"
    )
    if not args.no_multicast:
        services += f", multicast sender (carousel from {DEMO_MULTICAST_ENTER:g} downloaders)"
    print(
        f"pressrun demo: 3 origins, {services}, "
        f"{args.clients} clients"
        + (f" and {args.readers} browser readers" if args.readers else "")
        + f" in {args.waves} wave(s) {args.wave_gap_s:g} s apart, "
        f"a {args.size_mib} MiB issue; starting ...",
        flush=True,
    )
    try:
        rows, phones, stats, wall, burner_cpu_s, sender_bytes = asyncio.run(
            run_demo(
                clients=args.clients,
                size_mib=args.size_mib,
                stagger_s=args.stagger_s,
                keep=keep,
                waves=args.waves,
                wave_gap_s=args.wave_gap_s,
                swarm=not args.no_swarm,
                multicast=not args.no_multicast,
                algorithm=algorithm,
                readers=args.readers,
            )
        )
    except Exception as err:  # every failure ends in one line and exit code 1
        print(f"pressrun demo: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print_tables(rows, stats, wall, sender_bytes=sender_bytes)
    if phones:
        print_reader_table(phones)
    print(
        f"origin-b's background load: the burner process used {burner_cpu_s:.1f} CPU-seconds "
        "(niced busy loop, running from before the origins started until the end)"
    )
    bad = [r for r in rows if r.result is None or not r.sha_ok]
    bad_phones = [p for p in phones if not p.verified]
    if bad_phones:
        first_phone = bad_phones[0]
        print(
            f"pressrun demo: {len(bad_phones)} of {len(phones)} browser readers did not end "
            f"with a verified file (reader {first_phone.number}: "
            f"{first_phone.error or 'SHA-256 mismatch'})",
            file=sys.stderr,
        )
    if bad:
        first = bad[0]
        print(
            f"pressrun demo: {len(bad)} of {len(rows)} clients did not end with a verified "
            f"file (client {first.number}: {first.error or 'SHA-256 mismatch'})",
            file=sys.stderr,
        )
        return 1
    if bad_phones:
        return 1
    with contextlib.suppress(OSError):
        os.sync()
    return 0
