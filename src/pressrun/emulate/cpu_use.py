"""Where the host's CPU went during a run: how busy the host was, how much the engine's
containers took, and that split by component (issue 28): the multicast sender, the
origins, the balancers, the trackers and supernodes, the other services, the desktop
clients by the mode they ended in (carousel readers, swarm, origin), the phones, and
outside the containers the engine (dockerd, containerd, the shims), this run's own
process with its docker commands, and the rest of the host. An operator reads it to
judge whether a run was bound by the host's CPU, and by what.

How it is counted, every `CPU_SAMPLE_INTERVAL_S`:

- the host: /proc/stat (busy and all, and the softirq part of busy: the network's
  bridges, veths and qdiscs, counted within whatever it interrupted);
- each container: its cgroup v1 ``cpuacct.usage`` under the engine's cgroup (the
  container's id from ``docker ps`` at the first sample: every service and client
  container exists by then), and each of its processes' ``utime + stime`` by process
  name (``comm``; a Chromium process with its ``--type``), so a phone's renderer, its
  GPU process, its Playwright driver and its Python are told apart. What the cgroup
  took beyond the processes seen is ``short_lived_cores`` (processes that lived less
  than a sample interval: a service's healthcheck, a client's ``tc``). A container's
  cgroup goes with the container, so what a client did in the last sample interval
  before it exited (2 s at most) is counted in the engine's total only (``containers
  not attributed``);
- the engine's processes: those whose command line names the engine's socket folder
  (dockerd, containerd, the shims) with the children they waited for (``runc`` for
  each exec and healthcheck), and this process with its docker commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CPU_SAMPLE_INTERVAL_S = 2.0
#: the engine's processes are looked for again every this many samples (a shim is
#: started with each container; most before the first client)
ENGINE_RESCAN_SAMPLES = 15
#: the busiest stretch of the run the report splits by component too (seconds)
PEAK_WINDOW_S = 30.0
#: a compose service -> the component its CPU counts under
SERVICE_COMPONENTS = {
    "multicast": "sender",
    "origin-a": "origins",
    "origin-b": "origins",
    "origin-c": "origins",
    "balancer": "balancers",
    "balancer-2": "balancers",
    "tracker-1": "trackers, supernodes, redis",
    "tracker-2": "trackers, supernodes, redis",
    "supernode-1": "trackers, supernodes, redis",
    "supernode-2": "trackers, supernodes, redis",
    "redis": "trackers, supernodes, redis",
}
OTHER_SERVICES = "other services (reader, turn, subscriptions, prometheus, relay)"
#: a desktop client's component by the mode it ended in
MODE_COMPONENTS = {
    "multicast": "carousel readers",
    "swarm": "swarm clients",
    "origin": "origin clients",
}
PHONES = "phones (headless Chromium)"
AMT_READERS = "AMT readers"
NO_RESULT = "clients without a result"
ENGINE = "engine (dockerd, containerd, shims)"
ORCHESTRATOR = "this run's process and its docker commands"
UNATTRIBUTED = "containers not attributed (exited within a sample)"
HOST_OTHER = "the host's other processes and kernel threads"


def read_cpu(cgroup: Path | None) -> tuple[float, float, float | None]:
    """The host's CPU seconds so far, all cores: busy (user, nice, system, irq, softirq,
    steal) and in all (idle and iowait too), from /proc/stat; and the CPU seconds of
    the containers under ``cgroup`` (cgroup v1 ``cpuacct.usage``; None: not readable)."""
    busy, every, _ = _proc_stat()
    containers: float | None = None
    if cgroup is not None:
        with contextlib.suppress(OSError, ValueError):
            containers = int((cgroup / "cpuacct.usage").read_text()) / 1e9
    return busy, every, containers


def _proc_stat() -> tuple[float, float, float]:
    """Busy, all and softirq CPU seconds of the host so far (/proc/stat's first line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = (user + nice + system + irq + softirq + steal) / tick
    return busy, busy + (idle + iowait) / tick, softirq / tick


def process_cpu(stat: str, *, children: bool = False) -> tuple[str, int, float]:
    """A /proc/PID/stat line's process name, start time (clock ticks since boot: a pid
    with another start time is another process) and CPU seconds: its own user and
    system time, and with ``children`` its waited-for children's too."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17,
    # starttime 22
    ticks = sum(int(x) for x in rest[11 : 15 if children else 13])
    return name, int(rest[19]), ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Counters:
    """Cumulative CPU seconds of each thing followed: the first value seen in the run
    and the last (one seen first after the run's first sample started in it: from 0)."""

    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def see(self, key: str, seconds: float, *, born_in_run: bool) -> None:
        """Record ``key``'s cumulative seconds now."""
        self.first.setdefault(key, 0.0 if born_in_run else seconds)
        self.last[key] = seconds

    def used(self, key: str) -> float:
        """Seconds ``key`` used between its first and last sample."""
        return max(0.0, self.last.get(key, 0.0) - self.first.get(key, 0.0))


@dataclass
class CpuUse:
    """What the sampler saw: the host's series (``[(t, busy_s, all_s, containers_s)]``),
    the softirq seconds, and per-container, per-process and host-process counters."""

    series: list[tuple[float, float, float, float | None]] = field(default_factory=list)
    softirq: Counters = field(default_factory=Counters)
    #: container name -> its cgroup's seconds
    containers: Counters = field(default_factory=Counters)
    #: "container\0comm\0pid\0start" -> the process's seconds
    processes: Counters = field(default_factory=Counters)
    #: ENGINE or ORCHESTRATOR + "\0pid\0start" -> seconds
    host: Counters = field(default_factory=Counters)
    samples: int = 0
    #: container name -> [(sample index, its cgroup's seconds)], for the busiest window
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    #: "pid\0start" -> a Chromium process's name with its type (`chromium_label`)
    labels: dict[str, str] = field(default_factory=dict)


def container_ids(docker_ps: str) -> dict[str, str]:
    """``docker ps --no-trunc --format '{{.ID}} {{.Names}}'``'s output as id -> name."""
    out = {}
    for line in docker_ps.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def _engine_pids(run_dir: str) -> list[int]:
    """The host's processes whose command line names the engine's socket folder."""
    pids = []
    needle = run_dir.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(entry.path, "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def sample_once(
    use: CpuUse,
    t: float,
    cgroup: Path | None,
    ids: Mapping[str, str],
    engine_pids: Iterable[int],
) -> None:
    """One sample of everything `CpuUse` follows (blocking file reads: in a thread)."""
    busy, every, containers = read_cpu(cgroup)
    _, _, softirq = _proc_stat()
    first = use.samples == 0
    use.series.append((t, busy, every, containers))
    use.softirq.see("softirq", softirq, born_in_run=False)
    use.samples += 1
    if cgroup is not None:
        for cid, name in ids.items():
            group = cgroup / cid
            with contextlib.suppress(OSError, ValueError):
                seconds = int((group / "cpuacct.usage").read_text()) / 1e9
                use.containers.see(name, seconds, born_in_run=False)
                use.history.setdefault(name, []).append((use.samples - 1, seconds))
                for member in (group / "cgroup.procs").read_text().split():
                    _see_process(
                        use.processes, name, int(member), born_in_run=not first,
                        labels=use.labels,
                    )  # fmt: skip
    for pid in engine_pids:  # with the runc processes each shim waited for
        _see_process(use.host, ENGINE, pid, born_in_run=not first, children=True)
    # with its docker commands, waited for by it
    _see_process(use.host, ORCHESTRATOR, os.getpid(), born_in_run=False, children=True)


def _see_process(
    counters: Counters,
    owner: str,
    pid: int,
    *,
    born_in_run: bool,
    children: bool = False,
    labels: dict[str, str] | None = None,
) -> None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        name, start, seconds = process_cpu(stat, children=children)
        if labels is not None and name.startswith("chrom"):
            # a phone's Chromium by process type: the page's renderer, the GPU
            # process, the network service ... (read once per process)
            ident = f"{pid}\0{start}"
            if ident not in labels:
                labels[ident] = chromium_label(name, Path(f"/proc/{pid}/cmdline").read_bytes())
            name = labels[ident]
        counters.see(f"{owner}\0{name}\0{pid}\0{start}", seconds, born_in_run=born_in_run)


def chromium_label(name: str, cmdline: bytes) -> str:
    """A Chromium process's name with its ``--type`` (and a utility's sub-type): the
    browser process has none."""
    kind, sub = "browser", ""
    for arg in cmdline.decode(errors="replace").split("\0"):
        if arg.startswith("--type="):
            kind = arg.removeprefix("--type=")
        elif arg.startswith("--utility-sub-type="):
            sub = arg.removeprefix("--utility-sub-type=").rsplit(".", 1)[-1]
    return f"{name} {kind}" + (f" {sub}" if sub else "")


async def sample_cpu(
    use: CpuUse,
    t0: float,
    cgroup: Path | None,
    list_containers: Callable[[], str] | None = None,
    run_dir: str | None = None,
) -> None:
    """Every `CPU_SAMPLE_INTERVAL_S` until cancelled, `sample_once`. ``list_containers``
    (blocking; None: the containers are not told apart) gives ``docker ps``'s output
    for `container_ids`; ``run_dir``: the engine's socket folder (None: its processes
    are not counted apart)."""
    loop = asyncio.get_running_loop()
    ids: dict[str, str] = {}
    if list_containers is not None and cgroup is not None:
        with contextlib.suppress(Exception):  # the split is a figure, never a failure
            ids = container_ids(await asyncio.to_thread(list_containers))
    engine_pids: list[int] = []
    while True:
        if run_dir is not None and use.samples % ENGINE_RESCAN_SAMPLES == 0:
            with contextlib.suppress(OSError):
                engine_pids = await asyncio.to_thread(_engine_pids, run_dir)
        try:
            await asyncio.to_thread(sample_once, use, loop.time() - t0, cgroup, ids, engine_pids)
        except (OSError, ValueError):
            pass
        except Exception:  # a figure of the report must never end a run, nor its series
            log.exception("a CPU sample failed")
        await asyncio.sleep(CPU_SAMPLE_INTERVAL_S)


def component_of(container: str, clients: Mapping[str, str]) -> str:
    """A container's component: a client's from ``clients`` (container -> component),
    a service's from `SERVICE_COMPONENTS` (compose names it ``<project>_<service>_1``;
    neither a project's nor a service's name has an underscore)."""
    if container in clients:
        return clients[container]
    parts = container.split("_")
    return SERVICE_COMPONENTS.get(parts[1] if len(parts) == 3 else "", OTHER_SERVICES)


def cpu_summary(
    use: CpuUse | Sequence[tuple[float, float, float, float | None]],
    clients: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The host's CPU over the run, in cores: how many it has, how many were busy on
    average, how many the emulation's containers took (None: not counted), the split
    by component (``by_component``: cores, with ``clients`` counted in each and
    ``cpu_s_each``), the processes' names in each (``by_process``), the softirq part
    of the busy cores, and the samples (``[t, busy_s, all_s, containers_s]``,
    cumulative seconds). ``clients``: each client container's component."""
    if not isinstance(use, CpuUse):
        use = CpuUse(series=list(use))
    series = use.series
    out: dict[str, Any] = {"cores": None, "busy_cores": None, "containers_cores": None}
    if len(series) >= 2:
        (t0, busy0, all0, c0), (t1, busy1, all1, c1) = series[0], series[-1]
        dt = t1 - t0
        if dt > 0:
            out["cores"] = round((all1 - all0) / dt, 1)
            out["busy_cores"] = round((busy1 - busy0) / dt, 2)
            if c0 is not None and c1 is not None:
                out["containers_cores"] = round((c1 - c0) / dt, 2)
            if use.containers.last or use.host.last:
                out.update(_by_component(use, dt, clients or {}))
                out["busiest"] = busiest_window(use, clients or {})
    out["series"] = [
        [round(t, 1), round(b, 2), round(a, 2), None if c is None else round(c, 2)]
        for t, b, a, c in series
    ]
    return out


def _by_component(use: CpuUse, dt: float, clients: Mapping[str, str]) -> dict[str, Any]:
    seconds: dict[str, float] = {}
    counted: dict[str, int] = {}
    for name in use.containers.last:
        part = component_of(name, clients)
        seconds[part] = seconds.get(part, 0.0) + use.containers.used(name)
        if name in clients:
            counted[part] = counted.get(part, 0) + 1
    by_process: dict[str, dict[str, float]] = {}
    for key in use.processes.last:
        name, comm = key.split("\0")[:2]
        part = component_of(name, clients)
        names = by_process.setdefault(part, {})
        names[comm] = names.get(comm, 0.0) + use.processes.used(key)
    # what a component's cgroup took beyond its processes seen: processes that lived
    # less than a sample interval (a service's healthcheck, a client's tc at its start)
    short_lived = {
        part: max(0.0, seconds.get(part, 0.0) - sum(names.values()))
        for part, names in by_process.items()
    }
    for key in use.host.last:
        owner = key.split("\0")[0]
        seconds[owner] = seconds.get(owner, 0.0) + use.host.used(key)
    (_, busy0, _, c0), (_, busy1, _, c1) = use.series[0], use.series[-1]
    in_containers = sum(use.containers.used(n) for n in use.containers.last)
    if c0 is not None and c1 is not None:
        seconds[UNATTRIBUTED] = max(0.0, (c1 - c0) - in_containers)
        in_containers = c1 - c0
    outside = sum(seconds.get(k, 0.0) for k in (ENGINE, ORCHESTRATOR))
    seconds[HOST_OTHER] = max(0.0, (busy1 - busy0) - in_containers - outside)
    return {
        "by_component": {
            part: {
                "cores": round(s / dt, 3),
                **(
                    {"clients": counted[part], "cpu_s_each": round(s / counted[part], 1)}
                    if part in counted
                    else {}
                ),
                **(
                    {"short_lived_cores": round(short_lived[part] / dt, 3)}
                    if part in short_lived
                    else {}
                ),
            }
            for part, s in sorted(seconds.items(), key=lambda kv: -kv[1])
        },
        "by_process": {
            part: {
                comm: round(s / dt, 3)
                for comm, s in sorted(names.items(), key=lambda kv: -kv[1])
                if s / dt >= 0.001
            }
            for part, names in sorted(by_process.items())
        },
        "softirq_cores": round(use.softirq.used("softirq") / dt, 3),
    }


def busiest_window(
    use: CpuUse, clients: Mapping[str, str], window_s: float = PEAK_WINDOW_S
) -> dict[str, Any] | None:
    """The ``window_s`` of the run in which the host was busiest (from sample to sample)
    and, in it, the busy cores, the containers' and theirs by component (None: the run
    was shorter, or its containers were not told apart)."""
    series = use.series
    best: tuple[float, int, int] | None = None
    j = 0
    for i in range(len(series)):
        j = max(j, i + 1)
        while j < len(series) and series[j][0] - series[i][0] < window_s:
            j += 1
        if j >= len(series):
            break
        dt = series[j][0] - series[i][0]
        busy = (series[j][1] - series[i][1]) / dt
        if best is None or busy > best[0]:
            best = (busy, i, j)
    if best is None or not use.history:
        return None
    busy, i, j = best
    dt = series[j][0] - series[i][0]
    cores: dict[str, float] = {}
    for name, seen in use.history.items():
        part = component_of(name, clients)
        cores[part] = cores.get(part, 0.0) + (_at(seen, j) - _at(seen, i)) / dt
    c_i, c_j = series[i][3], series[j][3]
    return {
        "from_s": round(series[i][0], 1),
        "to_s": round(series[j][0], 1),
        "busy_cores": round(busy, 2),
        "containers_cores": None if c_i is None or c_j is None else round((c_j - c_i) / dt, 2),
        "by_component": {
            part: round(c, 3) for part, c in sorted(cores.items(), key=lambda kv: -kv[1])
        },
    }


def _at(seen: list[tuple[int, float]], k: int) -> float:
    """A container's cumulative seconds at sample ``k``: the last read at or before it
    (the first read, before it was read at all)."""
    value = seen[0][1]
    for index, seconds in seen:
        if index > k:
            break
        value = seconds
    return value


def components_line(name: str, cpu: Mapping[str, Any]) -> str:
    """The console's line of where the CPU went (`cpu_summary`'s ``by_component``)."""
    parts = []
    for part, entry in cpu["by_component"].items():
        if entry["cores"] < 0.005:
            continue
        each = f" ({entry['clients']} x {entry['cpu_s_each']:g} s)" if "clients" in entry else ""
        parts.append(f"{part} {entry['cores']:.2f}{each}")
    line = (
        f"{name}: CPU by component, cores of {cpu['cores']:g}: "
        + "; ".join(parts)
        + f" (softirq within these: {cpu['softirq_cores']:.2f})"
    )
    peak = cpu.get("busiest")
    if peak:
        line += (
            f"; the busiest {peak['to_s'] - peak['from_s']:.0f} s ({peak['from_s']:g}-"
            f"{peak['to_s']:g} s): {peak['busy_cores']:g} busy, the containers "
            f"{peak['containers_cores']}: "
            + "; ".join(f"{p} {c:.2f}" for p, c in peak["by_component"].items() if c >= 0.005)
        )
    return line
