"""``pressrun demo``: three origins, a balancer and about twenty clients on 127.0.0.1.

The origins are shaped like the machines of 000_9aae53f3113e9bd8.txt (section 5):

- **A** a dedicated, powerful server: gigabit stated, no cap;
- **B** a shared server with background tasks: gigabit stated, and a real CPU burner
  process (a separate ``python`` busy loop, niced) running beside it for the whole
  demo;
- **C** an underpowered remote machine with a small link: a real token-bucket egress
  cap of 24 Mbit/s (3 MB/s) on all its transfers, stated correctly to the balancer (as
  in the paper's waves-2 / burst-2 re-runs).

A balancer with Algorithm 2 polls them; a fresh Ed25519 key signs a generated sample
issue (32 MiB) published into the content folder all three serve; then the clients
run `pressrun.clients.aio.fetch_issue` concurrently, each into its own library. The
demo prints a table per origin (transfers, MB served) and per client (seconds, origins
used, handoffs, verified against the source file's SHA-256), and exits 0; anything
that fails ends it with a one-line message and exit code 1. Temp folders and the
burner process are removed in every case.

The origins and the balancer are ``pressrun serve`` child processes started with
``--port 0`` (their URLs read from their start-up lines: no fixed ports), each with its
own event loop as on separate machines; the clients run in the demo's process. On one
host the origins' ``cpu_percent`` is system-wide, so B's burner raises the CPU figure
all three report (docs/demo.md).

`Testbed` is a similar set-up for the integration tests (origins in-process or as
child processes, the balancer in-process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pressrun.balancer.aio import RunningBalancer
    from pressrun.clients.aio import FetchResult
    from pressrun.origin.aio import RunningOrigin

MIB = 1024 * 1024
DEMO_ISSUE = "weekly-2026-47"


@dataclass(frozen=True)
class OriginShape:
    """One origin of a test bed: its name, stated capacity, real cap, content."""

    name: str
    capacity_mbps: float = 1000.0
    egress_cap_mbps: float | None = None
    content_dir: Path | None = None  # None: the test bed's shared folder
    description: str = ""


#: Machines A, B and C of 000_9aae53f3113e9bd8.txt.
DEMO_SHAPES = (
    OriginShape("origin-a", 1000.0, None, description="A: dedicated, gigabit"),
    OriginShape("origin-b", 1000.0, None, description="B: shared, CPU burner beside it"),
    OriginShape("origin-c", 24.0, 24.0, description="C: small link, 3 MB/s cap"),
)


def start_cpu_burner() -> subprocess.Popen[bytes]:
    """A real background load: a separate Python process in a busy loop (niced)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import os; os.nice(5)\nwhile True: pass"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a process this module started, then kill it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)


