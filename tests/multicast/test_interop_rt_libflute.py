"""Interop with an independent RFC 6726 receiver: 5G-MAG's rt-libflute (C++, 5G-MAG
Public License) receives a ``--fec none`` carousel of ``pressrun serve multicast``
bit-exact, its packets carrying pressrun's channel sequence extension (HET 250),
which it skips as RFC 5651 says.

rt-libflute is not on a package registry: the check builds it from a copy of its
source named by ``PRESSRUN_RT_LIBFLUTE_SRC`` (a checkout of
github.com/5G-MAG/rt-libflute; its build needs cmake, a C++17 compiler, and Boost,
spdlog, tinyxml2, libnl-3, libconfig++, OpenSSL and zlib headers: on Debian
``apt-get install cmake g++ libboost-dev libspdlog-dev libtinyxml2-dev libnl-3-dev
libconfig++-dev libssl-dev zlib1g-dev``) into ``PRESSRUN_RT_LIBFLUTE_BUILD``
(default ``~/.cache/pressrun/rt-libflute``), once. Without the variable it skips and
says so; where the build fails it fails with cmake's words. It runs as root in a
network namespace of its own, with loopback multicast on and the ``224.0.0.0/4``
route a third-party receiver needs there (it joins its group on the interface the
route names), and a TSI of 16 bits (``--start ISSUE=TSI``): rt-libflute 0.12.3 reads
48-bit LCT fields with their halves swapped (docs/multicast.md).

    PRESSRUN_RT_LIBFLUTE_SRC=/path/to/rt-libflute .venv/bin/pytest -q \\
        tests/multicast/test_interop_rt_libflute.py
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import ISSUE, TOKEN, Published

pytestmark = pytest.mark.root

SOURCE_ENV = "PRESSRUN_RT_LIBFLUTE_SRC"
BUILD_ENV = "PRESSRUN_RT_LIBFLUTE_BUILD"

STATUS = r"""
import os, sys, urllib.request
token = os.environ["PRESSRUN_MULTICAST_TOKEN"]
req = urllib.request.Request(sys.argv[1] + "/v1/carousels",
                             headers={"Authorization": "Bearer " + token})
print(urllib.request.urlopen(req, timeout=5).read().decode())
"""


def build_receiver(source: Path, build: Path) -> Path:
    """rt-libflute's example receiver, built from ``source`` into ``build`` (kept:
    built once). Its CMake files run clang-tidy on every file; a stand-in that does
    nothing takes its place where there is none (the check is about the receiver,
    not the lint)."""
    binary = build / "examples" / "flute-receiver"
    if binary.exists():
        return binary
    build.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if shutil.which("clang-tidy") is None:
        stub = build / "no-clang-tidy"
        stub.mkdir(exist_ok=True)
        (stub / "clang-tidy").write_text("#!/bin/sh\nexit 0\n")
        (stub / "clang-tidy").chmod(0o755)
        env["PATH"] = f"{stub}:{env['PATH']}"
    steps = [
        ["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         "-DBUILD_TESTING=OFF", "-DGTEST_DISABLE=1"],
        ["cmake", "--build", str(build), "--target", "flute-receiver", "-j", "2"],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            pytest.fail(f"building rt-libflute failed ({' '.join(step)}):\n{done.stderr[-3000:]}")
    assert binary.exists(), f"the build made no {binary}"
    return binary


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def test_rt_libflute_receives_a_no_code_carousel_bit_exact(
    published: Callable[[int], Published], tmp_path: Path
) -> None:
    source = os.environ.get(SOURCE_ENV)
    if not source:
        pytest.skip(
            f"set {SOURCE_ENV} to a copy of 5G-MAG rt-libflute's source to run this check "
            "(it is on no package registry)"
        )
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip (a network namespace of its own)")
    build = Path(os.environ.get(BUILD_ENV, Path.home() / ".cache/pressrun/rt-libflute"))
    receiver_bin = build_receiver(Path(source), build)
    pub = published(4 * 1024 * 1024)
    name = f"pr-rt-{random.randrange(1 << 30):x}"
    _run("ip", "netns", "add", name)
    ex = ["ip", "netns", "exec", name]
    env = {**os.environ, "PRESSRUN_MULTICAST_TOKEN": TOKEN}
    sender = receiver = None
    try:
        _run(*ex, "ip", "link", "set", "lo", "up")
        _run(*ex, "ip", "link", "set", "lo", "multicast", "on")
        # a receiver that joins on 0.0.0.0 (rt-libflute's default) needs a route for
        # the multicast range; pressrun's own name their interface's address
        _run(*ex, "ip", "route", "add", "224.0.0.0/4", "dev", "lo")
        sender = subprocess.Popen(
            [*ex, sys.executable, "-m", "pressrun.cli", "--log-level", "INFO", "serve",
             "multicast", "--content", str(pub.content), "--key", str(pub.key_path),
             "--control-group", "239.255.9.1:5400", "--group-base", "239.254.9.1",
             "--channels", "1", "--fec", "none", "--rate-mbps", "20",
             "--start", f"{ISSUE}={random.randrange(1, 1 << 16)}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert sender.stderr is not None
        url = None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = sender.stderr.readline()
            if not line:
                break
            if "control API on " in line:
                url = line.split("control API on ")[1].split()[0]
        assert url is not None, "the sender did not start"
        status = json.loads(
            subprocess.run(
                [*ex, sys.executable, "-c", STATUS, url],
                env=env, capture_output=True, text=True, timeout=20, check=True,
            ).stdout
        )  # fmt: skip
        channel = status["carousels"][0]["channels"][0]
        out = tmp_path / "rt-out"
        out.mkdir()
        receiver = subprocess.Popen(
            [*ex, str(receiver_bin), "-m", channel["group"], "-p", str(channel["port"]),
             "-T", str(channel["tsi"]), "-o", str(out), "-l", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        cycle_s = status["carousels"][0]["cycle_s"]
        deadline = time.monotonic() + max(30.0, 4 * cycle_s)
        got: list[Path] = []
        while time.monotonic() < deadline and not got:
            time.sleep(0.5)
            got = [p for p in out.iterdir() if p.stat().st_size == len(pub.data)]
        assert got, f"rt-libflute received nothing complete in {out}: {sorted(out.iterdir())}"
        assert got[0].read_bytes() == pub.data
    finally:
        for proc in (receiver, sender):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
