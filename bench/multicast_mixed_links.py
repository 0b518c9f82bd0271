"""bench/multicast.py --mixed-links: one receiver behind a shaped link (tc tbf in a pair of
network namespaces, root only) of each channel plan, the channels it ends on and the
windows it saw congested."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
from pathlib import Path

# a sibling script: python puts bench/ first on the path when bench/multicast.py runs
from multicast_bundle import ISSUE, TOKEN, Bundle

MIXED_RECEIVER = r"""
import json, sys, tempfile
from pathlib import Path
from pressrun.multicast.receiver import receive_carousel
issue, group, port, manifest_sha, key, interface = sys.argv[1:7]
r = receive_carousel(issue, manifest_sha, control_group=(group, int(port)),
                     interface=interface, trusted_keys={key},
                     work_dir=Path(tempfile.mkdtemp()), deadline_s=120.0)
print(json.dumps({"completed": r.completed, "seconds": r.seconds, "final": r.final_channels,
                  "losses": r.losses}))
"""


def _sh(*args: str) -> None:
    import subprocess

    subprocess.run(args, check=True, capture_output=True, timeout=30)


def _mixed_run(bundle: Bundle, rate_mbit: float, channels: int, channel_mbps: float) -> str:
    """One receiver behind ``rate_mbit`` of one plan; its row's cells."""
    import json
    import os
    import subprocess

    tag = f"{random.randrange(1 << 24):06x}"
    snd, rcv, vs, vr = f"pr-bs-{tag}", f"pr-br-{tag}", f"vs{tag}", f"vr{tag}"
    subnet = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
    sender = None
    try:
        _sh("ip", "netns", "add", snd)
        _sh("ip", "netns", "add", rcv)
        _sh("ip", "link", "add", vs, "netns", snd, "type", "veth", "peer", "name", vr, "netns", rcv)
        for ns, dev, ip in ((snd, vs, f"{subnet}.1"), (rcv, vr, f"{subnet}.2")):
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        _sh("ip", "netns", "exec", snd, "tc", "qdisc", "add", "dev", vs, "root", "tbf",
            "rate", f"{rate_mbit}mbit", "burst", "32kb", "latency", "100ms")  # fmt: skip
        group = f"239.255.{random.randrange(1, 255)}.{random.randrange(1, 200)}"
        sender = subprocess.Popen(
            ["ip", "netns", "exec", snd, sys.executable, "-m", "pressrun.cli", "serve",
             "multicast", "--content", str(bundle.content), "--key", str(bundle.secret),
             "--interface", f"{subnet}.1", "--control-group", f"{group}:5400",
             "--group-base", f"239.254.{random.randrange(1, 255)}.1",
             "--channels", str(channels), "--rate-mbps", str(channel_mbps), "--start", ISSUE,
             "--announce-interval-s", "0.2"],
            env={**os.environ, "PRESSRUN_MULTICAST_TOKEN": TOKEN},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert sender.stderr is not None
        while "control API on " not in (line := sender.stderr.readline()):
            if not line:
                return "the sender did not start"
        out = subprocess.run(
            ["ip", "netns", "exec", rcv, sys.executable, "-c", MIXED_RECEIVER, ISSUE, group,
             "5400", hashlib.sha256(bundle.manifest_json).hexdigest(), bundle.public_hex,
             f"{subnet}.2"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        if out.returncode != 0:
            return f"receiver failed: {out.stderr[-300:]}"
        r = json.loads(out.stdout)
        congested = sum(loss > 0.25 for loss in r["losses"]) / max(1, len(r["losses"]))
        done = f"{r['seconds']:7.1f}" if r["completed"] else "    n/a"
        return f"{done}  {r['final']:5d}  {100 * congested:9.0f}%"
    finally:
        if sender is not None:
            sender.terminate()
            sender.wait(timeout=10)
        for ns in (snd, rcv):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


async def bench_mixed_links(root: Path, args: argparse.Namespace) -> None:
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("tc") is None:
        print("mixed links: skipped (needs root, ip and tc)")
        return
    bundle = Bundle(root / "mixed", 8 * 1024 * 1024)
    print("mixed links: an 8 MiB issue, one receiver per cell, default layering")
    print("  plan          link Mbit/s  seconds  ended  windows>25%")
    for channels, mbps in ((2, 40.0), (4, 5.0), (8, 5.0)):
        for link in (6.0, 50.0):
            row = await asyncio.to_thread(_mixed_run, bundle, link, channels, mbps)
            print(
                f"  {channels} x {mbps:4g} Mbit/s  {link:11g}  {row}  "
                f"(load {Path('/proc/loadavg').read_text().split()[0]})",
                flush=True,
            )
