"""``get`` into a library end to end (origins, a balancer and a subscription service on
127.0.0.1): issue files named like pressrun's own files, an issue already in the
library, and a disk that writes short."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest

from pressrun.clients.aio import FetchError, fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.content.bundle import verify_issue
from pressrun.content.keys import generate_keypair, load_public_key, load_subscriber_key
from pressrun.content.publish import PublishError, publish
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

PIECE = 64 * 1024
TOKEN = "library-test-token"
FAST = replace(DESKTOP, stall_timeout_s=3.0, retry_backoff_s=0.05, retry_backoff_max_s=0.5)


@dataclass
class Bed:
    bed: Testbed
    secret: Path
    trusted: set[bytes]

    @property
    def url(self) -> str:
        assert self.bed.balancer is not None
        return self.bed.balancer.url

    async def publish(self, data: bytes, issue: str, name: str, **kw: object) -> Path:
        source = self.bed.root / "sources" / issue / name
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        bundle = await asyncio.to_thread(
            publish,
            source,
            issue_id=issue,
            title=f"Issue {issue}",
            key_path=self.secret,
            content_dir=self.bed.content_dir,
            web_seeds=list(self.bed.urls.values()),
            piece_size=PIECE,
            **kw,  # type: ignore[arg-type]
        )
        await self.ready(issue)
        return bundle

    async def ready(self, issue: str) -> None:
        """Until the balancer answers a directive for ``issue`` (next status poll)."""
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                async with http.get(f"{self.url}/v1/issues/{issue}/directive") as r:
                    if r.status == 200:
                        return
                await asyncio.sleep(0.05)
        raise AssertionError(f"the balancer never offered {issue}")

    async def get(self, issue: str, library: Path, **kw: object) -> object:
        return await fetch_issue(
            issue,
            balancer_url=self.url,
            library=library,
            config=FAST,
            trusted_keys=self.trusted,
            **kw,  # type: ignore[arg-type]
        )


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    shapes = (OriginShape("origin-a"), OriginShape("origin-b"))
    testbed = Testbed(tmp_path / "bed", shapes, poll_interval_s=0.3, poll_timeout_s=1.0)
    await testbed.__aenter__()
    try:
        await testbed.start_balancer()
        yield Bed(testbed, secret, {load_public_key(public)})
    finally:
        await testbed.close()


async def test_an_encrypted_issue_named_manifest_json_is_the_issue_in_the_library(
    tmp_path: Path, bed: Bed
) -> None:
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    port = await service.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        reader_secret, _ = generate_keypair(tmp_path / "reader.key", subscriber=True)
        reader = load_subscriber_key(reader_secret)
        async with aiohttp.ClientSession() as http:
            operator = SubscriptionsClient(url, http, operator_token=TOKEN)
            await operator.add_subscriber(bytes(reader.public_key), "reader")
        data = random.Random(1).randbytes(3 * PIECE + 11)
        await bed.publish(
            data, "mj-1", "manifest.json", encrypt_for=HttpSubscriberDirectory(url, TOKEN)
        )
        result = await bed.get("mj-1", tmp_path / "lib", subscriber_key=reader)
    finally:
        await service.close()
    path = result.path  # type: ignore[attr-defined]
    assert path == tmp_path / "lib" / "mj-1" / "manifest.json"
    assert path.read_bytes() == data  # the plaintext, not the signed manifest over it
    report = verify_issue(path.parent, bed.trusted)  # the decrypted copy, checked
    assert report.decrypted and report.file_path == path


async def test_a_plain_issue_named_state_json_downloads(tmp_path: Path, bed: Bed) -> None:
    data = random.Random(2).randbytes(2 * PIECE + 3)
    await bed.publish(data, "sj-1", "state.json")
    result = await bed.get("sj-1", tmp_path / "lib")
    assert result.path.read_bytes() == data  # type: ignore[attr-defined]
    verify_issue(tmp_path / "lib" / "sj-1", bed.trusted)


async def test_publish_refuses_the_bundles_own_names(bed: Bed) -> None:
    for name in ("manifest.json", "mj-2.torrent"):
        with pytest.raises(PublishError, match="is one of the bundle's own files"):
            await bed.publish(b"x" * 100, "mj-2", name)
    assert not (bed.bed.content_dir / "mj-2").exists()


async def test_an_issue_already_in_the_library_is_checked_not_fetched(
    tmp_path: Path, bed: Bed
) -> None:
    data = random.Random(3).randbytes(4 * PIECE)
    await bed.publish(data, "mag-1", "mag-1.pdf")
    library = tmp_path / "lib"
    first = await bed.get("mag-1", library)
    assert first.bytes_from_origins == len(data)  # type: ignore[attr-defined]
    again = await bed.get("mag-1", library)
    assert again.already_in_library  # type: ignore[attr-defined]
    assert again.bytes_from_origins == 0  # type: ignore[attr-defined]
    # a damaged copy is noticed and fetched again
    path = first.path  # type: ignore[attr-defined]
    damaged = bytearray(path.read_bytes())
    damaged[PIECE + 1] ^= 0xFF
    path.write_bytes(bytes(damaged))
    third = await bed.get("mag-1", library)
    assert not third.already_in_library  # type: ignore[attr-defined]
    assert path.read_bytes() == data


async def test_a_short_write_is_finished_not_taken_for_a_piece(
    tmp_path: Path, bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(4).randbytes(4 * PIECE)
    await bed.publish(data, "mag-2", "mag-2.pdf")
    real = os.pwrite
    calls = [0]

    def short_once(fd: int, buf: bytes, offset: int) -> int:
        calls[0] += 1
        if calls[0] == 1:  # a full disk's first answer: part of the piece
            return real(fd, bytes(buf)[: len(buf) // 3], offset)
        return real(fd, buf, offset)

    monkeypatch.setattr(os, "pwrite", short_once)
    result = await bed.get("mag-2", tmp_path / "lib")
    assert result.path.read_bytes() == data  # type: ignore[attr-defined]
    # the rest of that piece was written, not fetched again after a failed final check
    assert result.bytes_from_origins == len(data)  # type: ignore[attr-defined]


async def test_a_disk_that_stays_full_is_a_clear_error(
    tmp_path: Path, bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(5).randbytes(4 * PIECE)
    await bed.publish(data, "mag-3", "mag-3.pdf")

    def full(fd: int, buf: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(FetchError, match="cannot write to the partial download: No space left"):
        await bed.get("mag-3", tmp_path / "lib")
    assert not (tmp_path / "lib" / "mag-3").exists()
