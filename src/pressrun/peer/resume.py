"""libtorrent's resume data next to the file, as ``<file>.swarm-resume``.

It holds the pieces held and the all-time upload/download, plus our own key: the bytes
the peer fetched from origins itself (`pressrun.peer.feed`; libtorrent counts pieces
given to ``add_piece`` as neither downloaded nor announced). A torn or foreign resume
file is ignored and the peer rechecks the file instead.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import libtorrent as lt

log = logging.getLogger(__name__)

RESUME_SUFFIX = ".swarm-resume"
#: our key in libtorrent's resume data: bytes the peer fetched from origins itself
_FED_KEY = b"pressrun_fed_bytes"


def resume_path_for(partial_dir: Path, file_name: str) -> Path:
    """Where the peer keeps libtorrent's resume data for this file."""
    return partial_dir / (file_name + RESUME_SUFFIX)


def read_resume(path: Path) -> tuple[Any | None, int]:
    """(add_torrent_params from the resume file or None, the fed bytes it recorded)."""
    if not path.exists():
        return None, 0
    try:
        raw = path.read_bytes()
        atp = lt.read_resume_data(raw)
        entry = lt.bdecode(raw)
        fed = entry.get(_FED_KEY, 0) if isinstance(entry, dict) else 0  # type: ignore[call-overload]
    except Exception as err:  # a torn or foreign resume file: recheck instead
        log.warning("ignoring resume data %s: %s", path, err)
        return None, 0
    return atp, fed if isinstance(fed, int) and fed >= 0 else 0


def write_resume(path: Path, params: Any, fed_bytes: int) -> None:
    """Save a save_resume_data_alert's params (and the fed bytes), atomically."""
    entry = lt.write_resume_data(params)
    entry[_FED_KEY] = fed_bytes  # libtorrent ignores keys it does not know
    data = lt.bencode(entry)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as err:
        log.warning("cannot save resume data %s: %s", path, err)
