"""Page thumbnails and two-page spreads, on a phone and on a tablet (touch), in Debian's
headless Chromium.

Thumbnails: "Pages" opens a strip of every page of the issue, each drawn by pdf.js as
it scrolls in; a tap on one turns to that page. Spreads: a tablet held in landscape
shows the cover alone, then pages 2-3, 4-5 side by side, drawn into one canvas at the
zoom (so a zoomed spread is sharp too); turned to portrait it shows one page.
"""

from __future__ import annotations

from typing import Any

import pytest

from pressrun.reader.browser import TABLET

from .conftest import ISSUE, Phone, StackFactory, bounded, browser_only
from .test_reading import touch

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

#: the profiles' devicePixelRatio (pressrun.reader.browser.PHONE and TABLET)
RATIO = 2
#: viewer.js's MAX_CANVAS_PIXELS
MAX_CANVAS_PIXELS = 2**25
#: the sample issue's pages (tests/reader/conftest.py, sample_pdf)
PAGES = 5


async def reading(
    make_stack: StackFactory, phone_factory: Any, profile: dict[str, Any] | None = None
) -> tuple[Phone, Any]:
    """A phone (or tablet) with the sample issue downloaded and open at its start."""
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url, profile)
    page = await phone.open()
    await stack.publish(None)
    await phone.check_for_issues()
    await phone.wait_for_download()
    await page.locator(f"li[data-issue='{ISSUE}'] button.open").tap()
    await page.wait_for_selector("#page[data-page='1'][data-zoom='1']")
    return phone, page


async def shown(page: Any) -> dict[str, Any]:
    """The shown canvas: its pages, its pixels and CSS width, its zoom."""
    doc: dict[str, Any] = await page.locator("#page").evaluate(
        "c => ({pages: c.dataset.pages, width: c.width, height: c.height,"
        " cssWidth: c.getBoundingClientRect().width, zoom: Number(c.dataset.zoom)})"
    )
    return doc


async def test_thumbnails_show_every_page_and_a_tap_turns_to_it(
    make_stack: StackFactory, phone_factory: Any
) -> None:
    phone, page = await reading(make_stack, phone_factory)
    strip = page.locator("#thumbnails")
    assert await strip.is_hidden()
    await page.locator("#pages-button").tap()
    await strip.wait_for(state="visible")
    assert await page.locator("#pages-button").get_attribute("aria-expanded") == "true"
    buttons = strip.locator("button.thumbnail")
    assert await buttons.count() == PAGES
    assert await buttons.nth(0).get_attribute("aria-current") == "page"
    # the pages in view are drawn (a picture with the page's shape), the strip scrolls
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#thumbnails img')].slice(0, 3)"
        ".every(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > i.naturalWidth)"
    )
    await phone.screenshot("thumbnails")
    await buttons.nth(3).scroll_into_view_if_needed()
    await buttons.nth(3).tap()
    await page.wait_for_selector("#page[data-pages='4']")
    assert await strip.is_hidden()
    assert await page.locator("#page-number").inner_text() == f"4 / {PAGES}"
    # the strip marks the page being read next time
    await page.locator("#pages-button").tap()
    assert await buttons.nth(3).get_attribute("aria-current") == "page"
    # a tap on the page closes the strip without turning
    box = await page.locator("#page-surface").bounding_box()
    await page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    await strip.wait_for(state="hidden")
    assert (await shown(page))["pages"] == "4"
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console