@dataclass
class Testbed:
    """Origins and a balancer on 127.0.0.1 for the demo and the integration tests.

    Use as ``async with Testbed(root, shapes) as bed:``; ``await bed.publish(...)`` a
    sample issue, ``await bed.start_balancer()``, then point clients at
    ``bed.balancer.url``. Everything started is stopped on exit. With
    ``processes=True`` each origin is a ``pressrun serve origin`` child process, so
    `kill_origin` is a real SIGKILL (connections reset mid-transfer); otherwise they
    run in this event loop through `start_origin`.
    """

    __test__ = False  # not a pytest test class

    root: Path
    shapes: tuple[OriginShape, ...]
    poll_interval_s: float = 0.5
    poll_timeout_s: float | None = None
    processes: bool = False
    origins: dict[str, RunningOrigin] = field(default_factory=dict)
    origin_processes: dict[str, ServiceProcess] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    balancer: RunningBalancer | None = None

    @property
    def content_dir(self) -> Path:
        """The shared content folder."""
        return self.root / "content"

    def content_of(self, name: str) -> Path:
        """The content folder an origin serves."""
        shape = next(s for s in self.shapes if s.name == name)
        return shape.content_dir or self.content_dir

    async def __aenter__(self) -> Testbed:
        self.content_dir.mkdir(parents=True, exist_ok=True)
        try:
            for shape in self.shapes:
                await self._start_origin(shape)
        except BaseException:
            await self.close()
            raise
        return self

    async def _start_origin(self, shape: OriginShape) -> None:
        from pressrun.origin import OriginConfig, start_origin

        content = shape.content_dir or self.content_dir
        content.mkdir(parents=True, exist_ok=True)
        if self.processes:
            args = [
                "origin",
                "--content",
                str(content),
                "--port",
                "0",
                "--name",
                shape.name,
                "--capacity-mbps",
                f"{shape.capacity_mbps:g}",
                "--stats-interval-s",
                f"{self.poll_interval_s:g}",
                "--shutdown-grace-s",
                "0",
            ]
            if shape.egress_cap_mbps is not None:
                args += ["--egress-cap-mbps", f"{shape.egress_cap_mbps:g}"]
            proc = await ServiceProcess.start(shape.name, args)
            self.origin_processes[shape.name] = proc
            self.urls[shape.name] = proc.url
            return
        running = await start_origin(
            OriginConfig(
                content_dir=content,
                name=shape.name,
                capacity_mbps=shape.capacity_mbps,
                egress_cap_mbps=shape.egress_cap_mbps,
                stats_interval_s=self.poll_interval_s,
                shutdown_grace_s=0.0,
            )
        )
        self.origins[shape.name] = running
        self.urls[shape.name] = running.url

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the balancer and every origin still running."""
        if self.balancer is not None:
            await self.balancer.stop()
            self.balancer = None
        for name in list(self.urls):
            await self.stop_origin(name)

    async def stop_origin(self, name: str) -> None:
        """Stop one origin cleanly (in-process: transfers are cut after no grace)."""
        self.urls.pop(name, None)
        origin = self.origins.pop(name, None)
        if origin is not None:
            await origin.stop()
        proc = self.origin_processes.pop(name, None)
        if proc is not None:
            await proc.stop()

    async def kill_origin(self, name: str) -> None:
        """SIGKILL an origin child process (``processes=True`` only)."""
        proc = self.origin_processes[name]
        with contextlib.suppress(ProcessLookupError):
            proc.proc.kill()
        await self.stop_origin(name)

    async def stats(self, name: str) -> dict[str, Any]:
        """An origin's ``/stats`` document, over HTTP."""
        import aiohttp

        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.urls[name]}/stats") as resp,
        ):
            doc: dict[str, Any] = await resp.json()
            return doc

    async def publish(
        self,
        data: bytes,
        *,
        issue_id: str,
        key_path: Path,
        file_name: str | None = None,
        piece_size: int = 262144,
    ) -> Path:
        """Publish ``data`` as ``issue_id`` into the shared folder, then copy the
        bundle into every origin with a folder of its own; returns the bundle path."""
        from pressrun.content.publish import publish

        source_dir = self.root / "source"
        source_dir.mkdir(exist_ok=True)
        source = source_dir / (file_name or f"{issue_id}.pdf")
        source.write_bytes(data)
        bundle = await asyncio.to_thread(
            publish,
            source,
            issue_id=issue_id,
            title=f"Sample issue {issue_id}",
            key_path=key_path,
            content_dir=self.content_dir,
            web_seeds=list(self.urls.values()),
            piece_size=piece_size,
        )
        for shape in self.shapes:
            if shape.content_dir is not None and shape.content_dir != self.content_dir:
                await asyncio.to_thread(
                    shutil.copytree, bundle, shape.content_dir / issue_id, dirs_exist_ok=True
                )
        return bundle

    async def start_balancer(self, algorithm: str = "alg2") -> RunningBalancer:
        """Start the balancer over the running origins and wait until all are up."""
        from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
        from pressrun.balancer.config import BalancerConfig
        from pressrun.balancer.events import OriginSpec

        self.balancer = await start_balancer(
            BalancerServiceConfig(
                origins=tuple(OriginSpec(n, url) for n, url in self.urls.items()),
                balancer=BalancerConfig(
                    poll_interval_s=self.poll_interval_s,
                    stale_after_s=3.5 * self.poll_interval_s,
                    algorithm=algorithm,
                ),
                seed=47,
                poll_timeout_s=self.poll_timeout_s,
            )
        )
        await self.balancer.wait_until_up(len(self.urls), timeout_s=10.0)
        # one more poll, so every origin's issue list includes what was just published
        await asyncio.sleep(2 * self.poll_interval_s)
        return self.balancer


# ----------------------------------------------------------------------- the demo


