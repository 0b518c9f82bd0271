"""Supernodes beside another service: an origin, or a desktop client with a reachable
port (docs/chord.md, "Running it"). Mobile profiles never run one.

004_3e4b985b4cf14853.txt, III.A: the ring's nodes are the hosts that stay and can be
reached. `SupernodeHost` runs one `Supernode` per issue next to the service that has
the issue: for an origin, every bundle in its content directory
(``CONTENT/<issue>/<issue>.torrent``), read again every ``rescan_s`` so issues
published later get theirs; for a desktop client, the one issue it seeds (`add`).
A supernode the tracker refuses (not a published issue, the tracker down) is logged
and tried again at the next scan; the service itself never fails because of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from pressrun.chord.aio import Supernode, SupernodeError
from pressrun.content.codec import ManifestError, parse_torrent

log = logging.getLogger(__name__)


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
    ) -> None:
        self.tracker_base = tracker_base
        self.host = host
        self.port = port
        self.content_dir = content_dir
        self.rescan_s = rescan_s
        self.heartbeat_s = heartbeat_s
        self.supernodes: dict[str, Supernode] = {}  # info-hash -> its supernode
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

    async def scan(self) -> int:
        """Start supernodes for bundles that have none yet; how many were started."""
        assert self.content_dir is not None
        started = 0
        for path in sorted(self.content_dir.glob("*/*.torrent")):
            try:
                meta = parse_torrent(path.read_bytes())
            except (OSError, ManifestError) as err:
                log.info("supernodes: skipping %s: %s", path, err)
                continue
            if meta.info_hash not in self.supernodes:
                started += await self.add(meta.info_hash, meta.num_pieces, meta.length) is not None
        return started

    async def _rescan(self) -> None:
        while True:
            await asyncio.sleep(self.rescan_s)
            await self.scan()

    async def close(self) -> None:
        """Leave every ring gracefully (each supernode hands its pieces over)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(n.close(graceful=True) for n in self.supernodes.values()))
        self.supernodes.clear()
