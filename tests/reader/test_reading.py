"""Reading an issue as a reader does, on a phone in Debian's headless Chromium.

Messages: what the reader is shown says what happened in their words, with the
operator's detail one tap away (a <details>); notices replace each other per issue
and can be dismissed; a non-subscriber is told once how to subscribe and offered no
download; a subscription service that refuses the reader's web origin (CORS) is named
as such, not as unreachable.

Zoom: double tap and pinch (touch events through CDP, as a phone's touchscreen sends
them) zoom the page up to 4x and more, and the page is drawn again at the zoom: the
canvas holds devicePixelRatio x zoom device pixels per CSS pixel, so text is sharp
rather than a stretched picture; a zoomed page pans.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import nacl.public
import pytest

from pressrun.clients.config import DESKTOP

from .conftest import ISSUE, PIECE, TOKEN, Phone, Stack, StackFactory, bounded, browser_only

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


async def test_chrome_hides_on_a_tap_position_kept_per_issue_offline_shown(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    phone, page = await reading(make_stack, phone_factory)
    box = await page.locator("#page-surface").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    # a tap in the page's middle hides the toolbars (the page gets the whole screen)
    await page.touchscreen.tap(cx, cy)
    await page.locator("#back").wait_for(state="hidden")
    assert (await canvas(page))["page"] == 1
    await phone.screenshot("reading-immersive")
    await page.touchscreen.tap(cx, cy)  # and the next brings them back
    await page.locator("#back").wait_for(state="visible")
    # a tap on the right third turns the page; the issue reopens where it was left
    await page.touchscreen.tap(box["x"] + box["width"] * 0.9, cy)
    await page.wait_for_selector("#page[data-page='2']")
    await page.locator("#back").tap()
    await page.locator(f"li[data-issue='{ISSUE}'] button.open").tap()
    await page.wait_for_function("() => window.pressrun.openTimesMs.length === 2")
    assert (await canvas(page))["page"] == 2
    assert await page.locator("#page-number").inner_text() == "2 / 5"

    # offline, the library says so (and that stored issues still open)
    await page.locator("#back").tap()
    assert await page.locator("#offline").is_hidden()
    await phone.context.set_offline(True)
    await page.locator("#offline").wait_for(state="visible")
    assert "still open" in await page.locator("#offline").inner_text()
    await phone.context.set_offline(False)
    await page.locator("#offline").wait_for(state="hidden")
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console


async def shown(page: Any) -> list[dict[str, str]]:
    """The notices on screen: their line, their kind and their details."""
    found: list[dict[str, str]] = await page.locator("#notices .notice").evaluate_all(
        "ns => ns.map(n => ({text: n.querySelector('.text').textContent, kind: n.className,"
        " detail: n.querySelector('details')?.textContent ?? ''}))"
    )
    return found


async def add_subscriber(stack: Stack, key: str) -> None:
    """The publisher adds this public key (hex) as a subscriber."""
    import aiohttp

    from pressrun.subscriptions.client import SubscriptionsClient

    async with aiohttp.ClientSession() as http:
        client = SubscriptionsClient(stack.subscriptions_url, http, operator_token=TOKEN)
        await client.add_subscriber(bytes.fromhex(key), "late")


async def error_of(phone: Phone) -> str:
    """The app's error for the issue (the operator's words), once there is one."""
    await phone.page.wait_for_function(f"() => window.pressrun.errors[{ISSUE!r}]", timeout=30_000)
    error: str = await phone.evaluate(f"window.pressrun.errors[{ISSUE!r}]", what="the error")
    return error


async def test_a_non_subscriber_is_told_once_how_to_subscribe_and_offered_no_download(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    someone = nacl.public.PrivateKey.generate().public_key.encode().hex()
    await stack.publish([someone])  # encrypted, for somebody else
    await phone.check_for_issues()
    error = await error_of(phone)
    assert error.startswith("You are not subscribed"), error
    notices = await shown(page)
    # one notice, in a reader's words, saying what to do; the service's answer in Details
    assert len(notices) == 1, notices
    assert "subscribe" in notices[0]["kind"]
    assert "is for subscribers" in notices[0]["text"]
    assert "send your reader key" in notices[0]["text"]
    assert "subscription service" not in notices[0]["text"]
    assert error in notices[0]["detail"]
    # no Download that can only fail
    item = page.locator(f"li[data-issue='{ISSUE}']")
    await item.locator(".meta", has_text="For subscribers").wait_for()
    assert await item.locator("button").count() == 0
    await phone.screenshot("not-subscribed-notice")
    # told once: the next check says nothing new, and nothing is downloaded
    await phone.evaluate("window.pressrun.checkForIssues()", what="a second check")
    assert len(await shown(page)) == 1
    await page.locator("#notices .notice button.dismiss").tap()
    assert await shown(page) == []
    page = await phone.open()  # opened again: not told again, still no Download
    await page.locator(f"li[data-issue='{ISSUE}'] .meta", has_text="For subscribers").wait_for()
    assert await shown(page) == []

    # the publisher adds this reader: the next check finds it subscribed, Download is back
    await add_subscriber(stack, await phone.subscriber_key())
    await phone.check_for_issues()
    notices = await shown(page)
    assert [n["text"] for n in notices] == ["You are a subscriber now: new issues download here."]
    await phone.evaluate(f"delete window.pressrun.errors[{ISSUE!r}]", what="forget the error")
    await page.locator(f"li[data-issue='{ISSUE}'] button.download").tap()
    # an issue out before the subscription: said so, not "no wrap of ... version 1"
    error = await error_of(phone)
    notices = await shown(page)
    assert "came out before your subscription started" in notices[0]["text"], notices
    assert "wrap" not in notices[0]["text"] and error in notices[0]["detail"]
    assert len(notices) == 2
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console


async def test_a_cors_refusal_is_named_not_called_unreachable(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    from pressrun.subscriptions.aio import SubscriptionService
    from pressrun.subscriptions.store import SubscriptionStore

    stack = await make_stack(origins=("origin-a",))
    # a subscription service whose --cors-origin is some other site than the reader's
    subs = SubscriptionService(
        SubscriptionStore(stack.root / "strict.db"),
        operator_token=TOKEN,
        cors_origins=("https://reader.example",),
    )
    stack.subscriptions_url = f"http://127.0.0.1:{await subs.start('127.0.0.1', 0)}"
    stack.stop.append(subs.close)
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await stack.publish([await phone.subscriber_key()])
    await phone.check_for_issues()
    error = await error_of(phone)
    reader = stack.reader_url.rstrip("/")
    assert f"refused this reader's web address {reader} (CORS)" in error, error
    assert "unreachable" not in error
    notices = await shown(page)
    assert len(notices) == 1, notices  # "New issue out" was replaced, not piled under
    assert "does not accept this reader's web address" in notices[0]["text"]
    assert "Tell your publisher" in notices[0]["text"]
    assert error in notices[0]["detail"]


async def test_download_notes_go_to_the_issues_details_not_to_the_notices(
    make_stack: StackFactory,
    phone_factory: Any,
) -> None:
    # origin-b serves a copy with a byte of every piece flipped: the download goes on
    # from origin-a, and the reader hears only that the issue is ready
    stack = await make_stack(download=replace(DESKTOP, section_bytes=4 * PIECE))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await stack.publish(None)
    copy = stack.origin_copy("origin-b")
    data = bytearray(copy.read_bytes())
    for offset in range(100, len(data), PIECE):
        data[offset] ^= 0xFF
    copy.write_bytes(bytes(data))
    await phone.check_for_issues()
    result = await phone.wait_for_download()
    assert result["failures"] >= 1
    notices = await shown(page)
    assert [n["text"] for n in notices] == [f"Sample issue {ISSUE} is ready to read (1.5 MB)."], (
        notices
    )
    # the operator's notes are one tap away under the issue, and in the app's log
    assert any("origin-b failed" in text for text in await phone.notices())
    notes = page.locator(f"li[data-issue='{ISSUE}'] details.notes")
    assert "origin origin-b failed" in (await notes.text_content() or "")
