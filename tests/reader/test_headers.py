"""The reader's security headers (issue 25, finding 8): every answer carries them, the
app works under its Content-Security-Policy in a real Chromium, and a violation is
reported to the reader service, which logs it, bounded."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from pressrun.clients.config import DESKTOP
from pressrun.reader.aio import (
    CSP_REPORT_BYTES,
    CSP_REPORTS_PER_MINUTE,
    ReportLimiter,
    RunningReader,
    start_reader,
)
from pressrun.reader.config import ReaderConfig

from .conftest import ISSUE, Phone, StackFactory, browser_only

KEY = "ab" * 32
HEADERS = ("X-Content-Type-Options", "Referrer-Policy", "Content-Security-Policy")


@pytest.fixture
async def reader() -> AsyncIterator[RunningReader]:
    running = await start_reader(
        ReaderConfig(balancer_url="http://127.0.0.1:9/", publisher_keys=(KEY,), download=DESKTOP)
    )
    yield running
    await running.stop()


def directives(csp: str) -> dict[str, list[str]]:
    out = {}
    for part in csp.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


@browser_only
async def test_every_answer_has_the_security_headers(reader: RunningReader) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/sw.js", "/config.json", "/vendor/libsodium.mjs", "/healthz", "/nope"):
            async with http.get(reader.url + path) as resp:
                for name in HEADERS:
                    assert name in resp.headers, (path, name)
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert resp.headers["Referrer-Policy"] == "no-referrer"
                csp = directives(resp.headers["Content-Security-Policy"])
        async with http.get(reader.url + "/") as resp:
            index = await resp.text()
    # no inline script but the import map, allowed by its exact hash
    script = csp["script-src"]
    assert "'unsafe-inline'" not in script and "'unsafe-eval'" not in script
    hashes = [v for v in script if v.startswith("'sha256-")]
    assert len(hashes) == 1 and index.count("<script") == 2
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["object-src"] == ["'none'"] and csp["base-uri"] == ["'none'"]
    assert csp["report-uri"] == ["/csp-report"]


@browser_only
async def test_reports_are_logged_bounded(
    reader: RunningReader, caplog: pytest.LogCaptureFixture
) -> None:
    url = reader.url + "/csp-report"
    report = {
        "csp-report": {
            "document-uri": "http://127.0.0.1/",
            "violated-directive": "script-src-elem",
            "blocked-uri": "inline\nWARNING forged line",
            "line-number": 7,
        }
    }
    caplog.set_level(logging.WARNING, "pressrun.reader")
    async with aiohttp.ClientSession() as http:
        async with http.post(
            url, data=json.dumps(report), headers={"Content-Type": "application/csp-report"}
        ) as resp:
            assert resp.status == 204
        lines = [r.getMessage() for r in caplog.records if "CSP violation" in r.getMessage()]
        assert len(lines) == 1 and "script-src-elem" in lines[0]
        assert "\n" not in lines[0]  # a stranger's newline cannot forge a log line
        # the Reporting API's shape (report-to)
        api = [{"type": "csp-violation", "body": {"effectiveDirective": "img-src"}}]
        async with http.post(url, json=api) as resp:
            assert resp.status == 204
        assert "directive='img-src'" in caplog.records[-1].getMessage()
        # bounded: a large body is refused, garbage is refused, a flood is not logged
        async with http.post(url, data=b"{" + b" " * CSP_REPORT_BYTES + b"}") as resp:
            assert resp.status == 413
        async with http.post(url, data=b"not json") as resp:
            assert resp.status == 400
        caplog.clear()
        for _ in range(3 * CSP_REPORTS_PER_MINUTE):
            async with http.post(url, json=report) as resp:
                assert resp.status == 204
    logged = [r for r in caplog.records if "CSP violation" in r.getMessage()]
    assert len(logged) <= CSP_REPORTS_PER_MINUTE
    assert reader.service.csp_reports_received == 2 + 3 * CSP_REPORTS_PER_MINUTE


def test_report_limiter_with_explicit_now() -> None:
    limiter = ReportLimiter(30, now=0.0)
    assert sum(limiter.allow(now=0.0) for _ in range(100)) == 30
    assert limiter.dropped == 70
    assert not limiter.allow(now=1.0)  # half a token back
    assert limiter.allow(now=2.0)
    assert sum(limiter.allow(now=200.0) for _ in range(100)) == 30  # never above the burst


@browser_only
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_the_app_works_under_its_csp_and_a_violation_is_reported(
    make_stack: StackFactory,
    phone_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "pressrun.reader")
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    # the whole app under the policy: key made (libsodium, wasm), an encrypted issue
    # downloaded, decrypted, stored, its cover and a page drawn by pdf.js (a worker,
    # wasm, fonts)
    await stack.publish([await phone.subscriber_key()])
    await phone.check_for_issues()
    result = await phone.wait_for_download()
    assert result["encrypted"]
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
    item = page.locator(f"li[data-issue='{ISSUE}']")
    await item.locator("img.cover").wait_for()
    assert await item.locator("img.cover").evaluate("img => img.naturalWidth > 0")
    await item.locator("button.open").tap()
    await page.wait_for_selector("#page[data-page='1']")
    await page.locator("#next-page").tap()
    await page.wait_for_selector("#page[data-page='2']")
    await phone.evaluate("navigator.serviceWorker.ready", what="the service worker's start")
    refused = [line for line in phone.console if "Content Security Policy" in line]
    assert refused == [], refused
    assert not [r for r in caplog.records if "CSP violation" in r.getMessage()]
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console

    # an injected inline script (what an XSS would add) does not run, and is reported
    ran = await phone.evaluate(
        """() => new Promise((done) => {
            const s = document.createElement('script');
            s.textContent = 'window.__injected = true';
            document.body.append(s);
            setTimeout(() => done(window.__injected === true), 200);
        })""",
        what="an injected inline script",
    )
    assert ran is False
    async with asyncio.timeout(20):
        while not [r for r in caplog.records if "CSP violation" in r.getMessage()]:
            await asyncio.sleep(0.1)
    line = next(r.getMessage() for r in caplog.records if "CSP violation" in r.getMessage())
    assert "script-src" in line and "inline" in line, line
    # and nobody can frame the reader
    framer = await phone.context.new_page()
    await framer.set_content(f'<iframe src="{stack.reader_url}/"></iframe>')
    frame_ok = True
    for _ in range(40):
        await asyncio.sleep(0.1)
        child = framer.frames[1] if len(framer.frames) > 1 else None
        if child is not None:
            try:
                frame_ok = bool(await child.evaluate("!!(window.pressrun)"))
            except Exception:  # the blocked frame is an error page of another origin
                frame_ok = False
            if not frame_ok:
                break
    assert not frame_ok
