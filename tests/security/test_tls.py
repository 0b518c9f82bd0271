"""TLS on every service (--tls-cert/--tls-key), and clients that verify it.

The certificates come from a CA the test makes itself (conftest.make_test_ca); a client
that trusts that CA gets through, one that trusts only the system's CAs is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from local_ca import LocalCA

from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import OriginSpec
from pressrun.origin.aio import start_origin
from pressrun.origin.config import OriginConfig
from pressrun.security import (
    CA_FILE_ENV,
    SecurityConfigError,
    ServiceSecurity,
    client_connector,
    client_ssl_context,
)
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

TOKEN = "tls-test-operator-token"


def _content(tmp_path: Path) -> tuple[Path, bytes]:
    data = random.Random(12).randbytes(3 * 1024 * 1024 + 17)
    issue = tmp_path / "content" / "tls-issue"
    issue.mkdir(parents=True)
    (issue / "tls-issue.pdf").write_bytes(data)
    return tmp_path / "content", data


async def test_origin_tracker_balancer_over_tls_with_a_verifying_client(
    tmp_path: Path, test_ca: LocalCA
) -> None:
    content, data = _content(tmp_path)
    origin = await start_origin(
        OriginConfig(content_dir=content, tls_cert=test_ca.cert_pem, tls_key=test_ca.key_pem)
    )
    security = ServiceSecurity(test_ca.cert_pem, test_ca.key_pem, TOKEN)
    tracker = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1)),
        SqliteStore(tmp_path / "t.db"),
        security=security,
    )
    tracker_port = await tracker.start("127.0.0.1", 0)
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("o", origin.url),),
            balancer=BalancerConfig(poll_interval_s=0.2),
            security=security,
            ca_file=test_ca.ca_pem,  # the balancer verifies the origin's certificate
        )
    )
    try:
        assert origin.url.startswith("https://") and balancer.url.startswith("https://")
        await balancer.wait_until_up(1, timeout_s=10)  # polled /stats over verified TLS
        async with aiohttp.ClientSession(connector=client_connector(test_ca.ca_pem)) as http:
            url = f"{origin.url}/content/tls-issue/tls-issue.pdf"
            async with http.get(url) as resp:  # sendfile falls back to writes under TLS
                assert resp.status == 200
                assert hashlib.sha256(await resp.read()).digest() == hashlib.sha256(data).digest()
            async with http.get(url, headers={"Range": "bytes=1000-1999"}) as resp:
                assert resp.status == 206 and await resp.read() == data[1000:2000]
            async with http.get(f"https://127.0.0.1:{tracker_port}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{balancer.url}/healthz") as resp:
                assert resp.status == 200
        # A client that trusts only the system's CAs refuses every one of them.
        async with aiohttp.ClientSession(connector=client_connector()) as http:
            for url in (origin.url, f"https://127.0.0.1:{tracker_port}", balancer.url):
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    async with http.get(url + "/healthz"):
                        pass
    finally:
        await balancer.stop()
        await tracker.close()
        await origin.stop()


def test_client_context_uses_the_ca_file_env(
    test_ca: LocalCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CA_FILE_ENV, str(test_ca.ca_pem))
    context = client_ssl_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    names = [dict(c["subject"][0]).get("commonName") for c in context.get_ca_certs()]
    assert "pressrun test CA" in [n for n in names if n]
    monkeypatch.setenv(CA_FILE_ENV, str(test_ca.cert_pem.parent / "missing.pem"))
    with pytest.raises(SecurityConfigError, match="cannot load the CA file"):
        client_ssl_context()


def test_bad_tls_flags_are_clear_errors(tmp_path: Path, test_ca: LocalCA) -> None:
    with pytest.raises(SecurityConfigError, match="go together"):
        ServiceSecurity(tls_cert=test_ca.cert_pem)
    with pytest.raises(SecurityConfigError, match="cannot load the TLS certificate"):
        ServiceSecurity(test_ca.cert_pem, test_ca.ca_pem).server_ssl_context()  # wrong key
    with pytest.raises(SecurityConfigError, match="at least 16 characters"):
        ServiceSecurity(operator_token="short")


async def test_tracker_cli_serves_https(tmp_path: Path, test_ca: LocalCA) -> None:
    """`pressrun serve tracker --tls-cert --tls-key`: says https and answers over TLS."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pressrun.cli", "serve", "tracker", "--port", "0",
        "--db", str(tmp_path / "t.db"), "--allow-any",
        "--tls-cert", str(test_ca.cert_pem), "--tls-key", str(test_ca.key_pem),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("tracker listening on https://127.0.0.1:")
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        async with (
            aiohttp.ClientSession(connector=client_connector(test_ca.ca_pem)) as http,
            http.get(f"https://127.0.0.1:{port}/healthz") as resp,
        ):
            assert resp.status == 200
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_the_later_services_serve_https_too(tmp_path: Path, test_ca: LocalCA) -> None:
    """The subscription service and the web reader take the same TLS settings."""
    from pressrun.reader.aio import AssetsMissing, start_reader
    from pressrun.reader.config import ReaderConfig
    from pressrun.subscriptions.aio import SubscriptionService
    from pressrun.subscriptions.store import SubscriptionStore

    tls = ServiceSecurity(test_ca.cert_pem, test_ca.key_pem)
    subscriptions = SubscriptionService(
        SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN, security=tls
    )
    port = await subscriptions.start("127.0.0.1", 0)
    urls = [f"https://127.0.0.1:{port}/healthz"]
    reader = None
    try:
        try:
            reader = await start_reader(
                ReaderConfig(balancer_url="https://127.0.0.1:1", trust_on_first_use=True, tls=tls)
            )
            urls.append(f"{reader.url}/healthz")
        except AssetsMissing:
            pass  # the web app's npm assets are not installed here; the reader is skipped
        async with aiohttp.ClientSession(connector=client_connector(test_ca.ca_pem)) as http:
            for url in urls:
                async with http.get(url) as resp:
                    assert resp.status == 200, url
    finally:
        if reader is not None:
            await reader.stop()
        await subscriptions.close()
