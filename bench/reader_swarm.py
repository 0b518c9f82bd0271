"""A flash crowd of browser readers, with the reader's peer path on and off (issue 26).

For each N in --readers (default 10 and 20), two halves in the same run, each on a
fresh set of services on 127.0.0.1 (child processes: --origins origins of
--origin-mbps each, a real egress cap, so the origins are the scarce resource as at a
peak; the tracker with its WebTorrent WebSocket; the balancer with swarm mode from
--swarm-enter downloaders, 1 by default, so that the whole crowd, the desktop peers
too, is sent to the swarm; the reader service in this process, the reader's defaults:
the mobile profile; the phones report a Wi-Fi link (--link), so their uploads are
uncapped, the reader's unmetered default; --link unknown: 256 KiB/s):

- **peers**: N browser readers (the web reader in Debian's headless Chromium, phone
  profile, one browser context each: `pressrun.demo.readers`) and --desktops desktop
  peers (``pressrun get --json`` child processes, the crowd's last arrivals, at
  --arrive-s, once the balancer sends the crowd to the swarm: libtorrent, WebRTC through the
  tracker's WebSocket, no STUN server: host candidates on one machine) arrive as a
  flash crowd (seeded random times within --arrive-s) for one --mb MB issue;
- **origin-only**: the same crowd (same arrival times, same desktop peers) with the
  reader's peer path off (``SwarmSettings(enabled=False)``: the app never asks for the
  swarm and downloads from the origins as before issue 26).

Printed per half: origin bytes / (N x size), from the origins' own counters (every
byte they sent: the readers', the desktop peers', manifests and torrents; the target
is judged on this, the strictest), the same without what the desktop peers say they
took from origins, and the readers' own tally; each reader's download time (the app's
seconds) and the median. Targets: at most 0.25 with peers (about 1.0 without), and
the median download time with peers no worse than origin-only. Every reader's stored
file is checked against the publisher's SHA-256 in its page. Exit 0 when every target
is met and every reader verified; 1 otherwise; 2 when the browser cannot run here.

When the reader has no peer path (``pressrun.reader.config.SwarmSettings`` missing),
only the origin-only half runs and the bench says plainly that the peer half is not
measurable yet.

    flock /work/heavy.lock .venv/bin/python bench/reader_swarm.py \\
        [--readers 10,20] [--desktops 2] [--mb 24] [--origins 2] [--origin-mbps 40] \\
        [--arrive-s 2] [--link wifi|unknown] [--halves peers,origin-only] \\
        [--reader-upload-kib K] [--json OUT.json] [--keep DIR]

Its parts: this file runs the halves; reader_swarm_figures.py holds a half's figures,
the pages' trace and the printing; reader_swarm_desktops.py the desktop peers' child
processes; reader_offers_cpu.py the --offers-cpu measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

# a sibling script: python puts bench/ first on the path when this one runs
from chromium_cpu import (
    CpuMeter,
    PageProfiles,
    chromium_cpu_now,
    chromium_threads_now,
    loadavg,
    threads_spent,
)
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish
from pressrun.demo.processes import ServiceProcess
from pressrun.demo.readers import WIFI_PHONE, BrowserReaders, ReaderOutcome
from pressrun.demo.testbed import (
    OriginShape,
    balancer_args,
    origin_args,
    tracker_args,
    wait_for_directive,
)
from pressrun.reader.aio import start_reader
from pressrun.reader.browser import why_no_browser
from pressrun.reader.config import ReaderConfig
from pressrun.reader.sample import write_sample_pdf
from reader_offers_cpu import offers_cpu
from reader_swarm_desktops import desktop_get, seeding_desktop, stop_process
from reader_swarm_figures import ISSUE, MB, Half, SwarmTrace, fmt_s, print_half


def peer_path() -> type | None:
    """The reader's swarm settings class, or None while the reader has no peer path."""
    try:
        from pressrun.reader.config import SwarmSettings
    except ImportError:
        return None
    return SwarmSettings


