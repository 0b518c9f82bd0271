"""Fixtures for tracker tests: a live tracker on 127.0.0.1:0, a real redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from live_tracker import LiveTracker, start_tracker

from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.sqlite_store import SqliteStore


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def tracker(tmp_path: Path, http: aiohttp.ClientSession) -> AsyncIterator[LiveTracker]:
    service, port = await start_tracker(
        SqliteStore(tmp_path / "tracker.db", flush_interval_s=0.05),
        TrackerConfig(max_numwant=20),
    )
    try:
        yield LiveTracker(service, port, http)
    finally:
        await service.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A throwaway redis-server on a free port, no persistence, in tmp_path."""
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/setup-system.sh installs it)")
    for _attempt in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                time.sleep(0.05)
        else:
            proc.kill()
            proc.wait()
            continue  # lost the port to someone else, or it did not start: try again
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=5)
        return
    pytest.fail("could not start redis-server on a free port in 5 tries")
