"""What only shows after weeks of uptime: a prepare loop that outlives a bad issue, an
issue too large for the default FEC blocks, metric children of stopped carousels.
Real senders on 127.0.0.1 with real UDP multicast (as in test_live.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pressrun.multicast.config import MAX_ESI, MAX_SOURCE_BLOCKS, CarouselConfig
from pressrun.multicast.sender import MulticastSender

from .conftest import AUTH, Shelf, receive_issue


async def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} within {seconds} s")


async def test_the_prepare_loop_outlives_a_bad_issue_and_says_why(
    shelf: Shelf, senders: Any
) -> None:
    # an issue whose manifest cannot be read (a directory where the file should be):
    # the old loop died on the OSError and never prepared anything again
    bad = shelf.content / "weekly-bad" / "manifest.json"
    bad.mkdir(parents=True)
    sender = await senders(
        shelf, CarouselConfig(channels=1, rate_bps=2e6), prepare_interval_s=0.1, prepare_issues=3
    )
    await wait_for(lambda: "weekly-bad" in sender.preparer.failed, 5, "the bad issue marked")
    shelf.publish("weekly-good", 40_000)
    await wait_for(lambda: "weekly-good" in sender.preparer.prepared, 10, "a later issue prepared")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{sender.url}/healthz") as resp:
            health = await resp.json()
        assert (
            "weekly-bad" in health["failed"] and "cannot be read" in health["failed"]["weekly-bad"]
        )
        async with http.post(
            f"{sender.url}/v1/carousels", json={"issue_id": "weekly-bad"}, headers=AUTH
        ) as resp:
            assert resp.status == 500
            assert "the manifest of weekly-bad cannot be read" in (await resp.json())["error"]
        async with http.post(
            f"{sender.url}/v1/carousels", json={"issue_id": "weekly-good"}, headers=AUTH
        ) as resp:
            assert resp.status == 201


def test_every_size_up_to_2_gb_fits_the_fec_blocks() -> None:
    """The default RaptorQ settings took 367 MB at most (255 blocks of 1024 symbols of
    1400 bytes, 345 MB with today's 1320); the block size now grows with the issue."""
    config = CarouselConfig()
    for size in (1, 10**6, 367_000_000, 400_000_000, 2 * 1024**3):
        k = config.source_block_symbols(size)
        symbols = -(-size // config.symbol_bytes)
        assert -(-symbols // k) <= MAX_SOURCE_BLOCKS["raptorq"], size
        assert k + config.repair_symbols_per_block(size) <= MAX_ESI + 1  # 24-bit ESIs
    assert config.source_block_symbols(10**6) == 1024  # small issues keep the default
    with pytest.raises(ValueError, match="use larger symbols"):
        CarouselConfig(symbol_bytes=64).source_block_symbols(10**12)


async def test_an_issue_past_the_default_block_limit_is_carried(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """The same limit at a small scale: 64-byte symbols in blocks of 4 hold 65,280
    bytes in 255 blocks; the binding refused more with a ValueError (a POST answered
    500 and the prepare loop died). Now it is encoded and received bit-exact."""
    data = shelf.publish("weekly-big", 100_000)
    carousel = CarouselConfig(channels=1, rate_bps=8e6, symbol_bytes=64, max_source_block_symbols=4)
    sender = await senders(shelf, carousel, prepare_interval_s=0.1)
    await wait_for(lambda: "weekly-big" in sender.preparer.prepared, 20, "the issue prepared")
    assert not sender.preparer.failed
    await sender.start_carousel("weekly-big", carousel)
    result = await receive_issue(
        shelf, sender.config.control_group, "weekly-big", tmp_path / "r", deadline_s=30.0
    )
    assert result.completed and result.path is not None, result.reason
    assert result.path.read_bytes() == data


async def test_the_receive_cache_grows_with_the_issue(
    shelf: Shelf, senders: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block of a carousel's object is in progress at once, so the binding's
    cache must hold about the whole object: with a fixed cache (512 MiB, here 20 kB
    for a 100 kB issue) the object failed with "Pkt cache is full"."""
    from pressrun.multicast import receiver

    monkeypatch.setattr(receiver, "MAX_CACHE_BYTES", 20_000)
    data = shelf.publish("weekly-cache", 100_000)
    carousel = CarouselConfig(channels=1, rate_bps=8e6, symbol_bytes=256)
    sender = await senders(shelf, carousel)
    await sender.start_carousel("weekly-cache", carousel)
    result = await receive_issue(shelf, sender.config.control_group, "weekly-cache", tmp_path / "r")
    assert result.completed and result.path is not None, result.reason
    assert result.path.read_bytes() == data


async def test_a_stopped_carousel_leaves_no_metric_children(shelf: Shelf, senders: Any) -> None:
    shelf.publish("weekly-m", 30_000)
    sender = await senders(shelf, CarouselConfig(channels=2, rate_bps=2e6))
    await sender.start_carousel("weekly-m", sender.config.carousel)
    label = 'issue="weekly-m"'
    async with aiohttp.ClientSession() as http:

        async def metrics() -> str:
            async with http.get(f"{sender.url}/metrics") as resp:
                return await resp.text()

        for _ in range(100):
            if label in await metrics():
                break
            await asyncio.sleep(0.05)
        assert label in await metrics()
        assert sender.stop_carousel("weekly-m")
        for _ in range(100):
            if label not in await metrics():
                break
            await asyncio.sleep(0.05)
        assert label not in await metrics()
        # a carousel started again counts again
        await sender.start_carousel("weekly-m", sender.config.carousel)
        for _ in range(100):
            if label in await metrics():
                break
            await asyncio.sleep(0.05)
        assert label in await metrics()


def _fdt_packets(sender: MulticastSender, issue_id: str, seconds: float) -> list[bytes]:
    """The FDT packets (TOI 0) heard on channel 0 of the issue's carousel."""
    import time

    from pressrun.multicast.net import receiver_socket

    running = sender.thread.get(issue_id)
    assert running is not None
    ch = running.plan.channels[0]
    sock = receiver_socket(ch.group, ch.port, "127.0.0.1")
    sock.setblocking(True)
    sock.settimeout(0.2)
    found: list[bytes] = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            try:
                data = sock.recv(4200)
            except TimeoutError:
                continue
            if b"<FDT-Instance" in data:
                found.append(data)
    finally:
        sock.close()
    return found


def _expires(fdt_packet: bytes) -> int:
    import re

    match = re.search(rb'Expires="(\d+)"', fdt_packet)
    assert match is not None
    return int(match.group(1))


async def test_a_receiver_a_day_ahead_takes_the_object(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """The pass's FDT expired a day after preparation: pressrun's receive path with
    its clock 25 h ahead (as after a day of uptime) took packets for ever and never
    completed. The FDT carries the Sender Current Time now (RFC 6726 EXT_TIME): the
    expiry is judged by the sender's clock."""
    import pressrun_flute

    from pressrun.multicast.net import receiver_socket

    data = shelf.publish("weekly-skew", 200_000)
    carousel = CarouselConfig(channels=1, rate_bps=8e6)
    sender = await senders(shelf, carousel)
    plan = await sender.start_carousel("weekly-skew", carousel)
    ch = plan.channels[0]

    def receive(clock_offset_s: float) -> Path | None:
        import time

        work = tmp_path / f"r{clock_offset_s:g}"
        work.mkdir()
        rx = pressrun_flute.Receiver(work, clock_offset_s=clock_offset_s)
        sock = receiver_socket(ch.group, ch.port, "127.0.0.1")
        sock.setblocking(True)
        sock.settimeout(0.2)
        end = time.monotonic() + 3 * plan.cycle_s + 5
        try:
            while time.monotonic() < end:
                try:
                    rx.push(sock.recv(4200))
                except TimeoutError:
                    continue
                for event in rx.take_events():
                    return Path(event.path) if event.path else None
        finally:
            sock.close()
        return None

    ahead, behind = await asyncio.gather(
        asyncio.to_thread(receive, 25 * 3600.0), asyncio.to_thread(receive, -25 * 3600.0)
    )
    assert ahead is not None and ahead.read_bytes() == data
    assert behind is not None and behind.read_bytes() == data


async def test_a_running_carousel_renews_its_fdt(shelf: Shelf, senders: Any) -> None:
    """A pass is reused for the sender's life: its FDT is built again every
    fdt_renew_s with the next FDT Instance ID and a later Expires."""
    shelf.publish("weekly-fdt", 50_000)
    carousel = CarouselConfig(channels=1, rate_bps=4e6, fdt_every_packets=10)
    sender = await senders(shelf, carousel, fdt_renew_s=1.0, prepare_interval_s=0.2)
    await sender.start_carousel("weekly-fdt", carousel)
    first = await asyncio.to_thread(_fdt_packets, sender, "weekly-fdt", 0.5)
    await asyncio.sleep(2.5)
    later = await asyncio.to_thread(_fdt_packets, sender, "weekly-fdt", 0.5)
    assert first and later
    assert max(map(_expires, later)) > max(map(_expires, first))
    running = sender.thread.get("weekly-fdt")
    assert running is not None and running.prepared.fdt.instance_id >= 2


async def test_passes_of_carousels_gone_from_the_air_are_dropped(
    shelf: Shelf, senders: Any
) -> None:
    """With --prepare-issues 0 every pass a carousel start encoded stayed in memory for
    the sender's life (size x channels x 1.35 per issue ever carouselled)."""
    for issue in ("weekly-p1", "weekly-p2"):
        shelf.publish(issue, 30_000)
    carousel = CarouselConfig(channels=2, rate_bps=200e3)
    sender = await senders(shelf, carousel, prepare_issues=0, prepare_interval_s=0.1)
    for issue in ("weekly-p1", "weekly-p2"):
        await sender.start_carousel(issue, carousel)
    assert sender.stop_carousel("weekly-p1")
    await wait_for(lambda: set(sender.preparer.prepared) == {"weekly-p2"}, 5, "the pass dropped")
    await asyncio.sleep(0.3)
    assert set(sender.preparer.prepared) == {"weekly-p2"}  # the one on the air stays
