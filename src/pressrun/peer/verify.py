"""Checking a swarm copy against the signed manifest: the final check, kept pieces.

The final check hashes the whole file (SHA-256 of every piece and of the file), once:
the peer calls it after libtorrent confirmed that its disk jobs for the torrent ran
(``flush_cache`` and its ``cache_flushed_alert``, pressrun.peer.aio), so a piece that
does not match is a real disagreement, not a write still on its way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from pressrun.content.codec import Manifest
from pressrun.content.manifest import FileCheck, check_file, piece_ok


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
