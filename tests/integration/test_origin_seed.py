"""An origin reader's copy serves the swarm (issue 28, `pressrun.clients.origin_seed`),
on 127.0.0.1 with real libtorrent: a loopback swarm (tracker, one origin capped at
8 Mbit/s, a published issue), a balancer that answers ``origin`` (demand below the
swarm's threshold) naming the issue's swarm, a reader fetching through it, and a swarm
peer that joins once the reader holds a third of the file; and the same with the
issue's Chord ring, where the reader reports what it holds to the supernodes.

Before, an origin-mode copy never joined the swarm: in flash-crowd-50-desktops the
second reader (in the swarm 7.5 s after the first, which held 19 MB then) took its
whole copy from the origins' web seeds, 0 bytes from peers (session 22, runs E2, F1,
F2)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pressrun.balancer.demand import DemandConfig
from pressrun.clients.aio import FetchResult, fetch_issue
from pressrun.clients.codec import decode_directive
from pressrun.clients.config import DESKTOP
from pressrun.peer.loopback import LoopbackSwarm, loopback_swarm
from pressrun.peer.results import SwarmResult

from .test_chord_ring import ring_state, start_supernode
from .test_swarm_path import swarm_balancer

PIECE = 64 * 1024
SIZE = 6 * 1024 * 1024 + 321
#: the origins' answer whatever the demand: the swarm's threshold is never reached
NEVER_SWARM = DemandConfig(enter_downloaders=1e6, leave_downloaders=1e5, min_dwell_s=0)
READER = replace(
    DESKTOP,
    stall_timeout_s=5.0,
    retry_backoff_s=0.05,
    retry_backoff_max_s=0.5,
    swarm_max_seed_s=20.0,
)


class Watch:
    """The reader's progress: set once it holds ``at_bytes``."""

    def __init__(self, at_bytes: int) -> None:
        self.at_bytes = at_bytes
        self.reached = asyncio.Event()
        #: set once the reader holds the whole file
        self.whole = asyncio.Event()
        self.total_bytes = 0
        self.notices: list[str] = []

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        self.total_bytes = total_bytes

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        if done_bytes >= self.at_bytes:
            self.reached.set()
        if self.total_bytes and done_bytes >= self.total_bytes:
            self.whole.set()

    def notice(self, text: str) -> None:
        self.notices.append(text)


class Connection:
    """Whether a swarm peer is connected to another BitTorrent peer (not a web seed),
    sampled every `SAMPLE_S` from its libtorrent handle from its first such connection
    until ``until`` is set."""

    SAMPLE_S = 0.1

    def __init__(self) -> None:
        self.samples: list[bool] = []

    async def sample(self, peer: Any, until: asyncio.Event) -> None:
        import libtorrent as lt

        while not until.is_set():
            handle = peer._handle
            if handle is not None:
                peers = [
                    p
                    for p in handle.get_peer_info()
                    if p.connection_type == lt.peer_info.standard_bittorrent
                ]
                if peers or self.samples:
                    self.samples.append(bool(peers))
            await asyncio.sleep(self.SAMPLE_S)

    @property
    def share(self) -> float:
        """The share of samples with a peer connected (0 with none)."""
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


