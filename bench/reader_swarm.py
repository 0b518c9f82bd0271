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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
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

ISSUE = "bench-reader-swarm"
MB = 1_000_000
#: a desktop peer's command line (``pressrun get`` / ``pressrun seed`` follow), its
#: log at INFO: the directives and the swarm's notices
PRESSRUN_INFO = (sys.executable, "-m", "pressrun.cli", "--log-level", "INFO")


def peer_path() -> type | None:
    """The reader's swarm settings class, or None while the reader has no peer path."""
    try:
        from pressrun.reader.config import SwarmSettings
    except ImportError:
        return None
    return SwarmSettings


@dataclass
class Desktop:
    """One desktop peer's ``pressrun get --json`` outcome (or its error)."""

    number: int
    ok: bool
    seconds: float | None = None
    bytes_from_origins: int = 0
    bytes_from_peers: int = 0
    mode: str = "-"
    error: str | None = None
    #: the process's CPU seconds (user + system, /proc/<pid>/stat, last seen alive)
    cpu_s: float = 0.0


def process_cpu_s(pid: int) -> float | None:
    """A live process's user + system CPU seconds (/proc/<pid>/stat), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Half:
    """One half of the run: N readers and the desktop peers, peers on or off."""

    readers: int
    peers: bool
    size_bytes: int
    origin_bytes: int = 0
    outcomes: list[ReaderOutcome] = field(default_factory=list)
    desktops: list[Desktop] = field(default_factory=list)
    wall_s: float = 0.0
    load_before: str = ""
    load_after: str = ""
    #: the host's busy cores over the crowd (mean, /proc/stat) and the CPU seconds of
    #: this bench's Chromium processes (/proc/<pid>/stat): whether 2 cores carried it
    host_busy_cores: float = 0.0
    chromium_cpu_s: float = 0.0
    #: the same by Chromium process kind (renderer, network, gpu, browser, utility)
    chromium_by_kind: dict[str, float] = field(default_factory=dict)
    #: the busiest of Chromium's threads ("kind/thread name" -> CPU seconds)
    chromium_threads: dict[str, float] = field(default_factory=dict)
    #: this process's event loop, late by at most this much (it runs the reader service
    #: the pages load the app from, and Playwright's side of every page)
    loop_lag_max_s: float = 0.0
    #: --profile: the profiled pages' functions by self time (s), most first
    profile_top: list[tuple[str, float]] = field(default_factory=list)
    #: the readers' notices saying a peer was disconnected as silent
    silent_disconnects: int = 0
    #: --trace: each page's swarm samples (page index in opening order -> samples)
    trace: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: readers whose page loaded more than once: their row is the later page's (a
    #: resume of what the first page stored), not the crowd's download
    reloaded: list[int] = field(default_factory=list)
    #: --idle-s: Chromium's CPU seconds over that long once the crowd is done, the
    #: pages left open (sharing, in the peers half): what an open page costs a second
    idle_cpu_s: float | None = None
    idle_s: float = 0.0
    #: ... by "kind/thread name", the busiest
    idle_threads: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "peers" if self.peers else "origin-only"

    def ratio(self) -> float:
        """Origin bytes (the origins' own counters, all of them) / (N x size)."""
        return self.origin_bytes / (self.readers * self.size_bytes)

    def ratio_without_desktops(self) -> float:
        """The same, less what the desktop peers report they took from origins."""
        desktop = sum(d.bytes_from_origins for d in self.desktops)
        return (self.origin_bytes - desktop) / (self.readers * self.size_bytes)

    def readers_own_ratio(self) -> float:
        """The readers' own tally of bytes from origins / (N x size)."""
        own = sum(o.bytes_from_origins for o in self.outcomes)
        return own / (self.readers * self.size_bytes)

    def seconds(self) -> list[float]:
        return [o.seconds for o in self.outcomes if o.seconds is not None]

    def median_s(self) -> float | None:
        done = self.seconds()
        return statistics.median(done) if done else None

    def verified(self) -> int:
        return sum(o.verified for o in self.outcomes)

    def cpu_s_per_mb(self) -> float:
        """Chromium's CPU seconds over the crowd per MB the readers stored (N x size):
        what a MB costs a phone, its uploads in the peers half included."""
        return self.chromium_cpu_s / (self.readers * self.size_bytes / MB)

    def from_desktops(self) -> int:
        """Bytes the readers received from desktop peers (libtorrent, "-PR"), by their
        own swarm tally."""
        return sum(desktop_bytes(o) for o in self.outcomes)


#: a desktop peer's id prefix ("-PR0100-": pressrun.peer.session.PEER_ID_PREFIX) in
#: hex, as the reader's tally names its sources ("peer <id's first 12 bytes in hex>")
DESKTOP_SOURCE = "peer " + b"-PR".hex()


def desktop_bytes(outcome: ReaderOutcome) -> int:
    """What one reader received from desktop peers (its swarm tally, by source)."""
    by_source = ((outcome.swarm or {}).get("bytes") or {}).get("by_source") or {}
    return sum(
        int(v.get("received") or 0) for k, v in by_source.items() if k.startswith(DESKTOP_SOURCE)
    )


#: one page's swarm figures for the trace (--trace): bytes received by source kind
#: (web seeds, readers "-WW", desktops "-PR"), the web seeds' mode and offer, the peers
_TRACE = """(issue) => {
  const s = window.pressrun?.swarm?.()?.[issue];
  if (!s) return null;
  let ws = 0, ww = 0, pr = 0;
  for (const [k, v] of Object.entries(s.bytes?.by_source ?? {})) {
    if (k.startsWith('web seed')) ws += v.received;
    else if (k.startsWith('peer 2d5052')) pr += v.received;
    else ww += v.received;
  }
  return {t: performance.now() / 1000, state: s.state, all: s.web_seeds_all_pieces,
    offered: s.web_seed_offered, peers: s.peers, unchoking: s.peers_unchoking,
    desktops: s.desktop_peers, desktops_unchoking: s.desktop_peers_unchoking,
    requests: s.peer_requests, ws, ww, pr, up: s.uploaded_bytes};
}"""


class SwarmTrace:
    """--trace S: every S seconds, each open page's swarm figures (_TRACE), with the
    bench's clock (``at``, seconds from the crowd's start): where a reader's time went
    (which sources sent it bytes, when the web seeds offered what, desktops connected)."""

    def __init__(self, fleet: BrowserReaders, every_s: float) -> None:
        self.fleet, self.every_s = fleet, every_s
        self.samples: dict[int, list[dict[str, Any]]] = {}
        self.task: asyncio.Task[None] | None = None

    async def _follow(self, index: int, page: Any, start: float) -> None:
        # one loop per page: a page still loading (its evaluate waits) holds up no other
        loop = asyncio.get_running_loop()
        while True:
            at = loop.time() - start
            with contextlib.suppress(Exception):
                doc = await asyncio.wait_for(page.evaluate(_TRACE, ISSUE), 5.0)
                if doc is not None:
                    self.samples.setdefault(index, []).append({"at": round(at, 2), **doc})
            await asyncio.sleep(max(0.0, self.every_s - (loop.time() - start - at)))

    async def _watch(self) -> None:
        start = asyncio.get_running_loop().time()
        followed: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                for k, context in enumerate(list(self.fleet._contexts), 1):
                    if k not in followed and context.pages:
                        page = context.pages[0]
                        followed[k] = asyncio.create_task(self._follow(k, page, start))
                await asyncio.sleep(0.2)
        finally:
            for task in followed.values():
                task.cancel()

    def start(self) -> None:
        if self.every_s > 0:
            self.task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> dict[int, list[dict[str, Any]]]:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        return self.samples


def print_trace(half: Half, bin_s: float = 5.0) -> None:
    """Per page (opening order), per bin_s of the crowd: MB from web seeds / readers /
    desktops, the web seeds' mode (A: every piece, h: held back, -: not downloading)
    and the missing pieces they offer, desktops connected (unchoking), requests out to
    peers; each bin's last sample against the bin before."""
    if not half.trace:
        return
    print(
        f"trace (per {bin_s:g} s of the crowd: web seeds/readers/desktops MB, web seeds' "
        "mode and pieces offered, D desktops connected (unchoking), r requests to peers):"
    )
    for index, samples in sorted(half.trace.items()):
        last_of: dict[int, dict[str, Any]] = {}
        for sample in samples:
            last_of[int(sample["at"] // bin_s)] = sample
        cells = []
        before = {"ws": 0, "ww": 0, "pr": 0}
        for k in sorted(last_of):
            x = last_of[k]
            mode = "-" if x["state"] != "downloading" else ("A" if x["all"] else "h")
            cells.append(
                f"{k * bin_s:.0f}s {(x['ws'] - before['ws']) / MB:.1f}/"
                f"{(x['ww'] - before['ww']) / MB:.1f}/{(x['pr'] - before['pr']) / MB:.1f} "
                f"{mode}{x['offered']} D{x['desktops']}({x['desktops_unchoking']}) r{x['requests']}"
            )
            before = {key: x[key] for key in before}
            if x["state"] != "downloading" and k > min(last_of):
                break
        print(f"  page {index}: " + " | ".join(cells))


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


async def desktop_get(
    number: int,
    balancer: str,
    library: Path,
    pub: Path,
    delay_s: float,
    max_seed_s: float,
    running: list[asyncio.subprocess.Process],
    log_path: Path,
    after: Callable[[], Awaitable[None]] | None = None,
) -> Desktop:
    """A desktop peer arriving after ``delay_s`` (and then ``after()``, if given):
    ``pressrun get --json``, which seeds after its download until its fair-exit rule or
    ``max_seed_s`` and then prints its outcome; the process is put in ``running`` (to be
    stopped when the crowd is over: then it has no outcome). Its log (INFO: the
    directives, the swarm's notices) goes to ``log_path``."""
    await asyncio.sleep(delay_s)
    if after is not None:
        await after()
    proc = await asyncio.create_subprocess_exec(
        *PRESSRUN_INFO,
        "get",
        ISSUE,
        "--balancer",
        balancer,
        "--library",
        str(library),
        "--publisher-key",
        str(pub),
        "--json",
        "--max-seed-s",
        f"{max_seed_s:g}",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**_environ(), "PRESSRUN_STUN": ""},
    )
    running.append(proc)
    cpu = [0.0]

    async def watch_cpu() -> None:
        while proc.returncode is None:
            cpu[0] = process_cpu_s(proc.pid) or cpu[0]
            await asyncio.sleep(0.5)

    watcher = asyncio.get_running_loop().create_task(watch_cpu())
    try:
        out, err = await proc.communicate()
    finally:
        watcher.cancel()
    log_path.write_bytes(err)
    if proc.returncode != 0:
        tail = (err or out).decode(errors="replace").strip().splitlines()[-1:]
        why = tail[0] if tail else f"exit {proc.returncode} (stopped while seeding?)"
        return Desktop(number, False, error=why, cpu_s=cpu[0])
    doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return Desktop(
        number,
        True,
        seconds=float(doc["seconds"]),
        bytes_from_origins=int(doc.get("bytes_from_origins") or 0),
        bytes_from_peers=int(doc.get("bytes_from_peers") or 0),
        mode=str(doc.get("mode") or "-"),
        cpu_s=cpu[0],
    )


async def seeding_desktop(
    content: Path, tracker: str, log_path: Path
) -> asyncio.subprocess.Process:
    """--seeding-desktops: a desktop peer that holds the issue before the crowd comes
    and seeds it until the half ends (``pressrun seed --until-stopped``, libtorrent with
    WebRTC through the tracker's WebSocket twin, no STUN server), as a reader's desktop
    seeding in the background; started once its copy is checked (its log says so, at
    most 20 s: "verified"). The caller stops it."""
    bundle = content / ISSUE
    name = json.loads((bundle / "manifest.json").read_text())["manifest"]["file_name"]
    log = log_path.open("wb")
    proc = await asyncio.create_subprocess_exec(
        *PRESSRUN_INFO,
        "seed",
        "--torrent",
        str(bundle / f"{ISSUE}.torrent"),
        "--manifest",
        str(bundle / "manifest.json"),
        "--until-stopped",
        "--listen",
        "127.0.0.1:0",
        "--tracker",
        f"{tracker}/announce",
        str(bundle / name),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
        env={**_environ(), "PRESSRUN_STUN": ""},
    )
    log.close()
    deadline = asyncio.get_running_loop().time() + 20.0
    while asyncio.get_running_loop().time() < deadline and proc.returncode is None:
        if b" verified" in log_path.read_bytes():
            break
        await asyncio.sleep(0.2)
    return proc


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 5 s (libtorrent's WebRTC threads can hang an exit)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


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


def print_half(half: Half) -> None:
    """One half's figures and its readers' rows."""
    med = half.median_s()
    print(
        f"\n== N = {half.readers}, {half.name}: {half.verified()}/{half.readers} readers "
        f"verified, crowd done in {half.wall_s:.1f} s (load {half.load_before} -> "
        f"{half.load_after}); host {half.host_busy_cores:.2f} of {os.cpu_count()} cores "
        f"busy, Chromium {half.chromium_cpu_s:.0f} CPU s ("
        + ", ".join(f"{k} {v:.0f}" for k, v in half.chromium_by_kind.items())
        + f"), this process's loop late by up to "
        f"{half.loop_lag_max_s:.1f} s; silent peers disconnected "
        f"(in the readers' last notices): {half.silent_disconnects}"
    )
    print(
        "Chromium's busiest threads (CPU s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in half.chromium_threads.items())
    )
    print(
        f"Chromium CPU s per MB stored: {half.cpu_s_per_mb():.3f} "
        f"({half.chromium_cpu_s:.1f} s / {half.readers} x {half.size_bytes / MB:.1f} MB)"
    )
    if half.idle_cpu_s is not None:
        print(
            f"the pages left open {half.idle_s:.0f} s after the crowd (sharing, in the peers "
            f"half): Chromium {half.idle_cpu_s:.2f} CPU s, "
            f"{half.idle_cpu_s / half.idle_s / half.readers * 1000:.1f} CPU ms a page a "
            "second; its busiest threads (CPU s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in half.idle_threads.items())
        )
    print(
        f"origin bytes / (N x size): {half.ratio():.3f} (origins' counters, all: "
        f"{half.origin_bytes / MB:.1f} MB); without the desktop peers' "
        f"{sum(d.bytes_from_origins for d in half.desktops) / MB:.1f} MB: "
        f"{half.ratio_without_desktops():.3f}; the readers' own tally: "
        f"{half.readers_own_ratio():.3f}"
    )
    if half.reloaded:
        print(
            f"NOT A VALID MEDIAN: readers {half.reloaded} loaded their page again; their "
            "rows are the later page's resume of what the first one stored"
        )
    secs = half.seconds()
    if secs and med is not None:
        print(
            f"reader download time (the app's seconds): median {med:.1f} s, min "
            f"{min(secs):.1f}, max {max(secs):.1f}"
        )
    if half.peers:
        print(
            f"readers' bytes from desktop peers (libtorrent, their tally): "
            f"{half.from_desktops() / MB:.1f} MB"
        )
    print(
        f"{'reader':>6} {'mode':>7} {'s':>6} {'origins MB':>11} {'peers MB':>9} "
        f"{'desktops MB':>12}  ok"
    )
    for o in half.outcomes:
        if o.seconds is None:
            print(f"{o.number:>6} {'-':>7} {'-':>6} {'-':>11} {'-':>9} {'-':>12}  no: {o.error}")
        else:
            print(
                f"{o.number:>6} {o.mode:>7} {o.seconds:>6.1f} {o.bytes_from_origins / MB:>11.1f} "
                f"{o.bytes_from_peers / MB:>9.1f} {desktop_bytes(o) / MB:>12.1f}  "
                f"{'yes' if o.verified else 'NO'}"
            )
            if half.peers and o.mode == "origin" and o.notices:
                # why a reader with the peer path on took the origin path
                print(f"{'':>6} the app said: {' | '.join(o.notices)[:300]}")
    print_bytes(half)
    print_trace(half)
    loads = [o.swarm["load"] for o in half.outcomes if o.swarm and "load" in o.swarm]
    if loads:
        # the swarm's own cost counters (swarm-load.js), summed over the readers
        total = {k: sum(int(x.get(k) or 0) for x in loads) for k in loads[0]}
        print("the readers' swarm work: " + ", ".join(f"{k} {v}" for k, v in total.items()))
    if half.profile_top:
        print("the profiled pages' JavaScript, functions by self time (summed over the pages):")
        for name, spent in half.profile_top[:25]:
            print(f"  {spent:7.2f} s  {name}")
    for d in half.desktops:
        if d.ok:
            print(
                f"desktop {d.number}: {d.mode}, {d.seconds:.1f} s, "
                f"{d.bytes_from_origins / MB:.1f} MB from origins, "
                f"{d.bytes_from_peers / MB:.1f} MB from peers; {d.cpu_s:.1f} CPU s"
            )
        else:
            print(f"desktop {d.number}: failed: {d.error} ({d.cpu_s:.1f} CPU s)")


def print_bytes(half: Half) -> None:
    """What each reader's swarm received against what it needed (the app's ``swarm()``
    readout, swarm-bytes.js): wasted bytes by cause and source kind, webtorrent's
    hotswaps, and what the web seeds were asked for pieces a peer held."""
    rows = [(o.number, o.swarm["bytes"]) for o in half.outcomes if o.swarm and "bytes" in o.swarm]
    if not rows:
        return
    got = sum(b["received"] for _, b in rows)
    wasted = sum(b["wasted"] for _, b in rows)
    print(
        f"swarm bytes received by {len(rows)} readers: {got / MB:.1f} MB for "
        f"{len(rows)} x {half.size_bytes / MB:.1f} MB ({got / (len(rows) * half.size_bytes):.3f} "
        f"of their copies); wasted {wasted / MB:.1f} MB"
    )
    print(
        f"{'reader':>6} {'recv MB':>8} {'waste MB':>9} {'w.seed':>7} {'peers':>6}  "
        "wasted by cause (MB)                 hotswaps (ws>p ws>ws p>p p>ws)  web seed asked MB "
        "(peer held / lacked)"
    )
    for number, b in rows:
        causes = " ".join(f"{k} {v / MB:.1f}" for k, v in b["wasted_by_cause"].items() if v)
        h = b["hotswaps"]
        print(
            f"{number:>6} {b['received'] / MB:>8.1f} {b['wasted'] / MB:>9.1f} "
            f"{b['wasted_from_web_seeds'] / MB:>7.1f} {b['wasted_from_peers'] / MB:>6.1f}  "
            f"{causes or '-':<36} {h['web_seed_over_peer']:>4} {h['web_seed_over_web_seed']:>4} "
            f"{h['peer_over_peer']:>4} {h['peer_over_web_seed']:>4}   "
            f"{b['web_seed_asked_peer_held'] / MB:.1f} / {b['web_seed_asked_lacked'] / MB:.1f}"
        )


#: a page that makes a real WebRTC offer (a data channel, ICE gathered), its SDP
_MAKE_OFFER = """async () => {
  const pc = new RTCPeerConnection();
  pc.createDataChannel('x');
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((r) => {
    if (pc.iceGatheringState === 'complete') r();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && r();
    setTimeout(r, 3000);
  });
  const sdp = pc.localDescription.sdp;
  pc.close();
  return sdp;
}"""

#: a torrent at its peer cap (boundPeers(torrent, 0, 0)) announced to the stand-in
#: tracker, which relays it the offers; `on`: the reader's refuseOffers, else
#: webtorrent's tracker client as before (a connection built for each, then refused)
_AT_CAP = """async ([announce, offers, on]) => {
  const { default: WebTorrent } = await import('webtorrent');
  const load = await import('./js/swarm-load.js');
  const options = { dht: false, lsd: false, utPex: false, natUpnp: false, natPmp: false };
  const maker = new WebTorrent({ ...options, tracker: false });
  const data = new Uint8Array(4 * 16384).fill(7);
  const file = await new Promise((resolve) => maker.seed(new File([data], 'o.bin'),
    { pieceLength: 16384, announce: [] }, (t) => resolve(t.torrentFile)));
  await new Promise((r) => maker.destroy(r));
  const client = new WebTorrent({ ...options, tracker: {} });
  try {
    const torrent = client.add(file, { announce: [announce] });
    const counts = load.boundPeers(torrent, 0, 0);
    if (!on) torrent.once('ready', () => {
      for (const t of torrent.discovery?.tracker?._trackers ?? []) delete t._onAnnounceResponse;
    });
    const deadline = performance.now() + 60000;
    while (counts.refused + counts.offers_refused < offers && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 2000)); // the connections' own teardown
    return counts;
  } finally {
    await new Promise((r) => client.destroy(r));
  }
}"""


async def offers_cpu(offers: int, rounds: int) -> int:
    """--offers-cpu: what a relayed offer costs a reader at its peer cap, in Chromium
    CPU seconds, with the reader's refuseOffers (the offer dropped before a connection
    is built) and without (webtorrent's tracker client builds an RTCPeerConnection, the
    peer is then refused): one page, a stand-in WebSocket tracker relaying ``offers``
    offers (a real offer's SDP, distinct peer ids) at each announce; ``rounds`` of each,
    alternated. Light (a few CPU seconds); not the crowd."""
    from aiohttp import WSMsgType, web
    from playwright.async_api import async_playwright

    from pressrun.reader.browser import CHROMIUM, CHROMIUM_ARGS, open_app

    sdp: dict[str, str] = {}

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        relayed_once = False  # the offers at the first announce (webtorrent announces again)
        async for msg in sock:
            if msg.type != WSMsgType.TEXT:
                continue
            doc = json.loads(msg.data)
            if doc.get("action") != "announce" or doc.get("answer") or relayed_once:
                continue
            relayed_once = True
            reply = {"action": "announce", "info_hash": doc["info_hash"], "interval": 600}
            await sock.send_str(json.dumps(reply))
            for k in range(offers):
                relayed = {
                    "action": "announce",
                    "info_hash": doc["info_hash"],
                    "peer_id": f"-WW3021-{random.getrandbits(48):012x}",
                    "offer_id": f"o{k:019d}",
                    "offer": {"type": "offer", "sdp": sdp["sdp"]},
                }
                await sock.send_str(json.dumps(relayed))
        return sock

    app = web.Application()
    app.router.add_get("/announce", ws)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    announce = f"ws://127.0.0.1:{runner.addresses[0][1]}/announce"
    # the app's page only (its modules and webtorrent); no balancer answers
    config = ReaderConfig(balancer_url="http://127.0.0.1:9", trust_on_first_use=True)
    reader = await start_reader(config)
    try:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, args=list(CHROMIUM_ARGS)
            )
            try:
                page = await (await browser.new_context()).new_page()
                await open_app(page, reader.url, 60.0)
                sdp["sdp"] = await page.evaluate(_MAKE_OFFER)
                print(
                    f"bench/reader_swarm.py --offers-cpu {offers}: {rounds} rounds of each, "
                    f"alternated; load {loadavg()}",
                    flush=True,
                )
                spent: dict[bool, list[float]] = {True: [], False: []}
                delivered: list[int] = []
                for _ in range(rounds):
                    for on in (False, True):
                        await asyncio.sleep(1.0)
                        before = await asyncio.to_thread(chromium_cpu_now)
                        counts = await page.evaluate(_AT_CAP, [announce, offers, on])
                        cpu = await asyncio.to_thread(chromium_cpu_now) - before
                        spent[on].append(cpu)
                        delivered.append(counts["refused"] + counts["offers_refused"])
                        print(
                            f"  refuseOffers {'on ' if on else 'off'}: Chromium {cpu:.2f} CPU s "
                            f"for {offers} offers (refused after a connection {counts['refused']}, "
                            f"dropped before one {counts['offers_refused']}); load {loadavg()}",
                            flush=True,
                        )
            finally:
                await browser.close()
    finally:
        await reader.stop()
        await runner.cleanup()
    off, on_ = statistics.median(spent[False]), statistics.median(spent[True])
    each = min(delivered) if delivered else 0
    print(
        f"median: off {off:.2f} CPU s, on {on_:.2f} CPU s for {each} offers: "
        f"{(off - on_) / max(1, each) * 1000:.1f} CPU ms saved per relayed offer at the "
        f"cap; load {loadavg()}"
    )
    return 0 if each == offers and min(delivered) == max(delivered) else 1


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
                    f"{_s(with_peers.median_s())} (no origin-only half in this run: not judged)"
                )
            continue
        ok &= alone.verified() == n
        line = f"N = {n}: origin-only ratio {alone.ratio():.3f}, median {_s(alone.median_s())}"
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
            f"{'met' if ratio_ok else 'NOT MET'}), median {_s(med_p)} (target <= origin-only: "
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
