"""A carousel reader seeds the issue's swarm afterwards (issue 28): the balancer
answers ``multicast`` with the swarm beside the carousel; the client takes the whole
file from the carousel, then joins the swarm as a seed, and a swarm peer that the
carousel does not reach (its only other source a 0.1 Mbit/s web seed) takes the
issue from it.

In flash-crowd-50 (session 20, run 7) the 35 carousel readers left at once while the
10 phones of the WebRTC swarm were a third of the way through; the phones took
156 MB from the origins' web seeds, half of the run's origin egress."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import MulticastInfo
from pressrun.clients.aio import FetchResult
from pressrun.clients.config import ClientConfig
from pressrun.clients.swarm_handoff import seeds_after_carousel
from pressrun.multicast.config import CarouselConfig
from pressrun.origin import OriginConfig, RunningOrigin, start_origin
from pressrun.peer.results import SwarmProgress, SwarmResult

from .conftest import (
    ISSUE,
    PEAK_AT_ONCE,
    Published,
    fetch_through_balancer,
    leave_swarm_for_carousel,
    multicast_client,
)

SIZE = 2_000_000 + 123
CLIENT = multicast_client(swarm_max_seed_s=30.0)


async def read_beside_a_peer(
    tmp_path: Path,
    pub: Published,
    sender: Any,
    origin: RunningOrigin,
    client: ClientConfig,
    **peer: Any,
) -> tuple[FetchResult, SwarmResult]:
    """A tracker on 127.0.0.1, and a swarm peer (``peer``: `SwarmPeer`'s arguments
    beside the torrent, the manifest, a folder and the tracker) downloading while a
    reader (``client``) fetches through a balancer over ``origin`` that answers
    ``multicast`` with the swarm beside ``sender``'s carousel: the reader's result and
    the peer's, once both ended (the peer's once it has the file)."""
    from pressrun.content.bundle import read_manifest
    from pressrun.peer.aio import SwarmPeer
    from pressrun.peer.loopback import OPERATOR_TOKEN
    from pressrun.security import ServiceSecurity
    from pressrun.tracker.aio import TrackerService
    from pressrun.tracker.config import TrackerConfig
    from pressrun.tracker.core import TrackerCore
    from pressrun.tracker.sqlite_store import SqliteStore

    tracker = TrackerService(
        TrackerCore(TrackerConfig(interval_s=2, min_interval_s=1), random.Random(7)),
        SqliteStore(tmp_path / "tracker.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )
    tracker_url = f"http://127.0.0.1:{await tracker.start('127.0.0.1', 0)}/announce"
    other = SwarmPeer(
        torrent=(pub.content / ISSUE / f"{ISSUE}.torrent").read_bytes(),
        manifest=read_manifest(pub.content / ISSUE / "manifest.json"),
        partial_dir=tmp_path / "other" / ".partial" / ISSUE,
        tracker_url=tracker_url,
        listen_interfaces="127.0.0.1:0",
        **peer,
    )
    try:
        await other.start()
        policy = carousel_beside_swarm(pub, origin, sender, tracker_url)
        reader, got = await asyncio.gather(
            fetch_through_balancer(ISSUE, origin, policy, client, publisher=pub),
            asyncio.wait_for(other.downloaded(), 90.0),
        )
        assert got
        return reader, await other.stop()
    finally:
        await other.close()
        await tracker.close()


def test_who_seeds_after_the_carousel() -> None:
    from pressrun.clients.codec import DirectiveSwarm

    swarm = DirectiveSwarm("http://o/t.torrent", "http://t/announce", "00" * 20)
    assert seeds_after_carousel(CLIENT, swarm)
    assert not seeds_after_carousel(CLIENT, None)  # no swarm named
    assert not seeds_after_carousel(replace(CLIENT, metered=True), swarm)
    assert not seeds_after_carousel(replace(CLIENT, swarm_max_seed_s=0.0), swarm)


async def test_a_carousel_reader_seeds_the_swarm_for_a_peer_the_carousel_misses(
    tmp_path: Path,
    published: Callable[[int], Published],
    sender_factory: Any,
) -> None:
    pytest.importorskip("libtorrent")
    from pressrun.peer.config import desktop_profile

    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    await sender.start_carousel(ISSUE, sender.config.carousel)
    # the reader's origin (the balancer's, for the manifest and the torrent), and a
    # 0.1 Mbit/s one: the other peer's only source but the seed (2 MB: 160 s)
    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    slow = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-slow", egress_cap_mbps=0.1)
    )
    try:
        reader, result = await read_beside_a_peer(
            tmp_path,
            pub,
            sender,
            origin,
            CLIENT,
            config=desktop_profile(max_seed_time_s=1.0),
            web_seeds=[f"{slow.url}/content/{ISSUE}/{ISSUE}.pdf"],
        )
    finally:
        await slow.stop()
    assert reader.mode == "multicast" and reader.bytes_from_multicast == SIZE
    assert sum(reader.bytes_by_origin.values()) == 0
    assert hashlib.sha256(reader.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    # it seeded, and left by a fair rule; the seeding is not its download; the swarm's
    # uploader policy is reported, as for any client that used the swarm
    assert reader.leave_rule is not None and reader.uploader_policy is not None
    assert reader.seeding_s > 0 and reader.download_s < reader.seconds
    # the other peer took the issue from it, a few web seed bytes at most
    assert result.completed
    assert result.bytes_from_peers >= SIZE * 0.9, result


async def test_a_swarm_leaver_seeds_the_carousel_copy_without_fetching_it_again(
    tmp_path: Path,
    published: Callable[[int], Published],
    sender_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sent to the swarm (a 2 Mbit/s web seed its only source), the client leaves for
    the carousel with part of the file, the carousel completes it, and it seeds: its
    seeding session downloads nothing. The swarm session's resume data, saved when it
    left, lists only the pieces it held then; a seed started on it took the carousel's
    pieces again from the web seed."""
    pytest.importorskip("libtorrent")
    import pressrun.clients.aio
    from pressrun.multicast.net import free_udp_port

    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    origin = await start_origin(
        OriginConfig(
            content_dir=pub.content, name="origin-a", stats_interval_s=0.2, egress_cap_mbps=2.0
        )
    )

    resume = pub.root / "library" / ".partial" / ISSUE / f"{ISSUE}.pdf.swarm-resume"

    async def carousel_later() -> None:
        # the carousel starts once the swarm has part of the file (0.25 MB/s: 8 s for
        # all of it) and has saved its resume data (every 2 s while pieces arrive)
        for _ in range(300):
            if resume.exists():
                break
            await asyncio.sleep(0.1)
        await sender.start_carousel(ISSUE, sender.config.carousel)

    later = asyncio.ensure_future(carousel_later())
    info_hash = json.loads(pub.manifest_json)["manifest"]["info_hash"]
    # no tracker answers there: the swarm is the web seed alone
    tracker = f"http://127.0.0.1:{free_udp_port()}/announce"
    swarm_first = DemandConfig(enter_downloaders=1.0, leave_downloaders=0.0, min_dwell_s=0.0)
    policy = DemandPolicy(
        swarm_first, {ISSUE: swarm_info_for(origin.url, tracker, ISSUE, info_hash)}
    )
    seeded: list[SwarmResult | None] = []
    seed = pressrun.clients.aio.seed_after_carousel

    async def recorded(*args: Any, **kwargs: Any) -> SwarmResult | None:
        seeded.append(await seed(*args, **kwargs))
        return seeded[-1]

    monkeypatch.setattr(pressrun.clients.aio, "seed_after_carousel", recorded)
    group = "{}:{}".format(*sender.config.control_group)
    config = replace(CLIENT, carousel_control_group=group, swarm_max_seed_s=1.0)
    result = await fetch_through_balancer(ISSUE, origin, policy, config, publisher=pub)
    await later
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    assert result.left_swarm_for_carousel and result.mode == "multicast"
    note = result.swarm_note or ""
    assert note.startswith("left for the carousel with") and " 0% " not in note, note
    assert len(seeded) == 1 and seeded[0] is not None
    assert seeded[0].completed
    assert seeded[0].downloaded_bytes == 0 and seeded[0].bytes_from_web_seeds == 0
    assert result.leave_rule is not None and result.seeding_s > 0


