"""The wrap route reads SQLite on the event loop through a read-only connection
(issue 35, the wrap crowd): it serves while a large upload commits on the worker
thread, and a database it cannot read is a 503 to ask again, not a 500."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import nacl.public

from pressrun.content.encryption import key_check, new_content_key, open_wrap, wrap_key
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import ServiceUnavailable, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "operator-secret-token"


async def test_wraps_are_served_while_a_large_upload_commits(tmp_path: Path) -> None:
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    url = f"http://127.0.0.1:{await service.start('127.0.0.1', 0)}"
    try:
        ada = nacl.public.PrivateKey.generate()
        key = new_content_key()
        others = [os.urandom(32) for _ in range(5_000)]
        with service.store.db:
            service.store.db.executemany(
                "INSERT INTO subscribers (public_key, name, added_at) VALUES (?, 'x', 'y')",
                [(k,) for k in [*others, bytes(ada.public_key)]],
            )
            service.store.db.executemany(  # each subscriber's own key: their one device
                "INSERT INTO devices (public_key, subscriber, name, added_at)"
                " VALUES (?, ?, 'x', 'y')",
                [(k, k) for k in [*others, bytes(ada.public_key)]],
            )
        async with aiohttp.ClientSession() as http:
            operator = SubscriptionsClient(url, http, operator_token=TOKEN)
            await operator.put_wraps(
                "mag-1", 1, {bytes(ada.public_key): wrap_key(key, bytes(ada.public_key))}
            )
            reader = SubscriptionsClient(url, http)
            # 5,000 wraps of another issue committing on the worker thread meanwhile
            upload = asyncio.create_task(
                operator.put_wraps("mag-2", 1, {k: os.urandom(80) for k in others})
            )
            opened = 0
            while not upload.done() or opened < 5:
                wrap = await reader.fetch_wrap("mag-1", 1, ada)
                assert open_wrap(wrap, ada, key_check(key)) == key
                opened += 1
            assert (await upload)[0] == 5_000
    finally:
        await service.close()


async def test_a_database_it_cannot_read_is_a_503(tmp_path: Path) -> None:
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    url = f"http://127.0.0.1:{await service.start('127.0.0.1', 0)}"
    try:
        ada = nacl.public.PrivateKey.generate()
        service.store.add_subscriber(bytes(ada.public_key), "ada", "2027-01-15T00:00:00Z")
        service.reader.db.close()  # every read on the loop now fails
        async with aiohttp.ClientSession() as http:
            reader = SubscriptionsClient(url, http)
            try:
                await reader.fetch_wrap("mag-1", 1, ada)
            except ServiceUnavailable as err:
                assert "cannot read its database" in str(err)
            else:
                raise AssertionError("a wrap was answered from a closed database")
        service.reader.db = SubscriptionStore(tmp_path / "subs.db", read_only=True).db
    finally:
        await service.close()
