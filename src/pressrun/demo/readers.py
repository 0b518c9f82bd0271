"""Browser readers for ``pressrun demo --readers N`` and bench/reader_swarm.py: the web
reader (``pressrun serve reader``) in Debian's headless Chromium at a phone's size, as
the reader's tests drive it (`pressrun.reader.browser`).

One Chromium process; each reader is its own browser context (its own storage, OPFS
and IndexedDB, like a separate phone) with one page on the reader service. A reader
opens the app, downloads the issue with the app's own ``startDownload`` (directive,
pieces from origins and, when the app joins the swarm, from peers, every piece checked
against the signed manifest), then the whole stored file's SHA-256 is computed in the
page and compared with the publisher's. The page stays open until `BrowserReaders`
closes (a phone reading the issue stays in the swarm while the app is open).

What a reader took from where is the app's own tally in its result: origins by name
(``bytes_by_origin``: Range sections, and web-seed requests when the app counts them
there) and ``bytes_from_web_seeds``/``bytes_from_peers`` when the app reports them
(the swarm-capable app does; an app that only downloads from origins reports none, and
its peer bytes are 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pressrun.demo.processes import ServiceProcess

#: every wait on the browser has an end (a page's promise has none of its own)
STEP_TIMEOUT_S = 60.0
#: the app's last notices, read after a download that did not end, wait at most this
NOTICES_TIMEOUT_S = 10.0

#: a script that makes a page's link Wi-Fi, as Chrome on Android reports it
#: (``navigator.connection.type``; desktop Chromium reports none): the reader uploads
#: on such a link with its unmetered cap (docs/reader.md, "Peers"). ``window.__connection``
#: lets a caller change it (``type``, then a ``change`` event).
WIFI_PHONE = """
(() => {
  const connection = new EventTarget();
  connection.type = "wifi";
  Object.defineProperty(Navigator.prototype, "connection", { get: () => connection });
  window.__connection = connection;
})();
"""


@dataclass(frozen=True)
class ReaderOutcome:
    """One browser reader's download, as the app reported it and the page's SHA-256.

    seconds: the app's own (performance.now(), manifest request to verified file);
    wall_s: from the reader's arrival (its page opening) to the result;
    bytes_from_origins: origins' Range sections plus web seeds (the app's tally);
    bytes_from_peers: from WebRTC peers (0 when the app reports none);
    mode: the directive's mode the app followed ("origin", "swarm"; "-" unknown).
    """

    number: int
    verified: bool
    error: str | None = None
    seconds: float | None = None
    wall_s: float | None = None
    bytes_from_origins: int = 0
    bytes_from_peers: int = 0
    bytes_by_origin: tuple[tuple[str, int], ...] = ()
    mode: str = "-"
    wave: int = 1
    #: the app's last notices (why a reader left the swarm, for instance)
    notices: tuple[str, ...] = ()
    #: the app's swarm figures for the issue once downloaded (``window.pressrun.swarm()``:
    #: bytes received, needed and wasted by source and cause, hotswaps), or None
    swarm: dict[str, Any] | None = None


def outcome_from_result(
    number: int, result: dict[str, Any], *, sha_ok: bool, wall_s: float, wave: int = 1
) -> ReaderOutcome:
    """A `ReaderOutcome` from the app's result document (``window.pressrun.results``)."""
    by_origin = {str(k): int(v) for k, v in (result.get("bytes_by_origin") or {}).items()}
    web_seeds = int(result.get("bytes_from_web_seeds") or 0)
    peers = int(result.get("bytes_from_peers") or 0)
    mode = str(result.get("mode") or ("swarm" if peers or web_seeds else "origin"))
    return ReaderOutcome(
        number=number,
        verified=sha_ok and result.get("status") == "complete",
        seconds=float(result["seconds"]),
        wall_s=wall_s,
        bytes_from_origins=sum(by_origin.values()) + web_seeds,
        bytes_from_peers=peers,
        bytes_by_origin=tuple(sorted(by_origin.items())),
        mode=mode,
        wave=wave,
    )


