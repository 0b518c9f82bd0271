"""The local library: where issues appear once verified, and what is in between.

```
LIBRARY/
  trusted-publishers             one publisher key (64 hex) a line; '#' comments
  <issue_id>/<file_name>         a verified issue ...
  <issue_id>/.manifest.json      ... with its signed manifest beside it
  .partial/<issue_id>/<file_name>   a download in progress (sparse, full size)
  .partial/<issue_id>/.state.json   which of its pieces are verified (codec.ResumeState)
  .partial/<issue_id>/.manifest.json the manifest it is being checked against
  .pressrun/<issue_id>.lock      held by the `pressrun get` working on the issue
  .pressrun/<issue_id>.swap      an install in progress (durable.FolderSwaps)
```

pressrun's own files start with a dot, which no issue file name may (``valid_file_name``):
an issue named ``manifest.json`` or ``state.json`` is one more file, never one of them.

An issue folder is built complete in ``LIBRARY/.<issue_id>.arriving-*`` and swapped in
(`durable.FolderSwaps`), so a reader of the library sees the old copy or the new one;
`Library.recover`, at the start of every ``pressrun get``, finishes an install a crash
interrupted or puts the verified file of an unfinished one back into ``.partial``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from pressrun.clients.codec import ResumeState
from pressrun.content.bundle import COPY_MANIFEST_NAME
from pressrun.content.codec import is_hex, valid_file_name
from pressrun.durable import FolderSwaps, ItemBusy, fsync_dir, write_atomic

TRUSTED_FILE = "trusted-publishers"
PARTIAL_DIR = ".partial"
STATE_FILE = ".state.json"
MANIFEST_FILE = COPY_MANIFEST_NAME
#: the names of pressrun before issue 27, still read (never written) where they
#: cannot be the issue's own file
LEGACY_STATE_FILE = "state.json"
LEGACY_MANIFEST_FILE = "manifest.json"


class LibraryError(Exception):
    """The library folder cannot be used (one line for a person)."""


class Library:
    """One library folder."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.swaps = FolderSwaps(self.root, "arriving")

    def ensure(self) -> None:
        """Create the library folder if needed; LibraryError if it cannot be."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise LibraryError(
                f"cannot create library folder {self.root}: {err.strerror}"
            ) from None
        if not self.root.is_dir():
            raise LibraryError(f"library {self.root} is not a folder")

    # -- trusted publishers

    @property
    def trusted_path(self) -> Path:
        """The ``trusted-publishers`` file."""
        return self.root / TRUSTED_FILE

    def trusted_keys(self) -> set[bytes]:
        """The keys in ``trusted-publishers`` (empty when there is no file)."""
        try:
            text = self.trusted_path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return set()
        except OSError as err:
            raise LibraryError(f"cannot read {self.trusted_path}: {err.strerror}") from None
        keys: set[bytes] = set()
        for number, line in enumerate(text.splitlines(), start=1):
            item = line.split("#", 1)[0].strip().lower()
            if not item:
                continue
            if not is_hex(item, 64):
                raise LibraryError(
                    f"{self.trusted_path}:{number} is not a publisher key (64 hex characters)"
                )
            keys.add(bytes.fromhex(item))
        return keys

    def trust(self, key: bytes, note: str) -> None:
        """Add ``key`` to ``trusted-publishers`` (trust on first use)."""
        old = self.trusted_path.read_bytes() if self.trusted_path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        write_atomic(self.trusted_path, old + f"{key.hex()}  # {note}\n".encode("ascii", "replace"))

    # -- issues

    def issue_dir(self, issue_id: str) -> Path:
        """Where a verified issue lives."""
        return self.root / issue_id

    def partial_dir(self, issue_id: str) -> Path:
        """Where a download in progress lives."""
        return self.root / PARTIAL_DIR / issue_id

    def load_state(self, issue_id: str) -> ResumeState | None:
        """The resume state of a partial download, or None."""
        folder = self.partial_dir(issue_id)
        for name in (STATE_FILE, LEGACY_STATE_FILE):
            try:
                data = (folder / name).read_bytes()
            except OSError:
                continue
            state = ResumeState.from_json_bytes(data)
            # a legacy state.json may be the issue's own file of that name
            if state is not None and (name == STATE_FILE or state.file_name != name):
                return state
        return None

    def save_state(self, state: ResumeState) -> None:
        """Record which pieces are verified (not fsynced: a resume re-checks them)."""
        write_atomic(
            self.partial_dir(state.issue_id) / STATE_FILE, state.to_json_bytes(), sync=False
        )

    def prepare_partial(
        self, issue_id: str, file_name: str, size_bytes: int, manifest_json: bytes, fresh: bool
    ) -> Path:
        """The partial file, full size (sparse), with the manifest beside it.

        ``fresh`` throws away whatever partial download was there.
        """
        if not valid_file_name(file_name):
            raise LibraryError(f"{file_name!r} is not a valid issue file name")
        folder = self.partial_dir(issue_id)
        if fresh and folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / file_name
        with open(path, "ab") as f:
            if f.tell() != size_bytes:
                f.truncate(size_bytes)
        write_atomic(folder / MANIFEST_FILE, manifest_json, sync=False)
        return path

    def discard_partial(self, issue_id: str) -> None:
        """Remove a partial download."""
        shutil.rmtree(self.partial_dir(issue_id), ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.root / PARTIAL_DIR).rmdir()

    def installed_manifest(self, issue_id: str) -> bytes | None:
        """The signed manifest bytes of the copy of ``issue_id`` in the library, or None."""
        folder = self.issue_dir(issue_id)
        try:
            return (folder / MANIFEST_FILE).read_bytes()
        except OSError:
            pass
        try:  # a library written before issue 27
            data = (folder / LEGACY_MANIFEST_FILE).read_bytes()
        except OSError:
            return None
        from pressrun.content.manifest import ManifestError, SignedManifest

        try:
            m = SignedManifest.from_json_bytes(data).manifest
        except ManifestError:
            return None
        plain = m.file_name if m.encryption is None else m.encryption.plain_file_name
        return None if plain == LEGACY_MANIFEST_FILE else data

    def install(
        self,
        issue_id: str,
        file_name: str,
        manifest_json: bytes,
        *,
        seeding: bool = False,
        keep_partial: bool = False,
    ) -> Path:
        """Move a verified partial file into ``LIBRARY/<issue_id>/`` with its manifest:
        a complete staging folder swapped in (an older copy of the issue is replaced in
        the same step). Returns the file's final path.

        ``seeding``: the peer still seeds the partial file, so it stays where it is
        (the library gets a hard link to it, a copy where links are impossible) and so
        does the partial folder, until `discard_partial` after the seeding (a crash in
        between leaves a partial download of the installed copy: `recover` removes it).
        ``keep_partial``: the file moves, but the peer seeds another file of the
        partial folder (an encrypted issue's ciphertext, its plaintext installed), so
        the folder stays until `discard_partial` after the seeding, as with ``seeding``.

        On an error the verified file goes back into ``.partial`` (a retry finds it)
        and an older copy stays as it was."""
        if not valid_file_name(file_name):
            raise LibraryError(f"{file_name!r} is not a valid issue file name")
        partial = self.partial_dir(issue_id) / file_name
        staging = self.swaps.new_staging(issue_id)
        try:
            fd = os.open(partial, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if seeding:
                _link_or_copy(partial, staging / file_name)
            else:
                os.rename(partial, staging / file_name)
            write_atomic(staging / MANIFEST_FILE, manifest_json)  # fsyncs staging too
            self.swaps.swap_in(staging, issue_id)
        except BaseException:
            if staging.exists():
                self._put_back(issue_id, staging)
                shutil.rmtree(staging, ignore_errors=True)
            raise
        if not (seeding or keep_partial):
            self.discard_partial(issue_id)
        return self.issue_dir(issue_id) / file_name

    def _put_back(self, issue_id: str, staging: Path) -> None:
        """Move the issue file of an unfinished staging folder back into ``.partial``
        (where its state file still lists its pieces as verified)."""
        folder = self.partial_dir(issue_id)
        if not folder.is_dir():
            return
        for entry in staging.iterdir():
            back = folder / entry.name
            if valid_file_name(entry.name) and entry.is_file() and not back.exists():
                with contextlib.suppress(OSError):
                    os.rename(entry, back)

    @contextlib.contextmanager
    def lock(self, issue_id: str) -> Iterator[None]:
        """Hold the issue's lock for a whole ``get``; LibraryError if another holds it."""
        try:
            with self.swaps.lock(issue_id):
                yield
        except ItemBusy as err:
            raise LibraryError(
                f"another pressrun get of {issue_id} is running in this library ({err}); "
                "wait for it to finish"
            ) from None

    def recover(self, *, held: frozenset[str] = frozenset()) -> list[str]:
        """Finish or roll back what a crash left in the library; one line per action.

        Installs a crash interrupted are finished (journaled) or rolled back (the
        verified file back into ``.partial``); a partial download of exactly the copy
        now in the library (an install killed before it removed it) is removed.
        """
        done = self.swaps.recover(held=held, on_roll_back=self._put_back)
        partials = self.root / PARTIAL_DIR
        with contextlib.suppress(OSError):
            for folder in sorted(partials.iterdir()):
                try:
                    mine = (folder / MANIFEST_FILE).read_bytes()
                except OSError:
                    continue
                if mine == self.installed_manifest(folder.name):
                    try:
                        lock: contextlib.AbstractContextManager[None] = (
                            contextlib.nullcontext()
                            if folder.name in held
                            else self.swaps.lock(folder.name)
                        )
                        with lock:
                            self.discard_partial(folder.name)
                    except ItemBusy:
                        continue
                    done.append(f"{folder.name}: removed the leftover partial download")
        if done:
            with contextlib.suppress(OSError):
                fsync_dir(self.root)
        return done


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` names the bytes of ``source``, which stays: a hard link (no second
    copy on disk; the seeding peer only reads the file), or a copy, fsynced, where the
    file system has no links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
