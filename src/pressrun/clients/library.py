"""The local library: where issues appear once verified, and what is in between.

```
LIBRARY/
  trusted-publishers             one publisher key (64 hex) a line; '#' comments
  <issue_id>/<file_name>         a verified issue ...
  <issue_id>/manifest.json       ... with its signed manifest beside it
  .partial/<issue_id>/<file_name>   a download in progress (sparse, full size)
  .partial/<issue_id>/state.json    which of its pieces are verified (codec.ResumeState)
  .partial/<issue_id>/manifest.json the manifest it is being checked against
```

An issue folder appears in one ``rename(2)`` of a complete staging folder, so a reader
of the library sees either no issue or a verified one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from pressrun.clients.codec import ResumeState
from pressrun.content.codec import is_hex
from pressrun.durable import fsync_dir, write_atomic

TRUSTED_FILE = "trusted-publishers"
PARTIAL_DIR = ".partial"
STATE_FILE = "state.json"
MANIFEST_FILE = "manifest.json"


class LibraryError(Exception):
    """The library folder cannot be used (one line for a person)."""


class Library:
    """One library folder."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

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
        try:
            data = (self.partial_dir(issue_id) / STATE_FILE).read_bytes()
        except OSError:
            return None
        return ResumeState.from_json_bytes(data)

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

    def install(self, issue_id: str, file_name: str, manifest_json: bytes) -> Path:
        """Move a verified partial file into ``LIBRARY/<issue_id>/`` with its manifest,
        in one rename of a staging folder; an older copy of the issue is replaced.
        Returns the file's final path."""
        partial = self.partial_dir(issue_id) / file_name
        staging = Path(tempfile.mkdtemp(prefix=f".{issue_id}.arriving-", dir=self.root))
        try:
            os.chmod(staging, 0o755)
            with open(partial, "rb+") as f:
                os.fsync(f.fileno())
            os.rename(partial, staging / file_name)
            write_atomic(staging / MANIFEST_FILE, manifest_json)
            fsync_dir(staging)
            final = self.issue_dir(issue_id)
            if final.exists() or final.is_symlink():
                old = Path(tempfile.mkdtemp(prefix=f".{issue_id}.replaced-", dir=self.root))
                old.rmdir()
                os.rename(final, old)
                os.rename(staging, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(staging, final)
            fsync_dir(self.root)
        except BaseException:
            # Put the verified file back where a retry finds it, then drop the staging.
            with contextlib.suppress(OSError):
                os.rename(staging / file_name, partial)
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.discard_partial(issue_id)
        return final / file_name
