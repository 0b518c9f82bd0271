"""Certificates and the CA file are read again when they change on disk (issue 24,
item 9): a renewal needs no restart. Real origins over TLS on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest
from local_ca import LocalCA, make_test_ca

import pressrun.security
from pressrun.origin.aio import start_origin
from pressrun.origin.config import OriginConfig
from pressrun.security import client_connector, client_ssl_context


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the files are looked at every 0.1 s instead of every second: a quick test
    monkeypatch.setattr(pressrun.security, "RELOAD_CHECK_S", 0.1, raising=False)


def install(src: Path, dst: Path) -> None:
    """Replace ``dst`` the way certbot and cp -f do: a new file renamed over it."""
    tmp = dst.with_name(dst.name + ".new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


async def served_cert(port: int, context: ssl.SSLContext) -> str:
    """The SHA-256 of the certificate a new connection to 127.0.0.1:port is shown."""
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return hashlib.sha256(der).hexdigest()
    finally:
        writer.close()


def fingerprint(pem: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.read_text())).hexdigest()


async def test_a_renewed_certificate_is_served_without_a_restart(
    tmp_path: Path, test_ca: LocalCA, caplog: pytest.LogCaptureFixture
) -> None:
    renewed = make_test_ca(tmp_path / "renewal")  # another CA, another key pair
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "cert.pem", live / "key.pem"
    shutil.copyfile(test_ca.cert_pem, cert)
    shutil.copyfile(test_ca.key_pem, key)
    (tmp_path / "content").mkdir()
    trust = ssl.create_default_context(cafile=str(test_ca.ca_pem))
    trust.load_verify_locations(cafile=str(renewed.ca_pem))
    origin = await start_origin(
        OriginConfig(content_dir=tmp_path / "content", tls_cert=cert, tls_key=key)
    )
    try:
        before = await served_cert(origin.port, trust)
        assert before == fingerprint(test_ca.cert_pem)
        # half a renewal: the new certificate, the old key. It does not load; the old
        # pair stays in use and a WARNING says why
        install(renewed.cert_pem, cert)
        await asyncio.sleep(0.15)
        assert await served_cert(origin.port, trust) == before
        assert any("does not load" in r.getMessage() for r in caplog.records)
        # the key follows: the next connection gets the new certificate
        install(renewed.key_pem, key)
        await asyncio.sleep(0.15)
        assert await served_cert(origin.port, trust) == fingerprint(renewed.cert_pem)
        connector = aiohttp.TCPConnector(ssl=trust)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(f"{origin.url}/healthz") as resp,
        ):
            assert resp.status == 200
    finally:
        await origin.stop()


async def test_a_changed_ca_file_is_read_again_by_a_running_client(
    tmp_path: Path, test_ca: LocalCA
) -> None:
    other = make_test_ca(tmp_path / "other")  # a server certified by a CA not yet trusted
    ca_file = tmp_path / "pressrun-ca.pem"
    shutil.copyfile(test_ca.ca_pem, ca_file)
    (tmp_path / "content").mkdir()
    origin = await start_origin(
        OriginConfig(
            content_dir=tmp_path / "content", tls_cert=other.cert_pem, tls_key=other.key_pem
        )
    )
    try:
        # one long-lived session, as a balancer's poller keeps for weeks
        async with aiohttp.ClientSession(connector=client_connector(ca_file)) as http:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with http.get(f"{origin.url}/healthz"):
                    pass
            # the operator adds the new CA to the file: the same session trusts it
            install_text = ca_file.read_text() + other.ca_pem.read_text()
            tmp = ca_file.with_name("ca.new")
            tmp.write_text(install_text)
            os.replace(tmp, ca_file)
            await asyncio.sleep(0.15)
            async with http.get(f"{origin.url}/healthz") as resp:
                assert resp.status == 200
        assert client_ssl_context(ca_file) is client_ssl_context(ca_file)  # still shared
    finally:
        await origin.stop()
