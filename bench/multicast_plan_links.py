"""Channel plans against unicast on one shaped link (issue 28, "a plan for mixed links").

For each link (down rate and loss, shaped as the emulation shapes a client's link:
`pressrun.emulate.link.shaping_commands`, a tbf on an ifb device fed by the
receiver's ingress and an nftables loss rule) and each channel plan (channels x
Mbit/s), a sender in one network namespace and one receiver (`receive_carousel`,
default layering, or starting on ``--start`` channels) in another; then the same
file over TCP through the same link (``python -m http.server`` and urllib). Prints,
per cell: seconds to the file, the channels the receiver ended on and held at most,
its CPU-seconds (user + system) and the time against TCP's. Root only.

    flock /work/heavy.lock .venv/bin/python bench/multicast_plan_links.py \
        --links 6:0.5 10:1 --plans 10x5 16x2 16x3 --seconds 12
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multicast_bundle import ISSUE, TOKEN, Bundle
from pressrun.emulate.link import LinkShape, shaping_commands

RECEIVER = r"""
import json, resource, sys, tempfile
from pathlib import Path
from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.receiver import receive_carousel
issue, group, port, manifest_sha, key, interface, start = sys.argv[1:8]
r = receive_carousel(issue, manifest_sha, control_group=(group, int(port)),
                     interface=interface, trusted_keys={key},
                     work_dir=Path(tempfile.mkdtemp()), deadline_s=300.0,
                     layering=LayeringConfig(start_channels=int(start)))
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"completed": r.completed, "seconds": r.seconds, "final": r.final_channels,
                  "most": r.most_channels, "cpu_s": u.ru_utime + u.ru_stime,
                  "log": r.channel_log}))
"""

TCP_RECEIVER = r"""
import json, resource, sys, time, urllib.request
t0 = time.monotonic()
with urllib.request.urlopen(sys.argv[1], timeout=300) as r:
    n = 0
    while chunk := r.read(1 << 16):
        n += len(chunk)
