"""Checking a swarm copy against the signed manifest: the final check, kept pieces.

The final check hashes the whole file (SHA-256 of every piece and of the file), once:
`FinalVerification` runs it after libtorrent confirmed that its disk jobs for the
torrent ran (``flush_cache`` and its ``cache_flushed_alert``, which the peer's alert
loop in `pressrun.peer.aio` passes on), so a piece that does not match is a real
disagreement, not a write still on its way. After a stall, `verified_pieces` re-checks
the pieces the peer hands over and `missing_spans` names the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pressrun.content.codec import Manifest
from pressrun.content.manifest import FileCheck, check_file, piece_ok
from pressrun.peer.results import SwarmError

log = logging.getLogger(__name__)

#: how long the final check waits for libtorrent to confirm its disk flush
_FLUSH_TIMEOUT_S = 60.0


async def final_check(manifest: Manifest, path: Path) -> FileCheck:
    """Hash the whole file against the manifest (in a thread)."""
    return await asyncio.to_thread(check_file, manifest, path)


def missing_spans(manifest: Manifest, have: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Byte ranges [start, end) of the pieces not in ``have``, adjacent ones merged."""
    held = set(have)
    spans: list[tuple[int, int]] = []
    for index in range(manifest.num_pieces):
        if index in held:
            continue
        start, length = manifest.piece_span(index)
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], start + length)
        else:
            spans.append((start, start + length))
    return tuple(spans)


def verified_pieces(manifest: Manifest, path: Path, candidates: Sequence[int]) -> list[int]:
    """The candidate pieces whose bytes in ``path`` match the manifest's SHA-256."""
    good: list[int] = []
    try:
        with open(path, "rb") as f:
            for index in candidates:
                start, length = manifest.piece_span(index)
                f.seek(start)
                if piece_ok(manifest, index, f.read(length)):
                    good.append(index)
    except FileNotFoundError:
        return []
    return good


class FinalVerification:
    """The final check of a finished download, started once: flush, then hash.

    ``handle()`` is the torrent handle (None once it is gone); ``on_verified()`` is
    called when the copy matches the manifest, ``on_failed(error)`` when it does not.
    The peer's alert loop calls `cache_flushed` on libtorrent's ``cache_flushed_alert``.
    """

    def __init__(
        self,
        manifest: Manifest,
        path: Path,
        *,
        handle: Callable[[], Any],
        on_verified: Callable[[], None],
        on_failed: Callable[[SwarmError], None],
    ) -> None:
        self.manifest = manifest
        self.path = path
        self._handle = handle
        self._on_verified = on_verified
        self._on_failed = on_failed
        self._flushed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def cache_flushed(self) -> None:
        """libtorrent ran every disk job queued before the flush."""
        self._flushed.set()

    def start(self) -> None:
        """Start the check (once: later calls do nothing)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        """Stop a check still running."""
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        # torrent_finished_alert comes once every piece passed its hash check, which
        # libtorrent computes from its store buffer while the writes to the file may
        # still be queued on its disk threads. flush_cache() queues a fence job behind
        # every outstanding job of this torrent's storage and posts cache_flushed_alert
        # when it ran: after that alert the file holds every piece. (The save_resume_data
        # flush_disk_cache flag used before queues the same fence but posts its alert
        # without waiting for it, and any periodic save's alert could answer the wait:
        # the race the final check lost on loaded machines.)
        handle = self._handle()
        if handle is not None:
            self._flushed.clear()
            handle.flush_cache()
            try:
                await asyncio.wait_for(self._flushed.wait(), timeout=_FLUSH_TIMEOUT_S)
            except TimeoutError:
                log.warning("peer: libtorrent did not confirm its disk flush in 60 s")
        found = await final_check(self.manifest, self.path)
        if not found.matches(self.manifest):
            self._on_failed(
                SwarmError(
                    f"{self.path} holds every piece by the torrent's hashes but not the "
                    f"manifest's (bad pieces {list(found.bad_pieces[:10])}, size "
                    f"{found.size_bytes}); the torrent and manifest disagree"
                )
            )
            return
        self._on_verified()
