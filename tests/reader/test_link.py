"""One subscription on several devices, in Debian's headless Chromium (two phones).

A subscribed phone shows a code (Settings, "Link another device"); a second phone
enters it, registers its OWN key under the subscriber (a link grant from the
subscription service, sealed in the box) and reads the next encrypted issue by its
own wrap. What went through the reader service was a mailbox name and a ciphertext:
no secret key, no code. A code works once; past the publisher's limit on devices the
subscribed phone is told so in a reader's words. A key made by ``pressrun keys new --subscriber``
(its reader.key file) is imported from Settings and opens an issue encrypted for it.
The mailboxes' rules (one take, expiry, the bound) are tested with explicit times.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pressrun.content.keys import generate_keypair
from pressrun.reader.link import LinkError, LinkMailboxes

from .conftest import PIECE, TOKEN, Phone, Stack, StackFactory, browser_only

NAME = "0123456789abcdef0123456789abcdef"
SECOND = "weekly-2026-48"


def test_a_box_is_taken_once_and_forgotten_when_stale() -> None:
    boxes = LinkMailboxes(ttl_s=600.0, max_boxes=3)
    assert boxes.put(NAME, b"sealed", now=10.0) == 610.0
    assert boxes.take(NAME, now=20.0) == b"sealed"
    assert boxes.take(NAME, now=21.0) is None  # once
    boxes.put(NAME, b"sealed", now=30.0)
    assert boxes.take(NAME, now=630.0) is None  # expired
    assert len(boxes) == 0


def test_the_mailboxes_are_bounded_and_refuse_bad_names_and_boxes() -> None:
    boxes = LinkMailboxes(ttl_s=600.0, max_boxes=3)
    names = [f"{n:032x}" for n in range(5)]
    for n, name in enumerate(names):
        boxes.put(name, b"x", now=float(n))
    assert len(boxes) == 3 and boxes.evicted == 2
    assert boxes.take(names[0], now=5.0) is None  # the oldest made room
    assert boxes.take(names[4], now=5.0) == b"x"
    for bad in ("", "ABCDEF0123456789abcdef0123456789", "0" * 31, "../" + "0" * 29):
        with pytest.raises(LinkError):
            boxes.put(bad, b"x", now=6.0)
    with pytest.raises(LinkError):
        boxes.put(NAME, b"", now=6.0)
    with pytest.raises(LinkError):
        boxes.put(NAME, b"x" * 2049, now=6.0)


@browser_only
async def test_the_reader_service_keeps_a_box_once_and_refuses_bad_ones() -> None:
    import aiohttp

    from pressrun.clients.config import DESKTOP
    from pressrun.reader.aio import start_reader
    from pressrun.reader.config import ReaderConfig

    reader = await start_reader(
        ReaderConfig(
            balancer_url="http://127.0.0.1:9/", publisher_keys=("ab" * 32,), download=DESKTOP
        )
    )
    url = f"{reader.url}/v1/link/{NAME}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.put(url, data=b'{"nonce": "00", "sealed": "11"}') as resp:
                assert resp.status == 201
                assert (await resp.json())["expires_in_s"] == 600
            async with http.get(url) as resp:
                assert resp.status == 200
                assert resp.headers["Cache-Control"] == "no-store"
                assert await resp.read() == b'{"nonce": "00", "sealed": "11"}'
            async with http.get(url) as resp:
                assert resp.status == 404  # taken once
                assert "taken already" in await resp.text()
            async with http.put(f"{reader.url}/v1/link/XYZ", data=b"x") as resp:
                assert resp.status == 400
            async with http.put(url, data=b"x" * 4096) as resp:
                assert resp.status == 413
            async with http.get(f"{reader.url}/v1/link/{'0' * 31}") as resp:
                assert resp.status == 400
    finally:
        await reader.stop()


async def settings(phone: Phone) -> Any:
    page = phone.page
    if await page.locator("#settings-view").is_hidden():
        await page.locator("#settings-button").tap()
    return page


async def publish_second(stack: Stack) -> None:
    """A second encrypted issue, SECOND, wrapped to every device the subscription
    service lists now (what ``pressrun publish --encrypt`` does)."""
    import aiohttp

    from pressrun.subscriptions.client import HttpSubscriberDirectory

    await stack.bed.publish(
        stack.data,
        issue_id=SECOND,
        key_path=stack.root / "publisher.key",
        piece_size=PIECE,
        encrypt_for=HttpSubscriberDirectory(stack.subscriptions_url, TOKEN),
    )
    assert stack.bed.balancer is not None
    url = f"{stack.bed.balancer.url}/v1/issues/{SECOND}/directive"
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            async with http.get(url) as resp:
                if resp.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the balancer never directed to {SECOND}")


@browser_only
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_a_second_phone_linked_by_a_code_reads_by_its_own_key_up_to_the_limit(
    make_stack: StackFactory, phone_factory: Any
) -> None:
    stack = await make_stack(origins=("origin-a",), max_devices=2)
    first: Phone = await phone_factory(stack.reader_url)
    await first.open()
    key = await first.subscriber_key()
    secret = await first.evaluate(
        "import('./js/subscription.js').then(async (m) => {"
        " const k = await m.subscriberKeys();"
        " return Array.from(k.secretKey, (b) => b.toString(16).padStart(2, '0')).join(''); })",
        what="the first phone's secret key",
    )
    # the first phone reads a subscriber issue (and so knows the subscription service)
    await stack.publish([key])
    await first.check_for_issues()
    await first.wait_for_download()
    sent: list[str] = []
    first.page.on(
        "request", lambda r: sent.append(r.post_data or "") if r.method != "GET" else None
    )
    page = await settings(first)
    await page.locator("#link-offer").tap()
    await page.locator("#link-offered").wait_for(state="visible")
    shown = await page.locator("#link-code").inner_text()
    assert len(shown) == 14 and shown.count("-") == 2, shown
    await first.screenshot("link-code")
    # the reader service got a sealed box; no request carried the secret key or the code
    boxes = [json.loads(body) for body in sent if body.startswith('{"nonce"')]
    assert len(boxes) == 1 and set(boxes[0]) == {"nonce", "sealed"}
    assert not [body for body in sent if secret in body or shown.replace("-", "") in body]

    second: Phone = await phone_factory(stack.reader_url)
    await second.open()
    own = await second.subscriber_key()
    assert own != key
    page2 = await settings(second)
    await page2.locator("#link-input").fill(shown.lower().replace("-", " "))  # typed loosely
    await page2.locator("#link-accept").tap()
    await page2.wait_for_function("() => window.pressrun.linked")
    assert await second.subscriber_key() == own  # its own key, now one of the subscriber's
    assert "now uses your subscription" in await page2.locator("#link-status").inner_text()
    await second.screenshot("linked")

    # an issue published after the link is wrapped to both devices: the second phone
    # downloads and opens it with its own wrap
    await publish_second(stack)
    await second.check_for_issues()
    await second.wait_for_download(SECOND)
    assert await second.stored_sha256(SECOND) == hashlib.sha256(stack.data).hexdigest()
    await page2.locator(f"li[data-issue='{SECOND}'] button.open").tap()
    await page2.wait_for_selector("#page[data-page='1']")

    # the code worked once: a third phone, opened from a shared link (the code in the
    # #fragment, filled in and gone from the address), is told so in a reader's words
    code = shown.replace("-", "")
    third: Phone = await phone_factory(f"{stack.reader_url}/#link={code}")
    page3 = await third.open()
    assert await page3.locator("#settings-view").is_visible()
    assert await page3.locator("#link-input").input_value() == code
    assert "#link" not in page3.url
    await page3.locator("#link-accept").tap()
    await page3.wait_for_function("() => window.pressrun.linkError")
    said = await page3.locator("#link-status").inner_text()
    assert "used already" in said and "Make a new one" in said, said

    # the publisher's limit (2 devices): a new code is refused, in a reader's words
    await first.evaluate("window.pressrun.linkError = null", what="reset the link error")
    await page.locator("#link-offer").tap()
    await page.wait_for_function("() => window.pressrun.linkError")
    said = await page.locator("#link-status").inner_text()
    assert "already has 2 devices, the most your publisher allows" in said, said
    assert "HTTP" not in said and "device_limit" not in said  # the detail is a tap away
    await page.locator("#link-status").scroll_into_view_if_needed()
    await first.screenshot("link-limit")
    for phone in (first, second, third):
        assert not [line for line in phone.console if line.startswith("pageerror")], phone.console


@browser_only
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_a_key_from_pressrun_keys_new_is_imported_and_opens_an_issue(
    make_stack: StackFactory, phone_factory: Any, tmp_path: Path
) -> None:
    secret_path, public_path = generate_keypair(tmp_path / "reader.key", subscriber=True)
    public = public_path.read_text().strip()
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    page = await settings(phone)
    # the .pub file first: refused, saying which file to choose
    await page.locator("#key-file").set_input_files(str(public_path))
    await page.wait_for_function("() => window.pressrun.linkError")
    assert await phone.subscriber_key() != public
    await page.locator("#key-file").set_input_files(str(secret_path))
    await page.wait_for_function("() => window.pressrun.linked")
    assert await phone.subscriber_key() == public
    assert await page.locator("#subscriber-key").inner_text() == public
    await stack.publish([public])
    await phone.check_for_issues()
    await phone.wait_for_download()
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
