"""The subscription service at a publisher's real scale and under its own rules (issue 25,
findings 2 and 6): every body read to its end, the shared token rule, private files."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nacl.public
import pytest

from pressrun.cli import main
from pressrun.content.bundle import Bundle
from pressrun.content.encryption import open_wrap
from pressrun.content.keys import generate_keypair
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "operator-secret-token"
#: 3,000 subscribers list as about 410 KB of JSON: the old client read the first
#: buffered chunk of it (failing from about 1,000)
SUBSCRIBERS = 3000


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[SubscriptionService, str]]:
    subs = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    port = await subs.start("127.0.0.1", 0)
    try:
        yield subs, f"http://127.0.0.1:{port}"
    finally:
        await subs.close()


async def test_publish_encrypt_for_thousands_of_subscribers(
    tmp_path: Path,
    service: tuple[SubscriptionService, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    subs, url = service
    reader = nacl.public.PrivateKey.generate()
    # the subscribers go straight into the real SQLite store (PUT one by one would
    # only make the test slow); one real reader among them opens its wrap at the end
    keys = [os.urandom(32) for _ in range(SUBSCRIBERS - 1)] + [bytes(reader.public_key)]
    for i, key in enumerate(keys):
        subs.store.add_subscriber(key, f"reader-{i}", "2026-11-28T00:00:00Z")
    publisher_key, _ = generate_keypair(tmp_path / "publisher.key")
    source = tmp_path / "weekly-50.pdf"
    source.write_bytes(os.urandom(300_000))
    monkeypatch.setenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", TOKEN)
    argv = [
        "publish",
        str(source),
        "--issue",
        "weekly-50",
        "--title",
        "Weekly 50",
        "--key",
        str(publisher_key),
        "--content",
        str(tmp_path / "content"),
        "--encrypt",
        "--subscriptions",
        url,
    ]
    # publish is synchronous and its directory runs its own loop on a thread: off
    # this loop, which serves the subscription service
    assert await asyncio.to_thread(main, argv) == 0
    bundle = Bundle.load(tmp_path / "content" / "weekly-50")
    enc = bundle.manifest.encryption
    assert enc is not None
    (stored,) = subs.store.db.execute(
        "SELECT count(*) FROM wraps WHERE issue_id = 'weekly-50' AND version = ?",
        (enc.version,),
    ).fetchone()
    assert stored == SUBSCRIBERS
    async with aiohttp.ClientSession() as http:
        client = SubscriptionsClient(url, http)
        wrap = await client.fetch_wrap("weekly-50", enc.version, reader)
    assert len(open_wrap(wrap, reader, enc.key_check)) == 32


async def test_a_small_body_in_two_segments_is_read_whole(
    service: tuple[SubscriptionService, str],
) -> None:
    _, url = service
    key = bytes(nacl.public.PrivateKey.generate().public_key)
    body = b'{"name": "' + b"a" * 150 + b'"}'

    async def two_segments() -> AsyncIterator[bytes]:
        yield body[:20]
        await asyncio.sleep(0.2)  # the first segment is in the server's buffer alone
        yield body[20:]

    async with aiohttp.ClientSession() as http:
        async with http.put(
            f"{url}/v1/subscribers/{key.hex()}",
            data=two_segments(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        ) as resp:
            doc = await resp.json()
            assert resp.status == 201, doc
        assert doc["name"] == "a" * 150
        # over the limit (4096 bytes) in segments: still 413, not a cut body
        big = b'{"name": "' + b"b" * 5000 + b'"}'

        async def big_segments() -> AsyncIterator[bytes]:
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]
                await asyncio.sleep(0.01)

        async with http.put(
            f"{url}/v1/subscribers/{key.hex()}",
            data=big_segments(),
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as resp:
            assert resp.status == 413


def test_the_token_rule_is_the_other_services_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SubscriptionStore(tmp_path / "subs.db")
    try:
        for short in ("x", "fifteen-chars-x"):
            with pytest.raises(ValueError, match="at least 16 characters"):
                SubscriptionService(store, operator_token=short)
        SubscriptionService(store, operator_token="sixteen-chars-ok")
    finally:
        store.close()
    monkeypatch.delenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", raising=False)
    argv = ["serve", "subscriptions", "--port", "0", "--db", str(tmp_path / "cli.db")]
    assert main([*argv, "--operator-token", "x"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    monkeypatch.setenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", "short")
    assert main(argv) == 2
    assert "at least 16 characters" in capsys.readouterr().err


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_database_is_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # the usual umask: files 0644 unless made private
    try:
        db = tmp_path / "state" / "subs" / "subscriptions.db"
        subs = SubscriptionService(SubscriptionStore(db), operator_token=TOKEN)
        await subs.start("127.0.0.1", 0)
        try:
            subs.store.add_subscriber(os.urandom(32), "alice", "2026-11-28T00:00:00Z")
            files = sorted(p.name for p in db.parent.iterdir())
            assert "subscriptions.db-wal" in files
            for name in files:
                assert mode(db.parent / name) == 0o600, name
            assert mode(db.parent) == 0o700
            assert mode(db.parent.parent) == 0o700
        finally:
            await subs.close()
        # a database made readable by others (an older pressrun, a copy) is narrowed
        legacy = tmp_path / "legacy.db"
        SubscriptionStore(legacy).close()
        os.chmod(legacy, 0o644)
        SubscriptionStore(legacy).close()
        assert mode(legacy) == 0o600
    finally:
        os.umask(old_umask)
