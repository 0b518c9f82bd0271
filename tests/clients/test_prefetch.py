"""``pressrun get --prefetch`` end to end (issue 35): two origin processes, a balancer
and a subscription service on 127.0.0.1, an issue under a real embargo of a few
seconds. The ciphertext is all there before the release, paced to the balancer's
grant; the wrap is fetched at the release and the issue opened at once. Also the
pure pace with an explicit ``now``."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import nacl.public
import pytest
from aiohttp import web

from pressrun.balancer.prefetch import PrefetchConfig, PrefetchPacer
from pressrun.clients.aio import FetchError, fetch_issue
from pressrun.clients.config import DESKTOP
from pressrun.clients.library import Library
from pressrun.clients.prefetch import prefetch_issue
from pressrun.clients.prefetch_pace import PrefetchPace
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.content.publish import publish
from pressrun.content.release import utc_text
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory
from pressrun.subscriptions.store import SubscriptionStore

PIECE = 64 * 1024
TOKEN = "prefetch-test-token"
FAST = replace(DESKTOP, stall_timeout_s=3.0, retry_backoff_s=0.05, retry_backoff_max_s=0.5)
ISSUE = "weekly-2027-03"
SIZE = 1 << 20  # 1 MiB: 17 pieces of ciphertext
RATE = 1_000_000.0  # the prefetch budget, bytes/s: about a second for the issue


@dataclass
class Bed:
    bed: Testbed
    service: SubscriptionService
    reader: nacl.public.PrivateKey
    trusted: set[bytes]
    release_unix: int
    data: bytes

    @property
    def url(self) -> str:
        assert self.bed.balancer is not None
        return self.bed.balancer.url


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    testbed = Testbed(
        tmp_path / "bed",
        (OriginShape("origin-a"), OriginShape("origin-b")),
        poll_interval_s=0.3,
        poll_timeout_s=1.0,
    )
    await testbed.__aenter__()
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    port = await service.start("127.0.0.1", 0)
    try:
        reader = nacl.public.PrivateKey.generate()
        service.store.add_subscriber(bytes(reader.public_key), "ada", "2027-01-15T00:00:00Z")
        data = os.urandom(SIZE)
        source = tmp_path / "weekly.pdf"
        source.write_bytes(data)
        # the release: the next whole second plus 4 s (a real embargo, the wall clock)
        release_unix = math.ceil(time.time()) + 4
        await asyncio.to_thread(
            publish,
            source,
            issue_id=ISSUE,
            title="Weekly 3",
            key_path=secret,
            content_dir=testbed.content_dir,
            web_seeds=list(testbed.urls.values()),
            piece_size=PIECE,
            encrypt_for=HttpSubscriberDirectory(f"http://127.0.0.1:{port}", TOKEN),
            release_at=utc_text(release_unix),
        )
        balancer = await testbed.start_balancer()
        # two origins of 125 MB/s each: a share of 0.004 is 1 MB/s of prefetch
        balancer.service.prefetch = PrefetchPacer(
            PrefetchConfig(share=RATE / 250e6, min_rate_bytes_per_s=100_000)
        )
        yield Bed(testbed, service, reader, {load_public_key(public)}, release_unix, data)
    finally:
        await service.close()
        await testbed.close()


async def test_prefetch_before_the_release_and_open_at_it(bed: Bed, tmp_path: Path) -> None:
    library = tmp_path / "library"
    # before the release, a plain get refuses at once, with the time and --prefetch
    with pytest.raises(FetchError, match=r"released at .*--prefetch"):
        await fetch_issue(
            ISSUE,
            balancer_url=bed.url,
            library=tmp_path / "other-library",
            config=FAST,
            trusted_keys=bed.trusted,
            subscriber_key=bed.reader,
        )
    started = time.time()
    getting = asyncio.create_task(
        prefetch_issue(
            ISSUE,
            balancer_url=bed.url,
            library=library,
            config=FAST,
            trusted_keys=bed.trusted,
            subscriber_key=bed.reader,
        )
    )
    # half a second before the release: every piece of the ciphertext is verified in
    # .partial, and no plaintext exists anywhere
    await asyncio.sleep(bed.release_unix - 0.5 - time.time())
    state = Library(library).load_state(ISSUE)
    assert state is not None and len(state.verified) == 17
    assert not getting.done()
    assert not (library / ISSUE).exists()
    result = await asyncio.wait_for(getting, 15)
    opened_at = time.time()
    # opened at the release (by the service's clock: this host's), at once
    assert bed.release_unix <= opened_at < bed.release_unix + 2.0
    assert result.path.read_bytes() == bed.data
    assert result.mode == "prefetch" and result.encrypted
    # paced: 1.1 MB at the 1 MB/s grant took about a second, not milliseconds
    ciphertext = sum(result.bytes_by_origin.values())
    assert ciphertext == SIZE + 17 * 16
    assert opened_at - started >= 0.9
    # one wrap handed out, after at least one refusal with the time
    assert bed.service.wraps_served._value.get() == 1
    assert bed.service.embargo_refusals._value.get() >= 2


async def test_a_removed_subscriber_holding_the_ciphertext_gets_nothing(
    bed: Bed, tmp_path: Path
) -> None:
    library = tmp_path / "library"
    getting = asyncio.create_task(
        prefetch_issue(
            ISSUE,
            balancer_url=bed.url,
            library=library,
            config=FAST,
            trusted_keys=bed.trusted,
            subscriber_key=bed.reader,
        )
    )
    await asyncio.sleep(bed.release_unix - 1.0 - time.time())
    state = Library(library).load_state(ISSUE)
    assert state is not None and len(state.verified) == 17  # it holds the ciphertext
    bed.service.store.remove_subscriber(bytes(bed.reader.public_key))
    with pytest.raises(FetchError, match="not subscribed"):
        await asyncio.wait_for(getting, 15)
    assert not (library / ISSUE).exists()


async def test_a_prefetcher_never_granted_room_opens_the_issue_at_the_release(
    bed: Bed, tmp_path: Path
) -> None:
    """The origins have no room for prefetch at all (every grant deferred): the client
    still reads the manifest (the 429 names the origins), waits no later than the
    release, and then fetches the issue the ordinary way."""
    assert bed.bed.balancer is not None
    bed.bed.balancer.service.prefetch = PrefetchPacer(
        PrefetchConfig(share=1e-6, min_rate_bytes_per_s=100_000)
    )
    library = tmp_path / "library"
    result = await asyncio.wait_for(
        prefetch_issue(
            ISSUE,
            balancer_url=bed.url,
            library=library,
            config=FAST,
            trusted_keys=bed.trusted,
            subscriber_key=bed.reader,
        ),
        20,
    )
    opened_at = time.time()
    assert bed.release_unix <= opened_at < bed.release_unix + 4.0
    assert result.path.read_bytes() == bed.data
    assert result.mode != "prefetch"  # the ordinary get did it, at the release


def test_the_pace_books_each_piece_at_the_granted_rate() -> None:
    pace = PrefetchPace(1000.0, now=10.0)
    assert pace.wait_s(500, now=10.0) == 0.0  # the first piece at once
    assert pace.wait_s(500, now=10.0) == pytest.approx(0.5)  # after the first's 0.5 s
    assert pace.wait_s(1000, now=10.2) == pytest.approx(0.8)  # booked until 11.0
    # idle for a while: no burst builds up, the next starts now and books its time
    assert pace.wait_s(1000, now=20.0) == 0.0
    assert pace.wait_s(1000, now=20.0) == pytest.approx(1.0)
    pace.set_rate(0.0)
    assert pace.wait_s(1000, now=30.0) is None  # waiting for room: nothing booked
    pace.set_rate(2000.0)
    assert pace.wait_s(1000, now=30.0) == 0.0
    assert pace.wait_s(1000, now=30.0) == pytest.approx(0.5)


def test_a_malformed_grant_is_no_grant() -> None:
    from pressrun.clients.prefetch import MAX_GRANT_WAIT_S, _seconds

    assert _seconds({"renew_s": 20}, "renew_s") == 20.0
    assert _seconds({"retry_after_s": 1e9}, "retry_after_s") == MAX_GRANT_WAIT_S
    assert _seconds({"rate_bytes_per_s": 5e6}, "rate_bytes_per_s") == 5e6
    for bad in ("20", True, -1, float("nan"), float("inf"), None, [1]):
        assert _seconds({"renew_s": bad}, "renew_s") is None
    assert _seconds(["not", "a", "dict"], "renew_s") is None


async def test_prefetchers_deferred_together_ask_again_spread_out(tmp_path: Path) -> None:
    """Eight prefetchers deferred together by a balancer (429, Retry-After 1 s, no
    origin named) each ask again after at least the full second and at most half again
    (`ClientConfig.retry_jitter`, 0.5), not at the same instant: in step, a balancer
    that admits a few after each status admits the same early ones every time (the
    security soak test, docs/results/2026-11-29-soak-retries.md). Before, each asked
    again exactly 1.0 s later, all eight within a few ms."""
    loop = asyncio.get_running_loop()
    asked: dict[str, list[float]] = {}

    async def prefetch(request: web.Request) -> web.Response:
        client = request.query["client"]
        asked.setdefault(client, []).append(loop.time())
        if len(asked[client]) == 1:
            return web.json_response({"retry_after_s": 1.0}, status=429)
        return web.json_response({"error": "unknown issue"}, status=404)  # ends it

    app = web.Application()
    app.router.add_get("/v1/issues/{issue}/prefetch", prefetch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = replace(FAST, retry_jitter=0.5)
    try:
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(
                    prefetch_issue(
                        ISSUE,
                        balancer_url=f"http://127.0.0.1:{port}",
                        library=tmp_path / f"library-{i}",
                        config=config,
                        trusted_keys=None,
                        trust_on_first_use=True,
                        client_id=f"prefetcher-{i}",
                    )
                    for i in range(8)
                ),
                return_exceptions=True,
            ),
            10,
        )
    finally:
        await runner.cleanup()
    for outcome in outcomes:
        assert isinstance(outcome, FetchError) and "no origin holds" in str(outcome), outcome
    assert len(asked) == 8 and all(len(times) == 2 for times in asked.values()), asked
    first = [times[0] for times in asked.values()]
    again = [times[1] for times in asked.values()]
    assert max(first) - min(first) < 0.2  # refused together
    waits = [b - a for a, b in zip(first, again, strict=True)]
    # at least Retry-After; at most half again, plus a loaded host's 0.2 s for the ask
    assert all(1.0 <= w <= 1.5 + 0.2 for w in waits), waits
    # not back in step: eight draws of up to 0.5 s all within 0.1 s has odds ~1e-4
    assert max(waits) - min(waits) > 0.1, waits
    assert max(again) - min(again) > 0.1, again
