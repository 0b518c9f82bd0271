"""The client keeps going while the system is up (issue 13's flash crowd found both):

- an origin that serves a truncated or otherwise bad ``manifest.json`` is failed and
  another origin is asked, instead of the download ending there;
- a balancer that is slow to accept (its process starved of CPU: connections wait in
  the listen backlog) or that answers 503 with Retry-After is retried with backoff, the
  first contact included, until the give-up rule; which still ends a download whose
  system is down.

Real origins and a real balancer on 127.0.0.1 (`pressrun.demo.testbed`); the slow
accept is a listening socket nobody accepts on for a while, then a byte relay to the
balancer; the Retry-After is an aiohttp front that answers 503 once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from fronts import directive_front
from pressrun.clients.aio import FetchError, FetchResult, fetch_issue
from pressrun.clients.config import DESKTOP, ClientConfig
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "retry-2026-47"
PIECE = 64 * 1024
DATA = random.Random(13).randbytes(PIECE * 9 + 123)

#: quick failure detection on loopback, a patient give-up rule
PATIENT = replace(
    DESKTOP,
    stall_timeout_s=3.0,
    balancer_timeout_s=1.0,
    retry_backoff_s=0.1,
    retry_backoff_max_s=0.8,
    max_attempts_without_progress=3,
    give_up_after_s=30.0,
)


class Notices:
    """A `Progress` that keeps the notices."""

    def __init__(self) -> None:
        self.notices: list[str] = []

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        pass

    def notice(self, text: str) -> None:
        self.notices.append(text)


async def make_bed(root: Path, shapes: tuple[OriginShape, ...]) -> tuple[Testbed, set[bytes]]:
    secret, public = generate_keypair(root / "publisher.key")
    bed = Testbed(root / "bed", shapes, poll_interval_s=0.3, poll_timeout_s=1.0)
    await bed.__aenter__()
    try:
        await bed.publish(DATA, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        await bed.start_balancer()
    except BaseException:
        await bed.close()
        raise
    return bed, {load_public_key(public)}


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[tuple[Testbed, set[bytes]]]:
    made = await make_bed(tmp_path, (OriginShape("origin-a"), OriginShape("origin-b")))
    yield made
    await made[0].close()


async def fetch(url: str, library: Path, trusted: set[bytes], config: ClientConfig,
                progress: Notices | None = None) -> FetchResult:  # fmt: skip
    return await fetch_issue(
        ISSUE,
        balancer_url=url,
        library=library,
        config=config,
        trusted_keys=trusted,
        progress=progress,
    )


def assert_in_library(library: Path, result: FetchResult) -> None:
    assert result.verified
    assert result.path.read_bytes() == DATA
    assert result.path == library / ISSUE / f"{ISSUE}.pdf"


async def test_a_truncated_manifest_fails_that_origin_and_another_serves_it(
    tmp_path: Path,
) -> None:
    # origins A and B (well placed, offered first) serve a manifest cut short; C is good
    shapes = (
        OriginShape("origin-a", 1000.0, content_dir=tmp_path / "content-a"),
        OriginShape("origin-b", 1000.0, content_dir=tmp_path / "content-b"),
        OriginShape("origin-c", 10.0, content_dir=tmp_path / "content-c"),
    )
    bed, trusted = await make_bed(tmp_path, shapes)
    try:
        for name in ("a", "b"):
            path = tmp_path / f"content-{name}" / ISSUE / "manifest.json"
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        assert bed.balancer is not None
        notes = [Notices() for _ in range(3)]
        results = await asyncio.wait_for(
            asyncio.gather(
                *(
                    fetch(bed.balancer.url, tmp_path / f"lib{n}", trusted, PATIENT, notes[n])
                    for n in range(3)
                )
            ),
            60,
        )
        for n, result in enumerate(results):
            assert_in_library(tmp_path / f"lib{n}", result)
        rejected = [t for n in notes for t in n.notices if "manifest" in t and "rejected" in t]
        # every client was offered A or B first (the balancer prefers them) and moved on
        assert len(rejected) >= 3, [n.notices for n in notes]
        assert all("origin-a" in t or "origin-b" in t for t in rejected)
    finally:
        await bed.close()


async def test_every_origin_serving_a_bad_manifest_still_ends_with_the_reason(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    testbed, trusted = bed
    assert testbed.balancer is not None
    path = testbed.content_dir / ISSUE / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])
    config = replace(PATIENT, give_up_after_s=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(FetchError, match="could not get a good manifest") as err:
        await fetch(testbed.balancer.url, tmp_path / "lib", trusted, config)
    assert loop.time() - started >= 1.0
    assert "is rejected" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "lib" / ISSUE).exists()


@contextlib.asynccontextmanager
async def slow_acceptor(target_port: int, accept_after_s: float) -> AsyncIterator[str]:
    """A port whose connections sit in the listen backlog (nobody accepts: a
    CPU-starved balancer) for ``accept_after_s``, then are relayed to ``target_port``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    port = sock.getsockname()[1]

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server: asyncio.Server | None = None

    async def open_later() -> None:
        nonlocal server
        await asyncio.sleep(accept_after_s)
        server = await asyncio.start_server(relay, sock=sock)

    opener = asyncio.create_task(open_later())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        opener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await opener
        if server is not None:
            server.close()
            await server.wait_closed()
        sock.close()


