"""bench/uptime.py (a week in an hour) cannot rot: its parts, in seconds.

The soak itself starts 11 services and Redis and runs for minutes (a 2-day run of
15-second days took 2 minutes on a 2-core machine: every service's start-up, the
readers' libtorrent sessions, a 35 s tracker outage), too long for the suite. What can
break it silently is checked here instead: every service's command line still parses
with today's ``pressrun`` flags; the week's plan restarts one service of each kind once
and steps the tracker's clock forward and back; a child under the sped clock
(libfaketime) reads the shared fast wall clock, an unsped monotonic clock and a
working ``time.sleep``; the verdict fails a store that grows and passes a flat one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def uptime() -> ModuleType:
    """bench/uptime.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("uptime_bench", ROOT / "bench" / "uptime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["uptime_bench"] = module
    spec.loader.exec_module(module)
    return module


def soak(uptime: ModuleType, tmp_path: Path, days: int = 7) -> object:
    args = argparse.Namespace(
        days=days, seconds_per_day=100.0, out=str(tmp_path), issue_mib=1, light=True, seed=1
    )
    return uptime.Soak(args)


def test_every_service_command_parses(uptime: ModuleType, tmp_path: Path) -> None:
    from pressrun.cli import build_parser

    urls = {name: f"http://127.0.0.1:{9000 + i}" for i, name in enumerate(uptime.SERVICES)}
    commands = uptime.service_commands(
        tmp_path,
        rate=864.0,
        seconds_per_day=100.0,
        publisher_key=tmp_path / "publisher.key",
        redis_url="redis://127.0.0.1:6379/0",
        control_group="239.255.1.1:5400",
        group_base="239.255.1.2",
        urls=urls,
    )
    assert set(commands) == set(uptime.SERVICES)
    parser = build_parser()
    for name, args in commands.items():
        parsed = parser.parse_args(["serve", *args])  # a renamed flag exits here
        assert parsed.service == args[0], name
        assert "--port" in args, f"{name} cannot be restarted on its port"
    # the sped clock's lifetimes: 5 real seconds of announcement, 300 of challenge
    sender = parser.parse_args(["serve", *commands["sender"]])
    assert sender.announcement_ttl_s == pytest.approx(5 * 864.0)


def test_the_week_restarts_each_kind_once_and_steps_the_clock(
    uptime: ModuleType, tmp_path: Path
) -> None:
    s = soak(uptime, tmp_path)
    labels = [label for day in range(1, 8) for _, label, _ in s.disturbances(day)]
    restarted = sorted(label.removeprefix("restart ") for label in labels if "restart" in label)
    kinds = {"origin", "tracker-sqlite", "tracker-redis", "subscriptions", "sender", "reader"}
    kinds |= {"balancer-origin", "balancer-swarm", "balancer-mc"}
    assert {n.split("-")[0] if n.startswith("origin") else n for n in restarted} == kinds
    assert len(restarted) == len(set(restarted)) == len(kinds)
    assert labels.count("step +1 h") == 1 and labels.count("step -1 h") == 1
    s.issues = ["d1", "d2", "d3"]
    plan = s.plan_day(3)
    modes = {label for _, label, _ in plan if label.endswith("reader")}
    assert modes == {"origin reader", "swarm reader", "multicast reader"}
    assert all(0 <= frac < 1 for frac, _, _ in plan)


@pytest.mark.skipif(
    not Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1").exists(),
    reason="Debian's faketime is not installed (scripts/setup-system.sh installs it)",
)
def test_a_child_reads_the_sped_clock(uptime: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(uptime.SITECUSTOMIZE)
    clock = uptime.SpedClock(tmp_path, 1000.0)
    clock.start()
    try:
        time.sleep(0.2)
        code = (
            "import json, time\n"
            "w0, m0 = time.time(), time.monotonic()\n"
            "time.sleep(0.3)\n"
            "print(json.dumps([w0, time.time() - w0, time.monotonic() - m0]))\n"
        )
        before = clock.fake_now()
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, **clock.env()},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        after = clock.fake_now()
    finally:
        clock.stop()
    wall0, wall_dt, mono_dt = json.loads(out)
    # the child's wall clock is the shared fast one (one 20 ms tick is 20 s here; a
    # loaded machine delays a tick: a quarter of a real second allowed, 250 s)...
    assert before - 250 <= wall0 <= after + 250
    # ... running 1000 times as fast, while its monotonic clock and sleeps do not
    assert 0.29 <= mono_dt < 2.0
    assert wall_dt >= 0.25 * 1000


def test_the_verdict_fails_a_store_that_grows(uptime: ModuleType, tmp_path: Path) -> None:
    s = soak(uptime, tmp_path, days=3)

    def day(n: int, rows: float) -> object:
        fig = uptime.DayFigures(n)
        fig.rss = {"tracker-sqlite": 50e6}
        fig.latency_ms = {"tracker-sqlite": [1.0] * 50}
        fig.sizes = {"tracker.db rows": rows + 2 * n, "tracker.db reader rows": rows}
        fig.sizes |= {"redis entries": 10.0 + n, "redis reader entries": 10.0}
        fig.ring_samples = fig.ring_whole = 10
        return fig

    s.issues = ["d1", "d2", "d3"]
    s.readers = [uptime.ReaderRun(1, "origin", "d1", "b", exit_code=0, got_mode="origin")]
    s.readers[0].verified = True
    s.figures = {1: day(1, 10), 2: day(2, 40), 3: day(3, 60)}
    ok, lines = s.verdict()
    assert ok, lines
    s.figures[3] = day(3, 120)  # 3 x day 2: a row per reader ever seen
    ok, lines = s.verdict()
    assert not ok
    assert any(line.startswith("GREW tracker.db reader rows") for line in lines)
    # rows that grow with the catalogue only count per issue
    s.figures[3] = day(3, 60)
    s.figures[3].sizes["tracker.db rows"] = 60 + 3 * 4.0  # 4 rows an issue, as day 2
    assert s.verdict()[0]
    s.figures[3].sizes["tracker.db rows"] = 60 + 3 * 9.0  # 9 an issue: more each issue
    assert not s.verdict()[0]
    # a multicast reader that verified through its fallbacks fails the run...
    s.figures[3].sizes["tracker.db rows"] = 60 + 3 * 4.0
    fell_back = uptime.ReaderRun(3, "multicast", "d3", "b", exit_code=0, got_mode="swarm")
    fell_back.verified, fell_back.began, fell_back.ended = True, 100.0, 130.0
    s.readers.append(fell_back)
    assert not s.verdict()[0]
    # ... unless the sender was restarted while it ran
    s.restarts = [("sender", 120.0, 121.5)]
    ok, lines = s.verdict()
    assert ok, lines
    assert any("fell back during the restart of sender" in line for line in lines)
