"""The loopback swarm bench's harness over several processes, and what it measures of
itself.

`bench/swarm.py` ran every peer, the supernodes, the tracker and the origin in one
process: at N = 80 that process used 1.5 of the machine's 2 cores with its event loop
up to 1.3 s late (docs/chord.md), so the figure measured the harness as much as the
swarm. Here:

- the parent keeps the tracker and the origins (and their egress token bucket);
- the ring's supernodes run in a process of their own (`--role supernodes`);
- the peers run in worker processes of at most ``peers_per_proc`` each
  (`--role peers`), every session made and listening before a common start time
  (the same monotonic clock for every process on the host), so every peer's clock
  runs from the same moment as in the one-process bench;
- every process measures its CPU (user + system, libtorrent's threads included), its
  event loop thread's CPU and the loop's lag (how late a 50 ms sleep wakes), and the
  parent samples the whole machine's busy CPU from ``/proc/stat``.

`verdict` refuses a run whose harness was saturated: a process's loop lag p99 above
`MAX_LAG_P99_MS` or a loop thread above `MAX_LOOP_CPU` of a core (a process starved of
CPU wakes late, its libtorrent threads with it). A refused run is printed with its
figures and the reason and left out of the medians: it measured the machine, not the
swarm. The machine's busy CPU (other people's work included) is printed beside every
run and flagged above `MAX_MACHINE_BUSY`, not refused for: on this shared machine it
was above 95% all night while the harness's loops stayed on time.

Workers talk JSON lines over stdin/stdout: the spec in, ``ready``, the ``go`` time in,
the result out (for a traced run, with the worker's events: `bench/swarm_trace.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

#: a run is refused when any harness process's event loop was later than this at the
#: 99th percentile (one-process runs at N = 40 had 78-94 ms; at N = 80 757 ms)
MAX_LAG_P99_MS = 250.0
#: ... or its event loop thread used more than this share of a core
MAX_LOOP_CPU = 0.85
#: the whole machine's CPU busy above this share of all cores over the run is flagged
MAX_MACHINE_BUSY = 0.92
#: seconds from every worker's ``ready`` to the common start (time to read the line)
GO_AFTER_S = 0.3


class LoopLoad:
    """A process's CPU and its event loop's lag over one run.

    CPU: user + system seconds of the whole process (libtorrent's threads included)
    and of the event loop's thread alone (the Python adapters), over the run's wall
    time; a share near 1.0 of the loop thread means the Python side is saturated.
    Lag: how late a 50 ms sleep wakes up (median, 99th percentile, max).
    """

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self.process_cpu_share = 0.0
        self.loop_cpu_share = 0.0

    async def __aenter__(self) -> LoopLoad:
        self._wall = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self._cpu = ru.ru_utime + ru.ru_stime
        self._thread = time.thread_time()
        self._task = asyncio.get_running_loop().create_task(self._sample())
        return self

    async def _sample(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.05)
            self.lags.append(time.perf_counter() - t - 0.05)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        wall = max(1e-6, time.perf_counter() - self._wall)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.process_cpu_share = (ru.ru_utime + ru.ru_stime - self._cpu) / wall
        self.loop_cpu_share = (time.thread_time() - self._thread) / wall

    def figures(self) -> dict[str, float]:
        """The run's figures for the table."""
        lags = sorted(self.lags) or [0.0]
        return {
            "cpu_process": self.process_cpu_share,
            "cpu_loop": self.loop_cpu_share,
            "lag_p50_ms": 1000 * statistics.median(lags),
            "lag_p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))],
            "lag_max_ms": 1000 * lags[-1],
        }


class MachineCpu:
    """The whole machine's busy CPU between `start` and `stop`, from ``/proc/stat``
    (every process, other people's work included, niced ones left out): busy share of
    all cores."""

    @staticmethod
    def _read() -> tuple[int, int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        # idle + iowait, and niced time: a niced process (someone's background
        # spinner) yields to the bench's processes, though not wholly (a nice 5
        # process weighs a third of a nice 0 one): printed apart, `machine_nice`
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0) + fields[1]
        return sum(fields), idle, fields[1]

    @staticmethod
    def _pressure() -> float:
        # the kernel's CPU pressure (PSI): microseconds in which at least one runnable
        # task waited for a CPU (0 where the kernel has no PSI)
        try:
            with open("/proc/pressure/cpu") as f:
                some = f.readline().split()
        except OSError:
            return 0.0
        return float(some[-1].partition("=")[2]) / 1e6

    def start(self) -> None:
        self._a = self._read()
        self._load = os.getloadavg()[0]
        self._psi = self._pressure()
        self._wall = time.monotonic()

    def stop(self) -> dict[str, float]:
        """``machine_busy`` (0..1 of all cores), ``cpu_pressure`` (0..1 of the wall time
        some task waited for a CPU), ``cores``, the load average at both ends."""
        total_b, idle_b, nice_b = self._read()
        total_a, idle_a, nice_a = self._a
        dt = max(1, total_b - total_a)
        return {
            "machine_busy": 1 - (idle_b - idle_a) / dt,
            "machine_nice": (nice_b - nice_a) / dt,
            # share of the run's wall time in which some task waited for a CPU
            "cpu_pressure": (self._pressure() - self._psi)
            / max(1e-6, time.monotonic() - self._wall),
            "cores": float(os.cpu_count() or 1),
            "load_start": self._load,
            "load_end": os.getloadavg()[0],
        }


class LoopWatchdog:
    """Where a process's event loop thread is while the loop is late (``--watchdog-ms``).

    A callback on the loop stamps the time every 20 ms; a thread checks the stamp every
    20 ms and, once the loop is ``threshold_ms`` late, takes the loop thread's stack
    (`sys._current_frames`) and its CPU clock. A stall whose loop thread used little CPU
    was blocked (a system call, a lock) or waiting for a CPU; one that used the whole
    stall was busy in Python: the stacks say where. Printed to stderr at the end.
    """

    def __init__(self, threshold_ms: float) -> None:
        self.threshold_s = threshold_ms / 1000
        self.stalls: list[dict[str, Any]] = []
        self._beat = time.monotonic()
        self._stop = threading.Event()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ident = threading.get_ident()
        self._tid = threading.get_native_id()
        self._started = time.monotonic()
        self._clock = time.pthread_getcpuclockid(self._ident)

        def beat() -> None:
            self._beat = time.monotonic()
            if not self._stop.is_set():
                loop.call_later(0.02, beat)

        beat()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        stall: dict[str, Any] | None = None
        while not self._stop.wait(0.02):
            late = time.monotonic() - self._beat
            if late < self.threshold_s:
                if stall is not None:
                    stall["cpu_s"] = time.clock_gettime(self._clock) - stall["cpu_at"]
                    stall["late_s"] = stall["last_late"]
                    self.stalls.append(stall)
                    stall = None
                continue
            frame = sys._current_frames().get(self._ident)
            stack = "".join(traceback.format_stack(frame)[-12:]) if frame else "?"
            if stall is None:
                stall = {
                    "at": time.monotonic() - self._started,
                    "cpu_at": time.clock_gettime(self._clock),
                    "stacks": {},
                    "states": {},
                }
            # the loop thread's scheduler state: R (running or waiting for a CPU),
            # S (asleep: a system call, a lock, the GIL), D (disk)
            state = _thread_state(self._tid)
            stall["states"][state] = stall["states"].get(state, 0) + 1
            stall["last_late"] = late
            stall["stacks"][stack] = stall["stacks"].get(stack, 0) + 1

    def stop(self) -> None:
        """Stop watching and print the stalls (longest first) to stderr."""
        self._stop.set()
        out = sys.stderr
        states: dict[str, int] = {}
        for st in self.stalls:
            for k, v in st["states"].items():
                states[k] = states.get(k, 0) + v
        late = sum(st["late_s"] for st in self.stalls)
        cpu = sum(st["cpu_s"] for st in self.stalls)
        print(
            f"watchdog: {len(self.stalls)} stalls above {self.threshold_s * 1000:.0f} ms, "
            f"{late:.1f} s late in all, the loop thread's CPU in them {cpu:.2f} s; "
            f"its states sampled in them {states}",
            file=out,
        )
        for s in sorted(self.stalls, key=lambda s: -s["late_s"])[:8]:
            print(
                f"--- stall {s['late_s'] * 1000:.0f} ms, loop thread CPU in it "
                f"{s['cpu_s'] * 1000:.0f} ms (from the threshold on), at {s['at']:.1f} s, "
                f"thread states {s['states']}",
                file=out,
            )
            for stack, count in sorted(s["stacks"].items(), key=lambda kv: -kv[1])[:3]:
                print(f"  [{count} samples]\n{stack}", file=out)
        out.flush()


def _thread_state(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return "?"


def verdict(loads: dict[str, dict[str, float]]) -> str | None:
    """Why this run's harness was saturated (None: it was not). ``loads``: each
    process's `LoopLoad.figures`, by name."""
    why = []
    for name, f in loads.items():
        if f["lag_p99_ms"] > MAX_LAG_P99_MS:
            why.append(f"{name} loop lag p99 {f['lag_p99_ms']:.0f} ms > {MAX_LAG_P99_MS:.0f}")
        if f["cpu_loop"] > MAX_LOOP_CPU:
            why.append(f"{name} loop thread {f['cpu_loop']:.2f} cores > {MAX_LOOP_CPU}")
    return "; ".join(why) or None


def busy_flag(machine: dict[str, float]) -> str:
    """A note when the machine (every process on it) was busier than `MAX_MACHINE_BUSY`."""
    if machine["machine_busy"] <= MAX_MACHINE_BUSY:
        return ""
    return f" [busy machine: above {100 * MAX_MACHINE_BUSY:.0f}%]"


def load_bench(name: str) -> ModuleType:
    """A sibling bench script as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the parent's side -------------------------------------------------------------


class Worker:
    """One child process of the harness (a role and its spec)."""

    def __init__(self, name: str, spec: dict[str, Any], *, own_session: bool = False) -> None:
        self.name = name
        self.spec = spec
        # a session of its own (setsid): with the kernel's autogroup scheduling on, its
        # own scheduling group, sharing the CPU with the other processes' groups as a
        # host of its own would not share it at all (`own_sessions`)
        self.own_session = own_session
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start it and send the spec; returns once it said ``ready``."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 30,  # (a traced worker's events come in one line)
            start_new_session=self.own_session,
        )
        await self.send(self.spec)
        msg = await self.receive()
        if not msg.get("ready"):
            raise RuntimeError(f"{self.name}: {msg}")

    async def send(self, msg: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        await self.proc.stdin.drain()

    async def receive(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            code = await self.proc.wait()
            raise RuntimeError(f"{self.name} exited ({code}) without an answer")
        doc = json.loads(line)
        assert isinstance(doc, dict)
        return doc

    async def close(self) -> None:
        """Wait for it to exit (it does after its result); kill it after 10 s."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def split(n: int, per_proc: int) -> list[int]:
    """N peers over as few processes of at most ``per_proc`` as it takes, evenly."""
    procs = max(1, -(-n // max(1, per_proc)))
    return [n // procs + (1 if i < n % procs else 0) for i in range(procs)]


# --- the children's side -----------------------------------------------------------


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


async def _receive() -> dict[str, Any]:
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line:
        raise SystemExit("the harness went away")
    doc = json.loads(line)
    assert isinstance(doc, dict)
    return doc


async def _sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.monotonic()))


#: how long the supernodes' worker waits for its ring to settle at most (a few of the
#: ring's stabilisation intervals, `pressrun.chord.config.ChordConfig`)
RING_SETTLE_S = 10.0


async def ring_settled(sns: list[Any], *, limit_s: float = RING_SETTLE_S) -> float:
    """Wait until every piece key has exactly one supernode answering for it (at most
    ``limit_s``); the seconds waited. A supernode that had just joined answered for
    no key until its predecessor notified it, at that one's next stabilisation (up to
    ``stabilize_interval_s``, 2 s; since 29 Nov the core takes its predecessor from the
    lookup of its own id and the wait is a message's time): the crowd started right
    after the last join, and
    for its first two seconds a fifth of the pieces (32 of 160 with five supernodes)
    were answered ``not_mine`` and that supernode's eight bringer slots stayed empty,
    so 8 of 40 peers were handed nothing to bring in and got their first piece 1-4 s
    late (docs/results/2026-11-28-swarm-limit.md, section 14). An issue's ring is up
    before its crowd comes (beside the origins, the desktops that seed it): the bench
    measures the swarm on a settled ring, as a crowd meets it."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < limit_s:
        keys = sns[0].keys if sns else []
        if all(sum(1 for sn in sns if sn.node.answers_for(k)) == 1 for k in keys):
            break
        await asyncio.sleep(0.05)
    return loop.time() - start


async def run_supernodes(spec: dict[str, Any]) -> None:
    """``--role supernodes``: the ring's supernodes until told to stop; their stats."""
    from pressrun.chord.aio import Supernode

    sns = []
    for i in range(spec["count"]):
        sn = Supernode(
            tracker_base=spec["tracker_base"],
            info_hash=spec["info_hash"],
            num_pieces=spec["num_pieces"],
            seed=i,
            **spec["knobs"],
        )
        sns.append(sn)
        await sn.start()
        await sn.wait_on_ring()
    settle_s = await ring_settled(sns)
    _send({"ready": True})
    go = await _receive()
    await _sleep_until(go["go"])
    watchdog = LoopWatchdog(spec["watchdog_ms"]) if spec.get("watchdog_ms") else None
    if watchdog is not None:
        watchdog.start()
    async with LoopLoad() as load:
        await _receive()  # "stop"
    if watchdog is not None:
        watchdog.stop()
    for sn in sns:
        await sn.close()
    _send(
        {
            "load": load.figures(),
            "sn_lookups": sum(sn.stats.lookups for sn in sns),
            "sn_uploader_answers": sum(sn.stats.uploader_answers for sn in sns),
            "sn_requests": sum(sn.stats.client_requests for sn in sns),
            "sn_rpcs_in": sum(sn.stats.requests_in for sn in sns),
            "ring_settle_s": settle_s,
        }
    )


async def run_peers(spec: dict[str, Any]) -> None:
    """``--role peers``: this worker's share of the peers, started at the common time."""
    from pressrun.content.bundle import read_manifest
    from pressrun.peer.aio import SwarmPeer, SwarmResult
    from pressrun.peer.config import desktop_profile

    swarm_bench = load_bench("swarm")
    args = argparse.Namespace(**spec["args"])
    swarm_bench.set_chord_peer_knobs(args)
    trace: ModuleType | None = None
    if spec.get("trace"):
        trace = load_bench("swarm_trace")
        trace.bench_swarm_args_upload_bps.append(spec["config"]["upload_limit_bps"])
        trace._install()
    swarm_bench.override_session_settings(args.lt, quiet=True)
    manifest = read_manifest(Path(spec["manifest"]))
    torrent = Path(spec["torrent"]).read_bytes()
    config = desktop_profile(**spec["config"])
    work = Path(spec["work_dir"])
    peers = [
        SwarmPeer(
            torrent=torrent,
            manifest=manifest,
            partial_dir=work / "peers" / str(spec["first_index"] + i) / ".partial" / spec["issue"],
            config=config,
            tracker_url=spec["tracker_url"],
            listen_interfaces="127.0.0.1:0",
            uploader_policy=spec["policy"],
        )
        for i in range(spec["count"])
    ]
    for p in peers:
        await p.open()
    _send({"ready": True})
    go = (await _receive())["go"]
    if trace is not None:
        trace.start_sampler(go, origin=None)
    await _sleep_until(go)

    async def one(peer: SwarmPeer) -> SwarmResult:
        try:
            await peer.start()
            if not await peer.downloaded():
                return await peer.stop()
            return await peer.finished()
        finally:
            await peer.close()

    async with LoopLoad() as load:
        results = await asyncio.gather(*(one(p) for p in peers))
    ring = [s for p in peers if (s := p.ring_stats) is not None]
    _send(
        {
            "load": load.figures(),
            "results": [
                {
                    "completed": r.completed,
                    "download_s": r.download_s,
                    "leave_rule": r.leave_rule.value if r.leave_rule else "none",
                    "ratio": r.ratio,
                    "downloaded_bytes": r.downloaded_bytes,
                }
                for r in results
            ],
            "ring_requests": sum(s.requests for s in ring),
            "ring_rounds": sum(s.rounds for s in ring),
            "ring_waits": sum(s.waits for s in ring),
            # lookup batches asked of a supernode, and answers that did not come
            # (the supernode then counts as failed for that peer)
            "ring_lookups": sum(s.lookups for s in ring),
            "ring_failures": sum(s.supernode_failures for s in ring),
            "ring": bool(ring),
            "events": trace.EVENTS if trace is not None else [],
        }
    )


async def _child() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = await _receive()
    if spec["role"] == "supernodes":
        await run_supernodes(spec)
    else:
        await run_peers(spec)


if __name__ == "__main__":
    asyncio.run(_child())
