"""Issue 34's namespace test: a sender island where multicast flows, a reader
namespace routed to it by unicast only (no multicast route, the native join fails),
an AMT relay on the island. ``pressrun get`` in the reader's namespace is told by the
balancer's directive which relay to use and gets the issue through it, verified, with
nftables dropping 20% of the tunnel's datagrams on the way in (the carousel's FEC
covers the loss: efficiency printed and checked); the same reader with ``--amt never``
falls back to the origin as before.

The island: its loopback (multicast on, an address of its own) the sender sends on
and the relay joins on; the sender, the balancer and the origin (on the island's end
of a veth pair) in one Python process, the relay a ``pressrun serve amt-relay``
process of its own. Skipped, with the reason, without root, ``ip`` or ``nft``."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netns import add_namespace, delete_namespace, need_root_and
from pressrun.multicast.config import CarouselConfig

from .conftest import Shelf

pytestmark = pytest.mark.root

ISSUE = "weekly-amt-netns"
SIZE = 1_500_000 + 11
LOSS_PERCENT = 20

#: the island's services in one process: the sender (232/8 channels and control
#: group on the dummy interface), the origin and the balancer on the veth address
ISLAND = r"""
import asyncio, signal, sys
from pathlib import Path
from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.demand import DemandConfig, DemandPolicy
from pressrun.balancer.events import MulticastInfo, OriginSpec
from pressrun.content.keys import load_signing_key
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.sender import MulticastSender, SenderServiceConfig
from pressrun.origin import OriginConfig, start_origin

content, key, issue, control, base, mcast_if, veth, relay = sys.argv[1:9]
group, port = control.split(":")

