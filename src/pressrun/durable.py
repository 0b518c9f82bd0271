"""Files and folders that survive a crash whole.

One place for the patterns the library folder, the publisher's content folder and the
key files use, so a reader sees the old thing or the new one, never half of one:

- `write_atomic`: a file through a temp file, fsync, a rename and an fsync of its
  folder; `write_all` / `pwrite_all`: a short write is finished or is an error
  (``ENOSPC``), never silently dropped;
- `FolderSwaps`: a complete staging folder replaces ``ROOT/<name>/`` in one
  ``renameat2(RENAME_EXCHANGE)`` (two renames where the file system has no exchange),
  journaled in ``ROOT/.pressrun/<name>.swap`` first, so `FolderSwaps.recover` at the
  next start finishes a replacement a crash interrupted and rolls back (removes) a
  staging folder that was never complete; one ``flock`` per name keeps two processes
  from working on the same item.

Every step that changes the disk goes through ``os.write``, ``os.pwrite``,
``os.fsync``, ``os.rename``, ``os.replace`` or `exchange`, the calls the crash tests
(tests/crash/) interrupt one at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "STATE_DIR",
    "FolderSwaps",
    "ItemBusy",
    "exchange",
    "fsync_dir",
    "pwrite_all",
    "write_all",
    "write_atomic",
]

log = logging.getLogger("pressrun.durable")

#: pressrun's own state beside the items of a library or content folder: locks, swap
#: journals, issue versions. A leading dot: never an issue id or an issue file name.
STATE_DIR = ".pressrun"
#: ``renameat2`` flag (linux/fs.h): swap two names atomically
RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def fsync_dir(path: Path) -> None:
    """fsync a folder, so the renames and new entries in it are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` at the file position; a write that makes no progress is
    ``OSError(ENOSPC)`` (a full disk answers a short write, then 0 or ENOSPC)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset``; no progress is ``OSError(ENOSPC)``."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
        offset += n


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644, sync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file in its folder and a rename.

    The file has ``mode`` from its first byte on (a key file is never readable by
    others, not even for a moment); ``sync`` fsyncs the data before the rename and
    the folder after it, so the new file is on disk when this returns.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(path.parent)


_renameat2: Any = None  # libc's renameat2, once looked up
_exchange_works: bool | None = None


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` (both must exist) in one atomic step.

    ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, glibc 2.28+). Returns False, having
    done nothing, where it is not available (another OS, an old libc, a file system
    without it); OSError for any other failure.
    """
    global _exchange_works, _renameat2
    if _exchange_works is False:
        return False
    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
        except (AttributeError, OSError):
            _exchange_works = False
            return False
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        _renameat2 = fn
    fn = _renameat2
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        _exchange_works = True
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        _exchange_works = False
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


class ItemBusy(Exception):
    """Another process holds the lock of this item (it is publishing or fetching it)."""


@dataclass(frozen=True)
class _Journal:
    staging: str  # the staging folder's name in ROOT
    inode: int  # its inode: after the swap, ROOT/<name> has it


def _remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


class FolderSwaps:
    """Crash-safe replacement of the item folders ``ROOT/<name>/`` of one folder.

    A new version of an item is built in a staging folder ``ROOT/.<name>.<kind>-<t>``
    (``kind``: ``arriving`` in a library, ``publishing`` in a content folder; both
    hidden, neither a valid issue id), then `swap_in`:

    1. ``ROOT/.pressrun/<name>.swap`` records the staging folder's name and inode
       (fsynced: from here on the new version is the one that counts);
    2. one ``renameat2(RENAME_EXCHANGE)`` of staging and ``ROOT/<name>`` (where there
       is no exchange: ``ROOT/<name>`` to ``ROOT/.<name>.replaced-<t>``, then staging
       to ``ROOT/<name>``), or one rename when there was no old version;
    3. fsync ROOT, remove the old version, remove the journal.

    `recover` finishes whatever a crash left: with a journal, the swap is completed
    (or found complete: ``ROOT/<name>`` has the journaled inode) and the old version
    removed; a staging folder without a journal was never complete and is rolled back
    (``on_roll_back`` may take what it wants out of it first, then it is removed); a
    ``.replaced-`` folder without a journal is put back if ``ROOT/<name>`` is missing.
    """

    LEFTOVER_RE = re.compile(
        r"\.(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})\."
        r"(?P<kind>arriving|publishing|replaced)-(?P<token>[A-Za-z0-9_]+)"
    )
    #: `write_atomic`'s temp files in ``.pressrun`` (of ``<name>.swap``, ``<name>.version``)
    STATE_TEMP_RE = re.compile(
        r"\.(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})\.(?:swap|version)\.[a-z0-9_]{8}"
    )

    def __init__(self, root: Path, kind: str) -> None:
        if kind not in ("arriving", "publishing"):
            raise ValueError(f"unknown staging kind {kind!r}")
        self.root = Path(root)
        self.kind = kind

    @property
    def state_dir(self) -> Path:
        """``ROOT/.pressrun``: locks and journals."""
        return self.root / STATE_DIR

    def _journal_path(self, name: str) -> Path:
        return self.state_dir / f"{name}.swap"

    # -- locks

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Hold ``ROOT/.pressrun/<name>.lock`` (``flock``; a dead holder's lock is
        gone with it); ItemBusy at once when another process holds it."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ItemBusy(str(self.state_dir / f"{name}.lock")) from None
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- building and swapping

    def new_staging(self, name: str) -> Path:
        """A new, empty staging folder for ``name`` (mode 0755)."""
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.{self.kind}-", dir=self.root))
        os.chmod(staging, 0o755)
        return staging

    def swap_in(self, staging: Path, name: str) -> None:
        """Make the complete, fsynced folder ``staging`` the item ``ROOT/<name>``.

        An error before the swap leaves the old version in place and ``staging`` as it
        was (the caller removes it); an error after it (removing the old version) is
        logged, and `recover` finishes it.
        """
        final = self.root / name
        token = staging.name.rsplit("-", 1)[1]
        aside = self.root / f".{name}.replaced-{token}"
        journal = self._journal_path(name)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        j = _Journal(staging.name, os.stat(staging).st_ino)
        write_atomic(journal, json.dumps({"staging": j.staging, "inode": j.inode}).encode())
        old: Path | None = None
        try:
            if os.path.lexists(final):
                if exchange(staging, final):
                    old = staging
                else:
                    os.rename(final, aside)
                    old = aside
                    os.rename(staging, final)
            else:
                os.rename(staging, final)
        except BaseException:
            # not swapped: undo what was done here (the old version back in place)
            with contextlib.suppress(OSError):
                self._settle(name, j, roll_back=True)
            raise
        # swapped: from here on errors are only logged (the next start cleans up)
        try:
            fsync_dir(self.root)
            if old is not None:
                _remove(old)
            os.unlink(journal)
        except OSError as err:
            log.warning("%s: could not remove the old version (%s); the next start will", name, err)

    # -- recovery

    def _read_journal(self, name: str) -> _Journal | None:
        try:
            doc = json.loads(self._journal_path(name).read_bytes())
            return _Journal(str(doc["staging"]), int(doc["inode"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return _Journal("", -1)  # unreadable: treated as no swap having started

    def _settle(self, name: str, j: _Journal, *, roll_back: bool = False) -> str:
        """Finish (or with ``roll_back``, undo) the swap journaled as ``j``."""
        final = self.root / name
        staging = self.root / j.staging if j.staging else None
        token = j.staging.rsplit("-", 1)[1] if "-" in j.staging else ""
        aside = self.root / f".{name}.replaced-{token}"

        def inode(p: Path | None) -> int | None:
            try:
                return None if p is None else os.lstat(p).st_ino
            except OSError:
                return None

        done: str
        if inode(final) == j.inode:
            # the swap happened; what is left is the old version
            for p in (staging, aside):
                if p is not None and os.path.lexists(p):
                    _remove(p)
            done = f"{name}: finished replacing it (removed the old version)"
        elif staging is not None and inode(staging) == j.inode and not roll_back:
            if os.path.lexists(final):
                if exchange(staging, final):
                    fsync_dir(self.root)
                    _remove(staging)
                else:
                    os.rename(final, aside)
                    os.rename(staging, final)
                    fsync_dir(self.root)
                    _remove(aside)
            else:
                os.rename(staging, final)
                fsync_dir(self.root)
                if os.path.lexists(aside):
                    _remove(aside)
            done = f"{name}: finished installing the new version a crash interrupted"
        else:
            if not os.path.lexists(final) and os.path.lexists(aside):
                os.rename(aside, final)
                fsync_dir(self.root)
            done = f"{name}: rolled back an unfinished replacement (the old version stays)"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._journal_path(name))
        return done

    def leftovers(self) -> dict[str, list[Path]]:
        """Staging and replaced folders in ROOT, and swap journals, by item name."""
        found: dict[str, list[Path]] = {}
        with contextlib.suppress(OSError):
            for entry in self.root.iterdir():
                m = self.LEFTOVER_RE.fullmatch(entry.name)
                if m is not None:
                    found.setdefault(m["name"], []).append(entry)
        with contextlib.suppress(OSError):
            for entry in self.state_dir.iterdir():
                m = self.STATE_TEMP_RE.fullmatch(entry.name)
                if m is not None:
                    found.setdefault(m["name"], []).append(entry)
                elif entry.name.endswith(".swap"):
                    found.setdefault(entry.name[: -len(".swap")], [])
        return found

    def recover(
        self,
        *,
        held: frozenset[str] = frozenset(),
        on_roll_back: Callable[[str, Path], None] | None = None,
    ) -> list[str]:
        """Finish or roll back every swap a crash interrupted; one line per action.

        Items whose lock another process holds are left alone (it is working on
        them); ``held`` names the items whose lock this process already holds.
        """
        done: list[str] = []
        for name, paths in sorted(self.leftovers().items()):
            lock: contextlib.AbstractContextManager[None] = (
                contextlib.nullcontext() if name in held else self.lock(name)
            )
            try:
                with lock:
                    done += self._recover_one(name, paths, on_roll_back)
            except ItemBusy:
                continue
            except OSError as err:
                done.append(f"{name}: could not recover ({err}); left as it is")
        return done

    def _recover_one(
        self, name: str, paths: list[Path], on_roll_back: Callable[[str, Path], None] | None
    ) -> list[str]:
        done: list[str] = []
        j = self._read_journal(name)
        if j is not None:
            done.append(self._settle(name, j))
        final = self.root / name
        for p in sorted(paths, key=lambda p: "replaced" not in p.name):
            if not os.path.lexists(p):
                continue
            if p.parent == self.state_dir:
                p.unlink()  # a temp file of a write a crash interrupted
                done.append(f"{name}: removed the temp file {p.name} of an unfinished write")
                continue
            if "replaced" in p.name:
                # an old version moved aside with no journal (pressrun before the
                # journal, or a crash before it was written): the old one counts
                if not os.path.lexists(final):
                    os.rename(p, final)
                    fsync_dir(self.root)
                    done.append(f"{name}: put back the version a crash had moved aside")
                else:
                    _remove(p)
                    done.append(f"{name}: removed an old version left aside ({p.name})")
                continue
            if on_roll_back is not None:
                on_roll_back(name, p)
            _remove(p)
            done.append(f"{name}: removed an unfinished {self.kind} folder ({p.name})")
        return done