async def read_then_next(
    swarm: LoopbackSwarm, library: Path, connection: Connection | None = None
) -> tuple[Watch, FetchResult, SwarmResult, int]:
    """Through a balancer that answers ``origin``, a reader fetches the issue into
    ``library``; a swarm peer (the `chord` policy) joins once the reader holds a third
    of the file, its web seed the origin the reader downloads from. The reader's
    progress, its result, the peer's, and the bytes the origins sent. ``connection``:
    sampled on the peer until the reader holds the whole file."""
    from pressrun.peer.config import desktop_profile

    balancer = await swarm_balancer(swarm, swarm.tracker_url, NEVER_SWARM)
    try:
        url = f"{balancer.url}/v1/issues/{swarm.issue_id}/directive"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            directive = decode_directive(await resp.read())
        # an origin directive names the swarm the copy is to seed, and is not one
        # that sends the reader there
        assert directive.mode == "origin" and directive.swarm is None
        assert directive.seed_swarm is not None
        assert directive.seed_swarm.tracker_url == swarm.tracker_url

        watch = Watch(SIZE // 3)
        reading = asyncio.ensure_future(
            fetch_issue(
                swarm.issue_id,
                balancer_url=balancer.url,
                library=library,
                config=READER,
                trusted_keys={swarm.manifest.publisher_key_bytes},
                progress=watch,
            )
        )
        await asyncio.wait_for(watch.reached.wait(), 30.0)
        peer = swarm.new_peer(1, desktop_profile(max_seed_time_s=1.0), uploader_policy="chord")
        sampling = None
        if connection is not None:
            sampling = asyncio.ensure_future(connection.sample(peer, watch.whole))
        try:
            await peer.start()
            assert await asyncio.wait_for(peer.downloaded(), 60.0)
            other = await peer.stop()
        finally:
            watch.whole.set()
            if sampling is not None:
                await sampling
            await peer.close()
        reader = await asyncio.wait_for(reading, 60.0)
    finally:
        await balancer.stop()
    return watch, reader, other, swarm.origin_bytes_sent()


def check(
    swarm: LoopbackSwarm,
    library: Path,
    watch: Watch,
    reader: FetchResult,
    other: SwarmResult,
    sent: int,
) -> None:
    # the reader: from the origins, but what it took from the next reader (each piece
    # once: clients/swarm_take.py), installed before its seeding
    assert reader.mode == "origin"
    assert sum(reader.bytes_by_origin.values()) + reader.bytes_from_peers == SIZE
    path = library / swarm.issue_id / swarm.manifest.file_name
    assert path.read_bytes() == swarm.data
    assert reader.seeding_s > 0 and reader.ready_s is not None
    assert reader.ready_s < reader.seconds
    # the next reader took pieces from it ...
    assert other.completed
    assert other.bytes_from_peers >= SIZE // 4, other
    # ... and the origin sent that much less: the reader's copy and the rest
    assert sent <= SIZE + (SIZE - other.bytes_from_peers) + 8 * PIECE, (sent, other)
    assert any("the origin copy in the swarm" in n for n in watch.notices), watch.notices


async def test_an_origin_readers_copy_serves_the_next_readers_pieces(tmp_path: Path) -> None:
    """No ring (the `chord` policy is `stripes` then): before, 0 bytes from the reader
    (nobody else was in the swarm) and 12.6 MB from the origin."""
    pytest.importorskip("libtorrent")
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(8.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        got = await read_then_next(swarm, tmp_path / "lib")
    check(swarm, tmp_path / "lib", *got)


async def test_on_the_ring_the_next_reader_is_named_the_origin_readers_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the issue's Chord ring (two supernode processes) and the reader's upload
    slower than the origin, as in flash-crowd-50-desktops (20 Mbit/s up against the
    origins' 6 MB/s): unless the reader reports its pieces to the ring, the next
    reader holds off each piece only it has (the tree rule) and takes it from the
    origin meanwhile (without the reports, 5 runs on 29 Nov: 0.31-0.66 MB from the
    reader, the origin 12.0-12.4 MB; with them 2.56-3.69 MB, 8.9-10.0 MB)."""
    pytest.importorskip("libtorrent")
    slower_upload(monkeypatch, 600_000)
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(8.0,), piece_size=PIECE, tracker_interval_s=2
    ) as swarm:
        got = await on_the_ring(swarm, tmp_path)
    check(swarm, tmp_path / "lib", *got)


#: the issue of the test below: 16 MiB
LARGER = 16 * 1024 * 1024 + 321


async def test_the_next_reader_keeps_its_connection_to_the_origin_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rates of flash-crowd-50-desktops' first two readers, scaled down: the origin
    gives the next reader's feed about 2.5 times the origin reader's upload (1 MB/s
    here; there 6 MB/s against 20 Mbit/s). The next reader (`chord`) holds off each
    piece only the origin reader has until the ring names it a first receiver, so it is
    not interested in it at first; the origin reader's sharing session, every piece it
    lacked at priority 0, was "finished" and said upload-only in its handshake, and the
    next reader closed the connection ("uninteresting upload-only peer") 0.5 s after it
    opened, each time the sharer came back (2 s later). In 5 runs before (29 Nov
    11:51-11:54), the next reader had the origin reader connected in 18-73% of its
    samples (22% at the median) and took 0.2-5.6 MB from it (0.4 at the median); with
    one piece kept wanted, 100% in 5 of 5 and 4.8-5.3 MB."""
    pytest.importorskip("libtorrent")
    slower_upload(monkeypatch, 1_000_000)
    async with loopback_swarm(
        tmp_path,
        size_bytes=LARGER,
        origin_cap_mbps=(40.0,),
        piece_size=PIECE,
        tracker_interval_s=2,
    ) as swarm:
        connection = Connection()
        watch, reader, other, _sent = await on_the_ring(swarm, tmp_path, connection)
    assert reader.mode == "origin" and reader.ready_s is not None
    assert other.completed
    # connected from its first connection on, while the reader downloaded
    assert len(connection.samples) >= 10, connection.samples
    assert connection.share >= 0.9, connection.samples
    # (and so it took pieces from it, before the reader's seeding too)
    assert other.bytes_from_peers >= 4 * PIECE, other
    notes = [n for n in watch.notices if "the origin copy in the swarm" in n]
    assert notes and " 0.0 MB uploaded while downloading" not in notes[0], notes


def slower_upload(monkeypatch: pytest.MonkeyPatch, upload_bps: int) -> None:
    """The origin reader's sharing session uploads at most ``upload_bps``."""
    import pressrun.clients.carousel_share

    real = pressrun.clients.carousel_share._peer_config

    def limited(f: Any, **extra: Any) -> Any:
        return real(f, upload_limit_bps=upload_bps, **extra)

    monkeypatch.setattr(pressrun.clients.carousel_share, "_peer_config", limited)


async def on_the_ring(
    swarm: LoopbackSwarm, tmp_path: Path, connection: Connection | None = None
) -> tuple[Watch, FetchResult, SwarmResult, int]:
    """`read_then_next` with the issue's Chord ring: two supernode processes, on the
    ring and answering for every piece before the reader starts."""
    assert swarm.tracker is not None
    swarm.tracker.ring.expected_supernodes = 2
    torrent = tmp_path / "issue.torrent"
    torrent.write_bytes(swarm.torrent)
    procs = [await start_supernode(swarm.tracker_base, torrent) for _ in range(2)]
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):  # the ring forms: its arcs cover every piece once
                states = [await ring_state(http, address) for _, address in procs]
                if all(s["phase"] == "on_ring" for s in states) and (
                    sum(int(str(s["pieces"])) for s in states) == swarm.manifest.num_pieces
                ):
                    break
                await asyncio.sleep(0.2)
        return await read_then_next(swarm, tmp_path / "lib", connection)
    finally:
        for proc, _ in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