async def test_a_balancer_slow_to_accept_is_waited_for_on_first_contact(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    testbed, trusted = bed
    assert testbed.balancer is not None
    port = int(testbed.balancer.url.rsplit(":", 1)[1])
    loop = asyncio.get_running_loop()
    async with slow_acceptor(port, accept_after_s=4.0) as url:
        started = loop.time()
        result = await asyncio.wait_for(fetch(url, tmp_path / "lib", trusted, PATIENT), 60)
        # more than max_attempts_without_progress directive requests timed out first
        assert loop.time() - started >= 4.0
    assert_in_library(tmp_path / "lib", result)


async def test_retry_after_of_a_503_is_honoured(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    testbed, trusted = bed
    assert testbed.balancer is not None
    real = testbed.balancer.url
    loop = asyncio.get_running_loop()
    asked: list[float] = []

    def first_refused(request: web.Request) -> web.Response | None:
        asked.append(loop.time())
        if len(asked) == 1:
            return web.json_response(
                {"error": "overloaded"}, status=503, headers={"Retry-After": "2"}
            )
        return None

    async with directive_front(real, first_refused) as url:
        result = await asyncio.wait_for(fetch(url, tmp_path / "lib", trusted, PATIENT), 60)
    assert_in_library(tmp_path / "lib", result)
    # the backoff alone would have waited 0.1 s: the server asked for 2
    assert asked[1] - asked[0] >= 2.0


async def test_a_balancer_that_is_down_still_ends_the_download_after_the_patience(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    config = replace(PATIENT, give_up_after_s=2.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(FetchError, match=f"the balancer at {url} is unreachable"):
        await fetch(url, tmp_path / "lib", set(), config)
    assert 2.0 <= loop.time() - started < 20.0


def test_backoff_doubles_to_its_cap_and_yields_to_a_longer_retry_after() -> None:
    config = replace(DESKTOP, retry_backoff_s=0.25, retry_backoff_max_s=4.0)
    assert [config.backoff_s(n) for n in range(1, 8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert config.backoff_s(1, retry_after_s=3.0) == 3.0
    assert config.backoff_s(6, retry_after_s=3.0) == 4.0
    assert config.backoff_s(10_000) == 4.0


def test_give_up_needs_the_count_and_the_patience() -> None:
    config = replace(DESKTOP, max_attempts_without_progress=3, give_up_after_s=60.0)
    assert not config.gives_up(2, 600.0)
    assert not config.gives_up(3, 59.0)
    assert config.gives_up(3, 60.0)
    assert replace(config, give_up_after_s=0.0).gives_up(3, 0.0)
    with pytest.raises(ValueError, match="give_up_after_s"):
        replace(config, give_up_after_s=-1.0)
