"""How pressrun drives a real browser (the reader's tests and bench/reader.py).

Debian's Chromium, headless, through Playwright (its ``executable_path``; Playwright's
own browser download is never used), with the flags that work on these machines
(FIELD-NOTES.md, "A real browser for tests") and a phone's viewport and touch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

from pressrun.reader.config import PACKAGE_DIR

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Playwright adds --headless and, for launch(), a fresh --user-data-dir
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
#: a phone: 390 x 844 CSS pixels (an iPhone 14's; 2x keeps screenshots small), touch
PHONE: dict[str, Any] = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}

#: a tablet held in landscape: 1180 x 820 CSS pixels (an iPad Air's), touch; the
#: reader shows two-page spreads on it (turned to portrait: one page)
TABLET: dict[str, Any] = {
    "viewport": {"width": 1180, "height": 820},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}


def why_no_browser() -> str | None:
    """Why the browser cannot be driven here (what to run), or None when it can."""
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM}: run `make setup` (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed: run `make setup`"
    if not (PACKAGE_DIR / "node_modules" / "pdfjs-dist").is_dir():
        return "the reader's npm packages are not installed: run `make setup`"
    return None


#: how long the app gets to set ``window.pressrun`` after each load of its page
APP_START_WAIT_S = 15.0
#: how long a page gets to say whether its app runs, before open_app loads it again
APP_CHECK_S = 5.0


async def open_app(
    page: Any, url: str, timeout_s: float, *, start_wait_s: float = APP_START_WAIT_S
) -> None:
    """The reader app on ``page``, opened again until its module has set
    ``window.pressrun`` or ``timeout_s`` passed: the reader service may still be
    starting, and a load can fail part-way (Chromium's ERR_NETWORK_CHANGED when the host
    adds a network, as a container run beside it does), leaving the page without the
    app. Each load gets ``start_wait_s`` for the app to start, however much of
    ``timeout_s`` it took (the last one may end up to that much after the deadline).
    Its ``ready`` promise is the caller's to await."""
    import asyncio
    import time

    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            await page.goto(url)
            # not what is left of the deadline: on a host with both cores busy the
            # window.pressrun of a page loaded late comes seconds after its load event,
            # and 10 of 20 bench readers got only 1 s (bench/reader_swarm.py, N = 20,
            # a0a91f1, load 11-36: "Page.wait_for_function: Timeout 1000ms exceeded")
            await page.wait_for_function(
                "() => window.pressrun !== undefined", timeout=1000 * start_wait_s
            )
            return
        except Exception:  # playwright's Error or TimeoutError: not up, or a partial load
            # a page whose app already runs is never loaded again: its load event (or
            # the wait's polling) can come late on a busy host while the app downloads,
            # and a reload there restarted the download as a resume of stored pieces
            # (bench/reader_swarm.py N = 10, 3 rows of 0.8-2.1 s, issue 26)
            if await _app_started(page):
                return
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(1.0)


async def _app_started(page: Any) -> bool:
    """Whether the page already has the app (``window.pressrun``); False when the page
    does not answer within a few seconds."""
    import asyncio

    try:
        async with asyncio.timeout(APP_CHECK_S):
            return bool(await page.evaluate("() => window.pressrun !== undefined"))
    except Exception:  # closed, navigating, or too busy to answer: not known to run
        return False