async def main():
    carousel = CarouselConfig(channels=2, rate_bps=12e6)  # CAROUSEL below
    sender = MulticastSender(SenderServiceConfig(
        content_dir=Path(content), control_group=(group, int(port)),
        signing_key=load_signing_key(Path(key)), token="test-token-0123456789",
        interface=mcast_if, carousel=carousel, group_base=base,
        announce_interval_s=0.2, announcement_ttl_s=2.0, multicast_ttl=2))
    await sender.start()
    await sender.start_carousel(issue, carousel)
    origin = await start_origin(OriginConfig(content_dir=Path(content), name="origin-a",
                                             host=veth, stats_interval_s=0.2))
    peak = DemandConfig(enter_downloaders=1000.0, leave_downloaders=0.0, min_dwell_s=0.0,
                        multicast_enter_downloaders=1.0, multicast_leave_downloaders=0.5)
    info = MulticastInfo(control, None, mcast_if, (relay,))
    balancer = await start_balancer(BalancerServiceConfig(
        origins=(OriginSpec("origin-a", origin.url),), host=veth,
        balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=1.0), seed=1),
        mode_policy=DemandPolicy(peak, {}, {issue: info}))
    await balancer.wait_until_up(1, timeout_s=20.0)
    print("balancer", balancer.url, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await balancer.stop(); await origin.stop(); await sender.close()

asyncio.run(main())
"""


#: the island's carousel (ISLAND's), for the efficiency the FEC can promise
CAROUSEL = CarouselConfig(channels=2, rate_bps=12e6)
#: the binding's decode waits for min(20, K / 50) symbols beyond a block's K (fast.rs
#: decode_extra)
DECODE_EXTRA = 20
#: standard deviations of the per-block tail the efficiency check allows (below)
TAIL_SIGMAS = 3.5


def fec_efficiency_floor(size: int, loss: float) -> float:
    """The lowest efficiency (source symbols / packets received until complete) the
    carousel's RaptorQ promises a one-channel receiver whose path lost ``loss`` of the
    datagrams (nftables' drops and its own socket's), bar a tail of about 5e-4.

    Each of the Z blocks of K symbols needs n = K + min(20, K / 50) distinct symbols;
    the blocks' symbols are interleaved, so the object completes when the slowest
    block has them. Sends of a block until n arrive are negative-binomial: mean
    n / (1 - loss), standard deviation sqrt(n loss) / (1 - loss), so the packets
    received per block are at most n' = n + z sqrt(n loss) but for a tail of
    P(z) per block (z = 3.5: 2.3e-4, two blocks 5e-4). While one cycle of the channel,
    K (1 + cycle_overhead) distinct symbols of which c = K (1 + overhead)(1 - loss)
    arrive, covers n', that is all: efficiency K / n'. Beyond (loss near
    overhead / (1 + overhead), 26%), the rest comes from the next cycle, where only
    the share ``loss`` of what arrives is new (the ones lost the first time): c +
    (n' - c) / loss packets. At 20% loss: 0.90 (the fixed 0.95 this replaces failed
    about 1% of runs by chance alone: a simulation of the interleaved cycle at 20%
    gave a minimum of 0.943, CI's figure, and a 1st percentile of 0.948 in 300)."""
    total = math.ceil(size / CAROUSEL.symbol_bytes)
    blocks = math.ceil(total / CAROUSEL.source_block_symbols(size))
    k = math.ceil(total / blocks)
    n = k + min(DECODE_EXTRA, k // 50)
    need = n + TAIL_SIGMAS * math.sqrt(n * loss)
    cycle = k * (1 + CAROUSEL.cycle_overhead) * (1 - loss)
    packets = need if cycle >= need else cycle + (need - cycle) / loss
    return k / packets


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=20).stdout


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str, str, str, str]]:
    """(island, reader, the island's veth address, the island's multicast address,
    the reader's veth device)."""
    need_root_and(
        "ip",
        "nft",
        "dumpcap",
        "tshark",
        install="scripts/setup-system.sh: iproute2 nftables tshark",
    )
    tag = f"{random.randrange(1 << 24):06x}"
    island, reader = f"pr-amt-i-{tag}", f"pr-amt-r-{tag}"
    net = random.randrange(1, 250)
    island_ip, reader_ip, mcast_ip = f"10.34.{net}.1", f"10.34.{net}.2", f"10.35.{net}.1"
    veth_i, veth_r = f"vi{tag}", f"vr{tag}"
    add_namespace(island)
    try:
        _run("ip", "netns", "add", reader)
        i, r = ["ip", "netns", "exec", island], ["ip", "netns", "exec", reader]
        _run("ip", "link", "add", veth_i, "type", "veth", "peer", "name", veth_r)
        _run("ip", "link", "set", veth_i, "netns", island)
        _run("ip", "link", "set", veth_r, "netns", reader)
        for ns, dev, ip in ((i, veth_i, island_ip), (r, veth_r, reader_ip)):
            _run(*ns, "ip", "link", "set", "lo", "up")
            _run(*ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            _run(*ns, "ip", "link", "set", dev, "up")
        # the island's multicast: its loopback, multicast on, with an address of its
        # own the sender sends from (no dummy module here); the veth pair to the
        # reader carries none: the reader has no multicast route at all
        _run(*i, "ip", "addr", "add", f"{mcast_ip}/32", "dev", "lo")
        _run(*i, "ip", "link", "set", "lo", "multicast", "on")
        _run(*r, "ip", "link", "set", veth_r, "multicast", "off")
        routes = _run(*r, "ip", "route", "show", "table", "all")
        assert "224.0.0.0" not in routes and "default" not in routes, routes
        yield island, reader, island_ip, mcast_ip, veth_r
    finally:
        for ns in (island, reader):
            delete_namespace(ns)


def _loss(reader: str, relay_port: int, percent: int) -> None:
    """nftables in the reader's namespace: drop ``percent`` of the datagrams from the
    relay (the tunnel) at random, counting all and the dropped."""
    r = ["ip", "netns", "exec", reader, "nft"]
    _run(*r, "add", "table", "inet", "tunnel")
    _run(*r, "add", "chain", "inet", "tunnel", "input", "{ type filter hook input priority 0 ; }")
    _run(*r, "add", "rule", "inet", "tunnel", "input", "udp", "sport", str(relay_port), "counter")
    _run(
        *r, "add", "rule", "inet", "tunnel", "input", "udp", "sport", str(relay_port),
        "numgen", "random", "mod", "100", "<", str(percent), "counter", "drop",
    )  # fmt: skip


def _capture(reader: str, device: str, port: int, pcap: Path) -> subprocess.Popen[str]:
    """dumpcap on the reader's link (the tunnel's UDP port), once it captures."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", reader, "dumpcap", "-i", device, "-f", f"udp port {port}",
         "-w", str(pcap)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line or "Capturing on" in line:
            break
    assert proc.poll() is None, "dumpcap did not start"
    return proc


def _counters(reader: str) -> list[int]:
    ruleset = json.loads(_run("ip", "netns", "exec", reader, "nft", "-j", "list", "ruleset"))
    return [
        expr["counter"]["packets"]
        for item in ruleset["nftables"]
        if "rule" in item
        for expr in item["rule"]["expr"]
        if "counter" in expr
    ]


def _get(reader: str, balancer: str, shelf: Shelf, library: Path, *extra: str) -> dict:
    out = subprocess.run(
        [
            "ip", "netns", "exec", reader, sys.executable, "-m", "pressrun.cli", "get", ISSUE,
            "--balancer", balancer, "--library", str(library),
            "--publisher-key", shelf.public_hex, "--multicast-deadline-s", "20", "--json",
            *extra,
        ],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    doc: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def test_a_unicast_only_reader_gets_the_issue_through_the_relay(
    namespaces: tuple[str, str, str, str, str], shelf: Shelf, tmp_path: Path
) -> None:
    island, reader, island_ip, mcast_ip, veth_r = namespaces
    data = shelf.publish(ISSUE, SIZE)
    rng = random.Random()
    control = f"232.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.1:{rng.randrange(20000, 60000)}"
    base = f"232.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.1"
    relay_port = 2268
    i = ["ip", "netns", "exec", island]
    relay = subprocess.Popen(
        [*i, sys.executable, "-m", "pressrun.cli", "serve", "amt-relay",
         "--listen", f"{island_ip}:{relay_port}", "--relay-address", island_ip,
         "--interface", mcast_ip],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    services = subprocess.Popen(
        [*i, sys.executable, "-c", ISLAND, str(shelf.content), str(shelf.key_path), ISSUE,
         control, base, mcast_ip, island_ip, f"{island_ip}:{relay_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert services.stdout is not None
        line = services.stdout.readline()
        assert line.startswith("balancer "), services.stderr.read() if services.stderr else ""
        balancer = line.split()[1]
        _loss(reader, relay_port, LOSS_PERCENT)
        pcap = tmp_path / "tunnel.pcapng"
        capture = _capture(reader, veth_r, relay_port, pcap)
        try:
            through = _get(reader, balancer, shelf, tmp_path / "lib-relay")
        finally:
            capture.terminate()
            capture.communicate(timeout=10)
        seen, dropped = _counters(reader)
        plain = _get(reader, balancer, shelf, tmp_path / "lib-plain", "--amt", "never")
    finally:
        for proc in (services, relay):
            proc.terminate()
        for proc in (services, relay):
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    digest = hashlib.sha256(data).hexdigest()
    assert through["sha256"] == digest and plain["sha256"] == digest
    # through the relay: every byte from the carousel, none from the origin
    note = through["multicast_note"]
    assert through["mode"] == "multicast" and through["bytes_from_multicast"] == SIZE, through
    assert f"through the AMT relay {island_ip}:{relay_port}" in note
    assert sum(through["bytes_by_origin"].values()) == 0
    # nftables really dropped about a fifth of the tunnel's datagrams ...
    assert seen > 500 and 0.15 < dropped / seen < 0.25, (seen, dropped)
    # ... and the FEC covered it: source symbols / packets received until complete
    # (against the loss the path really had: nftables' drops and the reader's own
    # socket's, the gateway's tunnel socket included, of the datagrams nftables saw)
    found = re.search(r"efficiency (\d+\.\d+)", note)
    own = re.search(r"(\d+) own socket drops", note)
    assert found is not None and own is not None, note
    efficiency = float(found.group(1))
    loss = (dropped + int(own.group(1))) / seen
    floor = fec_efficiency_floor(SIZE, loss)
    print(f"through the relay: {note}; tunnel datagrams {seen}, dropped {dropped}, "
          f"loss {loss:.3f}, efficiency floor {floor:.3f}")  # fmt: skip
    assert efficiency >= floor, (note, loss, floor)
    # the tunnel as captured on the reader's link decodes as AMT in Wireshark's own
    # dissector: Request, Membership Query, Membership Update, Multicast Data, no
    # expert info (malformed, bad length) on any frame
    fields = subprocess.run(
        ["tshark", "-r", str(pcap), "-T", "fields", "-e", "amt.type", "-e", "_ws.expert"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    types = {line.split("\t")[0] for line in fields}
    assert {"3", "4", "5", "6"} <= types and "" not in types, types
    assert all(line.split("\t")[1:] in ([""], []) for line in fields), fields[:5]
    # without a relay: the native join fails (no multicast route), the origin serves
    assert plain["bytes_from_multicast"] == 0 and sum(plain["bytes_by_origin"].values()) == SIZE