async def test_a_tablet_in_landscape_shows_spreads_zooms_them_and_portrait_one_page(
    make_stack: StackFactory, phone_factory: Any
) -> None:
    phone, page = await reading(make_stack, phone_factory, TABLET)
    # the pure rules, as the page has them
    rules = await phone.evaluate(
        """async () => {
            const p = await import('./js/pages.js');
            return {
                tablet: p.showsSpreads(1180, 760), phoneLandscape: p.showsSpreads(844, 340),
                portrait: p.showsSpreads(820, 1120),
                spreads: [1, 2, 3, 4, 5].map((n) => p.shownPages(n, 5, true)),
                even: p.shownPages(6, 6, true), next: [1, 2, 4].map((n) => p.nextPage(n, 5, true)),
                previous: [1, 2, 5].map((n) => p.previousPage(n, 5, true)),
            };
        }""",
        what="pages.js's rules",
    )
    assert rules == {
        "tablet": True,
        "phoneLandscape": False,
        "portrait": False,
        "spreads": [[1], [2, 3], [2, 3], [4, 5], [4, 5]],
        "even": [6],
        "next": [2, 4, 6],
        "previous": [0, 1, 2],
    }
    # the cover alone, then 2-3 side by side: one canvas twice a page's width
    cover = await shown(page)
    assert cover["pages"] == "1"
    await page.locator("#next-page").tap()
    await page.wait_for_selector("#page[data-pages='2-3']")
    spread = await shown(page)
    assert abs(spread["cssWidth"] - 2 * cover["cssWidth"]) <= 2, (cover, spread)
    assert abs(spread["width"] - spread["cssWidth"] * RATIO) <= 4, spread
    assert await page.locator("#page-number").inner_text() == f"2–3 / {PAGES}"
    await phone.screenshot("tablet-spread")
    # a swipe to the left turns the spread
    box = await page.locator("#page-surface").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    cdp = await bounded("a CDP session", phone.context.new_cdp_session(page))
    for kind, x in (("touchStart", cx + 150), ("touchMove", cx), ("touchMove", cx - 150)):
        await touch(cdp, kind, [(x, cy)])
    await touch(cdp, "touchEnd", [])
    await page.wait_for_selector("#page[data-pages='4-5']")
    await page.locator("#previous-page").tap()
    await page.wait_for_selector("#page[data-pages='2-3']")
    # double tap twice: the spread at 4x, drawn again at 4x (its pixels follow the zoom)
    for zoom in (2, 4):
        await page.touchscreen.tap(cx, cy)
        await page.touchscreen.tap(cx, cy)
        await page.wait_for_selector(f"#page[data-zoom='{zoom}']")
    at4 = await shown(page)
    assert at4["pages"] == "2-3"
    assert abs(at4["cssWidth"] - spread["cssWidth"] * 4) <= 8, at4
    # 4x a spread at a pixel ratio of 2 is past pdf.js's cap (2^25 canvas pixels, shared
    # by the two pages): drawn at the most pixels the cap allows, never stretched
    wanted = spread["width"] * 4 * spread["height"] * 4
    width = spread["width"] * 4 * min(1.0, (MAX_CANVAS_PIXELS / wanted) ** 0.5)
    assert abs(at4["width"] - width) <= 0.02 * width, (at4, width)
    assert at4["width"] * at4["height"] <= MAX_CANVAS_PIXELS * 1.01
    timing = await phone.evaluate("window.pressrun.lastRender", what="the 4x render")
    size = f"{timing['width']}x{timing['height']}"
    print(f"spread 2-3 drawn at 4x: {size} px in {timing['ms']:.0f} ms")
    await page.touchscreen.tap(cx, cy)
    await page.touchscreen.tap(cx, cy)
    await page.wait_for_selector("#page[data-zoom='1']")
    # a pinch, two fingers 50 px apart moved to 200 px apart: the spread at 4x again
    await touch(cdp, "touchStart", [(cx - 25, cy), (cx + 25, cy)])
    for step in range(1, 7):
        spread_px = 25 + 12.5 * step
        await touch(cdp, "touchMove", [(cx - spread_px, cy), (cx + spread_px, cy)])
    await touch(cdp, "touchEnd", [])
    await page.wait_for_selector("#page[data-zoom='4']")
    assert (await shown(page))["pages"] == "2-3"
    await page.touchscreen.tap(cx, cy)
    await page.touchscreen.tap(cx, cy)
    await page.wait_for_selector("#page[data-zoom='1']")
    # turned to portrait: one page, the left one of the spread
    await page.set_viewport_size({"width": 820, "height": 1180})
    await page.wait_for_selector("#page[data-pages='2']")
    one = await shown(page)
    assert one["cssWidth"] <= 820
    assert await page.locator("#page-number").inner_text() == f"2 / {PAGES}"
    await page.locator("#next-page").tap()
    await page.wait_for_selector("#page[data-pages='3']")
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console
