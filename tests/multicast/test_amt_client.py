"""The client through an AMT relay (issue 34): `fetch_issue` (what ``pressrun get``
runs) told by the balancer's multicast directive which relay to use, a real
``pressrun serve amt-relay`` process, a 232/8 carousel whose control channel is
source-specific too; the issue verified piece by piece. And RFC 8777 discovery: the
relay named by an AMTRELAY record that a DNS server on 127.0.0.1 answers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pressrun.balancer.demand import DemandConfig, DemandPolicy
from pressrun.balancer.events import MulticastInfo
from pressrun.clients.codec import DirectiveMulticast
from pressrun.clients.multicast_receive import relays_for
from pressrun.multicast import amt, driad
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.net import free_udp_port
from pressrun.origin import OriginConfig, start_origin

from .conftest import PEAK_AT_ONCE, Shelf, fetch_through_balancer, multicast_client

ISSUE = "weekly-amt-get"
SIZE = 1_200_000 + 77
CLIENT = multicast_client(20.0)
root = pytest.mark.skipif(os.geteuid() != 0, reason="the relay's raw socket needs root")


def ssm_group(rng: random.Random) -> str:
    return f"232.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.{rng.randrange(1, 200)}"


@pytest.fixture
def relay_process() -> Iterator[tuple[str, int]]:
    """``pressrun serve amt-relay`` on a free port of 127.0.0.1, answering."""
    port = free_udp_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "serve", "amt-relay",
         "--listen", f"127.0.0.1:{port}", "--interface", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_for_relay(("127.0.0.1", port), proc)
        yield "127.0.0.1", port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def wait_for_relay(address: tuple[str, int], proc: subprocess.Popen[str]) -> None:
    """Until the relay answers a Request (a loaded host starts Python slowly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gw:
        gw.settimeout(0.3)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and proc.poll() is None:
            gw.sendto(amt.encode(amt.Request(1)), address)
            try:
                gw.recv(65535)
                return
            except TimeoutError:
                continue
    raise AssertionError(f"the relay did not answer (rc {proc.poll()})")


async def ssm_carousel(
    shelf: Shelf, senders: Any, size: int, *, channels: int, rate_bps: float
) -> tuple[bytes, tuple[str, int], Any]:
    """Publish ISSUE (``size`` random bytes) and start its carousel on ``channels``
    channels at ``rate_bps``, its control group and channel groups random
    source-specific (232/8) ones: the data, the control group and the carousel's plan."""
    data = shelf.publish(ISSUE, size)
    rng = random.Random()
    control = (ssm_group(rng), free_udp_port())
    carousel = CarouselConfig(channels=channels, rate_bps=rate_bps)
    sender = await senders(shelf, carousel, group_base=ssm_group(rng), control_group=control)
    plan = await sender.start_carousel(ISSUE, carousel)
    return data, control, plan


async def _get(shelf: Shelf, info: MulticastInfo, config: Any) -> Any:
    origin = await start_origin(
        OriginConfig(content_dir=shelf.content, name="origin-a", stats_interval_s=0.2)
    )
    policy = DemandPolicy(PEAK_AT_ONCE, {}, {ISSUE: info})
    return await fetch_through_balancer(ISSUE, origin, policy, config, publisher=shelf)


@root
async def test_get_through_the_relay_the_directive_names(
    shelf: Shelf, senders: Any, relay_process: tuple[str, int]
) -> None:
    """``amt=always``: no native join at all; the control channel and both data
    channels come through the relay process; every byte from the carousel."""
    data, control, _ = await ssm_carousel(shelf, senders, SIZE, channels=2, rate_bps=16e6)
    relay = "{}:{}".format(*relay_process)
    info = MulticastInfo("{}:{}".format(*control), "127.0.0.1", "127.0.0.1", (relay,))
    result = await _get(shelf, info, replace(CLIENT, amt="always"))
    assert result.mode == "multicast" and result.verified
    assert result.bytes_from_multicast == SIZE, result.multicast_note
    assert sum(result.bytes_by_origin.values()) == 0
    assert f"through the AMT relay {relay}" in (result.multicast_note or "")
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(data).digest()


class _DnsServer:
    """A DNS server on 127.0.0.1 answering AMTRELAY and A queries from a table."""

    def __init__(self, records: dict[tuple[str, int], list[bytes]]) -> None:
        self.records = records
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.sock.getsockname()
        self.asked: list[tuple[str, int]] = []

    def serve(self, count: int) -> None:
        self.sock.settimeout(5)
        for _ in range(count):
            query, peer = self.sock.recvfrom(512)
            qid = struct.unpack_from("!H", query)[0]
            labels, offset = [], 12
            while query[offset]:
                labels.append(query[offset + 1 : offset + 1 + query[offset]].decode())
                offset += 1 + query[offset]
            rtype = struct.unpack_from("!H", query, offset + 1)[0]
            question = query[12 : offset + 5]
            name = ".".join(labels)
            self.asked.append((name, rtype))
            answers = self.records.get((name, rtype), [])
            reply = struct.pack("!HHHHHH", qid, 0x8180, 1, len(answers), 0, 0) + question
            for rdata in answers:
                reply += b"\xc0\x0c" + struct.pack("!HHIH", rtype, 1, 60, len(rdata)) + rdata
            self.sock.sendto(reply, peer)


async def test_rfc_8777_dns_names_the_relays() -> None:
    """The AMTRELAY records of the source's reverse name, best precedence first; a
    relay by domain name is looked up as an A record; D set on all: no discovery."""
    name = driad.reverse_name("192.0.2.1")
    assert name == "1.2.0.192.in-addr.arpa"
    records = {
        (name, driad.TYPE_AMTRELAY): [
            driad.encode_amtrelay(
                driad.AmtRelayRecord(20, True, driad.RELAY_NAME, "relay.example")
            ),
            driad.encode_amtrelay(driad.AmtRelayRecord(10, True, driad.RELAY_IPV4, "203.0.113.5")),
        ],
        ("relay.example", driad.TYPE_A): [bytes([198, 51, 100, 9])],
    }
    server = _DnsServer(records)
    try:
        config = replace(CLIENT, amt_dns="{}:{}".format(*server.address))
        directive = DirectiveMulticast("232.1.1.1:5000", None, "192.0.2.1", ("203.0.113.77",))
        serving = asyncio.to_thread(server.serve, 2)
        (relays, discovery), _ = await asyncio.gather(
            asyncio.to_thread(relays_for, config, directive), serving
        )
    finally:
        server.sock.close()
    assert relays == [("203.0.113.77", 2268), ("203.0.113.5", 2268), ("198.51.100.9", 2268)]
    assert not discovery
    assert server.asked == [(name, 260), ("relay.example", 1)]
    # a record with D clear: discovery first
    rdata = driad.encode_amtrelay(driad.AmtRelayRecord(0, False, driad.RELAY_IPV4, "203.0.113.5"))
    assert driad.read_amtrelay(rdata) == driad.AmtRelayRecord(
        0, False, driad.RELAY_IPV4, "203.0.113.5"
    )
    with pytest.raises(driad.DnsError):
        driad.read_amtrelay(b"\x00\x01\x01")


async def test_a_source_specific_control_group_is_joined_by_its_source(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """Natively, no relay: a 232/8 control group is joined by (source, group); the
    directive's source is what the client joins with. The same group without the
    source is refused (an SSM group cannot be joined any-source)."""
    data, control, _ = await ssm_carousel(shelf, senders, 300_000, channels=1, rate_bps=16e6)
    info = MulticastInfo("{}:{}".format(*control), "127.0.0.1", "127.0.0.1")
    result = await _get(shelf, info, replace(CLIENT, amt="never"))
    assert result.bytes_from_multicast == 300_000 and result.path.read_bytes() == data
    assert "through the AMT relay" not in (result.multicast_note or "")
    from .conftest import receive_issue

    with pytest.raises(ValueError, match="source"):
        await receive_issue(shelf, control, ISSUE, tmp_path / "no-source", deadline_s=1.0)


async def test_the_sender_sends_with_ttl_2_by_default(shelf: Shelf, senders: Any) -> None:
    """Issue 34: a TTL of at least 2 so a relay or router one hop away gets the
    carousel (the sender's socket as the kernel has it)."""
    from pressrun.multicast.sender import SenderServiceConfig

    sender = await senders(shelf, CarouselConfig(channels=1))
    assert sender.sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 2
    assert SenderServiceConfig.__dataclass_fields__["multicast_ttl"].default == 2


@root
async def test_layering_joins_channels_through_membership_updates(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """Through the relay the receiver-driven layering starts on one channel and joins
    the second by a Membership Update (ALLOW) once the tunnel shows no loss; when the
    receiver ends, the gateway leaves both (BLOCK) and the relay holds no member."""
    from pressrun.multicast.gateway import AmtGateway
    from pressrun.multicast.relay import AmtRelay, RelayConfig

    from .conftest import receive_issue

    # 2 s a cycle per channel
    data, control, plan = await ssm_carousel(shelf, senders, 1_500_000, channels=2, rate_bps=6e6)
    relay = AmtRelay(RelayConfig(), listen=("127.0.0.1", 0), interface="127.0.0.1")
    address = await relay.start()
    gateway = AmtGateway([address])
    try:
        result = await receive_issue(
            shelf, control, ISSUE, tmp_path / "rx", control_source="127.0.0.1", gateway=gateway
        )
        assert result.completed and result.path.read_bytes() == data
        assert result.most_channels == 2 and result.channel_log[0] == (0.0, 1), result
        # the data channels were left as the receiver ended (BLOCK); the control
        # channel is the gateway's until it closes
        await asyncio.sleep(0.3)
        assert gateway.core.channels == {("127.0.0.1", control[0])}
        assert set(relay.core.members) == {("127.0.0.1", control[0])}
        assert plan.source == "127.0.0.1"
    finally:
        gateway.close()
        await asyncio.sleep(0.3)
        members = dict(relay.core.members)
        await relay.close()
    assert members == {}  # the leaves reached the relay: nothing sent on to nobody


def test_the_balancer_names_the_relays_and_the_source_in_its_directives() -> None:
    """``pressrun serve balancer --amt-relay ... --multicast-source ...``: the
    directive's multicast object carries both, and the client reads them back; a
    232/8 control group or a relay without the source is refused at start."""
    import argparse

    from pressrun.balancer.cli import _multicast_options
    from pressrun.balancer.codec import encode_directive
    from pressrun.balancer.events import DeliveryMode, Directive
    from pressrun.clients.codec import decode_directive

    def args(**kw: Any) -> argparse.Namespace:
        base = {
            "multicast_sender": "http://127.0.0.1:9",
            "multicast_control_group": "232.1.2.3:5400",
            "multicast_interface": None,
            "multicast_source": "192.0.2.1",
            "amt_relay": ["198.51.100.1", "198.51.100.2:3000"],
            "multicast_token_env": "PR_TEST_TOKEN",
        }
        return argparse.Namespace(**{**base, **kw})

    os.environ["PR_TEST_TOKEN"] = "t" * 24
    try:
        info = _multicast_options(args())["multicast"]
        with pytest.raises(ValueError, match="multicast-source"):
            _multicast_options(args(multicast_source=None))
        with pytest.raises(ValueError, match="relay"):
            _multicast_options(args(amt_relay=["not-an-address"]))
    finally:
        del os.environ["PR_TEST_TOKEN"]
    assert info == MulticastInfo(
        "232.1.2.3:5400", None, "192.0.2.1", ("198.51.100.1", "198.51.100.2:3000")
    )
    directive = Directive(ISSUE, DeliveryMode.MULTICAST, (), None, (), 30.0, "test", info)
    got = decode_directive(json.dumps(encode_directive(directive)).encode())
    assert got.multicast == DirectiveMulticast(
        "232.1.2.3:5400", None, "192.0.2.1", ("198.51.100.1", "198.51.100.2:3000")
    )


@root
async def test_a_relay_restarted_mid_issue_gets_the_tunnel_back(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """The relay goes away mid-issue (its port answers ICMP unreachable for a while)
    and a new one (another secret, no tunnels) starts on the same port: the
    receiver goes on, its next keep-alive Request gets a query, the whole state goes
    back in an Update, and the issue completes through the new relay."""
    from pressrun.multicast.gateway import AmtGateway
    from pressrun.multicast.relay import AmtRelay, RelayConfig

    from .conftest import receive_issue

    # 3 s a cycle
    data, control, _ = await ssm_carousel(shelf, senders, 1_500_000, channels=1, rate_bps=4e6)
    relay = AmtRelay(RelayConfig(), listen=("127.0.0.1", 0), interface="127.0.0.1")
    address = await relay.start()
    gateway = AmtGateway([address], keepalive_s=0.5)
    receiving = asyncio.ensure_future(
        receive_issue(
            shelf, control, ISSUE, tmp_path / "rx", control_source="127.0.0.1", gateway=gateway
        )
    )
    try:
        await asyncio.sleep(1.0)
        assert not receiving.done()
        first = relay.forwarded
        await relay.close()
        await asyncio.sleep(0.7)  # Requests meet a closed port meanwhile
        relay = AmtRelay(RelayConfig(), listen=address, interface="127.0.0.1")
        await relay.start()
        result = await receiving
    finally:
        gateway.close()
        await relay.close()
    assert first > 0 and relay.forwarded > 0
    assert result.completed and result.path.read_bytes() == data


@pytest.mark.parametrize("with_source", [True, False])
async def test_a_swarm_client_watches_a_source_specific_control_group_by_its_source(
    shelf: Shelf, senders: Any, with_source: bool
) -> None:
    """Issue 34 in the emulation (flash-crowd-amt at 11:41 and 11:49): with the
    carousel in 232/8 every swarm client's watch of the control channel raised 'a
    source-specific group: join it with its source', which failed its swarm fetch
    (swarm_note 'failed (...)', the file from the origins) and kept every native reader
    off the carousel when it started. With the sender's address
    (``carousel_control_source``, ``get --multicast-control-source``) the client
    hears the carousel start, leaves the swarm and takes the file from it; without
    it the watch is given up and the swarm goes on."""
    pytest.importorskip("libtorrent")
    from pressrun.balancer.demand import swarm_info_for

    data, control, _ = await ssm_carousel(shelf, senders, SIZE, channels=2, rate_bps=20e6)
    # 4 Mbit/s: the web seed alone would take 2.4 s for the file
    origin = await start_origin(
        OriginConfig(
            content_dir=shelf.content, name="origin-a", stats_interval_s=0.2, egress_cap_mbps=4.0
        )
    )
    manifest = json.loads((shelf.content / ISSUE / "manifest.json").read_bytes())
    tracker = f"http://127.0.0.1:{free_udp_port()}/announce"  # nobody answers there
    swarm_first = DemandConfig(enter_downloaders=1.0, leave_downloaders=0.0, min_dwell_s=0.0)
    policy = DemandPolicy(
        swarm_first,
        {ISSUE: swarm_info_for(origin.url, tracker, ISSUE, manifest["manifest"]["info_hash"])},
    )
    config = replace(
        CLIENT, amt="never", swarm_max_seed_s=0.0, carousel_control_group="{}:{}".format(*control)
    )
    if with_source:
        config = replace(config, carousel_control_source="127.0.0.1")
    result = await fetch_through_balancer(ISSUE, origin, policy, config, publisher=shelf)
    assert result.path.read_bytes() == data
    assert not (result.swarm_note or "").startswith("failed"), result.swarm_note
    if with_source:
        assert result.left_swarm_for_carousel and result.mode == "multicast"
        assert result.bytes_from_multicast > SIZE // 2
    else:
        assert result.mode == "swarm" and not result.left_swarm_for_carousel
        assert result.bytes_from_multicast == 0
