"""The tracker's SQLite files hold readers' addresses, ports and peer ids, and the
ring's supernode addresses: they are the owner's alone (0600), whatever the umask,
as every service's state is (security.private_file)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pressrun.tracker.ring_store import SqliteRingStore
from pressrun.tracker.sqlite_store import SqliteStore


def _modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}


async def test_the_tracker_and_ring_databases_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: 0644 files unless made private
    try:
        for name in ("tracker", "ring"):
            (tmp_path / name).mkdir()
        store = SqliteStore(tmp_path / "tracker" / "t.db")
        assert await store.load_all() == []
        await store.close()
        ring = SqliteRingStore(tmp_path / "ring" / "r.db")
        assert await ring.load("00" * 20) is None
        await ring.close()
    finally:
        os.umask(old)
    for folder in (tmp_path / "tracker", tmp_path / "ring"):
        modes = _modes(folder)
        assert modes, folder
        # the database and SQLite's -wal/-shm beside it
        assert set(modes.values()) == {0o600}, modes
