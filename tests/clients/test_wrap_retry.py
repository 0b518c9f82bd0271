"""A reader whose subscription service is restarting gets its wrap once the service is
back (found by bench/uptime.py: a `get` during the service's restart failed at once,
while the balancer and the origins are asked again); a refusal stays final at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import nacl.public
import pytest

from pressrun.clients.subscription import fetch_wrap_patiently
from pressrun.content.encryption import key_check, new_content_key, open_wrap, wrap_key
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import NotSubscribed, ServiceUnavailable, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "operator-secret-token"


def service(db: Path) -> SubscriptionService:
    return SubscriptionService(SubscriptionStore(db), operator_token=TOKEN)


async def test_a_wrap_asked_during_a_restart_arrives_when_the_service_is_back(
    tmp_path: Path,
) -> None:
    db = tmp_path / "subs.db"
    first = service(db)
    port = await first.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    alice, eve = nacl.public.PrivateKey.generate(), nacl.public.PrivateKey.generate()
    key = new_content_key()
    async with aiohttp.ClientSession() as http:
        operator = SubscriptionsClient(url, http, operator_token=TOKEN)
        await operator.add_subscriber(bytes(alice.public_key), "alice")
        await operator.put_wraps(
            "mag-1", 1, {bytes(alice.public_key): wrap_key(key, alice.public_key.encode())}
        )
        await first.close()  # the restart begins: nothing listens on the port

        reader = SubscriptionsClient(url, http, timeout_s=2.0)
        asking = asyncio.create_task(fetch_wrap_patiently(reader, "mag-1", 1, alice, retry_s=20))
        await asyncio.sleep(1.5)
        assert not asking.done(), "the reader gave up while the service restarted"
        second = service(db)
        await second.start("127.0.0.1", port)
        try:
            wrap = await asyncio.wait_for(asking, 15)
            assert open_wrap(wrap, alice, key_check(key)) == key

            # a refusal is an answer, not an outage: final at once
            started = time.monotonic()
            with pytest.raises(NotSubscribed):
                await fetch_wrap_patiently(reader, "mag-1", 1, eve, retry_s=20)
            assert time.monotonic() - started < 2.0
        finally:
            await second.close()

        # a service that stays away: the outage is reported when the time is up
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match="unreachable"):
            await fetch_wrap_patiently(reader, "mag-1", 1, alice, retry_s=1.0)
        assert 1.0 <= time.monotonic() - started < 4.0
