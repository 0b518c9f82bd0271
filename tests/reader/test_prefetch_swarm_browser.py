"""The reader in the prefetchers' swarm before an embargoed issue's release (issue 35),
in Debian's headless Chromium.

Real parts on 127.0.0.1 (test_swarm_browser.py's stack): pressrun's tracker (HTTP
announce and the ``/webtorrent`` WebSocket), a real origin, a real balancer whose
prefetch grant names the swarm (the torrent and the WebSocket tracker), the
subscription service (it refuses the wrap until the release), and a desktop
prefetcher (`pressrun.clients.prefetch_swarm.PrefetchSwarm`, libtorrent with WebRTC,
in a child process: ``prefetch_peer.py``) holding the whole ciphertext.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Phone, browser_only
from .test_swarm_browser import (  # noqa: F401  (stack, swarm: the fixtures)
    SwarmStack,
    open_phone,
    stack,
    start,
    swarm,
    webrtc_peer,
)

pytestmark = [browser_only, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

LEAD_S = 10  # the release, this long after the publication
PEER_SCRIPT = Path(__file__).with_name("prefetch_peer.py")


async def prefetch_status(phone: Phone, issue_id: str) -> dict[str, Any]:
    status = await phone.evaluate("window.pressrun.prefetch()", what="the prefetch status")
    return dict(status.get(issue_id) or {})


async def test_a_reader_prefetches_from_a_desktop_prefetcher_and_opens_at_the_release(
    swarm: SwarmStack,  # noqa: F811
    sample_pdf: bytes,
    phone_factory,  # type: ignore[no-untyped-def]
) -> None:
    from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
    from pressrun.balancer.config import BalancerConfig
    from pressrun.balancer.events import OriginSpec
    from pressrun.balancer.prefetch import PrefetchConfig

    phone = await open_phone(phone_factory, swarm.reader_url)
    wraps: list[tuple[float, int]] = []  # (time, HTTP status) of the reader's wrap asks
    phone.page.on(
        "response",
        lambda r: wraps.append((time.time(), r.status)) if r.url.endswith("/wrap") else None,
    )
    # the desktop prefetcher's process, its imports done before the publication
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PEER_SCRIPT),
        str(swarm.root / "prefetcher"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    swarm.peers.append(webrtc_peer.WebRTCPeer(proc))
    release = math.ceil(time.time()) + LEAD_S
    issue = await swarm.publish(
        "pre-swarm",
        subscribers=[await phone.subscriber_key()],
        data=sample_pdf,
        release_at=datetime.datetime.fromtimestamp(release, datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ),
        http_tracker=True,
    )
    n = len(issue.manifest["piece_sha256"])
    # the origins' prefetch share small: 0.08 % of the origin's 1 Gbit/s, 100 kB/s
    # (the ciphertext alone would take 15 s from it, past the release)
    origin = await swarm.origin()
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("origin-0", origin),),
            balancer=BalancerConfig(poll_interval_s=0.3, stale_after_s=1.05),
            poll_timeout_s=1.0,
            tracker_url=swarm.announce_url,
            prefetch=PrefetchConfig(
                share=0.0008, min_rate_bytes_per_s=20_000, renew_s=1.0, hold_s=5.0
            ),
        )
    )
    swarm.balancers[issue.issue_id] = balancer
    await balancer.wait_until_up(1, timeout_s=10.0)
    # the desktop prefetcher, whole, in the swarm (the tracker lists it)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{issue.bundle}\n".encode())
    await proc.stdin.drain()
    assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
    info_hash = bytes.fromhex(issue.manifest["info_hash"])
    deadline = time.monotonic() + 15
    while not swarm.tracker.core.records(info_hash):
        assert time.monotonic() < deadline, "the prefetcher never announced"
        await asyncio.sleep(0.1)
    started = time.time()
    print(f"set up, {release - started:.2f} s before the release")
    await start(phone, issue)
    # a second before the release: the ciphertext is on the device, most of it from
    # the desktop prefetcher, and the wrap was refused (403 embargoed)
    await phone.page.wait_for_function(
        f"() => window.pressrun.prefetch()[{issue.issue_id!r}]?.state === 'done'",
        timeout=max(1.0, release - 1.0 - time.time()) * 1000,
    )
    status = await prefetch_status(phone, issue.issue_id)
    print(f"prefetched in {time.time() - started:.2f} s: {status}")
    assert time.time() < release
    assert status["stored_pieces"] == n, status
    assert 0 < status["rate_bytes_per_s"] <= 100_000, status
    from_origins = sum(status["bytes_by_origin"].values())
    assert status["bytes_from_peers"] >= issue.transfer_bytes // 2, status
    assert status["bytes_from_peers"] + from_origins >= issue.transfer_bytes, status
    assert status["swarm"]["peers_seen"] >= 1, status
    assert wraps and all(code == 403 for _, code in wraps), wraps
    assert (
        await phone.evaluate(
            f"window.pressrun.results[{issue.issue_id!r}] ?? null", what="no result yet"
        )
        is None
    )
    # at the release: the wrap, and the issue opens from what the device holds
    result = await phone.wait_for_download(issue.issue_id, timeout_s=30)
    assert time.time() >= release
    assert result["resumed_pieces"] == n and result["bytes_by_origin"] == {}, result
    assert [code for t, code in wraps if t >= release] == [200], wraps
    assert await phone.stored_sha256(issue.issue_id) == hashlib.sha256(sample_pdf).hexdigest()
    after = await prefetch_status(phone, issue.issue_id)
    assert after["state"] == "opened" and after["adopted_pieces"] == n, after
    assert after["swarm"]["state"] == "left", after
    await phone.evaluate(f"window.pressrun.openIssue({issue.issue_id!r})", what="the opening")
    await phone.page.wait_for_selector("#page[data-page='1']")
    # the origins' pick beside the peers, pure, in the page: a piece no peer holds
    # first; with every missing piece held, none until the peers are idle 3 s, then
    # the least held
    picks = await phone.evaluate(
        """async () => {
            const { nextOriginPiece } = await import('./js/prefetch.js');
            const first = () => 0;
            return [
                nextOriginPiece([], [1, 1], 10, first),
                nextOriginPiece([0, 1, 2], [2, 0, 1], 0, first),
                nextOriginPiece([0, 2], [2, 0, 1], 2.9, first),
                nextOriginPiece([0, 2], [2, 0, 1], 3.0, first),
            ];
        }""",
        what="nextOriginPiece",
    )
    assert picks == [None, 1, None, 2]