@dataclass
class ServiceProcess:
    """A ``pressrun serve ...`` child process and the URL it listens on.

    Started with ``--port 0``; the URL is read from the service's own start-up log line
    ("... on http://127.0.0.1:PORT ..."), so no port is guessed. Its stderr is drained
    for as long as it runs (the last lines are kept for error messages).
    """

    name: str
    proc: asyncio.subprocess.Process
    url: str
    tail: list[str]
    drain: asyncio.Task[None]

    @classmethod
    async def start(cls, name: str, args: list[str], timeout_s: float = 20.0) -> ServiceProcess:
        """Run ``pressrun --log-level INFO serve ARGS`` and wait for its URL."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pressrun.cli",
            "--log-level",
            "INFO",
            "serve",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        tail: list[str] = []
        pattern = re.compile(r" on (http://127\.0\.0\.1:\d+)")

        async def first_url() -> str:
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                text = line.decode(errors="replace").rstrip()
                tail.append(text)
                del tail[:-20]
                found = pattern.search(text)
                if found:
                    return found.group(1)
            raise RuntimeError(
                f"{name} exited before listening: {' | '.join(tail[-3:]) or 'no output'}"
            )

        try:
            url = await asyncio.wait_for(first_url(), timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise

        async def drain() -> None:
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                tail.append(line.decode(errors="replace").rstrip())
                del tail[:-20]

        return cls(name, proc, url, tail, asyncio.create_task(drain()))

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        self.drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.drain


@dataclass(frozen=True)
class ClientRow:
    """One demo client's outcome."""

    number: int
    result: FetchResult | None
    error: str | None
    sha_ok: bool
    wave: int = 1


#: the balancer's swarm thresholds in the demo (estimated concurrent downloaders, from
#: directive requests: each adds tau/typical = 3 with the defaults); low, so that the
#: first wave's requests push the issue into swarm mode and later waves get it
DEMO_SWARM_ENTER = 24.0
DEMO_SWARM_LEAVE = 4.0


