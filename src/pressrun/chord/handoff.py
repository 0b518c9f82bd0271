"""A leaving supernode's directory, handed to its successor (docs/chord.md, "The
core": a graceful leave's ``handoff``, opaque to the ring): what `PieceDirectory`
exports of the pieces it answered for, and how the successor merges it. The holders
go with the seconds since their last report (another process's clock means nothing
there), and a handoff is read as untrusted input: what cannot be read, holders beyond
the directory's bounds and holders silent for its TTL are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pressrun.chord.ids import host_of

if TYPE_CHECKING:
    from pressrun.chord.directory import PieceDirectory


def export_directory(d: PieceDirectory, pieces: Iterable[int], *, now: float) -> dict[str, object]:
    """What this directory knows of ``pieces`` (a graceful leave's handoff): the
    fresh holders, each with the seconds since its last report (another process's
    clock means nothing here)."""
    d._sweep(now, force=True)
    wanted = set(pieces)
    out_pieces = {str(p): sorted(d.pieces[p]) for p in wanted if p in d.pieces}
    ids = {pid for pids in out_pieces.values() for pid in pids}
    return {
        "pieces": out_pieces,
        "holders": {
            pid: [
                h.address,
                h.uploaded_bytes,
                h.downloaded_bytes,
                round(max(0.0, now - h.reported_at), 3),
                h.left,
            ]
            for pid, h in d.holders.items()
            if pid in ids
        },
    }


def adopt_handoff(d: PieceDirectory, handoff: object, *, now: float) -> int:
    """Merge a handoff from `export` (ignores what it cannot read, and holders
    beyond the bounds or silent for the TTL); pieces merged."""
    d._sweep(now)
    if not isinstance(handoff, dict):
        return 0
    holders, pieces = handoff.get("holders"), handoff.get("pieces")
    if not isinstance(holders, dict) or not isinstance(pieces, dict):
        return 0
    for pid, row in holders.items():
        if not isinstance(pid, str) or not isinstance(row, list) or len(row) != 5:
            continue
        addr, up, down, age, left = row
        if not (isinstance(addr, str) and isinstance(up, int) and isinstance(down, int)):
            continue
        if not isinstance(age, int | float) or not 0 <= age <= d.holder_ttl_s:
            continue
        h = d.holders.get(pid)
        if h is None:
            if len(pid) > 64 or len(addr) > 255 or d._full(host_of(addr)):
                continue
            h = d._new_holder(pid, addr, now - float(age))
        h.uploaded_bytes = max(h.uploaded_bytes, up)
        h.downloaded_bytes = max(h.downloaded_bytes, down)
        h.reported_at = max(h.reported_at, now - float(age))
        h.left = h.left or bool(left)
    merged = 0
    for key, pids in pieces.items():
        digits = isinstance(key, str) and key.isascii() and key.isdigit()
        if not (digits and isinstance(pids, list)):
            continue
        known = {p for p in pids if isinstance(p, str) and p in d.holders}
        if known:
            d.pieces.setdefault(int(key), set()).update(known)
            merged += 1
    return merged