async def run_half(
    half: Half,
    *,
    root: Path,
    data: bytes,
    want_sha: str,
    arrivals: list[float],
    desktop_arrivals: list[float],
    args: argparse.Namespace,
) -> None:
    """Start fresh services, run the crowd, fill ``half`` in; stop everything."""
    content = root / "content"
    content.mkdir(parents=True)
    services: list[ServiceProcess] = []
    seeders: list[asyncio.subprocess.Process] = []
    reader: Any = None
    half.load_before = loadavg()
    try:
        shapes = [
            OriginShape(f"origin-{chr(ord('a') + i)}", args.origin_mbps, args.origin_mbps)
            for i in range(args.origins)
        ]
        for shape in shapes:
            services.append(
                await ServiceProcess.start(
                    shape.name,
                    origin_args(shape, content, 0.5),
                    log_path=root / f"{shape.name}.log",
                )
            )
        origins = services[:]
        key, pub = generate_keypair(root / "publisher.key")
        source = root / "issue.pdf"
        source.write_bytes(data)
        await asyncio.to_thread(
            publish,
            source,
            issue_id=ISSUE,
            title="Bench issue (generated)",
            key_path=key,
            content_dir=content,
            web_seeds=[o.url for o in origins],
        )
        tracker = await ServiceProcess.start(
            "tracker",
            tracker_args(root / "tracker.db", content, pub),
            log_path=root / "tracker.log",
        )
        services.append(tracker)
        for i in range(args.seeding_desktops):
            log = root / f"seeder-{i + 1}.log"
            seeders.append(await seeding_desktop(content, tracker.url, log))
        b_args = balancer_args({o.name: o.url for o in origins}, tracker.url)
        b_args[b_args.index("--swarm-enter-downloaders") + 1] = f"{args.swarm_enter:g}"
        b_args[b_args.index("--swarm-leave-downloaders") + 1] = f"{args.swarm_enter / 2:g}"
        # the origins stay in rotation while the host is CPU-bound: with the demo's 0.4 s
        # poll timeout the balancer called both origins down mid-crowd and answered
        # 503 until two of ten readers gave up (N = 10, 20 MB, 28 Nov); the bench is
        # about who sends the bytes, not the origins' health checks
        b_args += ["--poll-timeout-s", "2", "--fall", "10", "--stale-after-s", "5"]
        balancer = await ServiceProcess.start("balancer", b_args, log_path=root / "balancer.log")
        services.append(balancer)
        await wait_for_directive(balancer.url, ISSUE, timeout_s=30.0)

        settings: dict[str, Any] = {}
        swarm_settings = peer_path()
        if swarm_settings is not None:
            tuned: dict[str, Any] = {"enabled": half.peers}
            if args.reader_upload_kib is not None:
                tuned["upload_limit_bytes_per_s"] = int(args.reader_upload_kib * 1024)
                tuned["unmetered_upload_limit_bytes_per_s"] = int(args.reader_upload_kib * 1024)
            settings["swarm"] = swarm_settings(**tuned)
        reader = await start_reader(
            ReaderConfig(
                balancer_url=balancer.url,
                publisher_keys=(pub.read_text().strip(),),
                **settings,
            )
        )
        loop = asyncio.get_running_loop()
        link_script = WIFI_PHONE if args.link == "wifi" else None
        async with BrowserReaders(before_start=link_script) as fleet:

            async def phone(number: int) -> ReaderOutcome:
                await asyncio.sleep(arrivals[number - 1])
                return await fleet.read(
                    number, reader.url, ISSUE, want_sha, timeout_s=args.timeout_s
                )

            async def readers_loaded() -> None:
                # --desktops-after-readers: until every reader's page fired its load
                # event (the app starts then), at most 60 s
                deadline = loop.time() + 60.0
                while loop.time() < deadline and not all(
                    any(line.startswith("load: ") for line in fleet.console.get(n, []))
                    for n in range(1, half.readers + 1)
                ):
                    await asyncio.sleep(0.2)

            meter = CpuMeter()
            meter.start()
            profiles = PageProfiles(fleet, args.profile if half.peers else 0, root)
            profiles.start()
            tracer = SwarmTrace(fleet, args.trace_s if half.peers else 0.0)
            tracer.start()
            started = loop.time()
            running: list[asyncio.subprocess.Process] = []
            readers = asyncio.gather(*(phone(n) for n in range(1, half.readers + 1)))
            desktops = asyncio.gather(
                *(
                    desktop_get(
                        i + 1,
                        balancer.url,
                        root / f"desktop-{i + 1}",
                        pub,
                        desktop_arrivals[i],
                        args.desktop_max_seed_s,
                        running,
                        root / f"desktop-{i + 1}.log",
                        readers_loaded if args.desktops_after_readers else None,
                    )
                    for i in range(args.desktops)
                )
            )
            half.outcomes = list(await readers)
            half.profile_top = list((await profiles.stop()).items())[:40]
            half.trace = await tracer.stop()
            if half.trace:
                (root / "trace.json").write_text(json.dumps(half.trace))
            # every reader's console (and the URLs of answers >= 400), kept with --keep
            (root / "consoles.json").write_text(json.dumps(fleet.console, indent=1))
            half.reloaded = sorted(
                n
                for n, lines in fleet.console.items()
                if sum(line.startswith("load: ") for line in lines) > 1
            )
            half.wall_s = loop.time() - started
            meter.stop()
            half.host_busy_cores = meter.busy_cores()
            half.chromium_cpu_s = meter.chromium_cpu_s()
            half.chromium_by_kind = meter.chromium_by_kind()
            half.chromium_threads = meter.chromium_threads()
            half.loop_lag_max_s = meter.loop_lag_max_s
            if args.idle_s > 0:
                # the pages stay open (sharing, in the peers half): their CPU a second
                before = await asyncio.to_thread(chromium_cpu_now)
                threads = await asyncio.to_thread(chromium_threads_now)
                await asyncio.sleep(args.idle_s)
                half.idle_cpu_s = await asyncio.to_thread(chromium_cpu_now) - before
                half.idle_threads = threads_spent(
                    threads, await asyncio.to_thread(chromium_threads_now)
                )
                half.idle_s = args.idle_s
            half.silent_disconnects = sum(
                "answers no request" in text for o in half.outcomes for text in o.notices
            )
            # the desktop peers seed while the readers download; once the crowd is
            # done, they get 15 s to leave by their own rule, then SIGTERM
            try:
                async with asyncio.timeout(15.0):
                    half.desktops = list(await asyncio.shield(desktops))
            except TimeoutError:
                for proc in running:
                    if proc.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.terminate()
                try:
                    async with asyncio.timeout(10.0):
                        half.desktops = list(await asyncio.shield(desktops))
                except TimeoutError:  # libtorrent's WebRTC threads can hang an exit
                    for proc in running:
                        if proc.returncode is None:
                            with contextlib.suppress(ProcessLookupError):
                                proc.kill()
                    half.desktops = list(await desktops)
        async with aiohttp.ClientSession() as http:
            for origin in origins:
                async with http.get(f"{origin.url}/stats") as resp:
                    half.origin_bytes += int((await resp.json())["bytes_sent_total"])
    finally:
        half.load_after = loadavg()
        if reader is not None:
            await reader.stop()
        for seeder in seeders:
            await stop_process(seeder)
        for service in reversed(services):
            await service.stop()


