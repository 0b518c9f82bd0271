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

With --efficiency: the carousel's efficiency through the relay under loss on the
tunnel. A published issue of --mb MB, a sender in this process (232/8 channels and
control group, the default carousel: 4 channels of 5 Mbit/s, RaptorQ), the relay
process, and pressrun's receive path with an AMT gateway (`receive_carousel(gateway=)`,
the default layering) --runs times at each --losses percent, the loss drawn in the
receive path on the tunnel's datagrams (`drop_probability`; the namespace test drops
them with nftables instead). Printed per run: efficiency (source symbols / object
packets received until complete), seconds, channels at most.

    sudo .venv/bin/python bench/amt.py --efficiency [--mb 8] [--runs 3] [--losses 0,5,20]
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


def efficiency(args: argparse.Namespace) -> int:
    """The --efficiency runs (the module docstring)."""
    import asyncio
    import hashlib
    import tempfile

    from pressrun.content.keys import generate_keypair, load_public_key, load_signing_key
    from pressrun.content.publish import publish
    from pressrun.multicast.config import CarouselConfig
    from pressrun.multicast.gateway import AmtGateway
    from pressrun.multicast.receiver import receive_carousel
    from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

    port = free_udp_port()
    relay = subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "--log-level", "WARNING", "serve", "amt-relay",
         "--listen", f"127.0.0.1:{port}"],
    )  # fmt: skip
    issue = "bench-amt"
    rng = random.Random()

    def ssm() -> str:
        return f"232.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.{rng.randrange(1, 200)}"

    async def run(root: Path) -> None:
        secret, public = generate_keypair(root / "publisher.key")
        source = root / f"{issue}.pdf"
        source.write_bytes(random.Random(1).randbytes(int(args.mb * 1e6)))
        content = root / "content"
        publish(source, issue_id=issue, title=issue, key_path=secret, content_dir=content)
        sha = hashlib.sha256((content / issue / "manifest.json").read_bytes()).hexdigest()
        control = (ssm(), free_udp_port())
        carousel = CarouselConfig()
        sender = MulticastSender(
            SenderServiceConfig(
                content_dir=content,
                control_group=control,
                signing_key=load_signing_key(secret),
                token="bench-token-0123456789",
                carousel=carousel,
                group_base=ssm(),
            )
        )
        await sender.start()
        try:
            await sender.start_carousel(issue, carousel)
            await asyncio.sleep(1.0)  # the relay process starts
            for loss in (float(x) for x in args.losses.split(",")):
                for n in range(args.runs):
                    gateway = AmtGateway([("127.0.0.1", port)])
                    try:
                        result = await asyncio.to_thread(
                            receive_carousel,
                            issue,
                            sha,
                            control_group=control,
                            control_source="127.0.0.1",
                            interface="127.0.0.1",
                            trusted_keys={load_public_key(public).hex()},
                            work_dir=Path(tempfile.mkdtemp(dir=root)),
                            deadline_s=60.0,
                            drop_probability=loss / 100,
                            gateway=gateway,
                        )
                    finally:
                        gateway.close()
                    eff = result.efficiency
                    print(
                        f"loss {loss:g}% run {n + 1}: "
                        + (f"efficiency {eff:.3f}" if eff else f"not completed ({result.reason})")
                        + f", {result.seconds:.1f} s, {result.most_channels} channel(s) at most, "
                        f"{result.object_packets} packets, {result.dropped} dropped "
                        f"(load {Path('/proc/loadavg').read_text().split()[0]})",
                        flush=True,
                    )
        finally:
            await sender.close()

    try:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(run(Path(tmp)))
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(timeout=10)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateways", type=int, default=20)
    p.add_argument("--pps", type=float, default=2000.0, help="datagrams/s sent to the channel")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--efficiency", action="store_true", help="efficiency under tunnel loss")
    p.add_argument("--mb", type=float, default=8.0, help="--efficiency: the issue's size")
    p.add_argument("--runs", type=int, default=3, help="--efficiency: runs per loss")
    p.add_argument("--losses", default="0,5,20", help="--efficiency: loss percents")
    return p.parse_args(argv)


if __name__ == "__main__":
    parsed = parse_args(sys.argv[1:])
    sys.exit(efficiency(parsed) if parsed.efficiency else main(parsed))
