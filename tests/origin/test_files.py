"""The origin's kept files (pressrun.origin.files): one descriptor per file across
requests, checked against the file system on each request, bounded, closed when no
transfer reads them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from pressrun.origin import OriginConfig, RunningOrigin, start_origin
from pressrun.origin.files import NotAFile, OpenFiles

ISSUE = "weekly-2026-48"


def _open_paths() -> list[str]:
    """What this process's descriptors point at (``/proc/self/fd``)."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return paths


@pytest.fixture
def content(tmp_path: Path) -> Path:
    issue = tmp_path / "content" / ISSUE
    issue.mkdir(parents=True)
    (issue / "a.bin").write_bytes(os.urandom(300_000))
    (issue / "b.bin").write_bytes(os.urandom(1000))
    (issue / "sub").mkdir()
    return tmp_path / "content"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def url(origin: RunningOrigin, name: str) -> str:
    return f"{origin.url}/content/{ISSUE}/{name}"


async def test_a_file_stays_open_across_requests(
    content: Path, http: aiohttp.ClientSession
) -> None:
    path = str(content / ISSUE / "a.bin")
    body = (content / ISSUE / "a.bin").read_bytes()
    origin = await start_origin(OriginConfig(content_dir=content, port=0))
    try:
        for first in range(0, 200_000, 20_000):
            headers = {"Range": f"bytes={first}-{first + 9999}"}
            async with http.get(url(origin, "a.bin"), headers=headers) as resp:
                assert resp.status == 206
                assert await resp.read() == body[first : first + 10_000]
        # opened once, and still open between requests (the old code opened and
        # closed it for each of the ten)
        assert origin.service.files.opened == 1
        assert _open_paths().count(path) == 1
    finally:
        await origin.stop()
    assert path not in _open_paths()  # closed at stop


async def test_a_file_replaced_while_kept_serves_the_new_bytes_and_etag(
    content: Path, http: aiohttp.ClientSession
) -> None:
    path = content / ISSUE / "a.bin"
    old = path.read_bytes()
    # capped: the old version's transfer is still running when the file is replaced
    origin = await start_origin(OriginConfig(content_dir=content, port=0, egress_cap_mbps=8.0))
    try:
        async with http.get(url(origin, "a.bin")) as slow:
            old_etag = slow.headers["ETag"]
            got = await slow.content.readexactly(50_000)
            new = os.urandom(200_000)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(new)
            os.replace(tmp, path)  # the publisher's atomic replace
            async with http.get(url(origin, "a.bin")) as resp:
                assert resp.status == 200
                assert resp.headers["ETag"] != old_etag
                assert resp.headers["Content-Length"] == str(len(new))
                assert await resp.read() == new
            # a validator of the old version no longer matches
            async with http.get(url(origin, "a.bin"), headers={"If-None-Match": old_etag}) as r:
                assert r.status == 200
                await r.read()
            # the transfer that started on the old version ends with the old bytes
            assert got + await slow.read() == old
        for _ in range(100):  # the old version's descriptor closes with its transfer
            if f"{path} (deleted)" not in _open_paths():
                break
            await asyncio.sleep(0.02)
        assert f"{path} (deleted)" not in _open_paths()
        assert _open_paths().count(str(path)) == 1
    finally:
        await origin.stop()


async def test_a_file_changed_in_place_serves_the_new_bytes_and_etag(
    content: Path, http: aiohttp.ClientSession
) -> None:
    path = content / ISSUE / "b.bin"
    origin = await start_origin(OriginConfig(content_dir=content, port=0))
    try:
        async with http.get(url(origin, "b.bin")) as resp:
            etag = resp.headers["ETag"]
            await resp.read()
        new = os.urandom(1500)
        path.write_bytes(new)  # same inode, new size and mtime
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        async with http.get(url(origin, "b.bin"), headers={"Range": "bytes=1000-"}) as resp:
            assert resp.status == 206
            assert resp.headers["Content-Range"] == "bytes 1000-1499/1500"
            assert resp.headers["ETag"] != etag
            assert await resp.read() == new[1000:]
    finally:
        await origin.stop()


async def test_a_kept_file_removed_is_404_and_a_directory_is_no_file(
    content: Path, http: aiohttp.ClientSession
) -> None:
    origin = await start_origin(OriginConfig(content_dir=content, port=0))
    try:
        async with http.get(url(origin, "b.bin")) as resp:
            assert resp.status == 200
            await resp.read()
        (content / ISSUE / "b.bin").unlink()
        async with http.get(url(origin, "b.bin")) as resp:
            assert resp.status == 404
        async with http.get(url(origin, "sub")) as resp:
            assert resp.status == 404
    finally:
        await origin.stop()


def test_kept_files_are_bounded_and_closed_when_unread(tmp_path: Path) -> None:
    issue = tmp_path / ISSUE
    issue.mkdir()
    for name in ("1", "2", "3"):
        (issue / name).write_bytes(name.encode() * 10)
    files = OpenFiles(str(tmp_path), max_files=2)
    reading = files.take(ISSUE, "1")  # a transfer holds it
    files.give_back(files.take(ISSUE, "2"))
    files.give_back(files.take(ISSUE, "3"))  # evicts "1", still read
    assert len(files) == 2
    assert os.pread(reading.fd, 2, 0) == b"11"
    fd = reading.fd
    files.give_back(reading)  # its transfer ended: now closed
    assert reading.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    # a kept file nobody reads is dropped on demand (out of descriptors)
    assert files.drop_unused() == 2
    assert len(files) == 0
    (issue / "d").mkdir()
    with pytest.raises(NotAFile):
        files.take(ISSUE, "d")
    files.close()


async def test_concurrent_tls_answers_of_one_kept_file_get_their_own_bytes(
    content: Path, tmp_path: Path
) -> None:
    """Under TLS the body is read with pread and written (no sendfile): concurrent
    answers share the kept descriptor, so none may read through its file position
    (asyncio's own fallback does, and they would move it under each other)."""
    import ssl

    from security.local_ca import make_test_ca  # tests/security: the suite's test CA

    ca = make_test_ca(tmp_path / "ca")  # skips, saying why, without the openssl program
    body = (content / ISSUE / "a.bin").read_bytes()
    origin = await start_origin(
        OriginConfig(content_dir=content, port=0, tls_cert=ca.cert_pem, tls_key=ca.key_pem)
    )
    client = ssl.create_default_context(cafile=str(ca.ca_pem))
    spans = [(i * 37_000, i * 37_000 + 60_000 + i * 999) for i in range(6)]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as http:

            async def fetch(first: int, last: int) -> bytes:
                headers = {"Range": f"bytes={first}-{last}"}
                async with http.get(url(origin, "a.bin"), headers=headers) as resp:
                    assert resp.status == 206
                    return await resp.read()

            got = await asyncio.gather(*(fetch(a, b) for a, b in spans))
        assert got == [body[a : b + 1] for a, b in spans]
        assert origin.service.files.opened == 1  # all six read one descriptor
    finally:
        await origin.stop()
