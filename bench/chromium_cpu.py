"""The CPU a crowd of browser pages costs, for bench/reader_swarm.py: the host's busy
cores, this bench's Chromium processes by kind and by thread (/proc), its own event
loop's lag, and DevTools CPU profiles of the first pages (where the pages'
JavaScript spends its time)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from pressrun.demo.readers import BrowserReaders
from pressrun.emulate.cpu_use import read_cpu


def loadavg() -> str:
    """The first three fields of /proc/loadavg."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _process_kind(pid: int) -> str:
    """A Chromium process's kind from its command line: browser, renderer, gpu, network
    (the network service, where a WebRTC page's UDP sockets are), utility (others)."""
    try:  # Chromium rewrites its process title: the arguments joined by spaces
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return "?"
    kind = next((a.decode()[7:] for a in args if a.startswith(b"--type=")), "browser")
    if kind == "utility":
        sub = next((a.decode() for a in args if a.startswith(b"--utility-sub-type=")), "")
        return "network" if "network" in sub else "utility"
    return {"gpu-process": "gpu"}.get(kind, kind)


def _descendants_cpu(root: int) -> dict[int, tuple[str, float]]:
    """(kind, CPU seconds (user + system)) of each Chromium process below ``root``."""
    parent: dict[int, int] = {}
    stats: dict[int, tuple[str, float]] = {}
    tick = float(os.sysconf("SC_CLK_TCK"))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parent[pid] = int(rest[1])
        stats[pid] = (comm, (int(rest[11]) + int(rest[12])) / tick)
    out: dict[int, tuple[str, float]] = {}
    for pid, (comm, cpu) in stats.items():
        if "chrom" not in comm and "headless" not in comm:
            continue
        up, hops = parent.get(pid, 0), 0
        while up not in (0, 1, root) and hops < 64:
            up, hops = parent.get(up, 0), hops + 1
        if up == root:
            out[pid] = (_process_kind(pid), cpu)
    return out


def _threads_cpu(pids: dict[int, tuple[str, float]]) -> dict[tuple[int, int], tuple[str, float]]:
    """("kind/thread name", CPU seconds) of each thread of the processes ``pids``
    (kind as _process_kind's): which of Chromium's threads the swarm keeps busy."""
    tick = float(os.sysconf("SC_CLK_TCK"))
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for pid, (kind, _) in pids.items():
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    text = (task / "stat").read_text()
                    name = text[text.index("(") + 1 : text.rindex(")")]
                    rest = text[text.rindex(")") + 2 :].split()
                    cpu = (int(rest[11]) + int(rest[12])) / tick
                    out[(pid, int(task.name))] = (f"{kind}/{name.rstrip('0123456789')}", cpu)
    return out


def chromium_cpu_now() -> float:
    """The CPU seconds this process's Chromium processes have used so far (those alive)."""
    return sum(cpu for _, cpu in _descendants_cpu(os.getpid()).values())


def chromium_threads_now() -> dict[tuple[int, int], tuple[str, float]]:
    """("kind/thread name", CPU seconds so far) of each thread of this process's
    Chromium processes (those alive): two readings apart, threads_spent."""
    return _threads_cpu(_descendants_cpu(os.getpid()))


def threads_spent(
    before: dict[tuple[int, int], tuple[str, float]],
    after: dict[tuple[int, int], tuple[str, float]],
    top: int = 10,
) -> dict[str, float]:
    """The CPU seconds each "kind/thread name" spent between two chromium_threads_now
    readings, the ``top`` busiest (a thread that ended meanwhile is not counted)."""
    out: dict[str, float] = {}
    for key, (name, cpu) in after.items():
        out[name] = out.get(name, 0.0) + cpu - before.get(key, (name, 0.0))[1]
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])


