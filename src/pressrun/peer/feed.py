"""The owed-piece feed: pieces of the policy's plan that no connected peer holds,
fetched from the origins by the peer itself.

For a policy that fetches its owed pieces itself (`UploaderPolicy.fetches_owed_pieces`):
one HTTP range request at a time for a piece of its plan that no connected peer holds,
checked against the manifest's SHA-256, handed to libtorrent (``add_piece``: it checks
the torrent's SHA-1, writes it and tells the peers). libtorrent's own web-seed picking
cannot be held to a plan: it finishes partial pieces and extends ranges first
(docs/swarm.md).

**Two requests at a time while the origins have room** (``parallel``, set at every
status poll: `pressrun.peer.status`): one request at a time waits a round trip and
the server's first byte between two pieces, and a peer that takes a whole small issue
from the origins (the first swarm client of `make emulate SCENARIO=small`: 31 pieces
of 128 KiB on a 20 Mbit/s link) took 3.1 s where the origin client, one request for
the whole file, took 2.0 s. Where the origins are busy (no room: their egress shared
among many fetches, the loopback bench) a second request would only split this
peer's share of it, and a piece would arrive later: one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from pressrun.content.codec import Manifest
from pressrun.content.manifest import piece_ok
from pressrun.security import BodyTooLarge, client_connector, read_body_limited

log = logging.getLogger(__name__)

#: requests in flight while the origins have room (module docstring)
PARALLEL_WITH_ROOM = 2

#: how long the arrivals that measure `OwedPieceFeed.fetch_bps` are kept
_ARRIVALS_KEPT_S = 30.0

#: a piece handed to libtorrent is not fetched again for this long (a status poll or
#: two: the time libtorrent takes to check and announce it)
_ADDED_HOLD_S = 2.0


class OwedPieceFeed:
    """Fetches ``owed`` pieces from ``web_seeds`` in turn while ``running()`` holds.

    ``handle()`` is the torrent handle (None once it is gone). ``fed_bytes`` counts
    every verified byte fetched, across restarts (the caller restores it from the resume data);
    ``session_bytes`` only this session's; ``received_bytes`` every byte as it arrives,
    verified or not (progress: a piece from a busy origin takes seconds, and a peer
    whose only source it is must not look stalled meanwhile).
    """

    def __init__(
        self,
        *,
        manifest: Manifest,
        web_seeds: Sequence[str],
        retry_s: float,
        handle: Callable[[], Any],
        running: Callable[[], bool],
    ) -> None:
        self.manifest = manifest
        self.web_seeds = list(web_seeds)
        self.retry_s = retry_s
        self._handle = handle
        self._running = running
        self.owed: tuple[int, ...] = ()
        self.fed_bytes = 0
        self.session_bytes = 0
        self.received_bytes = 0
        self.pieces_fed = 0  # this session
        #: what the origins gave this peer while its last verified piece was on its
        #: way, bytes/s (every piece that arrived meanwhile; 0: none yet): the ring
        #: hands a bringer as many pieces as it fetches in a round
        self.fetch_bps = 0
        #: requests in flight at most (module docstring); the status poll sets it
        self.parallel = 1
        #: once no other owed piece is left, take one libtorrent is fetching from a
        #: peer too (the status poll sets it while the origins have room and give more
        #: than the peers: the end of a download whose one peer is slow waited on the
        #: pieces libtorrent had queued on that peer; `add_piece` ends those requests)
        self.take_busy = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[int] = set()
        #: (when, bytes) of the pieces that arrived lately (`fetch_bps`)
        self._arrivals: list[tuple[float, int]] = []
        #: pieces handed to libtorrent, and when: not fetched again while the owed list
        #: (read at the next status poll) may still name them; after ``_ADDED_HOLD_S``
        #: a piece libtorrent did not keep is fetched again
        self._added: dict[int, float] = {}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def set_owed(self, owed: tuple[int, ...]) -> None:
        """The pieces owed now (in order); wakes the feed."""
        self.owed = owed
        self._wake.set()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=30)
        turn = 0
        fetches: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=timeout, connector=client_connector()) as http:
            try:
                while self._running():
                    # (cleared before the pieces are picked, with no await between: a
                    # new owed list set while the fetches run wakes the wait below)
                    self._wake.clear()
                    while len(fetches) < max(1, self.parallel):
                        piece = self._next_owed()
                        if piece is None:
                            break
                        # (round robin over the origins: two at a time go to two
                        # origins where there are several)
                        url = self.web_seeds[turn % len(self.web_seeds)]
                        turn += 1
                        self._in_flight.add(piece)
                        fetches.add(asyncio.create_task(self._feed_one(http, url, piece)))
                    waker = asyncio.create_task(self._wake.wait())
                    try:
                        done, _ = await asyncio.wait(
                            {*fetches, waker}, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        waker.cancel()
                    for task in done & fetches:
                        fetches.discard(task)
                        if not task.cancelled() and task.exception() is not None:
                            log.warning("origin fetch failed: %r", task.exception())
            finally:
                for task in fetches:
                    task.cancel()
                if fetches:
                    await asyncio.gather(*fetches, return_exceptions=True)

    async def _feed_one(self, http: aiohttp.ClientSession, url: str, piece: int) -> None:
        # one piece from one origin, handed to libtorrent
        try:
            data = await self._fetch_piece(http, url, piece)
            handle = self._handle()
            if data is None:
                await asyncio.sleep(self.retry_s)
            elif handle is not None:
                handle.add_piece(piece, data, 0)
                self.pieces_fed += 1
                self._added[piece] = asyncio.get_running_loop().time()
        finally:
            self._in_flight.discard(piece)

    def _received(self, size: int) -> None:
        self.received_bytes += size

    def _next_owed(self) -> int | None:
        handle = self._handle()
        if handle is None:
            return None
        # not a piece libtorrent is already fetching (from a peer or a web seed)
        busy = {int(q["piece_index"]) for q in handle.get_download_queue()}
        recent = asyncio.get_running_loop().time() - _ADDED_HOLD_S
        free = [
            p for p in self.owed if p not in self._in_flight and self._added.get(p, -1e9) < recent
        ]
        for piece in free:
            if piece not in busy:
                return piece
        if self.take_busy and free:
            return free[0]
        return None

    async def _fetch_piece(self, http: aiohttp.ClientSession, url: str, piece: int) -> bytes | None:
        """The piece from one origin, verified; None (logged) otherwise. A range answer
        longer than the piece is cut off, and bytes count as fed only once verified."""
        start, length = self.manifest.piece_span(piece)
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        began = asyncio.get_running_loop().time()
        try:
            async with http.get(url, headers=headers) as resp:
                if resp.status != 206:
                    log.info("origin %s answered %d for piece %d", url, resp.status, piece)
                    return None
                what = f"origin {url}'s answer for piece {piece}"
                data = await read_body_limited(resp, length, what, on_chunk=self._received)
        except (aiohttp.ClientError, TimeoutError) as err:
            log.info("origin %s failed for piece %d: %s", url, piece, err)
            return None
        except BodyTooLarge as err:
            log.warning("%s", err)
            return None
        if not piece_ok(self.manifest, piece, data):
            log.warning("origin %s sent piece %d not matching the manifest; dropped", url, piece)
            return None
        self.session_bytes += len(data)
        self.fed_bytes += len(data)
        took = asyncio.get_running_loop().time() - began
        # what the origins give this peer: the bytes of every piece that arrived while
        # this one was on its way, itself included (with two in flight each piece
        # comes at about half of it)
        now = began + took
        self._arrivals = [(t, n) for t, n in self._arrivals if t >= now - _ARRIVALS_KEPT_S]
        self._arrivals.append((now, len(data)))
        came = sum(n for t, n in self._arrivals if t >= began)
        self.fetch_bps = int(came / max(took, 1e-3))
        return data
