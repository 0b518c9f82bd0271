"""The emulation's bridge as IGMP querier: from when it forwards a multicast group only
to the ports that joined it (issue 29).

A Linux bridge made the querier (``mcast_querier 1``) does not count a querier as
present for its query response interval (its other-querier delay timer) and floods
every group to every port meanwhile. `pressrun emulate` set the querier right before
its first client, and the small scenario's carousel, 8-9 s later, went to every
client's link for its first seconds (16 Mbit/s into 20 and 8 Mbit/s links): the swarm
clients downloading then took 2.1-3.5x the origin client's time. Now the first client
starts `QUERIER_SETTLE_S` after `make_querier` at the earliest (`pressrun.emulate.run`).

Real namespaces: a bridge with a sender's port, a port that joined the group and one
that joined nothing. Skipped where it cannot run (not root, no ``ip``)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from netns import add_namespace, delete_namespace, need_root_and
from pressrun.emulate.project import QUERIER_SETTLE_S, make_querier

pytestmark = pytest.mark.root

GROUP, PORT = "239.255.74.53", 5500

#: the arrival times (``time.monotonic()``, the same clock in every namespace) of the
#: group's packets reaching the namespace's eth0 (a raw socket: also the packets of a
#: group nobody here joined); joins the group first when told to
COUNTER = r"""
import json, socket, struct, sys, time
group, port, join, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
if join:
    member = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    member.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    member.bind(("", port))
    member.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton("0.0.0.0")))
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
raw.bind(("eth0", 0))
raw.settimeout(0.1)
want = socket.inet_aton(group)
t0 = time.monotonic()
arrivals = []
print("ready", flush=True)
while time.monotonic() - t0 < seconds:
    try:
        frame = raw.recv(2048)
    except TimeoutError:
        continue
    if frame[30:34] == want:  # (14 bytes of Ethernet header, then the IP destination)
        arrivals.append(time.monotonic())
print(json.dumps(arrivals), flush=True)
"""

#: sends 100 datagrams a second to the group for the given seconds
SENDER = r"""
import socket, sys, time
group, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
t0 = time.monotonic()
while time.monotonic() - t0 < seconds:
    s.sendto(b"x" * 1000, (group, port))
    time.sleep(0.01)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@dataclass
class Bridge:
    hub: str  # the namespace of the bridge (br0)
    sender: str
    member: str  # joins the group
    other: str  # joins nothing


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    need_root_and("ip", install="apt-get install iproute2")
    tag = f"{random.randrange(1 << 24):06x}"
    names = [f"pr-bq{role}-{tag}" for role in ("h", "s", "m", "o")]
    made: list[str] = []
    subnet = f"198.19.{random.randrange(1, 250)}"
    try:
        for ns in names:
            add_namespace(ns)
            made.append(ns)
        hub = names[0]
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{subnet}.1/24", "dev", "br0")
        _ip("-n", hub, "link", "set", "br0", "type", "bridge", "mcast_snooping", "1")
        _ip("-n", hub, "link", "set", "br0", "up")
        for i, ns in enumerate(names[1:], start=2):
            _ip("link", "add", f"bq{i}{tag}", "netns", hub, "type", "veth", "peer", "name",
                "eth0", "netns", ns)  # fmt: skip
            _ip("-n", hub, "link", "set", f"bq{i}{tag}", "master", "br0")
            _ip("-n", hub, "link", "set", f"bq{i}{tag}", "up")
            _ip("-n", ns, "addr", "add", f"{subnet}.{i}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")
        yield Bridge(*names)
    finally:
        for ns in made:
            delete_namespace(ns)


def _python_in(ns: str, script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _arrivals(proc: subprocess.Popen[str]) -> list[float]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return [float(t) for t in json.loads(out.splitlines()[-1])]


def test_a_port_that_joined_nothing_gets_the_group_only_until_the_querier_settles(
    bridge: Bridge,
) -> None:
    """Right after `make_querier` the bridge floods the group to the port that joined
    nothing too (what the small scenario's clients got from its carousel); from
    `QUERIER_SETTLE_S` on only the member's port gets it, and still does."""
    seconds = QUERIER_SETTLE_S + 4.0
    counters = {
        "member": _python_in(bridge.member, COUNTER, GROUP, PORT, 1, seconds),
        "other": _python_in(bridge.other, COUNTER, GROUP, PORT, 0, seconds),
    }
    for proc in counters.values():
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    before = time.monotonic()
    make_querier("br0", netns=bridge.hub)
    on = time.monotonic()  # (the querier went on between the two)
    sender = _python_in(bridge.sender, SENDER, GROUP, PORT, seconds - 1.0)
    member, other = (_arrivals(p) for p in counters.values())
    sender.communicate(timeout=60)
    flooded = [t for t in other if t < before + QUERIER_SETTLE_S - 2.0]
    assert len(flooded) > 50, other  # the port that joined nothing, at first
    settled = on + QUERIER_SETTLE_S + 0.5
    assert [t for t in other if t >= settled] == [], other
    assert len([t for t in member if t >= settled]) > 100, member
