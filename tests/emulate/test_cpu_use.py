"""The emulation's CPU by component (issue 28): the host's cores, the containers' and
their processes' share by component, the engine's and this process's, and the console
line an operator judges a host-bound run by."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

import pytest

from pressrun.emulate import cpu_use
from pressrun.emulate.cpu_use import (
    ENGINE,
    HOST_OTHER,
    ORCHESTRATOR,
    OTHER_SERVICES,
    UNATTRIBUTED,
    CpuUse,
    busiest_window,
    chromium_label,
    component_of,
    components_line,
    container_ids,
    cpu_summary,
    process_cpu,
    sample_once,
)

P = "pressrun-emu-77-emulation"
CLIENTS = {f"{P}_client_1": "carousel readers", f"{P}_client_2": "carousel readers",
           f"{P}_client_3": "phones (headless Chromium)"}  # fmt: skip


def test_cpu_over_the_run_in_cores() -> None:
    # samples 2 s apart: 2 cores (4 CPU-seconds each step), 3 of them busy, the
    # containers 2 of those
    series = [(0.0, 100.0, 400.0, 50.0), (2.0, 103.0, 404.0, 52.0), (4.0, 106.0, 408.0, 54.0)]
    cpu = cpu_summary(series)
    assert cpu["cores"] == 2 and cpu["busy_cores"] == 1.5 and cpu["containers_cores"] == 1.0
    assert cpu["series"][1] == [2.0, 103.0, 404.0, 52.0]
    assert "by_component" not in cpu  # no container told apart
    # not counted (an engine of DOCKER_HOST's): the containers' share stays unknown
    assert cpu_summary([(0.0, 1.0, 2.0, None), (2.0, 2.0, 6.0, None)])["containers_cores"] is None
    assert cpu_summary([])["busy_cores"] is None


def test_a_stat_line_with_a_strange_name() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    # pid (comm) state ppid ... utime stime cutime cstime (14-17) ... starttime (22)
    fields = ["S", "1"] + ["0"] * 9 + [str(3 * tick), str(tick), str(5 * tick), "0"]
    fields += ["20", "0", "7", "0", "4242"] + ["0"] * 20
    stat = "123 (chrome (gpu) x) " + " ".join(fields)
    assert process_cpu(stat) == ("chrome (gpu) x", 4242, 4.0)
    assert process_cpu(stat, children=True) == ("chrome (gpu) x", 4242, 9.0)


def test_components_of_services_and_clients() -> None:
    assert component_of(f"{P}_multicast_1", CLIENTS) == "sender"
    assert component_of(f"{P}_origin-b_1", CLIENTS) == "origins"
    assert component_of(f"{P}_supernode-2_1", CLIENTS) == "trackers, supernodes, redis"
    assert component_of(f"{P}_prometheus_1", CLIENTS) == OTHER_SERVICES
    assert component_of(f"{P}_client_3", CLIENTS) == "phones (headless Chromium)"
    assert container_ids("abc123 x_origin-a_1\n\ndef456 x_client_9\n") == {
        "abc123": "x_origin-a_1",
        "def456": "x_client_9",
    }


def test_the_split_by_component_adds_up_to_the_busy_cores() -> None:
    use = CpuUse(series=[(0.0, 1000.0, 3000.0, 500.0), (10.0, 1018.0, 3020.0, 512.0)])
    use.softirq.see("softirq", 40.0, born_in_run=False)
    use.softirq.see("softirq", 42.0, born_in_run=False)
    # containers: two carousel readers (2 s and 4 s), a phone (3 s), the sender (2 s);
    # the engine's total grew 12 s, so 1 s is of a container gone between samples
    counts = [(f"{P}_client_1", 10.0, 12.0), (f"{P}_client_2", 0.0, 4.0),
              (f"{P}_client_3", 1.0, 4.0), (f"{P}_multicast_1", 30.0, 32.0)]  # fmt: skip
    for name, first, last in counts:
        use.containers.see(name, first, born_in_run=False)
        use.containers.see(name, last, born_in_run=False)
    use.processes.see(f"{P}_client_3\0chrome\0 10\0 1", 1.0, born_in_run=False)
    use.processes.see(f"{P}_client_3\0chrome\0 10\0 1", 3.0, born_in_run=False)
    use.processes.see(f"{P}_client_3\0node\0 11\0 1", 1.0, born_in_run=True)  # new in the run
    use.host.see(f"{ENGINE}\0dockerd\0 5\0 1", 100.0, born_in_run=False)
    use.host.see(f"{ENGINE}\0dockerd\0 5\0 1", 102.0, born_in_run=False)
    use.host.see(f"{ORCHESTRATOR}\0pressrun\0 6\0 1", 7.0, born_in_run=False)
    use.host.see(f"{ORCHESTRATOR}\0pressrun\0 6\0 1", 8.0, born_in_run=False)
    cpu = cpu_summary(use, CLIENTS)
    by = cpu["by_component"]
    assert by["carousel readers"] == {"cores": 0.6, "clients": 2, "cpu_s_each": 3.0}
    # the phone's cgroup took 3 s, its processes 2 + 1: nothing short-lived
    assert by["phones (headless Chromium)"] == {
        "cores": 0.3,
        "clients": 1,
        "cpu_s_each": 3.0,
        "short_lived_cores": 0.0,
    }
    assert by["sender"] == {"cores": 0.2}  # no process seen: none split off
    assert by[UNATTRIBUTED] == {"cores": 0.1}
    assert by[ENGINE] == {"cores": 0.2} and by[ORCHESTRATOR] == {"cores": 0.1}
    # busy 18 s: containers 12, engine 2, this process 1: the rest 3
    assert by[HOST_OTHER] == {"cores": 0.3}
    assert sum(e["cores"] for e in by.values()) == cpu["busy_cores"] == 1.8
    assert next(iter(by)) == "carousel readers"  # the largest first
    assert cpu["by_process"]["phones (headless Chromium)"] == {"chrome": 0.2, "node": 0.1}
    assert cpu["softirq_cores"] == 0.2
    line = components_line("emulation", cpu)
    assert line.startswith(
        "emulation: CPU by component, cores of 2: carousel readers 0.60 (2 x 3 s)"
    )
    assert "sender 0.20" in line and line.endswith("(softirq within these: 0.20)")


def test_one_sample_reads_the_cgroups_and_processes(tmp_path: Path) -> None:
    group = tmp_path / "abc"
    group.mkdir()
    (group / "cpuacct.usage").write_text("2500000000\n")
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (tmp_path / "cpuacct.usage").write_text("9000000000\n")
    use = CpuUse()
    ids = {"abc": f"{P}_client_1"}
    sample_once(use, 0.0, tmp_path, ids, [os.getpid()])
    (group / "cpuacct.usage").write_text("4000000000\n")
    sum(range(2_000_000))  # some CPU of this process between the samples
    sample_once(use, 2.0, tmp_path, ids, [os.getpid()])
    assert use.samples == 2 and use.series[1][3] == 9.0
    assert use.containers.used(f"{P}_client_1") == 1.5
    mine = [k for k in use.processes.last if k.startswith(f"{P}_client_1\0")]
    assert len(mine) == 1 and mine[0].split("\0")[2] == str(os.getpid())
    assert {k.split("\0")[0] for k in use.host.last} == {ENGINE, ORCHESTRATOR}


def test_the_busiest_window_split_by_component() -> None:
    # samples 10 s apart; the host busy 0.5, 1.9, 1.9, 0.4 cores in the four steps
    busy = [0.0, 5.0, 24.0, 43.0, 47.0]
    use = CpuUse(series=[(10.0 * k, b, 20.0 * k, b / 2) for k, b in enumerate(busy)])
    # a carousel reader from sample 0 on; the sender read only from sample 1 on
    use.history[f"{P}_client_1"] = [(0, 0.0), (1, 1.0), (2, 11.0), (3, 16.0), (4, 16.5)]
    use.history[f"{P}_multicast_1"] = [(1, 3.0), (2, 4.0), (3, 9.0)]  # gone after 3
    peak = busiest_window(use, CLIENTS, window_s=20.0)
    assert peak is not None
    assert (peak["from_s"], peak["to_s"], peak["busy_cores"]) == (10.0, 30.0, 1.9)
    assert peak["containers_cores"] == 0.95
    assert peak["by_component"] == {"carousel readers": 0.75, "sender": 0.3}
    # a run shorter than the window has none
    assert busiest_window(use, CLIENTS, window_s=100.0) is None


def test_chromium_processes_by_type() -> None:
    def cmd(*args: str) -> bytes:
        return "\0".join(["/usr/lib/chromium/chromium", *args, ""]).encode()

    assert chromium_label("chromium", cmd("--headless", "--no-sandbox")) == "chromium browser"
    assert chromium_label("chromium", cmd("--type=renderer", "--lang=en")) == "chromium renderer"
    utility = cmd("--type=utility", "--utility-sub-type=network.mojom.NetworkService")
    assert chromium_label("chromium", utility) == "chromium utility NetworkService"


def test_a_services_short_lived_processes(tmp_path: Path) -> None:
    # the sender's cgroup took 2.0 s, its one long-lived process (this one) much less:
    # the rest was processes gone between samples (its healthchecks)
    group = tmp_path / "abc"
    group.mkdir()
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    use = CpuUse()
    ids = {"abc": f"{P}_multicast_1"}
    for t, usage in ((0.0, 1_000_000_000), (2.0, 3_000_000_000)):
        (group / "cpuacct.usage").write_text(f"{usage}\n")
        sample_once(use, t, tmp_path, ids, [])
    by = cpu_summary(use, {})["by_component"]
    assert by["sender"]["cores"] == 1.0
    assert 0.9 <= by["sender"]["short_lived_cores"] <= 1.0


def test_the_sampler_names_the_containers_from_docker_ps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "cpuacct.usage").write_text("5\n")
    (tmp_path / "abc" / "cgroup.procs").write_text("")
    monkeypatch.setattr(cpu_use, "CPU_SAMPLE_INTERVAL_S", 0.01)
    use = CpuUse()
    # an engine socket folder no process on the host names (the official CI at 5c620c6
    # had a process naming "/nowhere", counted as the engine)
    run_dir = f"/run/pressrun-test-no-engine-{uuid.uuid4().hex}"

    async def run() -> None:
        task = asyncio.create_task(
            cpu_use.sample_cpu(use, 0.0, tmp_path, lambda: f"abc {P}_origin-a_1\n", run_dir)
        )
        while use.samples < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert set(use.containers.last) == {f"{P}_origin-a_1"}
    assert {k.split("\0")[0] for k in use.host.last} == {ORCHESTRATOR}  # no engine found
