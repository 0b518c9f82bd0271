"""An encrypted issue's version numbers: the last one used, and reserving the next.

An encrypted issue's content key is new for each issue version, and subscribers' wraps
are stored per version (docs/protocols.md, "Encrypted issues"): a version whose wraps
may exist must never be used again with another key. So `pressrun.content.publish`
reserves the version before any wrap of it is stored, in
``CONTENT/.pressrun/<issue_id>.version`` (written through a temp file, fsynced with its
folder); the next version is one above the larger of that record and the version of
the bundle in CONTENT, whatever a crash removed (docs/publishing.md, "Versions never go
back").
"""

from __future__ import annotations

from pathlib import Path

from pressrun.content.bundle import MANIFEST_NAME
from pressrun.content.codec import ManifestError
from pressrun.content.manifest import SignedManifest
from pressrun.durable import STATE_DIR, write_atomic

__all__ = ["VersionRefused", "last_version", "reserve_version", "version_path"]


class VersionRefused(ValueError):
    """The version asked for is not above the last one used; the message says so."""


def _bundle_version(final: Path) -> int:
    """The version of the encrypted bundle at ``final`` (0 if none or not encrypted)."""
    try:
        old = SignedManifest.from_json_bytes((final / MANIFEST_NAME).read_bytes()).manifest
    except (OSError, ManifestError):
        return 0
    return 0 if old.encryption is None else old.encryption.version


def version_path(content_dir: Path, issue_id: str) -> Path:
    """``CONTENT/.pressrun/<issue_id>.version``: the last encrypted version reserved."""
    return content_dir / STATE_DIR / f"{issue_id}.version"


def last_version(content_dir: Path, issue_id: str) -> int:
    """The last version of ``issue_id`` reserved or published in ``content_dir`` (0: none)."""
    recorded = 0
    try:
        text = version_path(content_dir, issue_id).read_text("ascii").strip()
        recorded = int(text) if text.isdigit() else 0
    except (OSError, UnicodeDecodeError):
        pass
    return max(recorded, _bundle_version(content_dir / issue_id))


def reserve_version(content_dir: Path, issue_id: str, wanted: int | None) -> int:
    """The version this publish uses, recorded on disk (fsynced) before any wrap of it
    is stored: the next one after every version reserved or published, or ``wanted``
    when it is above them (a version already used is refused)."""
    last = last_version(content_dir, issue_id)
    if wanted is not None and wanted <= last:
        raise VersionRefused(
            f"issue version {wanted} of {issue_id} is not above the last one used ({last}); "
            "versions never go back: pass a larger --issue-version or none"
        )
    chosen = wanted or last + 1
    (content_dir / STATE_DIR).mkdir(exist_ok=True)
    write_atomic(version_path(content_dir, issue_id), f"{chosen}\n".encode("ascii"))
    return chosen
