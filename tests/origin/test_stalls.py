"""Clients that stop reading (issue 25, finding 1), on a real origin over loopback:
they are no load in /stats, and they are cut after the send timeout. A slow client
that keeps reading is neither."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pressrun.origin.aio import RunningOrigin, runner_shutdown_timeout, start_origin
from pressrun.origin.config import OriginConfig
from stalled_clients import stall

ISSUE = "weekly-1"
BIG = "big.bin"
#: more than the socket buffers of a stalled connection hold (a few MB on loopback)
BIG_BYTES = 24 << 20
STALLED = 20


@pytest.fixture
def content(tmp_path: Path) -> Path:
    issue = tmp_path / "content" / ISSUE
    issue.mkdir(parents=True)
    (issue / BIG).write_bytes(os.urandom(BIG_BYTES))
    (issue / "small.bin").write_bytes(os.urandom(1 << 20))
    return tmp_path / "content"


async def stats(http: aiohttp.ClientSession, origin: RunningOrigin) -> dict[str, Any]:
    async with http.get(f"{origin.url}/stats") as resp:
        doc: dict[str, Any] = await resp.json()
        return doc


async def reset_by_server(s: socket.socket, timeout_s: float) -> bool:
    """True when the server resets the connection within ``timeout_s``, seen without
    reading a byte (reading would make the client a reader)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_stalled_clients_are_no_load_and_are_cut(content: Path) -> None:
    origin = await start_origin(
        OriginConfig(
            content_dir=content,
            stats_interval_s=0.2,
            stalled_after_s=0.5,
            send_timeout_s=3.0,
        )
    )
    socks: list[socket.socket] = []
    try:
        async with aiohttp.ClientSession() as http:
            socks = await stall(origin.port, f"/content/{ISSUE}/{BIG}", STALLED)
            for _ in range(50):
                await asyncio.sleep(0.05)
                if (await stats(http, origin))["transfers_total"] == STALLED:
                    break
            # stalled_after_s (0.5 s) and an interval or two; polled, for a loaded host
            for _ in range(40):
                await asyncio.sleep(0.1)
                doc = await stats(http, origin)
                if doc["stalled_transfers"] == STALLED:
                    break
            assert doc["transfers_total"] == STALLED
            assert doc["active_transfers"] == 0, doc
            assert doc["stalled_transfers"] == STALLED
            assert doc["active_transfers_by_issue"] == {}
            assert doc["mean_transfer_bytes_per_s"] is None
            # a reader meanwhile is served at once and counted
            started = time.monotonic()
            async with http.get(f"{origin.url}/content/{ISSUE}/small.bin") as resp:
                assert resp.status == 200 and len(await resp.read()) == 1 << 20
            assert time.monotonic() - started < 1.0
            # the send timeout (3 s) cuts every stalled connection
            closed = await asyncio.gather(*(reset_by_server(s, 6.0) for s in socks))
            assert all(closed)
            doc = await stats(http, origin)
            assert doc["stalled_transfers"] == 0 and doc["active_transfers"] == 0
            async with http.get(f"{origin.url}/metrics") as resp:
                metrics = await resp.text()
            assert f"pressrun_origin_transfers_timed_out_total {STALLED}.0" in metrics
    finally:
        for s in socks:
            s.close()
        await origin.stop()


async def test_a_slow_reader_is_load_and_is_not_cut(content: Path) -> None:
    # 64 KiB chunks, a send timeout of 1.5 s, a reader at about 320 KB/s: each chunk
    # takes about 0.2 s, well within the timeout, and it counts as a transfer all along
    origin = await start_origin(
        OriginConfig(
            content_dir=content,
            stats_interval_s=0.2,
            stalled_after_s=1.0,
            send_timeout_s=1.5,
            sendfile_chunk_bytes=64 * 1024,
            send_buffer_bytes=16 * 1024,
        )
    )
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession() as http:
            (s,) = await stall(origin.port, f"/content/{ISSUE}/small.bin", 1, rcvbuf=32 * 1024)
            got = 0
            seen_active = []
            started = time.monotonic()
            try:
                while True:
                    data = await loop.sock_recv(s, 32 * 1024)
                    if not data:
                        break
                    got += len(data)
                    if got >= (1 << 20) + 100:  # the whole body and the headers
                        break
                    await asyncio.sleep(0.1)
                    if len(seen_active) < 20:
                        doc = await stats(http, origin)
                        seen_active.append((doc["active_transfers"], doc["stalled_transfers"]))
            finally:
                s.close()
            assert got > 1 << 20, got
            assert time.monotonic() - started > 1.5  # it really was slow
            # once the first interval closed, it counted as moving every time
            assert all(pair == (1, 0) for pair in seen_active[3:]), seen_active
            async with http.get(f"{origin.url}/metrics") as resp:
                assert "pressrun_origin_transfers_timed_out_total 0.0" in await resp.text()
    finally:
        await origin.stop()


