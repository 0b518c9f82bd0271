"""A carousel reader sharing while it receives (`pressrun.clients.carousel_share`)
reports the pieces it offered to the issue's Chord ring, as the origin reader's copy
does (518bfb7), on 127.0.0.1 with real libtorrent sessions, two supernode processes and
a FLUTE carousel. Before, the carousel reader's sharing session reported nothing: the
supernodes did not know it held anything, and answered the next reader (the `chord`
policy) ``bring_in`` or ``wait`` for each piece only it held, which that reader held off
(the tree rule) meanwhile."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from integration.test_chord_ring import ring_state, start_supernode
from pressrun.multicast.config import CarouselConfig
from pressrun.origin import OriginConfig, start_origin

from .conftest import ISSUE, Published, fetch_through_balancer, multicast_client
from .test_seed_after_carousel import (
    SIZE,
    carousel_beside_swarm,
    receive_ends,
    resume_with_half,
)


async def test_on_the_ring_the_supernodes_know_what_a_carousel_reader_shares(
    tmp_path: Path,
    published: Callable[[int], Published],
    sender_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader resuming with half of the file, told ``multicast``, shares while it
    receives a slow carousel (2 channels of 0.5 Mbit/s: the other half takes about
    10 s); a `chord` peer with no other source joins the swarm meanwhile. While the
    carousel runs, a supernode knows two holders, the peer (it asks) and the reader
    (it reports); before, only the peer (29 Nov: 3 of 3 runs against 2 of 2)."""
    pytest.importorskip("libtorrent")
    from pressrun.content.bundle import read_manifest
    from pressrun.peer.aio import SwarmPeer
    from pressrun.peer.config import desktop_profile
    from pressrun.peer.loopback import OPERATOR_TOKEN
    from pressrun.security import ServiceSecurity
    from pressrun.tracker.aio import TrackerService
    from pressrun.tracker.config import TrackerConfig
    from pressrun.tracker.core import TrackerCore
    from pressrun.tracker.sqlite_store import SqliteStore

    pub = published(SIZE)
    m = read_manifest(pub.content / ISSUE / "manifest.json")
    half = resume_with_half(pub)
    received_at = receive_ends(monkeypatch)

    tracker = TrackerService(
        TrackerCore(TrackerConfig(interval_s=2, min_interval_s=1), random.Random(7)),
        SqliteStore(tmp_path / "tracker.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )
    port = await tracker.start("127.0.0.1", 0)
    tracker_base, tracker_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/announce"
    tracker.ring.expected_supernodes = 2
    torrent = pub.content / ISSUE / f"{ISSUE}.torrent"
    procs: list[tuple[asyncio.subprocess.Process, str]] = []
    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    # the holders each supernode knows (its reporters and askers), and when
    known: list[tuple[float, int]] = []
    other: SwarmPeer | None = None
    watching: asyncio.Future[None] | None = None
    done = asyncio.Event()

    async def holders() -> None:
        async with aiohttp.ClientSession() as http:
            while not done.is_set():
                for _, address in procs:
                    state = await ring_state(http, address)
                    known.append((time.monotonic(), int(str(state["holders"]))))
                await asyncio.sleep(0.2)

    try:
        for _ in range(2):
            procs.append(await start_supernode(tracker_base, torrent))
        async with aiohttp.ClientSession() as http:
            for _ in range(300):  # the ring forms: its arcs cover every piece once
                states = [await ring_state(http, address) for _, address in procs]
                if all(s["phase"] == "on_ring" for s in states) and (
                    sum(int(str(s["pieces"])) for s in states) == m.num_pieces
                ):
                    break
                await asyncio.sleep(0.2)
        sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=0.5e6))
        await sender.start_carousel(ISSUE, sender.config.carousel)
        other = SwarmPeer(
            torrent=torrent.read_bytes(),
            manifest=m,
            partial_dir=tmp_path / "other" / ".partial" / ISSUE,
            config=desktop_profile(max_seed_time_s=1.0, stall_after_s=60.0),
            tracker_url=tracker_url,
            listen_interfaces="127.0.0.1:0",
            uploader_policy="chord",
        )
        await other.start()
        policy = carousel_beside_swarm(pub, origin, sender, tracker_url)
        watching = asyncio.ensure_future(holders())
        client = multicast_client(
            60.0,
            swarm_max_seed_s=30.0,
            carousel_share=True,
            uploader_policy="chord",
        )
        reader, got = await asyncio.gather(
            fetch_through_balancer(ISSUE, origin, policy, client, publisher=pub),
            asyncio.wait_for(other.downloaded(), 90.0),
        )
        assert got
        result = await other.stop()
    finally:
        done.set()
        if watching is not None:
            await watching
        if other is not None:
            await other.close()
        await origin.stop()
        await tracker.close()
        for proc, _ in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    assert reader.mode == "multicast" and reader.resumed_bytes > 0
    assert len(received_at) == 1
    note = reader.multicast_note or ""
    assert f"shared while receiving: {half} pieces offered" in note, note
    assert result.completed and result.bytes_from_peers >= SIZE * 0.9, result
    # while the carousel ran, a supernode knew two holders: the peer, which asks, and
    # the reader, which reports the pieces it offered (before: the peer only)
    before = [n for at, n in known if at < received_at[0]]
    assert before and max(before) >= 2, (known, received_at)
