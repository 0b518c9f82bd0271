"""One subscription on several devices, in Debian's headless Chromium (two phones).

A subscribed phone shows a code (Settings, "Link another device"); a second phone
enters it and reads the same encrypted issue with the same subscriber key. What went
through the reader service was a mailbox name and a ciphertext: neither the secret
key nor the code. A code works once. A key made by ``pressrun keys new --subscriber``
(its reader.key file) is imported from Settings and opens an issue encrypted for it.
The mailboxes' rules (one take, expiry, the bound) are tested with explicit times.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pressrun.content.keys import generate_keypair
from pressrun.reader.link import LinkError, LinkMailboxes

from .conftest import ISSUE, Phone, StackFactory, browser_only

NAME = "0123456789abcdef0123456789abcdef"


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


@browser_only
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_a_second_phone_linked_by_a_code_reads_the_same_encrypted_issue(
    make_stack: StackFactory, phone_factory: Any
) -> None:
    stack = await make_stack(origins=("origin-a",))
    first: Phone = await phone_factory(stack.reader_url)
    await first.open()
    key = await first.subscriber_key()
    secret = await first.evaluate(
        "import('./js/subscription.js').then(async (m) => {"
        " const k = await m.subscriberKeys();"
        " return Array.from(k.secretKey, (b) => b.toString(16).padStart(2, '0')).join(''); })",
        what="the first phone's secret key",
    )
    sent: list[str] = []
    first.page.on(
        "request", lambda r: sent.append(r.post_data or "") if r.method == "PUT" else None
    )
    page = await settings(first)
    await page.locator("#link-offer").tap()
    await page.locator("#link-offered").wait_for(state="visible")
    shown = await page.locator("#link-code").inner_text()
    assert len(shown) == 14 and shown.count("-") == 2, shown
    await first.screenshot("link-code")
    # the reader service got a sealed box: not the secret key, not the code
    assert len(sent) == 1
    box = json.loads(sent[0])
    assert set(box) == {"nonce", "sealed"}
    assert secret not in sent[0] and shown.replace("-", "") not in sent[0]

    second: Phone = await phone_factory(stack.reader_url)
    await second.open()
    assert await second.subscriber_key() != key
    page2 = await settings(second)
    await page2.locator("#link-input").fill(shown.lower().replace("-", " "))  # typed loosely
    await page2.locator("#link-accept").tap()
    await page2.wait_for_function("() => window.pressrun.linked")
    assert await second.subscriber_key() == key
    assert "now uses your subscription" in await page2.locator("#link-status").inner_text()
    await second.screenshot("linked")

    await stack.publish([key])  # encrypted for the subscriber: one key, two phones
    await second.check_for_issues()
    await second.wait_for_download()
    assert await second.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
    await page2.locator(f"li[data-issue='{ISSUE}'] button.open").tap()
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
    assert await third.subscriber_key() != key
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