async def until_stalled(http: aiohttp.ClientSession, origin: RunningOrigin) -> None:
    """Until the origin's one transfer has sent nothing for `stalled_after_s`: its
    socket's buffers are full and it waits for room."""
    for _ in range(200):
        await asyncio.sleep(0.05)
        if (await stats(http, origin))["stalled_transfers"] == 1:
            return
    raise AssertionError("the transfer never stalled")


async def test_a_client_that_leaves_while_the_origin_waits_for_room_ends_its_transfer(
    content: Path,
) -> None:
    # the origin waits for room in the socket of a client that stopped reading; the
    # client's FIN comes first (as when it closes having read what it had), then its
    # close: before, the FIN made the transport close and drop the origin's writer
    # registration, and the transfer waited out the send timeout (60 s) for a client
    # long gone (a test stack's stop waited with it: the 57-59 s teardowns)
    origin = await start_origin(
        OriginConfig(content_dir=content, stats_interval_s=0.2, stalled_after_s=0.5)
    )
    socks: list[socket.socket] = []
    try:
        async with aiohttp.ClientSession() as http:
            socks = await stall(origin.port, f"/content/{ISSUE}/{BIG}", 1)
            await until_stalled(http, origin)
            socks[0].shutdown(socket.SHUT_WR)
            await asyncio.sleep(0.5)
            socks[0].close()  # bytes unread: a reset
            # a third of the send timeout (60 s) it waited before
            for _ in range(200):
                doc = await stats(http, origin)
                if doc["active_transfers"] + doc["stalled_transfers"] == 0:
                    break
                await asyncio.sleep(0.1)
            assert doc["active_transfers"] + doc["stalled_transfers"] == 0, doc
            async with http.get(f"{origin.url}/metrics") as resp:
                assert "pressrun_origin_transfers_timed_out_total 0.0" in await resp.text()
    finally:
        for s in socks:
            s.close()
        await origin.stop()


async def test_a_half_closed_client_that_reads_on_gets_the_whole_answer(content: Path) -> None:
    # a FIN alone is a half-close: the client may read on; paused reading while the
    # origin waits for room, the origin serves it to the end
    origin = await start_origin(
        OriginConfig(content_dir=content, stats_interval_s=0.2, stalled_after_s=0.5)
    )
    loop = asyncio.get_running_loop()
    try:
        (s,) = await stall(origin.port, f"/content/{ISSUE}/{BIG}", 1)
        try:
            async with aiohttp.ClientSession() as http:
                await until_stalled(http, origin)
            s.shutdown(socket.SHUT_WR)
            got = 0
            while data := await loop.sock_recv(s, 1 << 20):
                got += len(data)
                if got > BIG_BYTES:
                    break
        finally:
            s.close()
        assert got > BIG_BYTES, got  # the whole body and the headers
    finally:
        await origin.stop()


async def test_a_stop_without_grace_cuts_a_stalled_client_at_once(
    content: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # grace 0 (the test stacks' origins, `--shutdown-grace-s 0`): the stop cuts the
    # transfer of a client that stopped reading; before, aiohttp read the 0 as no bound
    # and the stop waited for the send timeout (60 s) to cut it: the test stacks'
    # 57-59 s teardowns
    caplog.set_level(logging.INFO, logger="pressrun.origin")
    origin = await start_origin(
        OriginConfig(content_dir=content, shutdown_grace_s=0.0, stalled_after_s=0.5)
    )
    socks: list[socket.socket] = []
    try:
        socks = await stall(origin.port, f"/content/{ISSUE}/{BIG}", 1)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if origin.service.meter.transfers_total == 1:
                break
        assert origin.service.meter.transfers_total == 1
        # a third of the send timeout (60 s) it would otherwise wait
        async with asyncio.timeout(20.0):
            await origin.stop()
    finally:
        for s in socks:
            s.close()
    assert origin.service.transfers_cut == 1
    timed_out = origin.service.metrics.registry.get_sample_value(
        "pressrun_origin_transfers_timed_out_total"
    )
    assert timed_out == 0  # cut by the stop, not by the send timeout
    messages = [r.getMessage() for r in caplog.records]
    assert any("stopped: 1 transfer(s) running at stop, 1 cut" in m for m in messages), messages


@pytest.mark.parametrize(("grace_s", "timeout_s"), [(0.0, 0.001), (0.3, 0.15), (5.0, 2.5)])
def test_the_runner_waits_half_the_grace_twice_and_never_without_bound(
    grace_s: float, timeout_s: float
) -> None:
    # aiohttp waits its shutdown_timeout for a running answer, then once more after
    # failing the request's payload, and reads 0 as no bound
    assert runner_shutdown_timeout(grace_s) == pytest.approx(timeout_s)
