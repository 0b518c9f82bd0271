"""Files that survive a crash whole: write through a temp file and a rename, fsync.

One place for the pattern the library folder, the publisher's bundle and the key files
all use: a reader sees either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a folder, so the renames and new entries in it are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644, sync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file in its folder and a rename.

    The file has ``mode`` from its first byte on (a key file is never readable by
    others, not even for a moment); ``sync`` fsyncs the data before the rename.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
