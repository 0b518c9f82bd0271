"""Reading an issue as a reader does, on a phone in Debian's headless Chromium.

Zoom: double tap and pinch (touch events through CDP, as a phone's touchscreen sends
them) zoom the page up to 4x and more, and the page is drawn again at the zoom: the
canvas holds devicePixelRatio x zoom device pixels per CSS pixel, so text is sharp
rather than a stretched picture; a zoomed page pans.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import ISSUE, Phone, StackFactory, bounded, browser_only

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

#: the phone profile's devicePixelRatio (pressrun.reader.browser.PHONE)
RATIO = 2


async def reading(make_stack: StackFactory, phone_factory: Any) -> tuple[Phone, Any]:
    """A phone with the sample issue (plain, one origin) downloaded and open at page 1."""
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await stack.publish(None)
    await phone.check_for_issues()
    await phone.wait_for_download()
    await page.locator(f"li[data-issue='{ISSUE}'] button.open").tap()
    await page.wait_for_selector("#page[data-page='1'][data-zoom='1']")
    return phone, page


async def canvas(page: Any) -> dict[str, float]:
    """The shown page's canvas: its pixels, its CSS size, its zoom."""
    doc: dict[str, float] = await page.locator("#page").evaluate(
        "c => ({width: c.width, height: c.height, cssWidth: c.getBoundingClientRect().width,"
        " zoom: Number(c.dataset.zoom), page: Number(c.dataset.page)})"
    )
    return doc


#: the surface's scroll position once it has stopped moving (a fling ends)
SETTLED = """async (s) => {
    let last = null;
    for (;;) {
        await new Promise((r) => setTimeout(r, 50));
        const now = [s.scrollLeft, s.scrollTop];
        if (last && now[0] === last[0] && now[1] === last[1]) return now;
        last = now;
    }
}"""


async def touch(cdp: Any, kind: str, points: list[tuple[float, float]]) -> None:
    """One touch event as the touchscreen sends it (touchStart, touchMove, touchEnd)."""
    await bounded(
        f"CDP's {kind}",
        cdp.send(
            "Input.dispatchTouchEvent",
            {
                "type": kind,
                "touchPoints": [{"x": x, "y": y, "id": n} for n, (x, y) in enumerate(points)],
            },
        ),
    )


async def test_double_tap_and_pinch_zoom_to_4x_drawn_sharp_and_pan(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    phone, page = await reading(make_stack, phone_factory)
    at1 = await canvas(page)
    # at zoom 1 the page is drawn at the screen's pixel ratio, and fits the screen
    assert abs(at1["width"] - at1["cssWidth"] * RATIO) <= 2, at1
    assert at1["cssWidth"] <= 390

    box = await page.locator("#page-surface").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    # double tap: 2x, double tap again: 4x, drawn again at 4x (not stretched)
    for zoom in (2, 4):
        await page.touchscreen.tap(cx, cy)
        await page.touchscreen.tap(cx, cy)
        await page.wait_for_selector(f"#page[data-zoom='{zoom}']")
        now = await canvas(page)
        assert abs(now["cssWidth"] - at1["cssWidth"] * zoom) <= 2, now
        assert abs(now["width"] - at1["cssWidth"] * zoom * RATIO) <= 2 * zoom, now
        assert now["page"] == 1  # zooming does not turn the page
    await phone.screenshot("zoom-4x")
    timing = await phone.evaluate("window.pressrun.lastRender", what="the 4x render's time")
    assert timing["zoom"] == 4
    print(f"page 1 drawn at 4x: {timing['width']}x{timing['height']} px in {timing['ms']:.0f} ms")

    # the zoomed page pans: the surface scrolls under one finger
    surface = page.locator("#page-surface")
    before = await surface.evaluate(
        "s => [s.scrollLeft, s.scrollTop, s.scrollWidth > s.clientWidth]"
    )
    assert before[2], "a page at 4x is wider than the screen"
    cdp = await bounded("a CDP session", phone.context.new_cdp_session(page))
    await touch(cdp, "touchStart", [(cx, cy)])
    for step in range(1, 11):
        await touch(cdp, "touchMove", [(cx - 15 * step, cy - 15 * step)])
    await touch(cdp, "touchEnd", [])
    # (a tap during the fling that follows would only stop it, as on a phone)
    after = await surface.evaluate(SETTLED)
    assert after[0] > before[0] and after[1] > before[1], (before, after)
    assert (await canvas(page))["page"] == 1  # a pan at 4x does not turn the page

    # a third double tap: back to the whole page
    await page.touchscreen.tap(cx, cy)
    await page.touchscreen.tap(cx, cy)
    await page.wait_for_selector("#page[data-zoom='1']")

    # pinch: two fingers 40 px apart move to 160 px apart: 4x, drawn at 4x
    await touch(cdp, "touchStart", [(cx - 20, cy), (cx + 20, cy)])
    for step in range(1, 7):
        spread = 20 + 10 * step
        await touch(cdp, "touchMove", [(cx - spread, cy), (cx + spread, cy)])
    await touch(cdp, "touchEnd", [])
    await page.wait_for_selector("#page[data-zoom='4']")
    now = await canvas(page)
    assert abs(now["width"] - at1["cssWidth"] * 4 * RATIO) <= 8, now
    assert now["page"] == 1
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console
