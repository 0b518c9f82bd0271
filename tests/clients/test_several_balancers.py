"""A client that knows several balancers (issue 30): it moves to the next on a refused
connection, a timeout or a 5xx, and keeps the pieces it has. Real origins and a real
balancer on 127.0.0.1 (`pressrun.demo.testbed`); a dead balancer is a port nobody
listens on, a failing one an aiohttp front (tests/fronts.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from clients.test_retry import DATA, ISSUE, PATIENT, PIECE, Notices, assert_in_library, make_bed
from fronts import directive_front
from pressrun.clients.aio import FetchError, fetch_issue
from pressrun.clients.config import parse_balancer_urls
from pressrun.demo.testbed import OriginShape, Testbed


def dead_url() -> str:
    """A balancer URL nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[tuple[Testbed, set[bytes]]]:
    made = await make_bed(tmp_path, (OriginShape("origin-a"), OriginShape("origin-b")))
    yield made
    await made[0].close()


def test_balancer_lists_parse() -> None:
    assert parse_balancer_urls("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    assert parse_balancer_urls(["http://a:1", "http://b:2,http://a:1"]) == (
        "http://a:1",
        "http://b:2",
    )
    for bad in ("", " , ", "ftp://a", "a:1"):
        with pytest.raises(ValueError):
            parse_balancer_urls(bad)


async def test_a_dead_first_balancer_is_passed_over(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    testbed, trusted = bed
    assert testbed.balancer is not None
    notes = Notices()
    dead = dead_url()
    result = await fetch_issue(
        ISSUE,
        balancer_url=f"{dead},{testbed.balancer.url}",
        library=tmp_path / "lib",
        config=PATIENT,
        trusted_keys=trusted,
        progress=notes,
    )
    assert_in_library(tmp_path / "lib", result)
    assert any(dead in n and testbed.balancer.url in n for n in notes.notices), notes.notices


async def test_a_balancer_failing_mid_download_loses_nothing(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    """The first balancer answers the first directive, then 502s: the client goes on
    with the second and downloads every byte once."""
    testbed, trusted = bed
    assert testbed.balancer is not None
    asked: list[str] = []

    def first_then_502(request: web.Request) -> web.Response | None:
        asked.append(request.path_qs)
        return None if len(asked) == 1 else web.Response(status=502, text="bad gateway")

    config = replace(PATIENT, section_bytes=2 * PIECE, concurrency=1)
    async with directive_front(testbed.balancer.url, first_then_502) as front:
        result = await fetch_issue(
            ISSUE,
            balancer_url=[front, testbed.balancer.url],
            library=tmp_path / "lib",
            config=config,
            trusted_keys=trusted,
        )
    assert_in_library(tmp_path / "lib", result)
    assert result.sections >= 4
    assert len(asked) == 2  # the first directive, then one 502: it stays on the second
    assert sum(result.bytes_by_origin.values()) == len(DATA)  # nothing fetched twice
    assert result.resumed_bytes == 0


async def test_every_balancer_dead_is_a_clear_error(tmp_path: Path) -> None:
    first, second = dead_url(), dead_url()
    with pytest.raises(FetchError) as err:
        await fetch_issue(
            ISSUE,
            balancer_url=[first, second],
            library=tmp_path / "lib",
            config=replace(PATIENT, give_up_after_s=1.0, max_attempts_without_progress=1),
            trusted_keys=set(),
        )
    assert first in str(err.value) and second in str(err.value)


async def test_pressrun_get_takes_the_balancers_from_the_environment(
    bed: tuple[Testbed, set[bytes]], tmp_path: Path
) -> None:
    testbed, _ = bed
    assert testbed.balancer is not None
    key = tmp_path / "publisher.key.pub"
    env = dict(os.environ, PRESSRUN_BALANCERS=f"{dead_url()},{testbed.balancer.url}")
    argv = [str(Path(sys.executable).with_name("pressrun")), "get", ISSUE,
            "--library", str(tmp_path / "lib"), "--publisher-key", str(key), "--quiet"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "lib" / ISSUE / f"{ISSUE}.pdf").read_bytes() == DATA
