"""What only shows after weeks of uptime: a prepare loop that outlives a bad issue, an
issue too large for the default FEC blocks, metric children of stopped carousels.
Real senders on 127.0.0.1 with real UDP multicast (as in test_live.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pressrun.content.keys import generate_keypair, load_public_key, load_signing_key
from pressrun.content.publish import publish
from pressrun.multicast.config import MAX_SOURCE_BLOCKS, CarouselConfig
from pressrun.multicast.receiver import receive_carousel
from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

from .conftest import TOKEN, random_groups

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Shelf:
    """A content folder and the publisher's key: issues published on demand."""

    root: Path
    content: Path
    key_path: Path
    public_hex: str

    def publish(self, issue_id: str, size: int, *, seed: int = 0, force: bool = False) -> bytes:
        data = random.Random(f"{issue_id}/{seed}").randbytes(size)
        source = self.root / "source" / f"{issue_id}.pdf"
        source.parent.mkdir(exist_ok=True)
        source.write_bytes(data)
        publish(
            source,
            issue_id=issue_id,
            title=issue_id,
            key_path=self.key_path,
            content_dir=self.content,
            piece_size=16384,
            force=force,
        )
        return data

    def manifest_sha256(self, issue_id: str) -> str:
        import hashlib

        return hashlib.sha256((self.content / issue_id / "manifest.json").read_bytes()).hexdigest()


@pytest.fixture
def shelf(tmp_path: Path) -> Shelf:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    content.mkdir()
    return Shelf(tmp_path, content, secret, load_public_key(public).hex())


@pytest.fixture
async def senders() -> AsyncIterator[Callable[..., Any]]:
    started: list[MulticastSender] = []
    rng = random.Random()

    async def start(shelf: Shelf, carousel: CarouselConfig, **extra: Any) -> MulticastSender:
        control, base = random_groups(rng)
        options: dict[str, Any] = {
            "content_dir": shelf.content,
            "control_group": control,
            "signing_key": load_signing_key(shelf.key_path),
            "token": TOKEN,
            "carousel": carousel,
            "group_base": base,
            "announce_interval_s": 0.2,
            "announcement_ttl_s": 2.0,
        }
        options.update(extra)
        sender = MulticastSender(SenderServiceConfig(**options))
        started.append(sender)
        await sender.start()
        return sender

    yield start
    for sender in started:
        await sender.close()


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
    1400 bytes); the block size now grows with the issue."""
    config = CarouselConfig()
    for size in (1, 10**6, 367_000_000, 400_000_000, 2 * 1024**3):
        k = config.source_block_symbols(size)
        symbols = -(-size // config.symbol_bytes)
        assert -(-symbols // k) <= MAX_SOURCE_BLOCKS["raptorq"], size
        assert config.repair_symbols_per_block(size) <= 65535
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
    work = tmp_path / "r"
    work.mkdir()
    result = await asyncio.to_thread(
        receive_carousel,
        "weekly-big",
        shelf.manifest_sha256("weekly-big"),
        control_group=sender.config.control_group,
        interface="127.0.0.1",
        trusted_keys={shelf.public_hex},
        work_dir=work,
        deadline_s=30.0,
    )
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
