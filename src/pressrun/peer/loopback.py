"""A whole swarm on one machine: tracker, capped origins, a published issue, N peers.

Used by the swarm tests (tests/peer/), `bench/swarm.py` and anything that wants a
real swarm on 127.0.0.1 with ephemeral ports: every peer is a real libtorrent session
(about 4 MB each, so dozens fit in one process; FIELD-NOTES.md), the tracker is
`pressrun.tracker`'s service on SQLite, the origins are `pressrun.origin` with their
egress token bucket, the issue is made by `pressrun.content.publish`.

    async with loopback_swarm(work_dir, size_bytes=..., origin_cap_mbps=16) as swarm:
        results = await swarm.run_peers(20, desktop_profile())
        swarm.origin_bytes_sent()   # the origins' own counters
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pressrun.content.bundle import read_manifest
from pressrun.content.codec import Manifest
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import DEFAULT_PIECE_SIZE, SubscriberDirectory, publish
from pressrun.origin.aio import RunningOrigin, start_origin
from pressrun.origin.config import OriginConfig
from pressrun.peer.aio import SwarmPeer, SwarmResult
from pressrun.peer.config import PeerConfig
from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY
from pressrun.security import ServiceSecurity
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore


@dataclass
class LoopbackSwarm:
    """The running pieces of a loopback swarm."""

    work_dir: Path
    issue_id: str
    data: bytes
    manifest: Manifest
    torrent: bytes
    origins: list[RunningOrigin]
    tracker: TrackerService | None
    tracker_port: int
    tracker_db: Path
    tracker_config: TrackerConfig
    peers: list[SwarmPeer] = field(default_factory=list)

    @property
    def tracker_url(self) -> str:
        """The announce URL every peer uses."""
        return f"http://127.0.0.1:{self.tracker_port}/announce"

    @property
    def tracker_base(self) -> str:
        """``http://127.0.0.1:PORT`` of the tracker."""
        return f"http://127.0.0.1:{self.tracker_port}"

    def origin_bytes_sent(self) -> int:
        """Bytes every origin sent since it started (their own counters)."""
        return sum(o.service.meter.bytes_sent_total for o in self.origins)

    def new_peer(self, index: int, config: PeerConfig, **kwargs: Any) -> SwarmPeer:
        """A peer (not started) with its own folder ``work_dir/peers/<index>``."""
        peer = SwarmPeer(
            torrent=self.torrent,
            manifest=self.manifest,
            partial_dir=self.work_dir / "peers" / str(index) / ".partial" / self.issue_id,
            config=config,
            tracker_url=self.tracker_url,
            listen_interfaces="127.0.0.1:0",
            **kwargs,
        )
        self.peers.append(peer)
        return peer

    async def run_peer(self, peer: SwarmPeer, *, delay_s: float = 0.0) -> SwarmResult:
        """Start a peer after ``delay_s``, download, seed by the rules, leave."""
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        try:
            await peer.start()
            if not await peer.downloaded():
                return await peer.stop()
            return await peer.finished()
        finally:
            await peer.close()

    async def run_peers(
        self,
        n: int,
        config: PeerConfig,
        *,
        spread_s: float = 0.0,
        seed: int = 1,
        uploader_policy: str = DEFAULT_UPLOADER_POLICY,
    ) -> list[SwarmResult]:
        """N peers arriving within ``spread_s`` seconds (uniformly, seeded); all results.

        Every peer's session is made and listening before the first one arrives (their
        machines are on; arriving is asking for the issue): the sessions are made one
        after the other in this one process, 20 to 40 ms each, and otherwise the first
        peers' clocks would run while the last ones do not exist yet (1.7 s at N = 40,
        docs/chord.md "Benches")."""
        rng = random.Random(seed)
        delays = sorted(rng.uniform(0, spread_s) for _ in range(n))
        peers = [
            self.new_peer(len(self.peers), config, uploader_policy=uploader_policy)
            for _ in range(n)
        ]
        for peer in peers:
            await peer.open()
        return list(
            await asyncio.gather(
                *(self.run_peer(p, delay_s=d) for p, d in zip(peers, delays, strict=True))
            )
        )

    async def stop_tracker(self) -> None:
        """Stop the tracker (its state stays in the SQLite file)."""
        if self.tracker is not None:
            await self.tracker.close()
            self.tracker = None

    async def start_tracker(self) -> None:
        """(Re)start the tracker on the same port from its SQLite file."""
        self.tracker = _tracker(self.tracker_db, self.tracker_config)
        self.tracker_port = await self.tracker.start("127.0.0.1", self.tracker_port)


#: the loopback tracker's operator token (its /v1/swarms needs it)
OPERATOR_TOKEN = "loopback-operator-token"


def _tracker(db: Path, config: TrackerConfig) -> TrackerService:
    return TrackerService(
        TrackerCore(config, random.Random(7)),
        SqliteStore(db, flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )


@contextlib.asynccontextmanager
async def loopback_swarm(
    work_dir: Path,
    *,
    size_bytes: int,
    origin_cap_mbps: Sequence[float | None] = (16.0,),
    piece_size: int = DEFAULT_PIECE_SIZE,
    issue_id: str = "swarm-issue",
    tracker_interval_s: int = 5,
    seed: int = 47,
    encrypt_for: SubscriberDirectory | None = None,
) -> AsyncIterator[LoopbackSwarm]:
    """Publish an issue of ``size_bytes`` and serve it: one origin per cap (megabits/s,
    None: uncapped), all of them the torrent's web seeds, and a tracker.
    ``encrypt_for``: publish it encrypted for that directory's subscribers (the swarm
    then carries ciphertext)."""
    content = work_dir / "content"
    content.mkdir(parents=True, exist_ok=True)
    origins: list[RunningOrigin] = []
    tracker: TrackerService | None = None
    swarm: LoopbackSwarm | None = None
    try:
        for i, cap in enumerate(origin_cap_mbps):
            origins.append(
                await start_origin(
                    OriginConfig(content_dir=content, name=f"origin-{i}", egress_cap_mbps=cap)
                )
            )
        tconfig = TrackerConfig(interval_s=tracker_interval_s, min_interval_s=1)
        db = work_dir / "tracker.db"
        tracker = _tracker(db, tconfig)
        tport = await tracker.start("127.0.0.1", 0)
        source = work_dir / f"{issue_id}.pdf"
        data = random.Random(seed).randbytes(size_bytes)
        source.write_bytes(data)
        secret, _public = generate_keypair(work_dir / "publisher.key")
        # in a thread: an encrypted publish calls the subscription service, which may
        # be served by this very event loop
        bundle = await asyncio.to_thread(
            publish,
            source,
            issue_id=issue_id,
            title=issue_id,
            key_path=secret,
            content_dir=content,
            web_seeds=[o.url for o in origins],
            trackers=[f"http://127.0.0.1:{tport}/announce"],
            piece_size=piece_size,
            encrypt_for=encrypt_for,
        )
        manifest = read_manifest(bundle / "manifest.json")
        torrent = (bundle / f"{issue_id}.torrent").read_bytes()
        swarm = LoopbackSwarm(
            work_dir=work_dir,
            issue_id=issue_id,
            data=data,
            manifest=manifest,
            torrent=torrent,
            origins=origins,
            tracker=tracker,
            tracker_port=tport,
            tracker_db=db,
            tracker_config=tconfig,
        )
        yield swarm
    finally:
        if swarm is not None:
            await asyncio.gather(*(p.close() for p in swarm.peers), return_exceptions=True)
            tracker = swarm.tracker
        if tracker is not None:
            await tracker.close()
        for origin in origins:
            await origin.stop()