async def run_demo(
    *,
    clients: int,
    size_mib: int,
    stagger_s: float,
    keep: Path | None,
    waves: int = 3,
    wave_gap_s: float = 4.0,
    swarm: bool = True,
) -> tuple[list[ClientRow], list[dict[str, Any]], float, float]:
    """Run the demo; returns the client rows, the origins' /stats, the wall time and
    the CPU seconds B's background burner used.

    Origins and balancer are ``pressrun serve`` child processes (each its own event
    loop, as on separate machines); the clients run in this process.
    """
    from dataclasses import replace

    import aiohttp

    from pressrun.clients.aio import FetchError, fetch_issue
    from pressrun.clients.config import DESKTOP
    from pressrun.content.keys import generate_keypair, load_public_key
    from pressrun.content.publish import publish

    root = Path(tempfile.mkdtemp(prefix="pressrun-demo-")) if keep is None else keep
    content = root / "content"
    content.mkdir(parents=True, exist_ok=True)
    burner = start_cpu_burner()
    services: list[ServiceProcess] = []
    try:
        for shape in DEMO_SHAPES:
            args = [
                "origin",
                "--content",
                str(content),
                "--port",
                "0",
                "--name",
                shape.name,
                "--capacity-mbps",
                f"{shape.capacity_mbps:g}",
                "--stats-interval-s",
                "0.5",
                "--shutdown-grace-s",
                "0",
            ]
            if shape.egress_cap_mbps is not None:
                args += ["--egress-cap-mbps", f"{shape.egress_cap_mbps:g}"]
            services.append(await ServiceProcess.start(shape.name, args))
        origins = services[:]
        key, pub = generate_keypair(root / "publisher.key")
        data = random.Random(2026).randbytes(size_mib * MIB)
        want_sha = hashlib.sha256(data).hexdigest()
        source = root / "source" / f"{DEMO_ISSUE}.pdf"
        source.parent.mkdir(exist_ok=True)
        source.write_bytes(data)
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
        listing = ",".join(f"{o.name}={o.url}" for o in origins)
        swarm_args: list[str] = []
        if swarm:
            tracker = await ServiceProcess.start(
                "tracker",
                [
                    "tracker",
                    "--port",
                    "0",
                    "--db",
                    str(root / "tracker.db"),
                    "--interval-s",
                    "2",
                    "--min-interval-s",
                    "1",
                ],
            )
            services.append(tracker)
            swarm_args = [
                "--tracker",
                f"{tracker.url}/announce",
                "--swarm-enter-downloaders",
                f"{DEMO_SWARM_ENTER:g}",
                "--swarm-leave-downloaders",
                f"{DEMO_SWARM_LEAVE:g}",
            ]
        balancer = await ServiceProcess.start(
            "balancer",
            [
                "balancer",
                *swarm_args,
                "--origins",
                listing,
                "--algorithm",
                "alg2",
                "--port",
                "0",
                "--poll-interval-s",
                "0.5",
                "--seed",
                "47",
            ],
        )
        services.append(balancer)
        await _wait_for_directive(balancer.url, DEMO_ISSUE, timeout_s=15.0)
        trusted = {load_public_key(pub)}
        loop = asyncio.get_running_loop()
        started = loop.time()

        # a swarm peer seeds after its download only until a rule lets it go: at most
        # 10 s here; a swarm quiet for 8 s hands over to origin sections
        config = replace(DESKTOP, swarm_max_seed_s=10.0, swarm_stall_after_s=8.0)
        per_wave = -(-clients // max(1, waves))

        async def one(number: int) -> ClientRow:
            wave, place = divmod(number - 1, per_wave)
            await asyncio.sleep(wave * wave_gap_s + place * stagger_s)
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
            sha = await asyncio.to_thread(_sha256_file, result.path)
            return ClientRow(number, result, None, sha == want_sha, wave + 1)

        rows = await asyncio.gather(*(one(n) for n in range(1, clients + 1)))
        wall = loop.time() - started
        burner_cpu_s = _cpu_seconds(burner.pid)
        stats: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http:
            for origin in origins:
                async with http.get(f"{origin.url}/stats") as resp:
                    stats.append(await resp.json())
        return list(rows), stats, wall, burner_cpu_s
    finally:
        for service in reversed(services):
            await service.stop()
        stop_process(burner)
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


async def _wait_for_directive(balancer_url: str, issue_id: str, timeout_s: float) -> None:
    """Until the balancer answers a directive for the issue (all origins polled)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline:
            try:
                async with http.get(f"{balancer_url}/v1/origins") as resp:
                    doc = await resp.json()
                up = [o for o in doc["origins"] if o.get("state") == "up"]
                held = [o for o in up if issue_id in (o.get("status") or {}).get("issues", [])]
                if len(held) == len(doc["origins"]):
                    return
                last = f"{len(held)} of {len(doc['origins'])} origins up with the issue"
            except (aiohttp.ClientError, OSError, ValueError, KeyError) as err:
                last = str(err)
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the balancer did not see every origin in {timeout_s:g} s ({last})")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def print_tables(rows: list[ClientRow], stats: list[dict[str, Any]], wall_s: float) -> None:
    """The demo's two tables (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    by_origin: dict[str, int] = {}
    for row in rows:
        if row.result is not None:
            for name, n in row.result.bytes_by_origin.items():
                by_origin[name] = by_origin.get(name, 0) + n
    shapes = {s.name: s for s in DEMO_SHAPES}
    origins = Table(title="Origins (000_9aae53f3113e9bd8.txt machines A, B, C)")
    origins.add_column("origin")
    origins.add_column("shape")
    origins.add_column("transfers", justify="right")
    origins.add_column("MB served", justify="right")
    origins.add_column("MB in verified pieces", justify="right")
    for doc in stats:
        name = str(doc["name"])
        origins.add_row(
            name,
            shapes[name].description if name in shapes else "",
            str(doc["transfers_total"]),
            f"{doc['bytes_sent_total'] / 1e6:.1f}",
            f"{by_origin.get(name, 0) / 1e6:.1f}",
        )
    console.print(origins)
    clients = Table(title=f"Clients ({len(rows)}, arriving in waves)")
    clients.add_column("client", justify="right")
    clients.add_column("wave", justify="right")
    clients.add_column("mode")
    clients.add_column("s", justify="right")
    clients.add_column("origin sections MB")
    clients.add_column("web seeds MB", justify="right")
    clients.add_column("peers MB", justify="right")
    clients.add_column("left by")
    clients.add_column("ok")
    for row in rows:
        r = row.result
        if r is None:
            clients.add_row(
                str(row.number), str(row.wave), "-", "-", row.error or "", "-", "-", "-", "[red]no"
            )
            continue
        used = ", ".join(
            f"{n.removeprefix('origin-')} {b / 1e6:.0f}"
            for n, b in sorted(r.bytes_by_origin.items())
            if b > 0
        )
        mode = r.mode + (" (stalled, then origins)" if r.swarm_stalled else "")
        swarm_cols = (
            (f"{r.bytes_from_web_seeds / 1e6:.1f}", f"{r.bytes_from_peers / 1e6:.1f}")
            if r.mode == "swarm"
            else ("-", "-")
        )
        clients.add_row(
            str(row.number),
            str(row.wave),
            mode,
            f"{r.seconds:.1f}",
            used or "-",
            *swarm_cols,
            r.leave_rule or "-",
            "[green]yes" if row.sha_ok and r.verified else "[red]NO",
        )
    console.print(clients)
    results = [r.result for r in rows if r.result is not None]
    in_swarm = sum(1 for r in results if r.mode == "swarm")
    delivered = sum(r.size_bytes - r.resumed_bytes for r in results)
    served = sum(int(doc["bytes_sent_total"]) for doc in stats)
    if delivered:
        console.print(
            f"{in_swarm} of {len(rows)} clients in swarm mode; the origins served "
            f"{served / 1e6:.1f} MB (their own counters: sections, web seeds, manifests, "
            f"torrents) for {delivered / 1e6:.1f} MB delivered to the clients "
            f"({served / delivered:.2f} of it). Web seeds vs peers per client are "
            "libtorrent's per-connection tallies, approximate."
        )
    done = [r.result.seconds for r in rows if r.result is not None]
    if done:
        console.print(
            f"{len(done)}/{len(rows)} clients verified; seconds per client: "
            f"min {min(done):.1f}, median {sorted(done)[len(done) // 2]:.1f}, "
            f"max {max(done):.1f}; all done {wall_s:.1f} s after the first started"
        )


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun demo``."""
    p = subparsers.add_parser(
        "demo",
        help="three origins (machines A, B, C), a balancer and 20 clients on 127.0.0.1",
        description="Start three origins shaped like machines A, B and C of "
        "000_9aae53f3113e9bd8.txt (B with a real CPU burner beside it, C with a 3 MB/s "
        "egress cap), a balancer with Algorithm 2, publish a generated sample issue, run "
        "concurrent clients and print per-origin and per-client tables.",
    )
    p.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
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
        "--no-swarm",
        action="store_true",
        help="no tracker, origin mode only (the demo before the swarm)",
    )
    p.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="work in DIR and keep it (default: a temp folder, removed at the end)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every client ends with a verified file."""
    import logging

    if (
        args.clients < 1
        or args.size_mib < 1
        or args.stagger_s < 0
        or args.waves < 1
        or args.wave_gap_s < 0
    ):
        print(
            "pressrun demo: --clients, --size-mib and --waves must be positive, "
            "--stagger-s and --wave-gap-s not negative",
            file=sys.stderr,
        )
        return 2
    # the services' per-transfer INFO lines would drown the tables
    for name in (
        "pressrun.origin",
        "pressrun.balancer",
        "pressrun.clients",
        "pressrun.peer",
        "aiohttp.access",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    services = (
        "balancer (alg2)"
        if args.no_swarm
        else f"tracker, balancer (alg2, swarm from {DEMO_SWARM_ENTER:g} downloaders)"
    )
    print(
        f"pressrun demo: 3 origins, {services}, "
        f"{args.clients} clients in {args.waves} wave(s) {args.wave_gap_s:g} s apart, "
        f"a {args.size_mib} MiB issue; starting ...",
        flush=True,
    )
    try:
        rows, stats, wall, burner_cpu_s = asyncio.run(
            run_demo(
                clients=args.clients,
                size_mib=args.size_mib,
                stagger_s=args.stagger_s,
                keep=keep,
                waves=args.waves,
                wave_gap_s=args.wave_gap_s,
                swarm=not args.no_swarm,
            )
        )
    except Exception as err:  # every failure ends in one line and exit code 1
        print(f"pressrun demo: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print_tables(rows, stats, wall)
    print(
        f"origin-b's background load: the burner process used {burner_cpu_s:.1f} CPU-seconds "
        "(niced busy loop, running from before the origins started until the end)"
    )
    bad = [r for r in rows if r.result is None or not r.sha_ok]
    if bad:
        first = bad[0]
        print(
            f"pressrun demo: {len(bad)} of {len(rows)} clients did not end with a verified "
            f"file (client {first.number}: {first.error or 'SHA-256 mismatch'})",
            file=sys.stderr,
        )
        return 1
    with contextlib.suppress(OSError):
        os.sync()
    return 0