seconds = time.monotonic() - t0
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"bytes": n, "seconds": seconds, "cpu_s": u.ru_utime + u.ru_stime}))
"""


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


class LinkPair:
    """A sender namespace and a receiver namespace joined by veth, the receiver's
    side shaped as an emulated client's link."""

    def __init__(self, down_mbit: float, loss_pct: float) -> None:
        tag = f"{random.randrange(1 << 24):06x}"
        self.snd, self.rcv = f"pr-ps-{tag}", f"pr-pr-{tag}"
        vs, vr = f"vs{tag}", f"vr{tag}"
        subnet = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.sender_ip, self.receiver_ip = f"{subnet}.1", f"{subnet}.2"
        _sh("ip", "netns", "add", self.snd)
        _sh("ip", "netns", "add", self.rcv)
        _sh("ip", "link", "add", vs, "netns", self.snd, "type", "veth", "peer", "name", vr,
            "netns", self.rcv)  # fmt: skip
        for ns, dev, ip in ((self.snd, vs, self.sender_ip), (self.rcv, vr, self.receiver_ip)):
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        shape = LinkShape(down_bps=int(down_mbit * 1e6), loss_pct=loss_pct)
        for command in shaping_commands(shape, device=vr):
            _sh("ip", "netns", "exec", self.rcv, *command)

    def run_receiver(self, script: str, *args: str) -> dict[str, object]:
        """Run ``script`` (Python printing one JSON line) in the receiver's namespace."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.rcv, sys.executable, "-c", script, *args],
            capture_output=True, text=True, timeout=360,
        )  # fmt: skip
        if out.returncode != 0:
            return {"error": out.stderr[-300:]}
        result: dict[str, object] = json.loads(out.stdout)
        return result

    def close(self) -> None:
        for ns in (self.snd, self.rcv):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def carousel_cell(
    bundle: Bundle, link: LinkPair, channels: int, mbps: float, start: int
) -> dict[str, object]:
    group = f"239.255.{random.randrange(1, 255)}.{random.randrange(1, 200)}"
    sender = subprocess.Popen(
        ["ip", "netns", "exec", link.snd, sys.executable, "-m", "pressrun.cli", "serve",
         "multicast", "--content", str(bundle.content), "--key", str(bundle.secret),
         "--interface", link.sender_ip, "--control-group", f"{group}:5400",
         "--group-base", f"239.254.{random.randrange(1, 255)}.1",
         "--channels", str(channels), "--rate-mbps", str(mbps), "--start", ISSUE,
         "--announce-interval-s", "0.2"],
        env={**os.environ, "PRESSRUN_MULTICAST_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert sender.stderr is not None
        while "control API on " not in (line := sender.stderr.readline()):
            if not line:
                return {"error": "the sender did not start"}
        return link.run_receiver(
            RECEIVER, ISSUE, group, "5400", hashlib.sha256(bundle.manifest_json).hexdigest(),
            bundle.public_hex, link.receiver_ip, str(start),
        )  # fmt: skip
    finally:
        sender.terminate()
        sender.wait(timeout=10)


def tcp_cell(source: Path, link: LinkPair) -> dict[str, object]:
    server = subprocess.Popen(
        ["ip", "netns", "exec", link.snd, sys.executable, "-m", "http.server", "8080",
         "--bind", link.sender_ip, "--directory", str(source.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        return link.run_receiver(TCP_RECEIVER, f"http://{link.sender_ip}:8080/{source.name}")
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", nargs="+", default=["6:0.5", "10:1", "20:0", "50:0"],
                        help="down Mbit/s:loss %% of each link")  # fmt: skip
    parser.add_argument("--plans", nargs="+", default=["10x5", "16x2", "16x3"],
                        help="channels x Mbit/s of each plan")  # fmt: skip
    parser.add_argument("--start", type=int, default=1, help="channels the receiver starts on")
    parser.add_argument("--seconds", type=float, default=12.0,
                        help="each link's file is this many seconds of the link")  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("nft") is None:
        sys.exit("needs root, ip, tc and nft")
    root = Path(tempfile.mkdtemp(prefix="pressrun-plan-links-"))
    print("link        plan     start  seconds  x TCP  ended  most  cpu_s   load", flush=True)
    for link_text in args.links:
        mbit, loss = (float(x) for x in link_text.split(":"))
        size = int(mbit * 1e6 / 8 * args.seconds)
        bundle = Bundle(root / link_text.replace(":", "-"), size)
        pair = LinkPair(mbit, loss)
        try:
            tcp = tcp_cell(bundle.content.parent / f"{ISSUE}.pdf", pair)
            tcp_s = float(tcp["seconds"]) if "seconds" in tcp else float("nan")
            name = f"{mbit:g}+{loss:g}%"
            load = Path("/proc/loadavg").read_text().split()[0]
            print(f"{name:10s}  TCP      {'':5s}  {tcp_s:7.1f}  {1:5.2f}  {'':5s}  {'':4s}  "
                  f"{float(tcp.get('cpu_s', 0)):5.2f}  {load}  ({size / 1e6:.1f} MB)",
                  flush=True)  # fmt: skip
            for plan in args.plans:
                channels, mbps = plan.split("x")
                r = carousel_cell(bundle, pair, int(channels), float(mbps), args.start)
                load = Path("/proc/loadavg").read_text().split()[0]
                if "error" in r or not r.get("completed"):
                    print(f"{name:10s}  {plan:7s}  failed: {r}", flush=True)
                    continue
                s = float(r["seconds"])
                print(f"{name:10s}  {plan:7s}  {args.start:5d}  {s:7.1f}  {s / tcp_s:5.2f}  "
                      f"{r['final']:5d}  {r['most']:4d}  {float(r['cpu_s']):5.2f}  {load}  "
                      f"log {[(round(t, 1), n) for t, n in r['log']]}",
                      flush=True)  # fmt: skip
        finally:
            pair.close()


if __name__ == "__main__":
    main()
