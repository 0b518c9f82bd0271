"""The web reader in a real headless Chromium at phone size, against real services.

Each test starts origins, the balancer and the reader service on 127.0.0.1 and a
fresh Chromium profile; the app downloads through the balancer with Range requests,
checks the signed manifest and every piece, stores the issue in the origin private
file system and shows it with pdf.js.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from pressrun.clients.config import DESKTOP, MOBILE

from .conftest import ISSUE, PIECE, Phone, Stack, StackFactory, bounded, browser_only

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def subscribe_and_publish(stack: Stack, phone: Phone) -> None:
    """The reader's key becomes a subscriber's, the issue is published encrypted for
    it, and the app looks for new issues (as on open or a periodic sync)."""
    await stack.publish([await phone.subscriber_key()])
    await phone.check_for_issues()


async def test_subscriber_downloads_reads_and_reads_offline(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await subscribe_and_publish(stack, phone)
    # the check finds the new issue and downloads it (auto-download is on)
    result = await phone.wait_for_download()
    assert result["encrypted"]
    assert result["size_bytes"] == len(stack.data)
    assert result["resumed_pieces"] == 0
    assert sum(result["bytes_by_origin"].values()) == result["transfer_bytes"]
    assert result["transfer_bytes"] == stack.origin_copy("origin-a").stat().st_size
    # what the browser stored is the decrypted issue, byte for byte
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
    assert f"New issue out: {ISSUE}" in await phone.notices()
    # the secret key stays in the browser: only the public key is in the service
    secret = await phone.evaluate(
        "(async () => { const db = await import('./js/db.js');"
        " const k = await db.getRecord('keys', 'subscriber');"
        " return Array.from(k.secretKey, b => b.toString(16).padStart(2, '0')).join(''); })()",
        what="the stored secret key",
    )
    assert secret.encode() not in (stack.root / "subs.db").read_bytes()

    # the library shows it with its cover (page 1 rendered) and its size
    item = page.locator(f"li[data-issue='{ISSUE}']")
    await item.locator("img.cover").wait_for()
    assert await item.locator("img.cover").evaluate("img => img.naturalWidth > 0")
    assert "1.5 MB" in await item.locator(".meta").inner_text()
    assert "used" in await page.locator("#storage").inner_text()
    await phone.screenshot("library")

    # tap Read: page 1 is drawn
    await item.locator("button.open").tap()
    await page.wait_for_selector("#page[data-page='1']")
    assert await page.locator("#page-number").inner_text() == "1 / 5"
    await phone.screenshot("reading")
    await page.locator("#next-page").tap()
    await page.wait_for_selector("#page[data-page='2']")

    # offline: the service worker serves the app, OPFS the issue
    await phone.evaluate("navigator.serviceWorker.ready", what="the service worker's start")
    await phone.context.set_offline(True)
    await phone.reload(what="the app's start offline")
    await page.locator(f"li[data-issue='{ISSUE}'] button.open").tap()
    await page.wait_for_selector("#page[data-page='2']")  # where it was left
    await phone.screenshot("reading-offline")
    # back online: Chromium finds nothing against installing the app (manifest, icons,
    # service worker) but that a test context is off the record (never installable)
    await phone.context.set_offline(False)
    cdp = await bounded("a CDP session", phone.context.new_cdp_session(page))
    installability = await bounded("CDP's installability", cdp.send("Page.getInstallabilityErrors"))
    errors = [e["errorId"] for e in installability["installabilityErrors"]]
    assert set(errors) <= {"in-incognito"}, installability
    # delete: two taps, and the issue's storage is freed
    await page.locator("#back").tap()
    delete = page.locator(f"li[data-issue='{ISSUE}'] button.delete")
    await delete.tap()
    await delete.tap()
    await page.locator(f"li[data-issue='{ISSUE}'] button.open").wait_for(state="detached")
    assert await phone.stored_pieces() == 0
    assert not [line for line in phone.console if line.startswith("pageerror")], phone.console


async def test_interrupted_download_resumes_without_refetching(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # 4 Mbit/s origins: the 1.5 MB issue takes about 3 s, in sections of 8 pieces
    stack = await make_stack(egress_cap_mbps=4.0, download=replace(MOBILE, section_bytes=8 * PIECE))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await subscribe_and_publish(stack, phone)
    async with asyncio.timeout(30):
        while await phone.stored_pieces() < 8:
            await asyncio.sleep(0.05)
    await page.close()  # the phone closes the app half way

    page = await phone.open()  # opened again: the unfinished download goes on
    result = await phone.wait_for_download()
    resumed = set(result["resumed"])
    assert len(resumed) >= 8
    assert len(resumed) < -(-len(stack.data) // PIECE)
    for header in result["ranges"]:
        first, last = (int(x) for x in header.removeprefix("bytes=").split("-"))
        asked = set(range(first // PIECE, last // PIECE + 1))
        assert not asked & resumed, f"{header} asks again for stored pieces {asked & resumed}"
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
    assert any("resuming" in text for text in await phone.notices())


async def test_runs_are_written_by_the_store_worker_and_read_back_whole(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    """store.js writes runs in its worker (sync access handles: the window's
    createWritable() was most of bench/reader.py's browser time, 0.37x pressrun get);
    a run whose chunks are given up moves them (no copy on the page's thread), and
    what is read back is every byte, in order, with no temporary file left."""
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    outcome = await phone.evaluate(
        """async () => {
            const store = await import('./js/store.js');
            const piece = (i) => Uint8Array.from({ length: 1000 }, (_, k) => (i * 7 + k) % 251);
            // the first run is copied (the worker has not written yet), the next moved
            await store.writeRun('w-test', 0, [piece(0), piece(1)], { transfer: true });
            const moved = [piece(2), piece(3), piece(4)];
            const handle = await store.writeRun('w-test', 2, moved, { transfer: true });
            const kept = [piece(5)];
            await store.writeRun('w-test', 5, kept);
            const blob = await store.issueBlob('w-test', 6, 'application/octet-stream');
            const bytes = new Uint8Array(await blob.arrayBuffer());
            const want = new Uint8Array(6000);
            for (let i = 0; i < 6; i++) want.set(piece(i), i * 1000);
            const root = await navigator.storage.getDirectory();
            const issues = await root.getDirectoryHandle('issues');
            const dir = await issues.getDirectoryHandle('w-test');
            const names = [];
            for await (const name of dir.keys()) names.push(name);
            return {
                backend: store.writeBackend(),
                same: bytes.length === want.length && bytes.every((b, i) => b === want[i]),
                movedLength: moved[0].length,
                keptLength: kept[0].length,
                handleName: handle.name,
                // the handle reads its run (a peer's upload reads stored pieces so)
                handleBytes: (await handle.getFile()).size,
                names: names.sort(),
            };
        }""",
        what="runs written through the store worker",
    )
    assert outcome == {
        "backend": "worker",
        "same": True,
        "movedLength": 0,  # its buffer went to the worker
        "keptLength": 1000,  # not given up: copied
        "handleName": "r2_3",
        "handleBytes": 3000,
        "names": ["r0_2", "r2_3", "r5_1"],
    }


async def test_tampered_piece_is_refetched_from_another_origin(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # two sections at once, so both origins are used; origin-b's copy has one byte of
    # every piece flipped (the size is right, so only the hashes can tell)
    stack = await make_stack(download=replace(DESKTOP, section_bytes=4 * PIECE))
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    await stack.publish([await phone.subscriber_key()])
    copy = stack.origin_copy("origin-b")
    data = bytearray(copy.read_bytes())
    for offset in range(100, len(data), PIECE):
        data[offset] ^= 0xFF
    copy.write_bytes(bytes(data))
    await phone.check_for_issues()
    result = await phone.wait_for_download()
    notices = await phone.notices()
    assert any(
        "origin-b failed: piece" in text and "does not match the signed manifest" in text
        for text in notices
    ), notices
    assert result["bytes_by_origin"] == {"origin-a": result["transfer_bytes"]}
    assert result["failures"] >= 1
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()


async def refused_with_nothing_stored(phone: Phone, page: Any) -> str:
    """The app's error for the issue, once it shows one: it says nothing was saved, the
    page shows it, and nothing of the issue is stored."""
    await page.wait_for_function(f"() => window.pressrun.errors[{ISSUE!r}]", timeout=30_000)
    error: str = await phone.evaluate(f"window.pressrun.errors[{ISSUE!r}]", what="the app's error")
    assert "nothing was saved" in error
    # the notice says it in a reader's words, the error one tap away (its Details)
    assert error in await page.locator(".notice details").first.text_content()
    assert await nothing_stored(phone)
    return error


async def test_tampered_manifest_is_refused_and_nothing_stored(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await stack.publish(None)  # a plain issue
    path = stack.bed.content_of("origin-a") / ISSUE / "manifest.json"
    doc = json.loads(path.read_text())
    doc["manifest"]["title"] = "Something else"
    path.write_text(json.dumps(doc))
    await phone.check_for_issues()
    error = await refused_with_nothing_stored(phone, page)
    assert "is rejected: its signature does not match its content" in error


async def test_callers_asking_for_the_key_at_once_get_one_key_and_it_stays(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    """The settings, the app's start and a link all ask for the subscriber key; on a
    fresh device asked at once they must agree, and the key stored must be the one they
    were given (CI at 7281f11 once saw a phone's key change after it was read)."""
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    keys = await phone.evaluate(
        "Promise.all([import('./js/db.js'), import('./js/subscription.js')])"
        ".then(async ([db, m]) => {"
        " await db.deleteRecord('keys', 'subscriber');"
        " return Promise.all([1, 2, 3, 4, 5, 6].map(() => m.subscriberPublicKey())); })",
        what="six keys asked at once",
    )
    assert len(set(keys)) == 1, keys
    assert await phone.subscriber_key() == keys[0]
    await phone.reload()
    assert await phone.subscriber_key() == keys[0]


async def test_non_subscriber_gets_a_clear_error_and_no_content(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    stack = await make_stack(origins=("origin-a",))
    subscriber: Phone = await phone_factory(stack.reader_url)
    await subscriber.open()
    stranger: Phone = await phone_factory(stack.reader_url)
    page = await stranger.open()
    await stack.publish([await subscriber.subscriber_key()])  # not the stranger's key
    await stranger.check_for_issues()
    error = await refused_with_nothing_stored(stranger, page)
    assert error.startswith("You are not subscribed to Sample issue"), error
    # not one byte of the issue was asked for: the origin served only the manifest
    doc = await stack.bed.stats("origin-a")
    manifest_bytes = (stack.bed.content_of("origin-a") / ISSUE / "manifest.json").stat().st_size
    assert doc["bytes_sent_total"] == manifest_bytes
    await stranger.screenshot("not-subscribed")


async def test_a_page_that_never_answers_fails_the_test_at_once_saying_where(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    # a promise that never settles (as `window.pressrun.ready` of an app that never
    # starts): the step fails the test after its bound, naming itself and the console
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    await page.evaluate("console.log('the last thing the page said')")
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(pytest.fail.Exception) as failed:
        await phone.evaluate("new Promise(() => {})", what="a promise without an end", timeout_s=1)
    assert loop.time() - began < 10
    message = str(failed.value)
    assert message.startswith("a promise without an end: no answer in 1 s"), message
    assert "log: the last thing the page said" in message, message
    # the page is still there for the next step
    assert await phone.evaluate("1 + 1", what="a sum") == 2


async def nothing_stored(phone: Phone) -> bool:
    """True when the browser holds no piece and no library record of the issue."""
    stored = await phone.evaluate(
        """async (issue) => {
            const store = await import('./js/store.js');
            const db = await import('./js/db.js');
            return [(await store.storedPieces(issue)).size, await db.getRecord('issues', issue)];
        }""",
        ISSUE,
        what="what the browser stored",
    )
    return bool(stored == [0, None])


#: What Chrome on Android exposes as navigator.connection (NetworkInformation: a
#: `type` and a `change` event). Desktop Chromium has no `type` at all (CDP's
#: emulateNetworkConditions does not set it either), so the test stands this in.
CELLULAR_PHONE = """
(() => {
  const connection = new EventTarget();
  connection.type = "cellular";
  Object.defineProperty(Navigator.prototype, "connection", { get: () => connection });
  window.__connection = connection;
})();
"""


async def test_wifi_only_waits_on_cellular_and_goes_on_over_wifi(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.context.add_init_script(CELLULAR_PHONE)
    page = await phone.open()
    await subscribe_and_publish(stack, phone)
    item = page.locator(f"li[data-issue='{ISSUE}'] .status")
    await item.filter(has_text="Waiting for Wi-Fi").wait_for()
    await asyncio.sleep(1.0)
    # not one byte of the issue was fetched on the cellular link
    assert (await stack.bed.stats("origin-a"))["bytes_sent_total"] == 0
    assert await phone.stored_pieces() == 0
    await phone.evaluate(
        "window.__connection.type = 'wifi'; window.__connection.dispatchEvent(new Event('change'))",
        what="the switch to Wi-Fi",
    )
    result = await phone.wait_for_download()
    assert result["resumed_pieces"] == 0
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()


async def test_readers_refused_together_ask_again_spread_out(
    make_stack: StackFactory,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    """Eight downloads told Retry-After 1 s at the same moment each wait at least the
    full second and at most half again (config.json's retry_jitter, 0.5, as
    ClientConfig.backoff_s), not all the same: in step, a balancer that admits a few
    after each status admits the same early ones every time (the security soak test,
    docs/results/2026-11-29-soak-retries.md). Before, each waited exactly 1.0 s."""
    stack = await make_stack(origins=("origin-a",))
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    jitter, waits = await phone.evaluate(
        """async () => {
            const { Download } = await import('./js/download.js');
            const config = await (await fetch('./config.json', { cache: 'no-store' })).json();
            const make = () => new Download({ issueId: 'x', config });
            const downloads = Array.from({ length: 8 }, make);
            const waits = await Promise.all(downloads.map(async (d) => {
                d.failuresInRow = 1;
                const began = performance.now();
                await d.backoff(1);
                return (performance.now() - began) / 1000;
            }));
            return [config.download.retry_jitter, waits];
        }""",
        what="eight backoffs of Retry-After 1 s",
    )
    assert jitter == 0.5
    # at least Retry-After; at most half again, plus a loaded host's 0.2 s for the timer
    assert all(1.0 <= w <= 1.5 + 0.2 for w in waits), waits
    # not in step: eight draws of up to 0.5 s all within 0.1 s has odds ~1e-4
    assert max(waits) - min(waits) > 0.1, waits
