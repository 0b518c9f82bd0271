"""What a stranger (or a careless operator) tries on the subscription and reader
services (issue 25, findings 2, 6 and 8), as the attack suite sees it; the fuller
tests are in tests/subscriptions/test_limits.py and tests/reader/test_headers.py."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nacl.public
import pytest

from pressrun.security import SecurityConfigError, ServiceSecurity, private_file
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "attack-suite-operator-token"


def test_one_token_rule_for_every_service(tmp_path: Path) -> None:
    store = SubscriptionStore(tmp_path / "subs.db")
    try:
        for short in ("x", "a" * 15):
            with pytest.raises(SecurityConfigError):
                ServiceSecurity(operator_token=short)  # tracker, balancer
            with pytest.raises(SecurityConfigError):
                SubscriptionService(store, operator_token=short)
    finally:
        store.close()


def test_state_is_created_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)  # the worst umask: everything world-writable
    try:
        path = private_file(tmp_path / "a" / "b" / "state.db")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        store = SubscriptionStore(tmp_path / "subs.db")
        store.add_subscriber(os.urandom(32), "alice", "2026-11-28T00:00:00Z")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("subs.db*")}
        store.close()
        assert modes and set(modes.values()) == {0o600}, modes
    finally:
        os.umask(old)


@pytest.fixture
async def subscriptions(tmp_path: Path) -> AsyncIterator[str]:
    service = SubscriptionService(SubscriptionStore(tmp_path / "s.db"), operator_token=TOKEN)
    port = await service.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await service.close()


async def test_a_challenge_dribbled_byte_by_byte_is_read_whole(subscriptions: str) -> None:
    # a slow client (or one byte a segment) is no reason to refuse a valid body
    key = bytes(nacl.public.PrivateKey.generate().public_key)
    body = f'{{"subscriber": "{key.hex()}"}}'.encode()

    async def dribble() -> AsyncIterator[bytes]:
        for i in range(len(body)):
            yield body[i : i + 1]
            await asyncio.sleep(0.002)

    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{subscriptions}/v1/challenge", data=dribble()) as resp,
    ):
        assert resp.status == 200, await resp.text()
        assert "sealed_token" in await resp.json()


@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / "src/pressrun/reader/node_modules").is_dir(),
    reason="the reader's npm packages are not installed: run `make setup`",
)
async def test_a_stranger_flooding_the_csp_endpoint_cannot_fill_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pressrun.reader.aio import CSP_REPORTS_PER_MINUTE, start_reader
    from pressrun.reader.config import ReaderConfig

    reader = await start_reader(
        ReaderConfig(balancer_url="http://127.0.0.1:9", publisher_keys=("ab" * 32,))
    )
    caplog.set_level(logging.WARNING, "pressrun.reader")
    report = {"csp-report": {"violated-directive": "script-src", "blocked-uri": "x" * 5000}}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(500):
                async with http.post(f"{reader.url}/csp-report", json=report) as resp:
                    assert resp.status == 204
            async with http.get(reader.url + "/") as resp:
                csp = resp.headers["Content-Security-Policy"]
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
    finally:
        await reader.stop()
    lines = [r.getMessage() for r in caplog.records if "CSP violation" in r.getMessage()]
    assert len(lines) == CSP_REPORTS_PER_MINUTE
    assert max(len(line) for line in lines) < 1000  # each field cut to 200 characters
    assert "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp
