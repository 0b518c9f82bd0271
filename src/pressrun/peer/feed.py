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

**No piece is fetched twice.** A piece on its way from the origins is held at
priority 0 in libtorrent (`HOLD_PRIORITY`: it asks no peer and no web seed for it),
once the origins have answered and as long as `HOLD_MARGIN` other missing pieces stay
wanted that libtorrent would not bring in first (a torrent whose missing pieces are
all at 0 is "finished" and drops its seeds: `OwedPieceFeed._hold`), and gets its priority back
when the fetch ends (a plan applied meanwhile is followed: its priority is the one
put back). The feed takes no piece libtorrent holds already and none it is fetching
(a block of it asked of a peer or web seed, `download_queue.fetching`: a partial piece whose
peer left is asked of nobody, and is taken), except, once nothing else is owed
(``take_busy``: the origins have room and its peers are slow), one that the origins
would deliver whole before its peers deliver the rest (`download_queue.sooner_from_origins`;
never one a web seed is fetching): then what libtorrent had received of it is the
only part fetched twice, against waiting on a slow peer's queue. While the origins
have room and its peers are not slow in all, the same holds for a connection slow
on its own, with the origins' rate shared among the swarm's downloading peers, at
`sources.ROOM_SHARE` (``late_bps``: the deadline `sources.peers_slow` sets all its
peers, applied to each connection), for any piece it lacks that libtorrent queued on
a connection, owed or not: the last swarm arrival of `make emulate SCENARIO=small` at
f61cd5b (2.11x the origin client) had nothing owed and its last piece queued on a
peer that brought 32 kB of it in 2.7 s while the origins gave its feed 1.9 MB/s
(that connection stalled in the emulation's carousel flood, fixed in 2f4756f: the
small scenario's slow last arrivals were all downloading when its bridge sent the
carousel's first seconds down every client's link; docs/results/2026-11-29-small-
scenario-querier.md). Before, the second
swarm client of `make emulate SCENARIO=small` received 0.2-0.9 MB of its 4 MB twice:
the feed picked a piece libtorrent was not fetching, and libtorrent then asked its
peer for the same piece (a loopback pair staggered like those clients,
`tests/peer/test_feed_twice.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import libtorrent as lt

from pressrun.content.codec import Manifest
from pressrun.content.manifest import piece_ok
from pressrun.peer.download_queue import ConnectionRates, fetching, sooner_from_origins
from pressrun.peer.uploader import HOLD_MARGIN, HOLD_PRIORITY
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
        #: ... and, while the origins have room, one libtorrent has queued on a
        #: connection whose rest of it comes later than a whole piece from the origins
        #: at this rate (bytes/s; 0: none): their rate shared among the swarm's
        #: downloading peers, at `sources.ROOM_SHARE` (the status poll sets it: the
        #: deadline `sources.peers_slow` judges all its peers by, applied to each
        #: connection). Judged only over all its peers, a swarm client of the small
        #: emulation whose peers gave 285-360 kB/s in all waited 2.6-2.8 s on three
        #: pieces queued on two connections while its feed sat idle with 6-11 pieces
        #: owed (3.76 s against the origin client's 1.69 s)
        self.late_bps = 0
        #: of the owed pieces free to fetch at the last pick, how many it passed over as
        #: queued in libtorrent on a peer or web seed (the timeline's progress lines)
        self.queued_elsewhere = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[int] = set()
        #: when the last fetch of each piece began (the timeline's last pieces)
        self.started_at: dict[int, float] = {}
        #: (when, bytes) of the pieces that arrived lately (`fetch_bps`)
        self._arrivals: list[tuple[float, int]] = []
        #: pieces handed to libtorrent, and when: not fetched again while the owed list
        #: (read at the next status poll) may still name them; after ``_ADDED_HOLD_S``
        #: a piece libtorrent did not keep is fetched again
        self._added: dict[int, float] = {}
        #: pieces on their way, held at priority 0 in libtorrent, with the priority
        #: each gets back when its fetch ends (module docstring)
        self._held: dict[int, int] = {}
        #: what each connection gives this peer (``take_busy``)
        self._rates = ConnectionRates()
        self._connection_rates: dict[tuple[str, int], int | None] = {}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def set_owed(
        self,
        owed: tuple[int, ...],
        *,
        peers: Sequence[Any] | None = None,
        have: Sequence[bool] | None = None,
    ) -> None:
        """The pieces owed now (in order); wakes the feed. (Called right after the
        status poll applied the policy's plan, which sets every piece's priority: the
        pieces on their way are held again here, at once.) ``peers``, ``have``: that
        status read's peer infos and pieces held (None: read here; libtorrent's
        synchronous reads, `pressrun.peer.status.SwarmStatus.read`)."""
        self.owed = owed
        self._hold_again(have)
        handle = self._handle()
        if owed and handle is not None and self._task is not None:
            # (the connections' rates, known once counted for a second: `take_busy`)
            self._connection_rates = self._rates.update(
                asyncio.get_running_loop().time(),
                handle.get_peer_info() if peers is None else peers,
            )
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
                        self.started_at[piece] = asyncio.get_running_loop().time()
                        self._hold(piece)
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
                self._release(piece)  # libtorrent may fetch it meanwhile
                await asyncio.sleep(self.retry_s)
            elif handle is not None:
                handle.add_piece(piece, data, 0)
                self.pieces_fed += 1
                self._added[piece] = asyncio.get_running_loop().time()
        finally:
            self._in_flight.discard(piece)
            self._release(piece)

    def _received(self, size: int) -> None:
        self.received_bytes += size

    def _next_owed(self) -> int | None:
        handle = self._handle()
        if handle is None:
            return None
        if not self.owed and self.late_bps <= 0:
            # nothing to pick (what the reads below would find): the feed wakes at
            # every status read, and most peers owe nothing most of the time
            self.queued_elsewhere = 0
            return None
        have = handle.status(lt.torrent_handle.query_pieces).pieces
        recent = asyncio.get_running_loop().time() - _ADDED_HOLD_S
        free = [
            p
            for p in self.owed
            if p not in self._in_flight
            and self._added.get(p, -1e9) < recent
            and not (p < len(have) and have[p])  # (owed as of the last status poll)
        ]
        if not free and self.late_bps <= 0:
            self.queued_elsewhere = 0  # (not the last pick's: the timeline's lines)
            return None
        # not a piece libtorrent is fetching (from a peer or a web seed)
        queue = handle.get_download_queue()
        busy = fetching(queue)
        self.queued_elsewhere = sum(1 for p in free if p in busy)
        for piece in free:
            if piece not in busy:
                return piece
        if self.take_busy:
            return sooner_from_origins(
                queue,
                set(free),
                self._connection_rates,
                piece_bytes=self.manifest.piece_size_bytes,
                origins_bps=self.fetch_bps,
            )
        if self.late_bps > 0:
            # every piece it lacks that libtorrent queued on a connection, owed or not:
            # a piece a connected peer holds is owed only while its peers are slow in
            # all (`take_busy`), so judged among the owed pieces alone this rule
            # (5cd8f8f) never saw the pieces it was for (module docstring)
            queued = {
                p
                for p in busy
                if p not in self._in_flight
                and self._added.get(p, -1e9) < recent
                and not (p < len(have) and have[p])
            }
            return sooner_from_origins(
                queue,
                queued,
                self._connection_rates,
                piece_bytes=self.manifest.piece_size_bytes,
                origins_bps=self.late_bps,
            )
        return None

    def _hold(self, piece: int) -> None:
        """Keep libtorrent from asking anyone else for ``piece`` while the feed fetches
        it: priority 0, once the origins have answered (`fetch_bps`: not while they may
        not answer at all) and while `HOLD_MARGIN` other missing pieces stay wanted that
        libtorrent would not bring in before the origins bring this one (twice its
        time, at its download rate now): a torrent whose missing pieces are all at 0 is
        "finished" and libtorrent drops its seeds at once, so a reader whose one seed
        had sent the rest while the feed tried a stopped origin was left with no peer
        (`tests/peer/test_cli.py`)."""
        handle = self._handle()
        if handle is None or self.fetch_bps <= 0:
            return
        priorities = handle.get_piece_priorities()
        if priorities[piece] == HOLD_PRIORITY:
            return  # the plan holds it already; nothing to put back
        st = handle.status(lt.torrent_handle.query_pieces)
        others = _wanted_without(st.pieces, priorities, piece)
        if others < HOLD_MARGIN:
            return
        rate = int(st.download_payload_rate)
        piece_bytes = self.manifest.piece_size_bytes
        if rate > 0 and others * piece_bytes / rate < 2 * piece_bytes / self.fetch_bps:
            return
        self._held[piece] = int(priorities[piece])
        handle.piece_priority(piece, HOLD_PRIORITY)

    def _hold_again(self, have: Sequence[bool] | None = None) -> None:
        """A plan applied since set every priority: hold the pieces on their way again
        (the plan's priority for each is the one put back), or let one go when too few
        other pieces would stay wanted. ``have``: the pieces held as the status read
        that applied the plan saw them (None: read here)."""
        handle = self._handle()
        if handle is None or not self._held:
            return
        priorities = handle.get_piece_priorities()
        if have is None:
            have = handle.status(lt.torrent_handle.query_pieces).pieces
        for piece in list(self._held):
            now = int(priorities[piece])
            if now == HOLD_PRIORITY:
                continue
            if _wanted_without(have, priorities, piece) < HOLD_MARGIN:
                del self._held[piece]  # libtorrent may fetch it too now: its plan says so
                continue
            self._held[piece] = now
            handle.piece_priority(piece, HOLD_PRIORITY)
            priorities[piece] = HOLD_PRIORITY

    def _release(self, piece: int) -> None:
        """The fetch of ``piece`` ended: its priority back (after `add_piece`, libtorrent
        holds its blocks and asks nobody for them; after a failure it may fetch it)."""
        priority = self._held.pop(piece, None)
        handle = self._handle()
        if priority is not None and handle is not None:
            handle.piece_priority(piece, priority)

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


def _wanted_without(have: Sequence[bool], priorities: list[int], piece: int) -> int:
    """The missing pieces libtorrent still wants (priority above 0), ``piece`` left out."""
    return sum(
        1
        for i, (p, h) in enumerate(zip(priorities, have, strict=False))
        if p != HOLD_PRIORITY and not h and i != piece
    )