async def test_a_client_that_leaves_with_nothing_does_not_check_the_file_first(
    published: Callable[[int], Published],
    sender_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With nothing in its last swarm report (a 0.1 Mbit/s web seed: no 64 KiB piece
    within a second), the client leaves for the carousel without reading the partial
    file back piece by piece (in flash-crowd-50, 13 of the 17 leavers had 0% and each
    hashed the 50 MB sparse file on a saturated host before joining the carousel); its
    note says how long the swarm took to close."""
    pytest.importorskip("libtorrent")
    import pressrun.clients.swarm_handoff

    checked: list[int] = []
    real = pressrun.clients.swarm_handoff.still_good

    def counting(m: Any, path: Path, indices: Any) -> list[int]:
        indices = list(indices)
        checked.append(len(indices))
        return real(m, path, indices)

    monkeypatch.setattr(pressrun.clients.swarm_handoff, "still_good", counting)
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    result = await leave_swarm_for_carousel(pub, sender, CLIENT, web_seed_mbps=0.1)
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    note = result.swarm_note or ""
    assert result.left_swarm_for_carousel and note.startswith("left for the carousel with 0%")
    assert "; the swarm closed in " in note and "; 0 held pieces handed" in note, note
    # the receive began without a check; what the swarm completed while it closed is
    # read back, those pieces alone (`carousel_handover`)
    assert "checked in" not in note, note
    assert all(n < -(-SIZE // 65536) for n in checked), checked


async def test_a_carousel_reader_offers_what_it_holds_while_it_receives(
    tmp_path: Path,
    published: Callable[[int], Published],
    sender_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader resuming with half of the file, told ``multicast``, joins the swarm as
    it starts receiving a slow carousel (2 channels of 0.5 Mbit/s: the other half
    takes about 10 s) and offers the half it holds (`carousel_share`): a peer with no
    other source has pieces from it before the reader's carousel completed; then the
    same session seeds the rest and the peer completes. Before, the reader joined the
    swarm only once its copy was complete, and the peer had nothing until then."""
    pytest.importorskip("libtorrent")
    from pressrun.peer.config import desktop_profile

    pub = published(SIZE)
    half = resume_with_half(pub)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=0.5e6))
    await sender.start_carousel(ISSUE, sender.config.carousel)
    received_at = receive_ends(monkeypatch)
    progress: list[tuple[float, int]] = []

    def seen(p: SwarmProgress) -> None:
        progress.append((time.monotonic(), p.done_bytes))

    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    reader, result = await read_beside_a_peer(
        tmp_path,
        pub,
        sender,
        origin,
        replace(CLIENT, multicast_deadline_s=60.0, carousel_share=True),
        config=desktop_profile(max_seed_time_s=1.0, stall_after_s=60.0),
        on_progress=seen,
    )
    assert hashlib.sha256(reader.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    assert reader.mode == "multicast" and reader.resumed_bytes > 0
    assert reader.bytes_from_multicast > 0 and len(received_at) == 1
    # the peer had pieces from the reader before the reader's carousel completed
    before = [done for at, done in progress if at < received_at[0]]
    assert before and max(before) > 0, (progress, received_at)
    note = reader.multicast_note or ""
    assert f"shared while receiving: {half} pieces offered" in note, note
    # it took nothing from the swarm; the rest came from the same reader's seeding
    # (the peer has no other source)
    assert reader.bytes_from_peers == 0 and reader.bytes_from_web_seeds == 0
    assert result.completed and result.bytes_from_web_seeds == 0
    assert result.bytes_from_peers >= SIZE * 0.9, result
    assert reader.leave_rule is not None and reader.seeding_s > 0


async def test_a_sharing_peer_joins_the_webrtc_trackers_once_it_has_a_piece(
    tmp_path: Path, published: Callable[[int], Published]
) -> None:
    """The sharing session announces to the directive's tracker at once, and to its
    WebTorrent twin (where the browsers are) only once it has a piece to give: every
    offer that tracker relays costs the browser that answers it a WebRTC connection."""
    pytest.importorskip("libtorrent")
    from pressrun.content.bundle import read_manifest
    from pressrun.peer.config import desktop_profile
    from pressrun.peer.sharing import SharingPeer

    pub = published(SIZE)
    m = read_manifest(pub.content / ISSUE / "manifest.json")
    peer = SharingPeer(
        torrent=(pub.content / ISSUE / f"{ISSUE}.torrent").read_bytes(),
        manifest=m,
        partial_dir=tmp_path / "share",
        config=desktop_profile(ratio_basis_bytes=SIZE),
        tracker_url="http://127.0.0.1:9/announce",
        listen_interfaces="127.0.0.1:0",
    )
    try:
        await peer.share()
        assert peer.websocket_trackers == ["ws://127.0.0.1:9/webtorrent"]
        assert _trackers(peer) == ["http://127.0.0.1:9/announce"]
        offset, length = m.piece_span(3)
        peer.offer(3, pub.data[offset : offset + length])
        assert _trackers(peer) == ["http://127.0.0.1:9/announce", "ws://127.0.0.1:9/webtorrent"]
        # libtorrent writes and checks it on its own threads: 0.1-2 s on a quiet host,
        # over 2 s once in CI (29 Nov 08:23)
        deadline = time.monotonic() + 15.0
        while peer.held != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert peer.held == 1 and peer.offered == {3}
    finally:
        await peer.close()


async def test_a_piece_offered_as_soon_as_sharing_starts_is_held(
    tmp_path: Path, published: Callable[[int], Published]
) -> None:
    """libtorrent drops a piece handed to ``add_piece`` while it still checks the torrent
    it just added (``checking_resume_data``: 2 of 20 such pieces on 127.0.0.1, 29 Nov),
    and a sharing peer hands each piece once: `share` returns only once the check has
    ended, so a piece offered right after it is held (a carousel sharer's seeding once
    failed with "libtorrent took 16 of 31 pieces handed to it")."""
    pytest.importorskip("libtorrent")
    from pressrun.content.bundle import read_manifest
    from pressrun.peer.config import desktop_profile
    from pressrun.peer.sharing import CHECKING, SharingPeer

    pub = published(SIZE)
    m = read_manifest(pub.content / ISSUE / "manifest.json")
    offset, length = m.piece_span(3)
    for k in range(5):
        peer = SharingPeer(
            torrent=(pub.content / ISSUE / f"{ISSUE}.torrent").read_bytes(),
            manifest=m,
            partial_dir=tmp_path / f"share{k}",
            config=desktop_profile(ratio_basis_bytes=SIZE),
            tracker_url="http://127.0.0.1:9/announce",
            listen_interfaces="127.0.0.1:0",
        )
        try:
            await peer.share()
            assert peer._handle.status().state not in CHECKING
            peer.offer(3, pub.data[offset : offset + length])
            # written and checked on libtorrent's threads; a dropped piece never comes
            deadline = time.monotonic() + 30.0
            while peer.held != 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert peer.held == 1, f"sharing peer {k}: the piece offered was dropped"
        finally:
            await peer.close()


def _trackers(peer: Any) -> list[str]:
    return [str(t["url"]) for t in peer._handle.trackers()]


def resume_with_half(pub: Published) -> int:
    """Put the first half of ``pub``'s pieces in its library's partial file, verified
    (a download to resume); the number of pieces held."""
    from pressrun.clients.codec import ResumeState
    from pressrun.clients.library import Library
    from pressrun.content.bundle import read_manifest

    m = read_manifest(pub.content / ISSUE / "manifest.json")
    half = m.num_pieces // 2
    library = Library(pub.root / "library")
    partial = library.prepare_partial(ISSUE, m.file_name, m.size_bytes, pub.manifest_json, True)
    with open(partial, "r+b") as f:
        f.write(pub.data[: half * m.piece_size_bytes])
    library.save_state(
        ResumeState(
            issue_id=ISSUE,
            file_name=m.file_name,
            sha256=m.sha256,
            size_bytes=m.size_bytes,
            piece_size_bytes=m.piece_size_bytes,
            verified=frozenset(range(half)),
        )
    )
    return half


def receive_ends(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The monotonic times at which the client's carousel receives end (each receive
    thread's return), filled as they do."""
    import pressrun.clients.multicast_receive as receive_module

    received_at: list[float] = []
    receive = receive_module.receive_native_or_tunnelled

    def timed(*args: Any, **kwargs: Any) -> Any:
        try:
            return receive(*args, **kwargs)
        finally:
            received_at.append(time.monotonic())

    monkeypatch.setattr(receive_module, "receive_native_or_tunnelled", timed)
    return received_at


def carousel_beside_swarm(
    pub: Published, origin: RunningOrigin, sender: Any, tracker_url: str
) -> DemandPolicy:
    """A balancer's policy over ``origin`` that answers ``multicast`` with ``sender``'s
    carousel and names the issue's swarm at ``tracker_url`` beside it."""
    info_hash = json.loads(pub.manifest_json)["manifest"]["info_hash"]
    group = "{}:{}".format(*sender.config.control_group)
    return DemandPolicy(
        PEAK_AT_ONCE,
        {ISSUE: swarm_info_for(origin.url, tracker_url, ISSUE, info_hash)},
        {ISSUE: MulticastInfo(group, "127.0.0.1")},
    )
