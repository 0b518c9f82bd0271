"""Source-specific multicast (RFC 4607, issue 34 item 1): channels on 232/8 groups are
joined by (source, group), the plan names the source, and packets fit an AMT tunnel.
Real UDP multicast on 127.0.0.1."""

from __future__ import annotations

import random
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pressrun.multicast import amt
from pressrun.multicast.codec import (
    ANNOUNCEMENT_PART_BYTES,
    AnnouncementFormatError,
    carousel_to_dict,
    decode_carousel,
)
from pressrun.multicast.config import CarouselConfig, is_ssm
from pressrun.multicast.events import CarouselPlan, ChannelSpec
from pressrun.multicast.net import free_udp_port, leave_and_close, receiver_socket

from .conftest import Shelf, receive_issue


def _ssm_group() -> str:
    rng = random.Random()
    return f"232.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.{rng.randrange(1, 200)}"


def _sent_from(address: str, group: str, port: int, payload: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.bind((address, 0))
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        tx.sendto(payload, (group, port))


def _drain(sock: socket.socket, seconds: float = 0.3) -> list[bytes]:
    got: list[bytes] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            got.append(sock.recv(2000))
        except BlockingIOError:
            time.sleep(0.01)
    return got


def test_a_source_specific_join_hears_its_source_only() -> None:
    group, port = _ssm_group(), free_udp_port()
    assert is_ssm(group) and not is_ssm("239.255.1.1") and not is_ssm("not an address")
    sock = receiver_socket(group, port, "127.0.0.1", source="127.0.0.1")
    try:
        _sent_from("127.0.0.2", group, port, b"a stranger")
        _sent_from("127.0.0.1", group, port, b"the sender")
        assert _drain(sock) == [b"the sender"]
    finally:
        leave_and_close(sock, group, "127.0.0.1", "127.0.0.1")
    with pytest.raises(ValueError, match="join it with its source"):
        receiver_socket(group, port, "127.0.0.1")


def test_the_plan_names_its_source_and_an_ssm_plan_without_one_is_refused() -> None:
    group = _ssm_group()
    plan = CarouselPlan(
        "weekly",
        "ab" * 32,
        1000,
        1,
        "raptorq",
        1320,
        1,
        1.0,
        (ChannelSpec(group, 5000, 1, 5e6, 473.0),),
        source="192.0.2.1",
    )
    assert decode_carousel(carousel_to_dict(plan)) == plan
    asm = replace(plan, channels=(ChannelSpec("239.255.1.1", 5000, 1, 5e6, 473.0),), source=None)
    assert "source" not in carousel_to_dict(asm)  # any-source plans' bytes as before
    with pytest.raises(AnnouncementFormatError, match="names no source"):
        decode_carousel(carousel_to_dict(replace(plan, source=None)))
    with pytest.raises(AnnouncementFormatError, match="not a unicast address"):
        decode_carousel(carousel_to_dict(replace(plan, source="232.1.1.1")))


def test_packets_and_announcements_fit_an_amt_tunnel_with_room_to_spare() -> None:
    """1500-byte path: IP/UDP (28) + the packet + AMT (30) leaves at least 80 bytes."""
    import pressrun_flute

    config = CarouselConfig()
    enc = pressrun_flute.encode_object(
        random.Random(1).randbytes(200_000),
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=1,
        toi=2,
        fec=config.fec,
        encoding_symbol_length=config.symbol_bytes,
        repair_symbols_per_block=10,
    )
    largest = max(
        len(pressrun_flute.add_channel_sequence(p, 1)) for p in [*enc.fdt_packets, *enc.packets]
    )
    for payload in (largest, ANNOUNCEMENT_PART_BYTES):
        assert 28 + payload + amt.TUNNEL_OVERHEAD_BYTES <= 1500 - 80, payload


async def test_a_carousel_on_ssm_groups_is_received_by_source(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    data = shelf.publish("weekly-ssm", 300_000)
    carousel = CarouselConfig(channels=2, rate_bps=8e6)
    sender = await senders(shelf, carousel, group_base=_ssm_group())
    plan = await sender.start_carousel("weekly-ssm", carousel)
    assert plan.source == "127.0.0.1" and all(is_ssm(ch.group) for ch in plan.channels)
    result = await receive_issue(shelf, sender.config.control_group, "weekly-ssm", tmp_path / "r")
    assert result.completed and result.path is not None, result.reason
    assert result.path.read_bytes() == data
    assert result.plan is not None and result.plan.source == "127.0.0.1"
