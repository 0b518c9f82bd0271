"""Supernodes beside another service: an origin, or a desktop client with a reachable
port (docs/chord.md, "Running it"). Mobile profiles never run one.

004_3e4b985b4cf14853.txt, III.A: the ring's nodes are the hosts that stay and can be
reached. `SupernodeHost` runs one `Supernode` per issue next to the service that has
the issue: for an origin, every bundle in its content directory
(``CONTENT/<issue>/<issue>.torrent``), read again every ``rescan_s`` so issues
published later get theirs; for a desktop client, the one issue it seeds (`add`).
A supernode the tracker refuses (not a published issue, the tracker down) is logged
and tried again at the next scan; the service itself never fails because of it.

**Supernodes follow the catalogue, not its history** (issue 24, item 6: one ran for
every torrent ever seen). At each scan, a supernode whose bundle left the content
directory leaves its ring, and so does one no client asked anything (reports,
questions, lookups: `SupernodeStats.client_requests`) for ``idle_s``: a back issue
nobody reads costs nothing. A retired idle issue's supernode starts again when the
tracker's swarm for it has peers (one BEP 48 scrape of the retired issues a scan);
until then its readers use `stripes` (the tracker lists no ring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from pathlib import Path
from urllib.parse import quote_from_bytes

import aiohttp
import yarl

from pressrun.chord.aio import Supernode, SupernodeError
from pressrun.content.codec import ManifestError, TorrentMeta, parse_torrent
from pressrun.peer.scrape import MAX_SCRAPE_BYTES, parse_scrape
from pressrun.security import BodyTooLarge, client_connector, read_body_limited

log = logging.getLogger(__name__)

#: info-hashes in one scrape request (a URL of about 3 kB)
_SCRAPE_BATCH = 50


class SupernodeHost:
    """The supernodes one service runs, at most one per issue (module docstring)."""

    def __init__(
        self,
        *,
        tracker_base: str,
        host: str,
        port: int = 0,
        content_dir: Path | None = None,
        rescan_s: float = 30.0,
        heartbeat_s: float = 5.0,
        idle_s: float | None = 3600.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``idle_s``: a catalogue supernode no client asked anything for this long is
        retired (None: never); ``clock``: monotonic seconds (default the loop's)."""
        self.tracker_base = tracker_base
        self.host = host
        self.port = port
        self.content_dir = content_dir
        self.rescan_s = rescan_s
        self.heartbeat_s = heartbeat_s
        self.supernodes: dict[str, Supernode] = {}  # info-hash -> its supernode
        self.idle_s = idle_s
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        #: catalogue supernodes: info-hash -> (client requests at the last look, since)
        self._activity: dict[str, tuple[int, float]] = {}
        #: catalogue issues retired for idleness (started again when read)
        self._idle: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start a supernode for every issue in the content directory, then rescan."""
        if self.content_dir is not None:
            await self.scan()
            self._task = asyncio.get_running_loop().create_task(self._rescan())

    async def add(self, info_hash: str, num_pieces: int, file_bytes: int = 0) -> Supernode | None:
        """A supernode for this issue (the running one if any; None if refused);
        ``file_bytes``: the issue's size (0: unknown), for the order of the askers."""
        if info_hash in self.supernodes:
            return self.supernodes[info_hash]
        node = Supernode(
            tracker_base=self.tracker_base,
            info_hash=info_hash,
            num_pieces=num_pieces,
            file_bytes=file_bytes,
            host=self.host,
            port=self.port,
            heartbeat_s=self.heartbeat_s,
        )
        try:
            me = await node.start()
        except (SupernodeError, OSError) as err:
            log.warning("no supernode for %s: %s", info_hash[:10], err)
            await node.close(graceful=False)
            return None
        log.info("supernode %040x for %s listening on %s", me.id, info_hash[:10], node.address)
        self.supernodes[info_hash] = node
        return node

    async def retire(self, info_hash: str) -> None:
        """Take this issue's supernode off its ring (gracefully) and stop it."""
        node = self.supernodes.pop(info_hash, None)
        self._activity.pop(info_hash, None)
        if node is not None:
            await node.close(graceful=True)

    async def scan(self) -> int:
        """Retire the supernodes of bundles gone or idle, start those of bundles that
        have none (an idle one only if its swarm has peers); how many were started."""
        assert self.content_dir is not None
        now = self._clock()
        present: dict[str, TorrentMeta] = {}
        for path in sorted(self.content_dir.glob("*/*.torrent")):
            try:
                meta = parse_torrent(path.read_bytes())
            except (OSError, ManifestError) as err:
                log.info("supernodes: skipping %s: %s", path, err)
                continue
            present[meta.info_hash] = meta
        for info_hash in [h for h in self._activity if h not in present]:
            log.info("supernode for %s retired: its bundle is gone", info_hash[:10])
            await self.retire(info_hash)
        self._idle &= set(present)
        for info_hash, (count, since) in list(self._activity.items()):
            node = self.supernodes[info_hash]
            if node.stats.client_requests != count:
                self._activity[info_hash] = (node.stats.client_requests, now)
            elif self.idle_s is not None and now - since >= self.idle_s:
                log.info(
                    "supernode for %s retired: no reader for %.0f s", info_hash[:10], now - since
                )
                await self.retire(info_hash)
                self._idle.add(info_hash)
        wanted = [h for h in present if h not in self.supernodes]
        read = await self._swarms_with_peers([h for h in wanted if h in self._idle])
        started = 0
        for info_hash in wanted:
            if info_hash in self._idle and info_hash not in read:
                continue
            meta = present[info_hash]
            if await self.add(info_hash, meta.num_pieces, meta.length) is not None:
                started += 1
                self._idle.discard(info_hash)
                self._activity[info_hash] = (0, now)
        return started

    async def _swarms_with_peers(self, info_hashes: Collection[str]) -> set[str]:
        # which of these issues' swarms have peers at the tracker (BEP 48 scrape; a
        # tracker that does not answer: none, asked again at the next scan)
        found: set[str] = set()
        if not info_hashes:
            return found
        url = f"{self.tracker_base.rstrip('/')}/scrape"
        ordered = sorted(info_hashes)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout, connector=client_connector()) as http:
            for i in range(0, len(ordered), _SCRAPE_BATCH):
                batch = [bytes.fromhex(h) for h in ordered[i : i + _SCRAPE_BATCH]]
                query = "&".join(f"info_hash={quote_from_bytes(b, safe='')}" for b in batch)
                try:
                    async with http.get(yarl.URL(f"{url}?{query}", encoded=True)) as resp:
                        body = await read_body_limited(resp, MAX_SCRAPE_BYTES, url)
                    for raw in batch:
                        counts = parse_scrape(body, raw)
                        if counts is not None and counts.seeds + counts.leechers > 0:
                            found.add(raw.hex())
                except (aiohttp.ClientError, TimeoutError, ValueError, BodyTooLarge) as err:
                    log.info("supernodes: the tracker's scrape did not answer: %s", err)
        return found

    async def _rescan(self) -> None:
        while True:
            await asyncio.sleep(self.rescan_s)
            try:
                await self.scan()
            except Exception:  # (the loop outlives any error: logged, next scan)
                log.exception("supernodes: the scan failed")

    async def close(self) -> None:
        """Leave every ring gracefully (each supernode hands its pieces over)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(n.close(graceful=True) for n in self.supernodes.values()))
        self.supernodes.clear()
        self._activity.clear()