class CpuMeter:
    """The host's mean busy cores and this bench's Chromium CPU seconds over a span
    (sampled every 2 s: a Chromium process that ends takes its count with it)."""

    def __init__(self) -> None:
        self.host_start = read_cpu(None)[:2]  # the host's (busy, all) CPU seconds
        self.chromium: dict[int, tuple[str, float]] = {}
        self.threads: dict[tuple[int, int], tuple[str, float]] = {}
        self.task: asyncio.Task[None] | None = None
        self.lag_task: asyncio.Task[None] | None = None
        #: the most this process's event loop was late waking a 0.25 s sleep
        self.loop_lag_max_s = 0.0

    async def _lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.25)
            self.loop_lag_max_s = max(self.loop_lag_max_s, loop.time() - before - 0.25)

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a sample lost is not the bench's end
                procs = await asyncio.to_thread(_descendants_cpu, os.getpid())
                self.chromium.update(procs)
                self.threads.update(await asyncio.to_thread(_threads_cpu, procs))
            await asyncio.sleep(2.0)

    def start(self) -> None:
        """Sample the Chromium processes every 2 s from now."""
        self.task = asyncio.get_running_loop().create_task(self._sample())
        self.lag_task = asyncio.get_running_loop().create_task(self._lag())

    def stop(self) -> None:
        """Stop sampling."""
        for task in (self.task, self.lag_task):
            if task is not None:
                task.cancel()

    def chromium_cpu_s(self) -> float:
        """This bench's Chromium processes' CPU seconds, all of them."""
        return sum(cpu for _, cpu in self.chromium.values())

    def chromium_by_kind(self) -> dict[str, float]:
        """The same by process kind (renderer: the pages; network: the network service)."""
        out: dict[str, float] = {}
        for kind, cpu in self.chromium.values():
            out[kind] = out.get(kind, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def chromium_threads(self, top: int = 12) -> dict[str, float]:
        """Chromium's CPU seconds by "kind/thread name", the ``top`` busiest."""
        out: dict[str, float] = {}
        for name, cpu in self.threads.values():
            out[name] = out.get(name, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])

    def busy_cores(self) -> float:
        """Mean busy cores since the meter was made."""
        busy0, all0 = self.host_start
        busy1, all1 = read_cpu(None)[:2]
        return (busy1 - busy0) / max(1e-9, all1 - all0) * (os.cpu_count() or 1)


class PageProfiles:
    """CPU profiles of the first ``count`` readers' pages (Chromium's DevTools profiler,
    ``Profiler.start``/``stop`` through a CDP session per page), written as
    ``reader-N.cpuprofile`` (open in DevTools) and summed up by function: where the
    pages' JavaScript spends its time."""

    def __init__(self, fleet: BrowserReaders, count: int, out: Path) -> None:
        self.fleet, self.count, self.out = fleet, count, out
        self.sessions: list[tuple[int, Any]] = []
        self.task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        seen: set[int] = set()
        while len(self.sessions) < self.count:
            for number, context in enumerate(list(self.fleet._contexts)[: self.count], 1):
                if number in seen or not context.pages:
                    continue
                seen.add(number)
                page = context.pages[0]
                with contextlib.suppress(Exception):
                    cdp = await page.context.new_cdp_session(page)
                    await cdp.send("Profiler.enable")
                    await cdp.send("Profiler.setSamplingInterval", {"interval": 1000})
                    await cdp.send("Profiler.start")
                    self.sessions.append((number, cdp))
            await asyncio.sleep(0.1)

    def start(self) -> None:
        """Profile each of the first ``count`` pages from the moment it opens."""
        if self.count > 0:
            self.task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> dict[str, float]:
        """Stop the profiles, write them, and return the self time (s) of the pages'
        functions summed over the pages, most first."""
        if self.task is not None:
            self.task.cancel()
        total: dict[str, float] = {}
        for number, cdp in self.sessions:
            try:
                prof = (await asyncio.wait_for(cdp.send("Profiler.stop"), 30.0))["profile"]
            except Exception as err:  # a page gone is only a profile lost
                print(f"reader {number}'s profile lost: {err}")
                continue
            (self.out / f"reader-{number}.cpuprofile").write_text(json.dumps(prof))
            for name, secs in profile_self_times(prof).items():
                total[name] = total.get(name, 0.0) + secs
        return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def profile_self_times(prof: dict[str, Any]) -> dict[str, float]:
    """Self time (s) by function (``name file:line``) of a DevTools ``Profile``."""
    nodes = {n["id"]: n["callFrame"] for n in prof["nodes"]}
    out: dict[str, float] = {}
    for node_id, delta in zip(prof.get("samples", []), prof.get("timeDeltas", []), strict=False):
        frame = nodes[node_id]
        name = frame.get("functionName") or "(anonymous)"
        where = frame.get("url", "").rsplit("/", 1)[-1]
        key = f"{name} {where}:{frame.get('lineNumber', -1) + 1}" if where else name
        out[key] = out.get(key, 0.0) + delta / 1e6
    return out
