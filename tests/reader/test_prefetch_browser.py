"""The web reader's background prefetch of an embargoed issue (issue 35), in Debian's
headless Chromium against real origins, the balancer (its prefetch pacing) and the
subscription service on 127.0.0.1 (conftest.py's `Stack`).

An issue is published encrypted with a release a few seconds ahead. The app finds
it, and while the subscription service still refuses the wrap the reader fetches
the ciphertext in the background at the balancer's granted rate (js/prefetch.js);
at the release it fetches the wrap, decrypts what it holds and opens the issue with
no request to an origin.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from pressrun.balancer.prefetch import PrefetchConfig, PrefetchPacer
from pressrun.content.release import utc_text
from pressrun.subscriptions.client import HttpSubscriberDirectory, SubscriptionsClient

from .conftest import ISSUE, PIECE, TOKEN, Phone, Stack, StackFactory, browser_only

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

RATE = 1_000_000.0  # the prefetch budget, bytes/s: about 1.5 s for the 1.5 MB issue
LEAD_S = 6  # the release, this long after the publication (page start + prefetch)


async def publish_embargoed(
    stack: Stack, phone: Phone, *, share: float, min_rate: float, lead_s: int = LEAD_S
) -> int:
    """The phone's key made a subscriber's, the balancer's prefetch pacing set (two
    origins of 125 MB/s each: ``share`` of 250 MB/s), the sample issue published
    encrypted with a release ``lead_s`` seconds ahead; the release (Unix seconds)."""
    async with aiohttp.ClientSession() as http:
        client = SubscriptionsClient(stack.subscriptions_url, http, operator_token=TOKEN)
        await client.add_subscriber(bytes.fromhex(await phone.subscriber_key()), "reader")
    balancer = stack.bed.balancer
    assert balancer is not None
    balancer.service.prefetch = PrefetchPacer(
        PrefetchConfig(share=share, min_rate_bytes_per_s=min_rate, renew_s=1.0, hold_s=5.0)
    )
    release = math.ceil(time.time()) + lead_s
    bundle = await stack.bed.publish(
        stack.data,
        issue_id=ISSUE,
        key_path=stack.root / "publisher.key",
        piece_size=PIECE,
        encrypt_for=HttpSubscriberDirectory(stack.subscriptions_url, TOKEN),
        release_at=utc_text(release),
    )
    stack.file_name = json.loads((bundle / "manifest.json").read_text())["manifest"]["file_name"]
    url = f"{balancer.url}/v1/issues/{ISSUE}/directive"
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            async with http.get(url) as resp:
                if resp.status == 200:
                    return release
            await asyncio.sleep(0.05)
    raise AssertionError(f"the balancer never directed to {ISSUE}")


async def prefetch_status(phone: Phone) -> dict[str, Any]:
    status = await phone.evaluate("window.pressrun.prefetch()", what="the prefetch status")
    return dict(status.get(ISSUE) or {})


async def test_the_ciphertext_arrives_before_the_release_paced_and_opens_at_it(
    make_stack: StackFactory,
    phone_factory: Callable[[str], Awaitable[Phone]],
) -> None:
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    release = await publish_embargoed(stack, phone, share=RATE / 250e6, min_rate=100_000)
    started = time.time()
    await phone.check_for_issues()  # finds the new issue; auto-download starts it
    # a second before the release: every piece of the ciphertext is on the device
    # (prefetch/), none decrypted (the key does not exist here yet), no result
    await asyncio.sleep(release - 1.0 - time.time())
    status = await prefetch_status(phone)
    assert status.get("state") == "done", status
    n = status["num_pieces"]
    assert status["stored_pieces"] == n
    fetched = sum(status["bytes_by_origin"].values())
    assert fetched == status["size_bytes"] == stack.origin_copy("origin-a").stat().st_size
    assert status["grants"] >= 1
    assert await phone.stored_pieces() == 0
    assert await phone.evaluate(f"window.pressrun.results[{ISSUE!r}]", what="no result") is None
    # paced: about 1.5 MB at the 1 MB/s grant took more than a second, not milliseconds
    took_s = (status["finished_at"] - status["started_at"]) / 1000
    assert took_s >= 0.9 * (fetched - PIECE) / RATE, status
    assert status["finished_at"] / 1000 - started < LEAD_S
    # at the release: the wrap, then the issue opens from what the device holds
    result = await phone.wait_for_download(timeout_s=30)
    opened = time.time()
    assert release <= opened < release + 3.0, opened - release
    assert result["encrypted"]
    assert result["resumed_pieces"] == n  # every piece was there already
    assert result["ranges"] == [] and result["bytes_by_origin"] == {}  # no origin asked
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
    after = await prefetch_status(phone)
    assert after["state"] == "opened" and after["adopted_pieces"] == n, after
    # the ciphertext's folder is gone: the issue is on the device once
    left = await phone.evaluate(
        """async () => {
            const root = await navigator.storage.getDirectory();
            const dir = await root.getDirectoryHandle('prefetch', {create: true});
            const names = [];
            for await (const name of dir.keys()) names.push(name);
            return names;
        }""",
        what="the prefetch folder",
    )
    assert left == []
    assert any("This issue opens at " in t for t in await phone.notices())
    # the library says where the bytes came from: the origins, before the release
    sources = phone.page.locator(f"li[data-issue='{ISSUE}'] .sources")
    assert "From origins 1.5 MB" in await sources.inner_text()


async def test_no_room_for_the_prefetch_still_opens_at_the_release(
    make_stack: StackFactory,
    phone_factory: Callable[[str], Awaitable[Phone]],
) -> None:
    # a budget below the least rate worth granting: every ask is deferred (429); the
    # reader fetches nothing before the release and the whole issue after it
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    release = await publish_embargoed(stack, phone, share=10_000 / 250e6, min_rate=100_000)
    await phone.check_for_issues()
    await asyncio.sleep(release - 1.0 - time.time())
    status = await prefetch_status(phone)
    assert status.get("state") == "waiting", status
    assert status["deferrals"] >= 2 and status["grants"] == 0  # asked again, renew_s 1 s
    assert status["stored_pieces"] == 0 and status["bytes_by_origin"] == {}
    result = await phone.wait_for_download(timeout_s=30)
    assert time.time() >= release
    assert result["resumed_pieces"] == 0
    assert sum(result["bytes_by_origin"].values()) == result["transfer_bytes"]
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()


async def test_a_page_reloaded_mid_prefetch_goes_on_from_the_stored_pieces(
    make_stack: StackFactory,
    phone_factory: Callable[[str], Awaitable[Phone]],
) -> None:
    # the page closes (here: reloads) while the ciphertext is half there; the app, open
    # again, starts the issue's download by itself and the prefetch fetches only the
    # pieces it did not store (before: the issue waited for a tap on Download)
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    page = await phone.open()
    release = await publish_embargoed(
        stack, phone, share=600_000 / 250e6, min_rate=100_000, lead_s=7
    )
    await phone.check_for_issues()
    await page.wait_for_function(
        f"() => (window.pressrun.prefetch()[{ISSUE!r}]?.stored_pieces ?? 0) >= 6",
        timeout=20_000,
    )
    first = await prefetch_status(phone)
    assert first["stored_pieces"] < first["num_pieces"], first  # cut half-way
    await phone.reload()
    try:
        await page.wait_for_function(
            f"() => window.pressrun.prefetch()[{ISSUE!r}]?.state === 'done'", timeout=20_000
        )
    except Exception:
        print(await prefetch_status(phone), time.time() - release, phone.console[-20:])
        raise
    assert time.time() < release
    second = await prefetch_status(phone)
    n = second["num_pieces"]
    assert second["stored_pieces"] == n
    again = sum(second["bytes_by_origin"].values())
    # after the reload only what was not stored before it: at least the 6 pieces
    # stored then were not fetched again
    assert again <= second["size_bytes"] - 6 * PIECE, (first, second)
    result = await phone.wait_for_download(timeout_s=30)
    assert result["resumed_pieces"] == n and result["ranges"] == []
    assert await phone.stored_sha256() == hashlib.sha256(stack.data).hexdigest()
    prefetching = await phone.evaluate(
        "(async () => (await import('./js/db.js')).getSetting('prefetching', []))()",
        what="the prefetching list",
    )
    assert prefetching == []


async def test_forgetting_a_prefetch_leaves_other_issues_folders(
    make_stack: StackFactory,
    phone_factory: Callable[[str], Awaitable[Phone]],
) -> None:
    # issue ids may hold dots: forgetting "weekly" must not take "weekly.extra"'s
    # ciphertext (before: every folder starting "weekly." went)
    stack = await make_stack()
    phone: Phone = await phone_factory(stack.reader_url)
    await phone.open()
    left = await phone.evaluate(
        """async () => {
            const root = await navigator.storage.getDirectory();
            const dir = await root.getDirectoryHandle('prefetch', {create: true});
            for (const name of ['weekly.0123456789abcdef', 'weekly.extra.0123456789abcdef'])
                await dir.getDirectoryHandle(name, {create: true});
            const prefetch = await import('./js/prefetch.js');
            await prefetch.forgetPrefetch('weekly');
            const names = [];
            for await (const name of dir.keys()) names.push(name);
            return names;
        }""",
        what="forgetting a prefetch",
    )
    assert left == ["weekly.extra.0123456789abcdef"]