def reader_service_args(
    balancer_urls: str, publisher_pub: Path, extra: tuple[str, ...] = ()
) -> list[str]:
    """``pressrun serve`` arguments of a reader service on 127.0.0.1, port 0 (desktop
    download settings are not forced: the app gets the reader's default, mobile)."""
    return [
        "reader",
        "--port",
        "0",
        "--balancer",
        balancer_urls,
        "--publisher-key",
        str(publisher_pub),
        *extra,
    ]


async def start_reader_service(
    balancer_urls: str,
    publisher_pub: Path,
    *,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> ServiceProcess:
    """``pressrun serve reader`` as a child process (its URL from its start-up line)."""
    return await ServiceProcess.start(
        "reader",
        reader_service_args(balancer_urls, publisher_pub, extra),
        env=env,
        log_path=log_path,  # at INFO: its URL is in its start-up line
    )


async def _bounded(what: str, step: Any, timeout_s: float = STEP_TIMEOUT_S) -> Any:
    try:
        async with asyncio.timeout(timeout_s):
            return await step
    except TimeoutError:
        raise RuntimeError(f"{what}: no answer in {timeout_s:g} s") from None


#: the stored issue's SHA-256 (hex), read back from the page's storage as the reader's
#: tests do (tests/reader/conftest.py)
_STORED_SHA256 = """async (issue) => {
    const store = await import('./js/store.js');
    const db = await import('./js/db.js');
    const r = await db.getRecord('issues', issue);
    const blob = await store.issueBlob(issue, r.num_pieces, 'application/pdf');
    const d = await crypto.subtle.digest('SHA-256', await blob.arrayBuffer());
    return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, '0')).join('');
}"""

#: the app's last notices (bench/reader_swarm.py keeps them in its JSON)
_LAST_NOTICES = "window.pressrun.notices.slice(-4).map((n) => n.text)"

#: the app's swarm figures for an issue (swarm.js SwarmFetch.status()), or null
_SWARM = "(issue) => window.pressrun.swarm?.()[issue] ?? null"

#: start the download and wait for its result or error (the app's own hooks); a
#: download the app finished by itself first (auto-download of a new issue) is the
#: reader's: asked again, the app resumes it with every piece stored in under a second
#: (readers 9 and 10 of bench/reader_swarm.py at N = 10 on a loaded host: 0.6 s)
_DOWNLOAD = """async (issue) => {
    if (window.pressrun.results[issue]) return window.pressrun.results[issue];
    await window.pressrun.startDownload(issue);
    const result = window.pressrun.results[issue];
    return result ?? {error: window.pressrun.errors[issue] ?? 'no result and no error'};
}"""


def _note_response(console: list[str], response: Any) -> None:
    """A refused or failed answer (status 400 and up) as a console line with its URL."""
    if response.status >= 400:
        method = response.request.method
        console.append(f"http {response.status}: {method} {response.url}")


class BrowserReaders:
    """One headless Chromium (Debian's, through Playwright) for a fleet of phones.

    ``async with BrowserReaders() as fleet: outcome = await fleet.read(...)``; every
    context is closed and Chromium stopped on exit. `RuntimeError` when no browser can
    be driven here (the message says what to install).
    """

    def __init__(self, *, before_start: str | None = None) -> None:
        #: a script run in every page before the app's own (e.g. a setting), or None
        self.before_start = before_start
        self._manager: Any = None
        self._browser: Any = None
        self._contexts: list[Any] = []
        self.console: dict[int, list[str]] = {}

    async def __aenter__(self) -> BrowserReaders:
        from pressrun.reader.browser import CHROMIUM, CHROMIUM_ARGS, why_no_browser

        reason = why_no_browser()
        if reason is not None:
            raise RuntimeError(f"browser readers: {reason}")
        from playwright.async_api import async_playwright

        self._manager = async_playwright()
        playwright = await _bounded("the Playwright driver's start", self._manager.__aenter__())
        try:
            self._browser = await _bounded(
                "Chromium's start",
                playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS)),
            )
        except BaseException:
            await self._manager.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for context in self._contexts:
            with contextlib.suppress(Exception):
                await _bounded("a browser context's close", context.close(), 20.0)
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await _bounded("Chromium's close", self._browser.close(), 30.0)
        if self._manager is not None:
            with contextlib.suppress(Exception):
                await _bounded(
                    "the Playwright driver's stop", self._manager.__aexit__(None, None, None), 30.0
                )

    async def read(
        self,
        number: int,
        reader_url: str,
        issue: str,
        want_sha256: str,
        *,
        timeout_s: float = 300.0,
        wave: int = 1,
    ) -> ReaderOutcome:
        """Reader ``number`` (a new phone) opens the app and downloads ``issue``; its
        outcome (an error in it, never an exception, once the browser runs)."""
        from pressrun.reader.browser import PHONE, open_app

        started = time.perf_counter()
        console = self.console.setdefault(number, [])
        try:
            context = await _bounded("a new browser context", self._browser.new_context(**PHONE))
            self._contexts.append(context)
            context.set_default_timeout(STEP_TIMEOUT_S * 1000)
            if self.before_start is not None:
                await context.add_init_script(self.before_start)
            page = await context.new_page()
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            # Chromium's console names no URL for a failed load ("the server responded
            # with a status of 503"): which service refused is in these lines
            page.on("response", lambda r: _note_response(console, r))
            # when each load of the app ended (seconds from this reader's arrival): a
            # page that loads again was reloaded by open_app
            page.on(
                "load", lambda _: console.append(f"load: {time.perf_counter() - started:.1f} s")
            )
            page.on(
                "requestfailed",
                lambda r: console.append(f"requestfailed: {r.method} {r.url}: {r.failure}"),
            )
            console.append(f"page open: {time.perf_counter() - started:.1f} s")
            await open_app(page, reader_url, STEP_TIMEOUT_S)
            await _bounded("the app's start", page.evaluate("window.pressrun.ready"))
            try:
                result = await _bounded("the download", page.evaluate(_DOWNLOAD, issue), timeout_s)
            except RuntimeError as err:  # say where the app was: its last notices
                try:  # a page too busy to tell them keeps the download's error
                    notices = await _bounded(
                        "the app's notices",
                        page.evaluate("window.pressrun.notices.slice(-2).map((n) => n.text)"),
                        NOTICES_TIMEOUT_S,
                    )
                except RuntimeError as no_answer:
                    notices = str(no_answer)
                raise RuntimeError(f"{err}; the app's last notices: {notices}") from None
            wall = time.perf_counter() - started
            if "error" in result:
                return ReaderOutcome(number, False, str(result["error"]), wall_s=wall, wave=wave)
            sha = await _bounded("the stored issue's SHA-256", page.evaluate(_STORED_SHA256, issue))
            notices = await _bounded("the app's notices", page.evaluate(_LAST_NOTICES), 10.0)
            try:  # figures, not the outcome: a page too busy to answer them loses only them
                figures = page.evaluate(_SWARM, issue)
                swarm = await _bounded("the app's swarm figures", figures, 10.0)
            except RuntimeError:
                swarm = None
        except Exception as err:  # one reader's failure is its row, not the run's end
            tail = "; ".join(console[-3:])
            detail = f"{type(err).__name__}: {err}" + (f" (console: {tail})" if tail else "")
            return ReaderOutcome(
                number, False, detail, wall_s=time.perf_counter() - started, wave=wave
            )
        outcome = outcome_from_result(
            number, result, sha_ok=sha == want_sha256, wall_s=wall, wave=wave
        )
        return dataclasses.replace(
            outcome, notices=tuple(str(n) for n in notices), swarm=swarm or None
        )
