"""The emulation's phones (`pressrun.emulate.browser_reader`) ask for their directive
when their reader arrives, not when the app opened before the start line.

flash-crowd-50 at 53e51eb: the app, opened while the phone waited at the start line,
found the issue new and downloaded it at once (its automatic download), so every phone
was told ``origin`` (asked before any reader had arrived) and 6 of 10 reported the
resumed download's 0 B in under 2 s. Here a real phone (headless Chromium, the app
served by ``pressrun serve reader``, the balancer and two origins on 127.0.0.1) is held
at the start line: no directive may be asked during the hold, and after the release
the download it reports is the one that took the issue's bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from pressrun.emulate.browser_reader import parse_args, read_issue
from pressrun.emulate.fleet import by_kind, kinds_line
from pressrun.emulate.held import go_path, ready_path
from pressrun.reader.browser import why_no_browser

ISSUE = "phones-2026-47"
#: how long the phone waits at the start line after it said ready: the old app's own
#: download asked 3 directives within it and had the issue stored before the release
#: (the reported download then took 0.07 s with 0 B, as the emulation's phones did)
HOLD_S = 3.0


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """Two origins, the balancer and the reader service, a 1.5 MB PDF published."""
    from pressrun.clients.config import MOBILE
    from pressrun.content.keys import generate_keypair, load_public_key
    from pressrun.demo.testbed import OriginShape, Testbed
    from pressrun.reader.aio import start_reader
    from pressrun.reader.config import ReaderConfig
    from pressrun.reader.sample import write_sample_pdf

    pdf = tmp_path / "issue.pdf"
    write_sample_pdf(pdf, title="Phones, issue 47", pages=2, pad_to_bytes=1_500_000)
    data = pdf.read_bytes()
    generate_keypair(tmp_path / "publisher.key")
    shapes = tuple(
        OriginShape(name, content_dir=tmp_path / name) for name in ("origin-a", "origin-b")
    )
    bed = Testbed(tmp_path / "bed", shapes, poll_interval_s=0.3, poll_timeout_s=1.0)
    await bed.__aenter__()
    try:
        await bed.publish(
            data, issue_id=ISSUE, key_path=tmp_path / "publisher.key", piece_size=64 * 1024
        )
        balancer = await bed.start_balancer()
        await _directed(balancer.url)  # the app finds the issue new when it opens
        reader = await start_reader(
            ReaderConfig(
                balancer_url=balancer.url,
                publisher_keys=(load_public_key(tmp_path / "publisher.key.pub").hex(),),
                download=MOBILE,
            )
        )
        try:
            yield {"bed": bed, "balancer": balancer, "reader_url": reader.url, "data": data}
        finally:
            await reader.stop()
    finally:
        await bed.close()


async def _directed(balancer_url: str) -> None:
    """Until the balancer answers a directive for the issue."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            async with http.get(f"{balancer_url}/v1/issues/{ISSUE}/directive") as resp:
                if resp.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the balancer never directed to {ISSUE}")


@pytest.mark.skipif(why_no_browser() is not None, reason=why_no_browser() or "")
async def test_a_held_phone_asks_for_its_directive_at_its_arrival(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    data: bytes = stack["data"]
    core = stack["balancer"].core
    release = tmp_path / "release"
    release.mkdir()
    opts = parse_args(
        ["--release-dir", str(release), "--name", "1", "--reader-url", stack["reader_url"],
         "--issue", ISSUE, "--sha256", hashlib.sha256(data).hexdigest(),
         "--timeout-s", "60", "--seed-s", "0", "--step-timeout-s", "60"]
    )  # fmt: skip
    phone = asyncio.create_task(read_issue(opts))
    try:
        deadline = time.monotonic() + 90.0
        while not ready_path(release, "1").exists():
            assert not phone.done(), f"the phone ended before it was ready: {phone.result()}"
            assert time.monotonic() < deadline, "the phone never said ready"
            await asyncio.sleep(0.1)
        asked_before = core.directives_answered
        await asyncio.sleep(HOLD_S)
        asked_in_hold = core.directives_answered - asked_before
    finally:
        go_path(release, "1").write_text("")
        async with asyncio.timeout(120.0):
            doc = await phone
    # the app asked nothing while its reader had not arrived (before: its automatic
    # download of the new issue asked at the app's start)
    assert asked_in_hold == 0, f"{asked_in_hold} directive(s) asked at the start line: {doc}"
    assert core.directives_answered > asked_before  # asked after the release
    assert doc["error"] is None and doc["verified"], doc
    # the download reported is the one that took the bytes (before: the resumed one, 0 B)
    assert doc["bytes_from_origins"] + doc["bytes_from_peers"] >= len(data), doc
    assert doc["told"] == "origin"  # no tracker here: the directive's mode is origin
    assert json.loads(json.dumps(doc)) == doc


PHONES = """
name = "t"
issue_mb = 2
[[links]]
name = "phone"
down_rate = "6mbit"
up_rate = "2mbit"
[[arrivals]]
kind = "burst"
count = 1
at_s = 0
[browser_readers]
[[browser_readers.arrivals]]
kind = "burst"
count = 3
at_s = 1
"""


def test_the_report_says_what_the_phones_were_told() -> None:
    from pressrun.emulate.outcomes import ClientOutcome, VariantResult
    from pressrun.emulate.report import client_rows
    from pressrun.emulate.scenario import parse_scenario

    plans = parse_scenario(PHONES).clients()
    doc = {"verified": True, "sha256": "ab", "bytes_from_origins": 50, "bytes_from_peers": 0,
           "download_s": 10.0}  # fmt: skip
    docs = [{**doc, "mode": "origin"}, {**doc, "mode": "swarm", "told": "swarm"},
            {**doc, "mode": "origin", "told": "swarm"},  # no peer came
            {**doc, "mode": "origin", "told": "origin"}]  # fmt: skip
    outcomes = [ClientOutcome(plan, f"c{plan.number}", exit_code=0, doc=d)
                for plan, d in zip(plans, docs, strict=True)]  # fmt: skip
    rows = client_rows(VariantResult("emulation", outcomes, {}), "ab")
    kinds = by_kind(rows)
    assert kinds["browser"]["told"] == {"swarm": 2, "origin": 1}
    assert "told" not in kinds["desktop"]
    line = kinds_line("emulation", kinds)
    assert "told origin 1, swarm 2" in line and line.count("told") == 1
