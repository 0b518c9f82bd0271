"""The origin over real loopback HTTP: files, ranges, validators, stats, metrics, the cap."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pressrun.origin import OriginConfig, RunningOrigin, start_origin

ISSUE = "weekly-2026-47"
FILE = "weekly-2026-47.pdf"
SIZE = 1_000_003  # not a multiple of any chunk size

STATS_FIELDS = {
    "name",
    "cpu_percent",
    "ram_percent",
    "out_bytes_per_s",
    "interval_s",
    "capacity_bytes_per_s",
    "egress_cap_bytes_per_s",
    "active_transfers",
    "stalled_transfers",
    "issues",
    "cached_issues",
    "mean_transfer_bytes_per_s",
    "mean_transfer_bytes_per_s_by_issue",
    "bytes_sent_total",
    "transfers_total",
    "active_transfers_by_issue",
    "transfers_total_by_issue",
    "bytes_sent_by_issue",
    "recent_intervals",
}


@pytest.fixture
def content(tmp_path: Path) -> Path:
    root = tmp_path / "content"
    issue = root / ISSUE
    issue.mkdir(parents=True)
    (issue / FILE).write_bytes(os.urandom(SIZE))
    (issue / "manifest.json").write_text('{"manifest": {}}')
    (issue / "empty.bin").write_bytes(b"")
    # something outside the content directory that traversal must never reach
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    return root


@pytest.fixture
def body(content: Path) -> bytes:
    return (content / ISSUE / FILE).read_bytes()


async def _origin(content: Path, **kw: object) -> RunningOrigin:
    return await start_origin(OriginConfig(content_dir=content, port=0, **kw))  # type: ignore[arg-type]


@pytest.fixture
async def origin(content: Path) -> AsyncIterator[RunningOrigin]:
    running = await _origin(content, capacity_mbps=100.0, name="origin-a")
    yield running
    await running.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def url(origin: RunningOrigin, name: str = FILE, issue: str = ISSUE) -> str:
    return f"{origin.url}/content/{issue}/{name}"


async def raw_request(origin: RunningOrigin, target: str, method: str = "GET") -> tuple[int, bytes]:
    """Send a request line exactly as given (no client-side normalisation)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", origin.port)
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data


# ---------------------------------------------------------------- whole files


