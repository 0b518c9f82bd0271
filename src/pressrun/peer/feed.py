"""The owed-piece feed: pieces of the policy's plan that no connected peer holds,
fetched from the origins by the peer itself.

For a policy that fetches its owed pieces itself (`UploaderPolicy.fetches_owed_pieces`):
one HTTP range request at a time for a piece of its plan that no connected peer holds,
checked against the manifest's SHA-256, handed to libtorrent (``add_piece``: it checks
the torrent's SHA-1, writes it and tells the peers). libtorrent's own web-seed picking
cannot be held to a plan: it finishes partial pieces and extends ranges first
(docs/swarm.md).
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
        #: the rate of its last verified piece from the origins, bytes/s (0: none yet):
        #: the ring hands a bringer as many pieces as it fetches in a round
        self.fetch_bps = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
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
        async with aiohttp.ClientSession(timeout=timeout, connector=client_connector()) as http:
            while self._running():
                piece = self._next_owed()
                if piece is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                url = self.web_seeds[turn % len(self.web_seeds)]
                turn += 1
                data = await self._fetch_piece(http, url, piece)
                handle = self._handle()
                if data is None:
                    await asyncio.sleep(self.retry_s)
                elif handle is not None:
                    handle.add_piece(piece, data, 0)
                    self.pieces_fed += 1
                    self._added[piece] = asyncio.get_running_loop().time()

    def _received(self, size: int) -> None:
        self.received_bytes += size

    def _next_owed(self) -> int | None:
        handle = self._handle()
        if handle is None:
            return None
        # not a piece libtorrent is already fetching (from a peer or a web seed)
        busy = {int(q["piece_index"]) for q in handle.get_download_queue()}
        recent = asyncio.get_running_loop().time() - _ADDED_HOLD_S
        for piece in self.owed:
            if piece not in busy and self._added.get(piece, -1e9) < recent:
                return piece
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
        self.fetch_bps = int(len(data) / max(took, 1e-3))
        return data
