"""A carousel reader in the issue's swarm while it receives (issue 28).

A reader that shares while it receives (``ClientConfig.carousel_share``, ``pressrun
get --share-while-receiving``; off by default, why there) and may seed
(`swarm_handoff.seeds_after_carousel`: the directive names a swarm, the link is not
metered, the seeding time is not 0) joins the directive's
swarm as soon as it starts receiving the carousel, not once the copy is complete: a
`pressrun.peer.sharing.SharingPeer` in a folder of its own beside the partial file
(``share/``), every piece at priority 0 but one no connected peer holds (not
upload-only: `pressrun.peer.sharing`) and no web seeds, so it downloads nothing (the
carousel is its source). It offers

- at once, the pieces it holds already and checked (from the swarm it left for the
  carousel, or a resumed download);
- while the carousel runs, each piece the decoder has written to the object's file
  and that verifies against the manifest: the file is read where it holds data
  (``SEEK_DATA``/``SEEK_HOLE``: the decoder writes each source block at its offset
  when it completes), every `WATCH_INTERVAL_S`, each piece checked once (a piece
  read while its block was being written is tried again, at most `MAX_CHECKS` times);
- when the carousel completes, every piece the client's check of the whole object
  verified (`finish`, read back from the partial file).

**On the issue's Chord ring** (the `chord` uploader policy) it reports the pieces it
offered to the supernodes that answer for them, as a swarm peer's ring client does
(`pressrun.peer.ring_client.RingClient`, fed from the pieces offered, their bytes as
downloaded, what it uploaded and its fastest upload), names no peers it serves (any
asker: it downloads nothing, so its upload slots are free), and asks the ring for
nothing. Without it the ring does not know it holds anything: the next readers' `chord`
policy holds off each piece only it has (a tree's first receivers, docs/chord.md) and
their feeds take those from the origins meanwhile, where the ring names them its
pieces' first receivers once it knows (measured for the origin reader's copy, which
shares through this class: `pressrun.clients.origin_seed`). The seeding's own ring
client takes over once the copy is complete (`seed`).

`seed` then hands the same session and torrent to the fair-exit rules
(`swarm_handoff.seed_after_carousel`): its connections and what it uploaded while
receiving carry over, the copy counting as downloaded as for any carousel copy
(``ratio_basis_bytes``). A carousel that falls back closes it (`close`).

Why: in flash-crowd-50 the phones (WebRTC readers the carousel does not reach) arrive
at 35-52 s, when the desktops have left the swarm and the carousel readers are still
receiving; they took 4.4-5.1% of the unicast-only twin's bytes from the origins' web
seeds (docs/results/2026-11-28-emulation-multicast-twin.md).

What it can offer while receiving depends on the carousel: with RaptorQ every channel
spreads each block's symbols over its whole cycle (`multicast.core.channel_cycles`), so
a reader completes every block at about the same time, at the end; the pieces held
from the swarm are what it offers before that (the measurement in the results file).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pressrun.clients.codec import DirectiveSwarm
from pressrun.clients.session import FetchState, describe
from pressrun.clients.swarm_handoff import (
    _listen_interfaces,
    _peer_config,
    _torrent,
    seeds_after_carousel,
)
from pressrun.content.codec import piece_ok
from pressrun.content.manifest import Manifest

if TYPE_CHECKING:
    from pressrun.peer.results import SwarmResult
    from pressrun.peer.ring_client import RingClient
    from pressrun.peer.sharing import SharingPeer

log = logging.getLogger("pressrun.clients.carousel_share")

__all__ = ["SHARE_DIR", "CarouselShare", "data_spans", "decoded_pieces"]

#: the sharing peer's folder beside the partial file (its own copy of the pieces)
SHARE_DIR = "share"
#: how often the decoder's file is looked at while the carousel runs
WATCH_INTERVAL_S = 1.0
#: times a piece inside written data is checked before it is given up (a piece read
#: while its block was being written fails once; a poisoned one every time)
MAX_CHECKS = 3
#: pieces read from the partial file and handed over per call of the worker thread
#: at the end (the loop runs between them)
FINISH_BATCH = 64


def data_spans(path: Path) -> list[tuple[int, int]]:
    """The (start, end) byte ranges of ``path`` that hold data, by ``SEEK_DATA`` and
    ``SEEK_HOLE`` (a file system without them reports the whole file as data)."""
    spans: list[tuple[int, int]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        at = 0
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past `at`
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            spans.append((start, end))
            at = end
    finally:
        os.close(fd)
    return spans


def decoded_pieces(
    m: Manifest, path: Path, skip: set[int], checks: dict[int, int]
) -> list[tuple[int, bytes]]:
    """The pieces of ``path`` (the decoder's object file) that lie wholly in its data
    and verify against the manifest, with their bytes; not those in ``skip`` nor
    those checked `MAX_CHECKS` times already (``checks`` counts the failed checks,
    bounded by the manifest's pieces). Blocking: for a worker thread."""
    found: list[tuple[int, bytes]] = []
    spans = data_spans(path)
    if not spans:
        return found
    with open(path, "rb") as f:
        for start, end in spans:
            first = start // m.piece_size_bytes
            for index in range(first, m.num_pieces):
                offset, length = m.piece_span(index)
                if offset >= end:
                    break
                if offset < start or offset + length > end:
                    continue
                if index in skip or checks.get(index, 0) >= MAX_CHECKS:
                    continue
                f.seek(offset)
                data = f.read(length)
                if piece_ok(m, index, data):
                    found.append((index, data))
                else:
                    checks[index] = checks.get(index, 0) + 1
    return found


def _read_pieces(m: Manifest, path: Path, indices: Iterable[int]) -> list[tuple[int, bytes]]:
    """Pieces ``indices`` of ``path`` with their bytes (checked before). Blocking."""
    with open(path, "rb") as f:
        out: list[tuple[int, bytes]] = []
        for index in indices:
            offset, length = m.piece_span(index)
            f.seek(offset)
            out.append((index, f.read(length)))
        return out


@dataclass
class CarouselShare:
    """One carousel reader's sharing peer while it receives (the module docstring).
    `start` it, `stop_watching` when the carousel ends, then `finish` and `seed`, or
    `close`."""

    f: FetchState
    m: Manifest
    path: Path  # the partial file
    swarm: DirectiveSwarm
    work_dir: Path  # the carousel decoder's folder
    kept: list[int]
    peer: SharingPeer | None = None
    #: pieces offered before the carousel completed (held before, or decoded)
    offered_while_receiving: int = 0
    #: payload uploaded while the carousel ran (the peer's all-time upload then)
    uploaded_while_receiving: int = 0
    #: why it stopped sharing before the seeding, if it did
    failed: str | None = None
    #: its reports to the issue's Chord ring while it shares (None: no ring, or not yet)
    ring: RingClient | None = None
    _ring_tried: bool = False
    _peak_upload_bps: int = 0
    _upload_seen: tuple[float, int] | None = None
    #: when its first look ran (the sharing lines' clock)
    _began: float = 0.0
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _checks: dict[int, int] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        f: FetchState,
        m: Manifest,
        path: Path,
        swarm: DirectiveSwarm | None,
        work_dir: Path,
        kept: list[int],
    ) -> CarouselShare | None:
        """Join the swarm beside the carousel (in a task of its own) when this client
        shares while it receives (``ClientConfig.carousel_share``) and may seed; None
        otherwise (not asked, metered, ``--max-seed-s 0``, no swarm)."""
        if (
            swarm is None
            or not f.config.carousel_share
            or not seeds_after_carousel(f.config, swarm)
        ):
            return None
        share = cls(f, m, path, swarm, work_dir, list(kept))
        share._task = f.loop.create_task(share._run())
        return share

    @property
    def share_dir(self) -> Path:
        return self.path.parent / SHARE_DIR

    async def _run(self) -> None:
        from pressrun.peer.sharing import SharingPeer  # libtorrent: only when needed
        from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY

        f, m = self.f, self.m
        torrent, reason = await _torrent(f, m, self.swarm)
        if torrent is None:
            self.failed = f"cannot get the torrent ({reason})"
            return
        # a folder of its own: a copy left by an earlier run is not trusted
        await asyncio.to_thread(shutil.rmtree, self.share_dir, True)
        policy = f.config.uploader_policy or DEFAULT_UPLOADER_POLICY
        try:
            peer = SharingPeer(
                torrent=torrent,
                manifest=m,
                partial_dir=self.share_dir,
                config=_peer_config(f, ratio_basis_bytes=m.size_bytes),
                tracker_url=self.swarm.tracker_url,
                listen_interfaces=await _listen_interfaces(policy, self.swarm.tracker_url),
                uploader_policy=policy,
            )
            self.peer = peer
            f.swarm_peers.append(peer)
            await peer.share()
            if self.kept:
                for index, data in await asyncio.to_thread(_read_pieces, m, self.path, self.kept):
                    peer.offer(index, data)
            while not self._stop.is_set():
                await self._offer_decoded(peer)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), WATCH_INTERVAL_S)
        except Exception as err:  # sharing is an extra: the carousel goes on
            self.failed = describe(err)
            log.info("%s: not sharing while receiving: %s", m.issue_id, self.failed)

    async def _offer_decoded(self, peer: SharingPeer) -> None:
        """Offer the pieces the decoder has written since the last look, and tell the
        ring."""
        before = len(peer.offered)
        objects = await asyncio.to_thread(lambda: sorted(self.work_dir.glob("*.object")))
        for obj in objects:
            try:
                found = await asyncio.to_thread(
                    decoded_pieces, self.m, obj, set(peer.offered), self._checks
                )
            except OSError:  # the object ended (renamed or removed) meanwhile
                continue
            for index, data in found:
                peer.offer(index, data)
        self._tell_ring(peer, len(peer.offered) > before)

    def _tell_ring(self, peer: SharingPeer, offered_more: bool) -> None:
        """At each look: start the ring reports (the first time), note the fastest
        upload, and run a report soon when it offered more."""
        if not self._ring_tried:
            self._ring_tried = True
            self.ring = self._ring_client(peer)
            self._began = self.f.now()
        self._look_at_upload(peer)
        with contextlib.suppress(Exception):  # (a line in the log: never the sharing's end)
            peer.note_connections(self.f.now() - self._began)
        if offered_more and self.ring is not None:
            self.ring.nudge()

    def _ring_client(self, peer: SharingPeer) -> RingClient | None:
        """The sharing session's reports to the ring (started), or None when the
        uploader policy asks no ring or the session has no address yet."""
        from pressrun.peer.chord_policy import ChordPolicy
        from pressrun.peer.ring_client import RingClient
        from pressrun.peer.ring_link import ring_endpoint
        from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY, make_uploader_policy

        name = self.f.config.uploader_policy or DEFAULT_UPLOADER_POLICY
        self.f.uploader_policy = name  # the swarm is used: its policy is reported, as its ring
        policy = make_uploader_policy(name)
        if not isinstance(policy, ChordPolicy) or peer.listen_port is None:
            return None
        # the address it listens on (`swarm_handoff._listen_interfaces`: the one the
        # tracker is reached from, with a ring), as a swarm peer's ring client says
        base, address = ring_endpoint(
            self.swarm.tracker_url, peer.listen_interfaces, peer.listen_port
        )
        m, n = self.m, self.m.num_pieces
        ring = RingClient(
            tracker_base=base,
            info_hash=m.info_hash,
            num_pieces=n,
            peer_id=peer._peer_id,
            address=address,
            policy=policy,
            have=lambda: [i in peer.offered for i in range(n)],
            unheld=tuple,  # it asks the ring for nothing: its own source brings the rest
            # (what it holds counts as downloaded: its upload is what it pays back)
            totals=lambda: (
                self._uploaded(peer),
                sum(m.piece_span(i)[1] for i in peer.offered),
            ),
            connect=lambda host, port: None,  # (named for nothing it asked)
            upload_bps=lambda: self._peak_upload_bps,
            missing=lambda: n - len(peer.offered),
            # it serves any asker (said by naming none: few ask a peer that
            # downloads nothing, and its upload slots are free)
            unchoked=lambda: None,
        )
        ring.start()
        return ring

    def _uploaded(self, peer: SharingPeer) -> int:
        with contextlib.suppress(Exception):  # (a session closing)
            return peer.uploaded_bytes
        return 0

    def _look_at_upload(self, peer: SharingPeer) -> None:
        """Note its fastest upload so far (over the time since the last look), for the
        ring's reports."""
        now, up = self.f.now(), self._uploaded(peer)
        if self._upload_seen is not None and now > self._upload_seen[0]:
            rate = (up - self._upload_seen[1]) / (now - self._upload_seen[0])
            self._peak_upload_bps = max(self._peak_upload_bps, int(rate))
        self._upload_seen = (now, up)

    async def _close_ring(self) -> None:
        """Stop the reports (no ``left``: the seeding's own ring client reports the
        same peer as a seed next, or the supernodes forget it)."""
        ring, self.ring = self.ring, None
        if ring is not None:
            await ring.close()

    async def stop_watching(self) -> None:
        """The carousel ended: stop reading the decoder's file (its folder is removed
        next) and note what was offered and uploaded while receiving."""
        await self._end_task()
        if self.peer is not None:
            self.offered_while_receiving = len(self.peer.offered)
            with contextlib.suppress(Exception):
                self.uploaded_while_receiving = self.peer.uploaded_bytes

    async def _end_task(self) -> None:
        """End the task: its watch loop ends after the look under way (which reads
        the decoder's folder: it must end before that is removed); a torrent fetch or a
        session start still under way is cancelled."""
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        if self.peer is None or not self.peer.sharing:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @property
    def sharing(self) -> bool:
        """The peer is in the swarm and takes pieces."""
        return self.peer is not None and self.peer.sharing and self.failed is None

    def describe(self) -> str:
        """What it did while the carousel ran, for the multicast note."""
        if self.failed is not None:
            return f"not shared while receiving: {self.failed}"
        return (
            f"shared while receiving: {self.offered_while_receiving} pieces offered, "
            f"{self.uploaded_while_receiving / 1e6:.1f} MB uploaded"
        )

    async def finish(self, good: list[int]) -> None:
        """The carousel completed the copy: hand the peer every piece of ``good``
        (verified) it has not had, read back from the partial file in batches."""
        peer = self.peer
        if peer is None or not self.sharing:
            return
        rest = [i for i in good if i not in peer.offered]
        for at in range(0, len(rest), FINISH_BATCH):
            batch = rest[at : at + FINISH_BATCH]
            for index, data in await asyncio.to_thread(_read_pieces, self.m, self.path, batch):
                peer.offer(index, data)

    async def seed(self) -> SwarmResult:
        """Seed by the fair-exit rules in the same session (`SharingPeer.seed`), every
        piece handed over first (`finish`); the peer is closed after."""
        assert self.peer is not None
        try:
            await self.finish(list(range(self.m.num_pieces)))
            await self._close_ring()  # (the seeding's own ring client takes over)
            return await self.peer.seed()
        finally:
            await self.close()

    async def close(self) -> None:
        """Leave the swarm (the carousel fell back, or the seeding ended)."""
        await self._end_task()
        await self._close_ring()
        peer, self.peer = self.peer, None
        if peer is not None:
            await peer.close()
