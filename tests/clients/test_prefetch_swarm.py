"""The prefetchers' swarm (issue 35): three ``get --prefetch`` clients of one embargoed
issue share its ciphertext among themselves before the release, so the origins send
each piece about once, not once per subscriber. Real parts on 127.0.0.1: two origin
processes and the balancer (`Testbed`), pressrun's tracker on SQLite, libtorrent
sessions (`pressrun.clients.prefetch_swarm`), the subscription service. Also the pure
choice of the next origin piece."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nacl.public
import pytest

from pressrun.balancer.aio import RunningBalancer
from pressrun.balancer.prefetch import PrefetchConfig, PrefetchPacer
from pressrun.clients import prefetch_swarm
from pressrun.clients.aio import FetchResult
from pressrun.clients.config import DESKTOP
from pressrun.clients.prefetch import prefetch_issue
from pressrun.clients.prefetch_swarm import PEER_PATIENCE_S, PrefetchSwarm, next_origin_piece
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.content.manifest import SignedManifest
from pressrun.content.publish import publish
from pressrun.content.release import utc_text
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.security import ServiceSecurity
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory
from pressrun.subscriptions.store import SubscriptionStore
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

pytest.importorskip("libtorrent")

PIECE = 64 * 1024
TOKEN = "prefetch-swarm-test-token"
FAST = replace(DESKTOP, stall_timeout_s=3.0, retry_backoff_s=0.05, retry_backoff_max_s=0.5)
ISSUE = "weekly-2027-04"
SIZE = 2 << 20  # 2 MiB: 33 pieces of ciphertext
READERS = 3
RATE = 600_000.0  # the whole prefetch budget, bytes/s: 200 kB/s per prefetcher
LEAD_S = 8  # publication to release


def test_next_origin_piece_takes_what_no_peer_holds_and_waits_for_peers() -> None:
    rng = random.Random(1)
    # pieces 0 and 2 are held by a peer, 1 and 3 by nobody: one of those
    picks = {
        next_origin_piece([0, 1, 2, 3], [1, 0, 2, 0], peers_idle_s=0.0, rng=rng) for _ in range(50)
    }
    assert picks == {1, 3}
    # every missing piece is a peer's: none from the origins while the peers deliver
    assert next_origin_piece([0, 2], [1, 0, 2, 0], peers_idle_s=0.5, rng=rng) is None
    # ... but the least held once they have brought nothing for a while
    assert next_origin_piece([0, 2], [1, 0, 2, 0], peers_idle_s=PEER_PATIENCE_S, rng=rng) == 0
    # no availability known (no peer connected): any missing piece
    assert next_origin_piece([5], [], peers_idle_s=0.0, rng=rng) == 5
    assert next_origin_piece([], [], peers_idle_s=9.0, rng=rng) is None


@dataclass
class Bed:
    balancer: RunningBalancer
    readers: list[nacl.public.PrivateKey]
    trusted: set[bytes]
    release_unix: int
    data: bytes
    transfer_bytes: int
    bundle: Path

    @property
    def url(self) -> str:
        return self.balancer.url

    def pace(self, budget_bytes_per_s: float, *, min_rate: float, renew_s: float) -> None:
        """The balancer's prefetch budget (two origins of 125 MB/s each)."""
        self.balancer.service.prefetch = PrefetchPacer(
            PrefetchConfig(
                share=budget_bytes_per_s / 250e6,
                min_rate_bytes_per_s=min_rate,
                renew_s=renew_s,
                hold_s=max(5.0, 2 * renew_s),
            )
        )


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    tracker = TrackerService(
        TrackerCore(TrackerConfig(interval_s=1, min_interval_s=1), random.Random(35)),
        SqliteStore(tmp_path / "tracker.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=TOKEN),
    )
    tracker_port = await tracker.start("127.0.0.1", 0)
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
        readers = [nacl.public.PrivateKey.generate() for _ in range(READERS)]
        for n, reader in enumerate(readers):
            service.store.add_subscriber(bytes(reader.public_key), f"r{n}", "2027-01-15T00:00:00Z")
        data = os.urandom(SIZE)
        source = tmp_path / "weekly.pdf"
        source.write_bytes(data)
        release_unix = math.ceil(time.time()) + LEAD_S
        bundle = await asyncio.to_thread(
            publish,
            source,
            issue_id=ISSUE,
            title="Weekly 4",
            key_path=secret,
            content_dir=testbed.content_dir,
            web_seeds=list(testbed.urls.values()),
            trackers=[f"http://127.0.0.1:{tracker_port}/announce"],
            piece_size=PIECE,
            encrypt_for=HttpSubscriberDirectory(f"http://127.0.0.1:{port}", TOKEN),
            release_at=utc_text(release_unix),
        )
        balancer = await testbed.start_balancer()
        size = json.loads((bundle / "manifest.json").read_text())["manifest"]["size_bytes"]
        yield Bed(
            balancer, readers, {load_public_key(public)}, release_unix, data, int(size), bundle
        )
    finally:
        await service.close()
        await testbed.close()
        await tracker.close()


async def prefetch_all(bed: Bed, tmp_path: Path) -> list[FetchResult]:
    """The subscribers' ``get --prefetch``, all at once; their results."""
    return await asyncio.wait_for(
        asyncio.gather(
            *(
                prefetch_issue(
                    ISSUE,
                    balancer_url=bed.url,
                    library=tmp_path / f"library-{n}",
                    config=FAST,
                    trusted_keys=bed.trusted,
                    subscriber_key=reader,
                    client_id=f"prefetcher-{n}",
                    listen_interfaces="127.0.0.1:0",
                )
                for n, reader in enumerate(bed.readers)
            )
        ),
        LEAD_S + 20,
    )


async def test_prefetchers_share_the_ciphertext_and_the_origins_send_it_about_once(
    bed: Bed, tmp_path: Path
) -> None:
    # renewed every 2 s: the first one granted the whole budget is cut to a third soon
    bed.pace(RATE, min_rate=50_000, renew_s=2.0)
    results = await prefetch_all(bed, tmp_path)
    opened_at = time.time()
    print(f"the last opened {opened_at - bed.release_unix:.2f} s after the release")
    assert bed.release_unix <= opened_at < bed.release_unix + 5.0
    from_origins = [sum(r.bytes_by_origin.values()) for r in results]
    from_peers = [r.bytes_from_peers for r in results]
    print(f"from origins {from_origins}, from peers {from_peers}, size {bed.transfer_bytes}")
    for r, origins, peers in zip(results, from_origins, from_peers, strict=True):
        assert r.path.read_bytes() == bed.data
        assert r.mode == "prefetch" and r.encrypted and r.swarm_note is None
        # every byte of the ciphertext came before the release, from one or the other
        assert origins + peers == bed.transfer_bytes
    # without the swarm the origins send the whole ciphertext to each of the three;
    # with it, each piece leaves them about once (a few twice: two prefetchers asked
    # for one before either held it)
    assert sum(from_origins) < 1.6 * bed.transfer_bytes
    assert sum(from_peers) > 1.4 * bed.transfer_bytes


async def test_prefetchers_without_room_get_it_all_from_the_one_with_room(
    bed: Bed, tmp_path: Path
) -> None:
    # room for one prefetcher at a time, and no renewal before the release: the other
    # two never fetch from the origins before it, and must get every piece from the
    # first. (Before close_redundant_connections was off, they dropped it as an
    # uninteresting upload-only peer the moment it had the last piece, before that
    # piece's HAVE was counted: both lacked it at the release and took it from the
    # origins then.)
    bed.pace(1_500_000.0, min_rate=1_500_000.0, renew_s=30.0)
    results = await prefetch_all(bed, tmp_path)
    assert all(r.mode == "prefetch" for r in results), [r.mode for r in results]
    granted = [r for r in results if r.bytes_by_origin]
    assert len(granted) == 1
    assert sum(granted[0].bytes_by_origin.values()) == bed.transfer_bytes
    for r in results:
        assert r.path.read_bytes() == bed.data
        if r is not granted[0]:
            assert r.bytes_from_peers == bed.transfer_bytes and not r.bytes_by_origin


class _Cut:
    """A progress that cancels the prefetch once ``after_bytes`` are verified."""

    def __init__(self, after_bytes: int) -> None:
        self.after_bytes = after_bytes
        self.reached = asyncio.Event()

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        return None

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        if done_bytes >= self.after_bytes:
            self.reached.set()

    def notice(self, text: str) -> None:
        return None


async def test_a_resumed_prefetch_counts_what_it_had_on_disk_as_its_own(
    bed: Bed, tmp_path: Path
) -> None:
    # cut after 20 pieces (the resume state is written every 16): the pieces written
    # since are on disk and libtorrent finds them; alone in the swarm, nothing may be
    # counted as from peers (before: those pieces were)
    bed.pace(RATE, min_rate=50_000, renew_s=2.0)
    library = tmp_path / "library"

    def prefetch(progress: _Cut | None) -> Awaitable[FetchResult]:
        return prefetch_issue(
            ISSUE,
            balancer_url=bed.url,
            library=library,
            config=FAST,
            trusted_keys=bed.trusted,
            subscriber_key=bed.readers[0],
            client_id="alone",
            listen_interfaces="127.0.0.1:0",
            progress=progress,
        )

    cut = _Cut(20 * PIECE)
    first = asyncio.ensure_future(prefetch(cut))
    await asyncio.wait_for(cut.reached.wait(), LEAD_S)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    result = await asyncio.wait_for(prefetch(None), LEAD_S + 20)
    assert result.mode == "prefetch" and result.path.read_bytes() == bed.data
    assert result.bytes_from_peers == 0
    assert result.resumed_bytes >= 20 * PIECE
    assert result.resumed_bytes + sum(result.bytes_by_origin.values()) == bed.transfer_bytes


class _LateLooks:
    """`asyncio` for the prefetch swarm's module alone, its 50 ms looks taking 6 s."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay: float) -> None:
        await asyncio.sleep(6.0 if delay == 0.05 else delay)


async def test_what_the_file_held_is_read_before_any_peer_can_send(
    bed: Bed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a seed is in the swarm when a prefetcher with an empty file joins, and the
    # prefetcher's looks at libtorrent's check take 6 s each (a loaded host): what the
    # file held is fixed before any peer can send, so nothing the seed sent meanwhile
    # passes for it. (Before, the pieces held when the look came were taken as found on
    # disk and counted as from nobody: 2 pieces in a fresh-clone run of the suite at load
    # 7. That race needs a look that lags the check's end; this test does not force it
    # on the old code, where the first look often comes after the check.)
    m = SignedManifest.from_json_bytes((bed.bundle / "manifest.json").read_bytes()).manifest
    torrent = (bed.bundle / f"{ISSUE}.torrent").read_bytes()
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / m.file_name).write_bytes((bed.bundle / m.file_name).read_bytes())
    (tmp_path / "leech").mkdir()
    seed = PrefetchSwarm(
        torrent=torrent, manifest=m, partial_dir=tmp_path / "seed", listen_interfaces="127.0.0.1:0"
    )
    leech = PrefetchSwarm(
        torrent=torrent, manifest=m, partial_dir=tmp_path / "leech", listen_interfaces="127.0.0.1:0"
    )
    try:
        await seed.start()
        assert seed.on_disk == frozenset(range(m.num_pieces))
        await asyncio.sleep(1.5)  # the seed has announced: the tracker names it
        monkeypatch.setattr(prefetch_swarm, "asyncio", _LateLooks())
        await leech.start()
        monkeypatch.undo()
        assert leech.on_disk == frozenset()
        async with asyncio.timeout(20):  # and the seed does send (the swarm is real)
            while len(leech.have()) < m.num_pieces:
                await asyncio.sleep(0.1)
                leech.refresh()
    finally:
        await leech.close()
        await seed.close()