async def test_full_get(origin: RunningOrigin, http: aiohttp.ClientSession, body: bytes) -> None:
    async with http.get(url(origin)) as resp:
        assert resp.status == 200
        assert await resp.read() == body
        assert resp.headers["Content-Type"] == "application/pdf"
        assert resp.headers["Accept-Ranges"] == "bytes"
        assert resp.headers["Content-Length"] == str(SIZE)
        assert resp.headers["ETag"].startswith('"')
        assert "Last-Modified" in resp.headers
    async with http.get(url(origin, "manifest.json")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        assert await resp.read() == b'{"manifest": {}}'
    async with http.get(url(origin, "empty.bin")) as resp:
        assert resp.status == 200
        assert await resp.read() == b""


async def test_head(origin: RunningOrigin, http: aiohttp.ClientSession) -> None:
    async with http.head(url(origin)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Length"] == str(SIZE)
        assert resp.headers["Accept-Ranges"] == "bytes"
        assert await resp.read() == b""
    async with http.head(url(origin), headers={"Range": "bytes=0-99"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 0-99/{SIZE}"
    # a HEAD sends no body: not a transfer
    assert origin.service.meter.transfers_total == 0
    # and the raw answer really has no body after the headers
    status, data = await raw_request(origin, f"/content/{ISSUE}/{FILE}", method="HEAD")
    assert status == 200
    assert data.endswith(b"\r\n\r\n")


# --------------------------------------------------------------------- ranges


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=0-0", 0, 0),
        ("bytes=100-199", 100, 199),
        ("bytes=999000-", 999000, SIZE - 1),
        ("bytes=-1000", SIZE - 1000, SIZE - 1),
        ("bytes=5-99999999", 5, SIZE - 1),
        ("bytes=-99999999", 0, SIZE - 1),
    ],
)
async def test_ranges(
    origin: RunningOrigin,
    http: aiohttp.ClientSession,
    body: bytes,
    header: str,
    first: int,
    last: int,
) -> None:
    async with http.get(url(origin), headers={"Range": header}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes {first}-{last}/{SIZE}"
        assert resp.headers["Content-Length"] == str(last - first + 1)
        assert await resp.read() == body[first : last + 1]


@pytest.mark.parametrize(
    "header", ["bytes=2000000-", "bytes=-0", "bytes=10-5", "bytes=x-y", "bytes=", "bytes=1-2,z"]
)
async def test_bad_range_is_416(
    origin: RunningOrigin, http: aiohttp.ClientSession, header: str
) -> None:
    async with http.get(url(origin), headers={"Range": header}) as resp:
        assert resp.status == 416
        assert resp.headers["Content-Range"] == f"bytes */{SIZE}"
        assert (await resp.text()).strip()


async def test_multi_range_answers_the_whole_file(
    origin: RunningOrigin, http: aiohttp.ClientSession, body: bytes
) -> None:
    async with http.get(url(origin), headers={"Range": "bytes=0-9,20-29"}) as resp:
        assert resp.status == 200
        assert "Content-Range" not in resp.headers
        assert await resp.read() == body


async def test_range_on_an_empty_file_is_416(
    origin: RunningOrigin, http: aiohttp.ClientSession
) -> None:
    async with http.get(url(origin, "empty.bin"), headers={"Range": "bytes=0-"}) as resp:
        assert resp.status == 416
        assert resp.headers["Content-Range"] == "bytes */0"


# ----------------------------------------------------------------- validators


async def test_etag_if_none_match_and_if_range(
    origin: RunningOrigin, http: aiohttp.ClientSession, body: bytes
) -> None:
    async with http.head(url(origin)) as resp:
        etag = resp.headers["ETag"]
        last_modified = resp.headers["Last-Modified"]
    for inm in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        async with http.get(url(origin), headers={"If-None-Match": inm}) as resp:
            assert resp.status == 304
            assert resp.headers["ETag"] == etag
            assert await resp.read() == b""
    async with http.get(url(origin), headers={"If-None-Match": '"nope"'}) as resp:
        assert resp.status == 200
        assert await resp.read() == body
    ranged = {"Range": "bytes=10-19"}
    async with http.get(url(origin), headers={**ranged, "If-Range": etag}) as resp:
        assert resp.status == 206
        assert await resp.read() == body[10:20]
    async with http.get(url(origin), headers={**ranged, "If-Range": last_modified}) as resp:
        assert resp.status == 206
    # a stale validator: the whole (new) file
    async with http.get(url(origin), headers={**ranged, "If-Range": '"stale"'}) as resp:
        assert resp.status == 200
        assert await resp.read() == body
    # the ETag changes when the file does
    path = origin.service.content_dir / ISSUE / FILE
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    async with http.get(url(origin), headers={"If-None-Match": etag}) as resp:
        assert resp.status == 200
        assert resp.headers["ETag"] != etag
        await resp.read()


# ---------------------------------------------------------- unknown and hostile


async def test_unknown_issue_or_file_is_404_with_a_reason(
    origin: RunningOrigin, http: aiohttp.ClientSession
) -> None:
    async with http.get(url(origin, issue="no-such-issue")) as resp:
        assert resp.status == 404
        assert "unknown issue 'no-such-issue'" in await resp.text()
    async with http.get(url(origin, name="nope.pdf")) as resp:
        assert resp.status == 404
        assert "has no file 'nope.pdf'" in await resp.text()
    async with http.get(f"{origin.url}/content/{ISSUE}") as resp:
        assert resp.status == 404
    async with http.get(f"{origin.url}/content/{ISSUE}/{FILE}/more") as resp:
        assert resp.status == 404


@pytest.mark.parametrize(
    "target",
    [
        "/content/../secret.txt",
        "/content/../../secret.txt",
        f"/content/{ISSUE}/../../secret.txt",
        f"/content/{ISSUE}/..",
        "/content/%2e%2e/secret.txt",
        f"/content/{ISSUE}/%2e%2e%2f%2e%2e%2fsecret.txt",
        f"/content/{ISSUE}/..%2f..%2fsecret.txt",
        f"/content/{ISSUE}/%2E%2E%2F%2E%2E%2Fsecret.txt",
        f"/content/{ISSUE}/..%5c..%5csecret.txt",
        "/content/%2e%2e/%2e%2e/secret.txt",
        f"/content/{ISSUE}/.%2e/.%2e/secret.txt",
        f"/content/{ISSUE}/%252e%252e%252fsecret.txt",
        "/content/./secret.txt",
        "/content//secret.txt",
        f"/content/{ISSUE}/.hidden",
        f"/content/{ISSUE}/{FILE}%00.txt",
    ],
)
async def test_path_traversal_is_404(origin: RunningOrigin, target: str) -> None:
    status, data = await raw_request(origin, target)
    assert status == 404, data[:200]
    assert b"TOP SECRET" not in data


async def test_a_symlinked_issue_folder_name_must_still_be_valid(
    origin: RunningOrigin, http: aiohttp.ClientSession, content: Path
) -> None:
    # a hidden folder (like publish's temp folders) is not an issue
    hidden = content / ".weekly.publishing-x"
    hidden.mkdir()
    (hidden / "a.pdf").write_bytes(b"half-written")
    status, _ = await raw_request(origin, "/content/.weekly.publishing-x/a.pdf")
    assert status == 404


# ------------------------------------------------------------ status and metrics


async def test_stats_has_exactly_the_protocol_fields(
    origin: RunningOrigin, http: aiohttp.ClientSession, content: Path
) -> None:
    async with http.get(f"{origin.url}/stats") as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert set(doc) == STATS_FIELDS
    assert doc["name"] == "origin-a"
    assert 0.0 <= doc["cpu_percent"] <= 100.0
    assert 0.0 < doc["ram_percent"] <= 100.0
    assert doc["capacity_bytes_per_s"] == 12_500_000.0
    assert doc["egress_cap_bytes_per_s"] is None
    assert doc["active_transfers"] == 0 and doc["stalled_transfers"] == 0
    assert doc["issues"] == [ISSUE]
    assert doc["cached_issues"] == []
    assert doc["mean_transfer_bytes_per_s"] is None
    assert doc["mean_transfer_bytes_per_s_by_issue"] == {}
    assert doc["out_bytes_per_s"] == 0.0
    assert doc["interval_s"] > 0
    assert doc["bytes_sent_total"] == 0 and doc["transfers_total"] == 0
    assert doc["active_transfers_by_issue"] == {}
    assert doc["transfers_total_by_issue"] == doc["bytes_sent_by_issue"] == {}
    # a new bundle appears (renamed into place, as publish does): listed at once
    tmp = content / ".new.publishing-1"
    tmp.mkdir()
    (tmp / "n.pdf").write_bytes(b"x")
    tmp.rename(content / "new-issue")
    async with http.get(f"{origin.url}/stats") as resp:
        assert (await resp.json())["issues"] == ["new-issue", ISSUE]
    # and the balancer's strict decoder accepts the document
    from pressrun.balancer.codec import decode_status

    decode_status(origin.service.stats_document(), origin_name="origin-a")


async def test_stats_follow_a_transfer(content: Path, http: aiohttp.ClientSession) -> None:
    big = content / ISSUE / "big.bin"
    big.write_bytes(os.urandom(3_000_000))
    origin = await _origin(content, egress_cap_mbps=16.0, stats_interval_s=0.2)  # 2 MB/s
    try:
        assert origin.name == f"origin-{origin.port}"

        async def download() -> int:
            async with http.get(url(origin, "big.bin")) as resp:
                return len(await resp.read())

        task = asyncio.create_task(download())
        await asyncio.sleep(0.7)
        async with http.get(f"{origin.url}/stats") as resp:
            during = await resp.json()
        assert during["active_transfers"] == 1
        assert during["active_transfers_by_issue"] == {ISSUE: 1}
        assert during["transfers_total_by_issue"] == {ISSUE: 1}
        assert 0 < during["bytes_sent_by_issue"][ISSUE] < 3_000_000
        assert during["egress_cap_bytes_per_s"] == 2_000_000.0
        # paced at 2 MB/s: the last 0.2 s interval saw about 400 kB
        assert 1_000_000 < during["out_bytes_per_s"] < 3_000_000
        assert during["mean_transfer_bytes_per_s"] == pytest.approx(
            during["out_bytes_per_s"], rel=0.2
        )
        assert set(during["mean_transfer_bytes_per_s_by_issue"]) == {ISSUE}
        assert during["cached_issues"] == [ISSUE]
        assert await task == 3_000_000
        await asyncio.sleep(0.5)
        async with http.get(f"{origin.url}/stats") as resp:
            after = await resp.json()
        assert after["active_transfers"] == 0
        assert after["out_bytes_per_s"] == 0.0
        assert after["mean_transfer_bytes_per_s"] is None
        assert after["cached_issues"] == [ISSUE]
        assert after["bytes_sent_total"] == 3_000_000
        assert after["transfers_total"] == 1
        assert after["active_transfers_by_issue"] == {}
        assert after["transfers_total_by_issue"] == {ISSUE: 1}
        assert after["bytes_sent_by_issue"] == {ISSUE: 3_000_000}
    finally:
        await origin.stop()


async def test_cached_issues_expire(content: Path, http: aiohttp.ClientSession) -> None:
    origin = await _origin(content, stats_interval_s=0.1, cache_window_s=0.3)
    try:
        async with http.get(url(origin, "manifest.json")) as resp:
            await resp.read()
        assert origin.service.stats_document()["cached_issues"] == [ISSUE]
        await asyncio.sleep(0.5)
        assert origin.service.stats_document()["cached_issues"] == []
    finally:
        await origin.stop()


async def test_metrics(origin: RunningOrigin, http: aiohttp.ClientSession) -> None:
    async with http.get(url(origin)) as resp:
        await resp.read()
    async with http.get(url(origin, issue="nope")) as resp:
        await resp.read()
    async with http.get(f"{origin.url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("pressrun_origin_sent_bytes_total", (("issue", ISSUE),))] == SIZE
    ok = (("code", "200"), ("endpoint", "content"))
    missing = (("code", "404"), ("endpoint", "content"))
    assert samples[("pressrun_origin_requests_total", ok)] == 1
    assert samples[("pressrun_origin_requests_total", missing)] == 1
    assert samples[("pressrun_origin_active_transfers", ())] == 0
    assert samples[("pressrun_origin_transfer_duration_seconds_count", ())] == 1
    assert ("pressrun_origin_out_bytes_per_second", ()) in samples
    assert samples[("pressrun_origin_capacity_bytes_per_second", ())] == 12_500_000
    assert samples[("pressrun_origin_egress_cap_bytes_per_second", ())] == 0
    async with http.get(f"{origin.url}/healthz") as resp:
        assert resp.status == 200
        assert await resp.text() == "ok"


async def test_two_origins_have_separate_registries(
    content: Path, http: aiohttp.ClientSession
) -> None:
    a = await _origin(content)
    b = await _origin(content)
    try:
        async with http.get(url(a)) as resp:
            await resp.read()
        async with http.get(f"{b.url}/metrics") as resp:
            assert "pressrun_origin_sent_bytes_total{" not in await resp.text()
    finally:
        await a.stop()
        await b.stop()


async def test_transfer_log_line(
    origin: RunningOrigin, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # a complete transfer is logged at DEBUG (per-request work is not done at INFO)
    caplog.set_level(logging.INFO, logger="pressrun.origin")
    async with http.get(url(origin), headers={"Range": "bytes=0-9"}) as resp:
        await resp.read()
    await asyncio.sleep(0.1)
    assert not [r for r in caplog.records if r.getMessage().startswith("transfer")]
    caplog.set_level(logging.DEBUG, logger="pressrun.origin")
    async with http.get(url(origin), headers={"Range": "bytes=10-19"}) as resp:
        await resp.read()
    # the client may have every byte before the server's handler has returned
    for _ in range(50):
        lines = [
            r.getMessage() for r in caplog.records if r.getMessage().startswith("transfer complete")
        ]
        if lines:
            break
        await asyncio.sleep(0.02)
    assert len(lines) == 1
    line = lines[0]
    for part in (
        "transfer complete",
        f"issue={ISSUE}",
        f"file={FILE}",
        f"range=10-19/{SIZE}",
        "bytes=10",
        "seconds=",
        "rate=",
        "client=127.0.0.1",
    ):
        assert part in line


# ------------------------------------------------------------------- egress cap


async def _timed_get(http: aiohttp.ClientSession, target: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    async with http.get(target) as resp:
        n = len(await resp.read())
    return n, time.perf_counter() - t0


async def test_egress_cap_limits_one_transfer(content: Path, http: aiohttp.ClientSession) -> None:
    (content / ISSUE / "four.bin").write_bytes(os.urandom(4_000_000))
    origin = await _origin(content, egress_cap_mbps=16.0)  # 2 MB/s
    try:
        n, seconds = await _timed_get(http, url(origin, "four.bin"))
    finally:
        await origin.stop()
    assert n == 4_000_000
    # (4 MB - 100 kB burst) / 2 MB/s = 1.95 s; generous window for a loaded machine
    assert 1.75 < seconds < 3.0, seconds


async def test_concurrent_transfers_share_the_cap(
    content: Path, http: aiohttp.ClientSession
) -> None:
    (content / ISSUE / "two.bin").write_bytes(os.urandom(2_000_000))
    origin = await _origin(content, egress_cap_mbps=16.0)  # 2 MB/s for both together
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *[_timed_get(http, url(origin, "two.bin")) for _ in range(3)]
        )
        total = time.perf_counter() - t0
    finally:
        await origin.stop()
    assert [n for n, _ in results] == [2_000_000] * 3
    # 6 MB at 2 MB/s: about 3 s in total, and the three ran side by side (each took
    # nearly the whole time) rather than one after the other
    assert 2.7 < total < 4.5, total
    assert all(seconds > 2.3 for _, seconds in results), results


# ---------------------------------------------------------- disconnects, shutdown


def _abort(sock: socket.socket) -> None:
    # SO_LINGER 0: close sends a RST, as a client that dies does
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("cap_mbps", [None, 16.0])
async def test_client_disconnect_mid_transfer_is_quiet(
    content: Path,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    cap_mbps: float | None,
) -> None:
    caplog.set_level(logging.DEBUG)
    (content / ISSUE / "big.bin").write_bytes(os.urandom(40_000_000))
    origin = await _origin(content, egress_cap_mbps=cap_mbps)
    try:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", origin.port))
            request = f"GET /content/{ISSUE}/big.bin HTTP/1.1\r\nHost: x\r\n\r\n"
            await loop.sock_sendall(sock, request.encode())
            got = await loop.sock_recv(sock, 65536)
            assert got.startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.1)
            _abort(sock)
        # the server notices, ends the transfers and keeps serving
        for _ in range(50):
            if origin.service.meter.active_transfers == 0:
                break
            await asyncio.sleep(0.1)
        assert origin.service.meter.active_transfers == 0
        async with http.get(url(origin), headers={"Range": "bytes=0-9"}) as resp:
            assert resp.status == 206
            await resp.read()
        async with http.get(f"{origin.url}/healthz") as resp:
            assert resp.status == 200
    finally:
        await origin.stop()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud]
    gone = [r.getMessage() for r in caplog.records if "transfer client gone" in r.getMessage()]
    assert len(gone) == 3


async def test_stop_cuts_transfers_after_the_grace_period(
    content: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pressrun.origin")
    (content / ISSUE / "slow.bin").write_bytes(os.urandom(4_000_000))
    origin = await _origin(content, egress_cap_mbps=8.0, shutdown_grace_s=0.3)  # 1 MB/s

    async def download() -> None:
        async with http.get(url(origin, "slow.bin")) as resp:
            await resp.read()

    task = asyncio.create_task(download())
    await asyncio.sleep(0.3)
    assert origin.service.meter.active_transfers == 1
    t0 = time.perf_counter()
    await origin.stop()
    assert time.perf_counter() - t0 < 2.0
    with pytest.raises(aiohttp.ClientError):
        await task
    assert origin.service.meter.active_transfers == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("transfer cut at shutdown" in m for m in messages)
    assert any("stopped: 1 transfer(s) running at stop, 1 cut" in m for m in messages)


async def test_stop_lets_short_transfers_finish(content: Path, http: aiohttp.ClientSession) -> None:
    (content / ISSUE / "short.bin").write_bytes(os.urandom(1_000_000))
    origin = await _origin(content, egress_cap_mbps=16.0, shutdown_grace_s=3.0)  # 2 MB/s

    async def download() -> int:
        async with http.get(url(origin, "short.bin")) as resp:
            return len(await resp.read())

    task = asyncio.create_task(download())
    await asyncio.sleep(0.1)
    await origin.stop()
    assert await task == 1_000_000
    assert origin.service.transfers_cut == 0


async def test_missing_content_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        await start_origin(OriginConfig(content_dir=tmp_path / "nope"))


def _scarce_open(monkeypatch: pytest.MonkeyPatch, content: Path, failures: list[int]) -> None:
    """os.open fails with EMFILE for the next failures[0] files under `content`."""
    import errno

    real_open = os.open

    def scarce_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if failures[0] > 0 and str(path).startswith(str(content)):
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", scarce_open)


async def test_out_of_file_descriptors_waits_instead_of_refusing(
    origin: RunningOrigin,
    http: aiohttp.ClientSession,
    body: bytes,
    content: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures = [2]
    _scarce_open(monkeypatch, content, failures)
    t0 = time.perf_counter()
    async with http.get(url(origin)) as resp:
        assert resp.status == 200
        assert await resp.read() == body
    assert time.perf_counter() - t0 >= 0.1
    assert failures == [0]


async def test_out_of_file_descriptors_drops_the_kept_files_first(
    origin: RunningOrigin,
    http: aiohttp.ClientSession,
    body: bytes,
    content: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the manifest is kept open after its answer; out of descriptors, the next file's
    # request closes it and gets its descriptor without waiting
    caplog.set_level(logging.WARNING, logger="pressrun.origin")
    async with http.get(url(origin, "manifest.json")) as resp:
        assert resp.status == 200
        await resp.read()
    assert len(origin.service.files) == 1
    failures = [1]
    _scarce_open(monkeypatch, content, failures)
    async with http.get(url(origin)) as resp:
        assert resp.status == 200
        assert await resp.read() == body
    assert failures == [0]
    assert not [r for r in caplog.records if "out of file descriptors" in r.getMessage()]
    assert len(origin.service.files) == 1  # the manifest dropped, the file kept


async def test_a_file_truncated_mid_transfer_ends_the_answer_short(
    content: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pressrun.origin")
    path = content / ISSUE / "shrinking.bin"
    path.write_bytes(os.urandom(2_000_000))
    origin = await _origin(content, egress_cap_mbps=8.0)  # 1 MB/s
    try:
        async with http.get(url(origin, "shrinking.bin")) as resp:
            assert resp.status == 200
            await resp.content.readexactly(100_000)
            os.truncate(path, 500_000)
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        for _ in range(50):
            if origin.service.meter.active_transfers == 0:
                break
            await asyncio.sleep(0.05)
        assert origin.service.meter.active_transfers == 0
    finally:
        await origin.stop()
    assert any("ended at byte 500000" in r.getMessage() for r in caplog.records)
    assert any("transfer file shrank" in r.getMessage() for r in caplog.records)


def test_system_cpu_sees_a_busy_core() -> None:
    from pressrun.origin.aio import SystemCpu

    cpu = SystemCpu()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        pass
    percent = cpu.sample()
    # one busy core of os.cpu_count(): at least half of its share shows
    assert 50.0 / (os.cpu_count() or 1) <= percent <= 100.0


# ---------------------------------------------------------------- the fast path

#: requests the content route's fast path (OriginService.fast_handler) takes or hands
#: to the app: every answer must be the app's own, byte for byte but the Date
_SAME_AS_APP = [
    ("GET", f"/content/{ISSUE}/{FILE}", {}),
    ("HEAD", f"/content/{ISSUE}/{FILE}", {}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Range": "bytes=10-19"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Range": "bytes=-5"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Range": "bytes=0-9,20-29"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Range": "bytes=5-4"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Range": f"bytes={SIZE}-"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"If-None-Match": "*"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Range": "bytes=0-9", "If-Range": '"other"'}),
    ("GET", f"/content/{ISSUE}/manifest.json", {}),
    ("GET", f"/content/{ISSUE}/empty.bin", {}),
    ("GET", f"/content/{ISSUE}/nothing.pdf", {}),
    ("GET", "/content/no-such-issue/x.pdf", {}),
    ("GET", f"/content/{ISSUE}/.hidden", {}),
    ("GET", f"/content/{ISSUE}%2F{FILE}/x", {}),
    ("GET", f"/content/{ISSUE}/a%252Fb", {}),
    ("GET", f"/content/{ISSUE}/%7Bx%7D", {}),
    ("GET", f"/content/{ISSUE}/{FILE}/", {}),
    ("GET", f"/content/{ISSUE}/{FILE}/extra", {}),
    ("GET", f"/content/{ISSUE}", {}),
    ("GET", "/content/../secret.txt", {}),
    ("POST", f"/content/{ISSUE}/{FILE}", {}),
    ("GET", f"/content/{ISSUE}/manifest.json", {"Expect": "100-continue"}),
    ("GET", "/healthz", {}),
    ("GET", "/nope", {}),
    # CORS: aiohttp-cors's headers on every answer of the content route
    ("GET", f"/content/{ISSUE}/{FILE}", {"Origin": "http://r.example", "Range": "bytes=0-9"}),
    ("HEAD", f"/content/{ISSUE}/{FILE}", {"Origin": "http://r.example"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Origin": "http://r.example", "If-None-Match": "*"}),
    ("GET", f"/content/{ISSUE}/{FILE}", {"Origin": "http://r.example", "Range": "bytes=x-y"}),
    ("GET", f"/content/{ISSUE}/nothing.pdf", {"Origin": "http://r.example"}),
    ("GET", "/healthz", {"Origin": "http://r.example"}),
    (
        "OPTIONS",
        f"/content/{ISSUE}/{FILE}",
        {
            "Origin": "http://r.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "range",
        },
    ),
    ("OPTIONS", f"/content/{ISSUE}/{FILE}", {"Origin": "http://r.example"}),
]


async def _exchange(port: int, method: str, target: str, headers: dict[str, str]) -> bytes:
    """One raw HTTP/1.1 exchange: the answer's status line, its headers sorted but the
    Date, and its body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {target} HTTP/1.1", "Host: x", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    interim = b""
    if data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):  # asked with Expect
        interim, data = data[:25], data[25:]
    head, _, payload = data.partition(b"\r\n\r\n")
    kept = []
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b": ")
        if name.lower() == b"date":
            continue
        if name.lower() == b"access-control-expose-headers":
            # aiohttp-cors lists them from a frozenset: in no particular order
            value = b",".join(sorted(value.split(b",")))
        kept.append(name + b": " + value)
    kept.sort()
    return interim + head.split(b"\r\n")[0] + b"\n" + b"\n".join(kept) + b"\n\n" + payload


async def test_the_fast_path_answers_as_the_app(content: Path) -> None:
    fast = await _origin(content, name="fast")
    app = await _origin(content, name="app")
    try:
        # the second origin without the fast path: the aiohttp app for every request
        server = app.runner.server
        assert server is not None and app.service.app_handler is not None
        server.request_handler = app.service.app_handler
        resolved: list[tuple[str, str, bool]] = []
        router = fast.runner.app.router
        resolve = router.resolve

        async def counting(request: Any) -> Any:
            resolved.append(
                (request.method, request.rel_url.path_safe, "Expect" in request.headers)
            )
            return await resolve(request)

        router.resolve = counting  # type: ignore[method-assign]
        for method, target, headers in _SAME_AS_APP:
            want = await _exchange(app.port, method, target, headers)
            got = await _exchange(fast.port, method, target, headers)
            assert got == want, (method, target, headers)
        # the content route's GET/HEAD never reached the app's router (but with an
        # Expect header, which the app answers); the rest did
        route = re.compile(r"/content/[^{}/]+/[^{}/]+")
        assert [
            (method, path)
            for method, path, expect in resolved
            if method in ("GET", "HEAD") and route.fullmatch(path) and not expect
        ] == []
        assert ("GET", f"/content/{ISSUE}/manifest.json", True) in resolved
        assert ("POST", f"/content/{ISSUE}/{FILE}", False) in resolved
        assert ("GET", f"/content/{ISSUE}/{FILE}/extra", False) in resolved
        assert ("GET", "/healthz", False) in resolved

        # and the requests were counted alike (endpoint, code)
        def counts(origin: RunningOrigin) -> dict[tuple[str, str], float]:
            return {
                (s.labels["endpoint"], s.labels["code"]): s.value
                for family in text_string_to_metric_families(
                    origin.service.metrics.exposition().decode()
                )
                for s in family.samples
                if s.name == "pressrun_origin_requests_total"
            }

        assert counts(fast) == counts(app)
        assert counts(fast)[("content", "206")] >= 2
    finally:
        await fast.stop()
        await app.stop()