async def main(args: argparse.Namespace) -> int:
    reason = why_no_browser()
    if reason is not None:
        print(f"bench/reader_swarm.py: {reason}", file=sys.stderr)
        return 2
    if args.offers_cpu:
        return await offers_cpu(args.offers_cpu, args.offers_rounds)
    counts = [int(x) for x in args.readers.split(",") if x.strip()]
    base = Path(tempfile.mkdtemp(prefix="pressrun-bench-reader-swarm-"))
    if args.keep:
        base = Path(args.keep)
        base.mkdir(parents=True, exist_ok=True)
    # a real PDF (a cover, text pages, a page of incompressible pixels), as
    # bench/reader.py: the app draws the cover with pdf.js after the download, and over
    # 24 MB of random bytes that is not quick (in the first run, on random bytes, the
    # origin-only crowd took 118 s from the first arrival to the last result while its
    # slowest download took 30.5 s: CPU the pages still downloading went without)
    pdf = base / "issue.pdf"
    write_sample_pdf(pdf, title="Bench issue", pad_to_bytes=int(args.mb * MB))
    data = pdf.read_bytes()
    size = len(data)
    want_sha = hashlib.sha256(data).hexdigest()
    can_peer = peer_path() is not None
    cap = "default" if args.reader_upload_kib is None else f"{args.reader_upload_kib:g} KiB/s"
    cap += f" on a link the browser reports as {args.link}"
    print(
        f"bench/reader_swarm.py: a {args.mb:g} MB issue, {args.origins} origins of "
        f"{args.origin_mbps:g} Mbit/s (capped), {args.desktops} desktop peers, readers "
        f"{counts}, arriving within {args.arrive_s:g} s; readers' upload cap "
        f"{cap}"
        f"; load {loadavg()}",
        flush=True,
    )
    if not can_peer:
        print(
            "THE PEER HALF IS NOT MEASURABLE YET: this reader has no peer path "
            "(pressrun.reader.config.SwarmSettings is missing); only the origin-only "
            "half runs",
            flush=True,
        )
    halves: list[Half] = []
    rng = random.Random(args.seed)
    try:
        for n in counts:
            arrivals = sorted(rng.uniform(0, args.arrive_s) for _ in range(n))
            # the desktop peers are the crowd's last arrivals: one that comes before the
            # balancer has seen the crowd is sent to the origins, downloads in a second
            # and leaves, and bridges nothing (two trial runs)
            desktop_arrivals = [args.arrive_s] * args.desktops
            wanted = [h.strip() for h in args.halves.split(",")]
            for peers in [p for p in (True, False) if ("peers" if p else "origin-only") in wanted]:
                if peers and not can_peer:
                    continue
                half = Half(n, peers, size)
                print(f"\nrunning N = {n}, {half.name} ...", flush=True)
                await run_half(
                    half,
                    root=base / f"n{n}-{half.name}",
                    data=data,
                    want_sha=want_sha,
                    arrivals=arrivals,
                    desktop_arrivals=desktop_arrivals,
                    args=args,
                )
                print_half(half)
                halves.append(half)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    print("\n== summary")
    ok = True
    for n in counts:
        with_peers = next((h for h in halves if h.readers == n and h.peers), None)
        alone = next((h for h in halves if h.readers == n and not h.peers), None)
        if alone is None:
            ok = False
            if with_peers is not None:
                print(
                    f"N = {n}: with peers ratio {with_peers.ratio():.3f}, median "
                    f"{fmt_s(with_peers.median_s())} (no origin-only half in this run: not judged)"
                )
            continue
        ok &= alone.verified() == n
        line = f"N = {n}: origin-only ratio {alone.ratio():.3f}, median {fmt_s(alone.median_s())}"
        if with_peers is None:
            print(line + "; peers: NOT MEASURABLE YET (the reader has no peer path)")
            ok = False
            continue
        ok &= with_peers.verified() == n
        ratio_ok = with_peers.ratio() <= 0.25
        med_p, med_o = with_peers.median_s(), alone.median_s()
        time_ok = med_p is not None and med_o is not None and med_p <= med_o
        time_ok &= not with_peers.reloaded and not alone.reloaded
        ok &= ratio_ok and time_ok
        print(
            f"{line}; with peers ratio {with_peers.ratio():.3f} (target <= 0.25: "
            f"{'met' if ratio_ok else 'NOT MET'}), median {fmt_s(med_p)} (target <= origin-only: "
            f"{'met' if time_ok else 'NOT MET'}); readers from peers "
            f"{sum(o.bytes_from_peers for o in with_peers.outcomes) / MB:.1f} MB (from desktop "
            f"peers {with_peers.from_desktops() / MB:.1f} MB)"
        )
        unfinished = sum(o.seconds is None for o in with_peers.outcomes)
        if unfinished:
            print(
                f"  N = {n}: {unfinished} readers with peers did not finish (their bytes are "
                "in the origins' counters, not in the readers' tallies)"
            )
        if not any(o.bytes_from_peers for o in with_peers.outcomes):
            print(
                f"  N = {n}: no reader that finished took a byte from a peer (were they sent "
                "to the swarm? the balancer answers peer=webrtc readers 'swarm' at swarm "
                "demand)"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        **{k: v for k, v in asdict(h).items() if k != "outcomes"},
                        "half": h.name,
                        "ratio": h.ratio(),
                        "ratio_without_desktops": h.ratio_without_desktops(),
                        "readers_own_ratio": h.readers_own_ratio(),
                        "median_s": h.median_s(),
                        "bytes_from_desktops": h.from_desktops(),
                        "cpu_s_per_mb": h.cpu_s_per_mb(),
                        "outcomes": [asdict(o) for o in h.outcomes],
                    }
                    for h in halves
                ],
                indent=1,
            )
        )
    print("targets met" if ok else "TARGETS NOT MET (or not measurable)")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", default="10,20", help="crowd sizes (default 10,20)")
    parser.add_argument("--desktops", type=int, default=2, help="desktop peers (default 2)")
    parser.add_argument("--mb", type=float, default=24.0, help="issue size, MB (default 24)")
    parser.add_argument("--origins", type=int, default=2, help="origins (default 2)")
    parser.add_argument(
        "--origin-mbps",
        type=float,
        default=40.0,
        help="each origin's egress cap and stated capacity, Mbit/s (default 40)",
    )
    parser.add_argument(
        "--arrive-s", type=float, default=2.0, help="the crowd arrives within (default 2 s)"
    )
    parser.add_argument(
        "--swarm-enter",
        type=float,
        default=1.0,
        help="the balancer's --swarm-enter-downloaders (default 1: the crowd, desktop peers "
        "included, is in the swarm from its first request; leave at half of it)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="a reader's download at most (300 s)"
    )
    parser.add_argument(
        "--desktop-max-seed-s",
        type=float,
        default=120.0,
        help="a desktop peer seeds at most this long after its download (default 120)",
    )
    parser.add_argument(
        "--reader-upload-kib",
        type=float,
        default=None,
        metavar="KIB_PER_S",
        help="the readers' upload cap on any link instead of the reader's defaults (none on "
        "Wi-Fi, 256 KiB/s elsewhere); 0: none",
    )
    parser.add_argument(
        "--link",
        choices=("wifi", "unknown"),
        default="wifi",
        help="the link the phones' browser reports: wifi (default; navigator.connection.type "
        "as on Android, the reader's unmetered upload cap, none by default) or unknown "
        "(desktop Chromium: the reader's upload_limit_bytes_per_s, 256 KiB/s)",
    )
    parser.add_argument(
        "--halves",
        default="peers,origin-only",
        help="which halves to run (default both: peers,origin-only; the targets are judged "
        "only with both)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="K",
        help="CPU-profile the first K readers' pages of the peers half (DevTools "
        "profiler; reader-N.cpuprofile in the work dir, see --keep) and print their "
        "functions by self time (default 0: none)",
    )
    parser.add_argument(
        "--offers-cpu",
        type=int,
        default=0,
        metavar="K",
        help="instead of the crowd: Chromium's CPU for K offers relayed to one page at its "
        "peer cap, with the reader's refuseOffers and without (default 0: the crowd)",
    )
    parser.add_argument(
        "--offers-rounds", type=int, default=3, help="--offers-cpu: rounds of each (3)"
    )
    parser.add_argument(
        "--desktops-after-readers",
        action="store_true",
        help="the desktop peers arrive once every reader's page has loaded (at most 60 s), "
        "not at --arrive-s: on this 2-core host the pages' apps come up 4-28 s after they "
        "open, so at --arrive-s the desktops are the first peers, and at N = 20 on 28 Nov "
        "(session 19) both left by their not_needed rule 0.4 s before the first reader "
        "announced (both halves alike; off by default)",
    )
    parser.add_argument(
        "--seeding-desktops",
        type=int,
        default=0,
        metavar="K",
        help="K desktop peers that hold the issue from the start and seed it until the "
        "half ends (pressrun seed --until-stopped), beside --desktops (default 0)",
    )
    parser.add_argument(
        "--trace-s",
        type=float,
        default=0.0,
        metavar="S",
        help="sample each page's swarm figures every S seconds in the peers half "
        "(trace.json in the work dir; a per-page timeline is printed; default 0: off)",
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        default=0.0,
        metavar="S",
        help="once the crowd is done, Chromium's CPU over S more seconds with the pages "
        "open (sharing, in the peers half; with --desktops 0 nobody asks them for a piece): "
        "what an open page costs a second (default 0: not measured)",
    )
    parser.add_argument("--seed", type=int, default=26, help="arrival times' seed (26)")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    parser.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it")
    sys.exit(asyncio.run(main(parser.parse_args())))
