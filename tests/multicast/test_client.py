"""``pressrun get`` in multicast mode end to end: an origin, the balancer answering
``multicast`` for a running carousel, the sender, and `fetch_issue`; a poisoned
carousel fails the manifest check and the client still ends with a verified file."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import MulticastInfo
from pressrun.multicast.config import CarouselConfig
from pressrun.origin import OriginConfig, start_origin

from .conftest import (
    ISSUE,
    PEAK_AT_ONCE,
    Published,
    fetch_through_balancer,
    leave_swarm_for_carousel,
    multicast_client,
)

SIZE = 2_000_000 + 123
CLIENT = multicast_client()


async def _fetch(pub: Published, sender: Any) -> Any:
    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    group = "{}:{}".format(*sender.config.control_group)
    policy = DemandPolicy(PEAK_AT_ONCE, {}, {ISSUE: MulticastInfo(group, "127.0.0.1")})
    return await fetch_through_balancer(ISSUE, origin, policy, CLIENT, publisher=pub)


async def test_get_in_multicast_mode(
    published: Callable[[int], Published], sender_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pressrun.clients.aio

    # the object's pieces and whole SHA-256 are checked on the one read that makes it
    # the partial file: the final check does not read it again
    final_checks: list[Path] = []
    check_file = pressrun.clients.aio.check_file
    monkeypatch.setattr(
        pressrun.clients.aio,
        "check_file",
        lambda m, path, **kw: final_checks.append(path) or check_file(m, path, **kw),
    )
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    await sender.start_carousel(ISSUE, sender.config.carousel)
    result = await _fetch(pub, sender)
    assert final_checks == []
    assert result.mode == "multicast"
    assert result.bytes_from_multicast == SIZE
    assert sum(result.bytes_by_origin.values()) == 0
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()


async def test_poisoned_carousel_fails_verification_and_falls_back(
    published: Callable[[int], Published], sender_factory: Any
) -> None:
    import pressrun_flute

    pub = published(SIZE)
    carousel = CarouselConfig(channels=1, rate_bps=20e6, max_source_block_symbols=512)
    sender = await sender_factory(pub, carousel)
    plan = await sender.start_carousel(ISSUE, carousel)
    # the same pass the sender built (the encoder is deterministic): find block 0
    enc = pressrun_flute.encode_object(
        pub.data,
        content_location=f"file:///{ISSUE}/{ISSUE}.pdf",
        content_type="application/octet-stream",
        tsi=plan.channels[0].tsi,
        toi=plan.toi,
        fec="raptorq",
        encoding_symbol_length=carousel.symbol_bytes,
        max_source_block_length=carousel.max_source_block_symbols,
        repair_symbols_per_block=carousel.repair_symbols_per_block(SIZE),
    )
    running = sender.thread.get(ISSUE)
    assert running is not None and len(running.packets) == len(enc.fdt_packets) + len(enc.packets)
    fdt = len(enc.fdt_packets)
    packets = [running.packets.packet(i) for i in range(len(running.packets))]
    poisoned = 0
    for i, sbn in enumerate(enc.sbns):
        if sbn == 0:  # every symbol of block 0: its last payload byte changed in flight
            packet = bytearray(packets[fdt + i])
            assert bytes(packet) == enc.packets[i]
            packet[-1] ^= 0x5A
            packets[fdt + i] = bytes(packet)
            poisoned += 1
    assert poisoned > 0 and len(enc.block_source_symbols) > 1
    running.packets = pressrun_flute.PacketBuffer(packets)  # what goes out from now on
    result = await _fetch(pub, sender)
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    assert result.mode == "multicast"
    # block 0's pieces failed the manifest and came from the origin; the rest was kept
    from_origin = sum(result.bytes_by_origin.values())
    assert from_origin > 0
    assert 0 < result.bytes_from_multicast < SIZE
    assert result.bytes_from_multicast + from_origin >= SIZE
    assert (
        result.multicast_note is not None and "failed the manifest check" in result.multicast_note
    )


@pytest.mark.parametrize("control_group", ["not-a-group", "10.0.0.1:5"])
async def test_a_bad_control_group_goes_to_the_fallbacks(
    published: Callable[[int], Published], control_group: str
) -> None:
    pub = published(300_000)
    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    policy = DemandPolicy(PEAK_AT_ONCE, {}, {ISSUE: MulticastInfo(control_group, None)})
    result = await fetch_through_balancer(ISSUE, origin, policy, CLIENT, publisher=pub, seed=None)
    assert result.path.read_bytes() == pub.data
    assert result.bytes_from_multicast == 0 and sum(result.bytes_by_origin.values()) > 0


async def test_a_swarm_client_leaves_for_the_carousel_when_one_runs(
    published: Callable[[int], Published], sender_factory: Any
) -> None:
    """Sent to the swarm (its only source a slow origin's web seed), the client hears
    the issue's carousel on the control channel early in its download, leaves the swarm
    and ends with the carousel's file, the swarm's verified pieces kept."""
    pytest.importorskip("libtorrent")
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    # 4 Mbit/s: the web seed alone would take 4 s for the file
    result = await leave_swarm_for_carousel(pub, sender, CLIENT, web_seed_mbps=4.0)
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    assert result.left_swarm_for_carousel and result.mode == "multicast"
    assert result.swarm_note is not None and result.swarm_note.startswith("left for the carousel")
    assert result.bytes_from_multicast > SIZE // 2
    assert sum(result.bytes_by_origin.values()) == 0  # no origin section was needed
