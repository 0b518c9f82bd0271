"""`pressrun.reader.browser.open_app` on a host too busy to start the app at once.

bench/reader_swarm.py at a0a91f1 (N = 20 with peers, load 11-36, both cores busy): 10
of 20 readers failed with "Page.wait_for_function: Timeout 1000ms exceeded": their
page's load had ended with about a second of open_app's 60 s left, and that second
was all the app got to set ``window.pressrun`` (which on a loaded host comes after the
load event). A page that has loaded now gets the app's full start wait, whatever the
load took of the deadline; the deadline still ends the retries.

And a page whose app runs is not loaded again (issue 26). bench/reader_swarm.py N = 10
with peers at d929e3f (18:08, load 3-18): readers 4, 5 and 7 reported downloads of
0.8-2.1 s, "resuming: 153 of 153 pieces already stored", and reader 6 one of 6.6 s with
135 of 153 stored; their notices began with that resume, not with "New issue out": a
second page of the same reader. `open_app` loaded the page again when its wait failed
(the load event or the app's start check coming late on a busy host: the pages' load
events came 30-45 s after they opened in the N = 10 runs of 17:01-17:28), although the
app had started and was downloading; the new page resumed from the stored pieces and
the bench recorded that resume. Now a page whose app runs is kept, whatever failed in
the wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from pressrun.reader.browser import CHROMIUM, CHROMIUM_ARGS, open_app, why_no_browser

pytestmark = pytest.mark.skipif(why_no_browser() is not None, reason=why_no_browser() or "")

#: the page's load event waits for this image; its answer comes this late (seconds)
SLOW_LOAD_S = 2.0
#: the app's ``window.pressrun`` appears this long after the load event
START_AFTER_LOAD_S = 1.5

PAGE = f"""<!doctype html><html><body>
<img src="/slow.png">
<script>
window.addEventListener("load", () =>
  setTimeout(() => {{ window.pressrun = {{}}; }}, {START_AFTER_LOAD_S * 1000}));
</script>
</body></html>"""

NEVER = "<!doctype html><html><body>no app here</body></html>"

#: the app starts at once and counts its loads; its page's load event waits on an
#: image that answers far later than the navigation's timeout
STARTS_AT_ONCE = """<!doctype html><html><body>
<img src="/hangs.png">
<script>
localStorage.loads = String(Number(localStorage.loads || 0) + 1);
window.pressrun = {};
</script>
</body></html>"""


async def _slow_png(request: web.Request) -> web.Response:
    await asyncio.sleep(SLOW_LOAD_S)
    return web.Response(body=b"", content_type="image/png")


async def _hangs_png(request: web.Request) -> web.Response:
    await asyncio.sleep(30.0)
    return web.Response(body=b"", content_type="image/png")


@pytest_asyncio.fixture
async def site() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/", _page)
    app.router.add_get("/never", _never)
    app.router.add_get("/slow.png", _slow_png)
    app.router.add_get("/at-once", _at_once)
    app.router.add_get("/hangs.png", _hangs_png)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def _never(request: web.Request) -> web.Response:
    return web.Response(text=NEVER, content_type="text/html")


async def _at_once(request: web.Request) -> web.Response:
    return web.Response(text=STARTS_AT_ONCE, content_type="text/html")


@pytest_asyncio.fixture
async def page() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS)
        )
        try:
            yield await (await browser.new_context()).new_page()
        finally:
            await browser.close()


async def test_a_page_that_loads_near_the_deadline_gets_time_to_start_the_app(
    site: str, page: Any
) -> None:
    # the load takes all of open_app's time (2 s of 2 s), the app appears 1.5 s later:
    # before, open_app waited max(1 s, what was left) and failed
    await open_app(page, site + "/", timeout_s=SLOW_LOAD_S)
    assert await page.evaluate("window.pressrun !== undefined")
    assert await page.evaluate("performance.getEntriesByType('navigation').length") == 1


async def test_a_page_without_the_app_still_fails_after_the_deadline(site: str, page: Any) -> None:
    started = time.perf_counter()
    with pytest.raises(Exception, match="Timeout 2000ms"):
        await open_app(page, site + "/never", timeout_s=3.0, start_wait_s=2.0)
    # the deadline, then at most one more wait for the app (and a load)
    assert 3.0 <= time.perf_counter() - started < 3.0 + 2.0 + 3.0


async def test_a_page_whose_app_runs_is_not_loaded_again_when_its_load_comes_late(
    site: str, page: Any
) -> None:
    # the load event does not come within the navigation's 1.5 s, well inside
    # open_app's 6 s: before, open_app loaded the page again (and again) and failed at
    # its deadline; now it sees the app running and keeps that page
    page.set_default_navigation_timeout(1500)
    await open_app(page, site + "/at-once", timeout_s=6.0)
    assert await page.evaluate("window.pressrun !== undefined")
    assert await page.evaluate("localStorage.loads") == "1"
