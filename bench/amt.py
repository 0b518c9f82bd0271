"""The AMT relay's forwarding rate (issue 34): packets per second per core of
``pressrun serve amt-relay``, and how many gateways one relay holds at the carousel's
rate on this machine. Root (the relay's raw socket); real UDP on 127.0.0.1.

The relay runs in its own process. --gateways gateway sockets (in this process) make
the handshake (Request, Query, Update joining one 232/8 channel); a sender thread then
sends --pps datagrams per second of 1384 bytes (a carousel packet of 1320-byte
symbols with its headers) to that channel for --seconds. Printed: datagrams sent,
Multicast Data messages the gateways received, the relay process's CPU (user +
system, /proc), forwarded packets per second per core (received / CPU seconds), and
gateways per core at the default carousel's rate (4 channels of 5 Mbit/s: 1806
packets/s a gateway on all four).

    sudo .venv/bin/python bench/amt.py [--gateways 20] [--pps 2000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from pressrun.multicast import amt
from pressrun.multicast.net import free_udp_port

CAROUSEL_PPS = 4 * 5e6 / 8 / 1384  # the default plan, every channel joined


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(args: argparse.Namespace) -> int:
    port = free_udp_port()
    relay = subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "--log-level", "WARNING", "serve", "amt-relay",
         "--listen", f"127.0.0.1:{port}", "--max-tunnels", str(args.gateways + 10)],
    )  # fmt: skip
    address = ("127.0.0.1", port)
    group = f"232.{random.randrange(1, 255)}.{random.randrange(0, 255)}.{random.randrange(1, 250)}"
    gateways: list[socket.socket] = []
    try:
        for _ in range(args.gateways):
            gw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            gw.bind(("127.0.0.1", 0))
            gw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            gw.settimeout(0.5)
            gateways.append(gw)
        nonce = 1
        for gw in gateways:
            for _ in range(40):  # the relay may still be starting
                gw.sendto(amt.encode(amt.Request(nonce)), address)
                try:
                    query = amt.decode(gw.recv(65535))
                    break
                except TimeoutError:
                    continue
            else:
                print("the relay did not answer")
                return 1
            assert isinstance(query, amt.MembershipQuery)
            record = amt.GroupRecord(amt.ALLOW_NEW_SOURCES, group, ("127.0.0.1",))
            report = amt.igmpv3_report("127.0.0.1", [record])
            gw.sendto(amt.encode(amt.MembershipUpdate(query.response_mac, nonce, report)), address)
            nonce += 1
        time.sleep(0.3)
        received = [0] * len(gateways)
        stop = threading.Event()

        def drain(i: int, gw: socket.socket) -> None:
            gw.settimeout(0.2)
            while not stop.is_set():
                try:
                    gw.recv(65535)
                    received[i] += 1
                except TimeoutError:
                    continue

        drains = [threading.Thread(target=drain, args=(i, g)) for i, g in enumerate(gateways)]
        for t in drains:
            t.start()
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        payload = bytes(1384 - 28)
        cpu0, t0 = _cpu_s(relay.pid), time.perf_counter()
        sent = 0
        while time.perf_counter() - t0 < args.seconds:
            due = int((time.perf_counter() - t0) * args.pps)
            while sent < due:
                tx.sendto(payload, (group, 5400))
                sent += 1
            time.sleep(0.002)
        time.sleep(0.3)
        cpu = _cpu_s(relay.pid) - cpu0
        stop.set()
        for t in drains:
            t.join()
        got = sum(received)
        per_core = got / cpu if cpu else float("nan")
        print(
            f"relay: {sent} datagrams sent in {args.seconds:g} s to 1 channel, "
            f"{got} Multicast Data received by {args.gateways} gateways "
            f"({got / max(1, sent * args.gateways):.1%} of {sent * args.gateways}); relay CPU "
            f"{cpu:.2f} s: {per_core:,.0f} packets/s per core, {per_core / CAROUSEL_PPS:.1f} "
            f"gateways per core at the default carousel's {CAROUSEL_PPS:.0f} packets/s "
            f"(load {Path('/proc/loadavg').read_text().split()[0]})"
        )
        return 0
    finally:
        for gw in gateways:
            gw.close()
        relay.send_signal(signal.SIGTERM)
        relay.wait(timeout=10)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateways", type=int, default=20)
    p.add_argument("--pps", type=float, default=2000.0, help="datagrams/s sent to the channel")
    p.add_argument("--seconds", type=float, default=5.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args(sys.argv[1:])))
