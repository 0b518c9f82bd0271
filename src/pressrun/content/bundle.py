"""Issue bundles on disk: load, list and verify ``CONTENT/<issue_id>/`` folders.

``Bundle.load`` is what an origin runs at start-up for every issue it serves: it
checks the signature, the names, that the file is there with the signed size, and
that the torrent is the one the manifest signs (its info-hash). It does not read the
issue file itself, which would take seconds per hundred MB; ``Bundle.check_content``
and ``verify_issue`` (behind ``pressrun verify``) do.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from pressrun.content.codec import (
    Manifest,
    ManifestError,
    TorrentMeta,
    parse_torrent,
    valid_file_name,
    valid_issue_id,
)
from pressrun.content.manifest import (
    BytesDone,
    FileCheck,
    SignedManifest,
    check_file,
    file_sha256,
)

__all__ = [
    "COPY_MANIFEST_NAME",
    "MANIFEST_NAME",
    "Bundle",
    "BundleError",
    "VerifyReport",
    "list_bundles",
    "valid_file_name",
    "valid_issue_id",
    "verify_issue",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
#: the signed manifest beside a reader's copy in a library (``LIBRARY/<issue>/``): a
#: dot-name, which no issue file can have (docs/client.md, "Library layout")
COPY_MANIFEST_NAME = ".manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # a 100 GB issue in 256 KiB pieces is about 26 MB of JSON
MAX_TORRENT_BYTES = 64 << 20


class BundleError(ManifestError):
    """A bundle that is incomplete or does not match its manifest (one-line message)."""


def _read_limited(path: Path, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise BundleError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise BundleError(f"{what} {path} is a folder") from None
    except OSError as err:
        raise BundleError(f"cannot read {what} {path}: {err.strerror}") from None
    if len(data) > limit:
        raise BundleError(f"{what} {path} is larger than {limit} bytes")
    return data


def read_manifest(path: Path, trusted_keys: Collection[bytes] | None = None) -> Manifest:
    """Parse and verify ``manifest.json`` at ``path``; ManifestError/BundleError if not."""
    data = _read_limited(path, MAX_MANIFEST_BYTES, "manifest")
    return SignedManifest.from_json_bytes(data).verify(trusted_keys)


def check_torrent(manifest: Manifest, torrent_path: Path) -> TorrentMeta:
    """The torrent at ``torrent_path`` is the one the manifest signs, or BundleError."""
    meta = parse_torrent(_read_limited(torrent_path, MAX_TORRENT_BYTES, "torrent"))
    if meta.info_hash != manifest.info_hash:
        raise BundleError(
            f"torrent {torrent_path.name} has info-hash {meta.info_hash} but the manifest "
            f"signs {manifest.info_hash}"
        )
    # The info-hash covers name, length and pieces, so with a matching hash these can
    # only differ if the publisher signed an inconsistent pair: still worth one line.
    if (meta.name, meta.length, meta.piece_length) != (
        manifest.file_name,
        manifest.size_bytes,
        manifest.piece_size_bytes,
    ):
        raise BundleError(
            f"torrent {torrent_path.name} describes {meta.name} ({meta.length} bytes, "
            f"pieces of {meta.piece_length}) but the manifest {manifest.file_name} "
            f"({manifest.size_bytes} bytes, pieces of {manifest.piece_size_bytes})"
        )
    return meta


def describe_bad_pieces(manifest: Manifest, file_name: str, found: FileCheck) -> str:
    """One line for a copy that does not match: size, bad pieces or whole-file hash."""
    if found.size_bytes != manifest.size_bytes:
        return (
            f"{file_name} is {found.size_bytes} bytes but the manifest says "
            f"{manifest.size_bytes} (truncated or wrong file)"
        )
    if found.bad_pieces:
        shown = ", ".join(str(i) for i in found.bad_pieces[:8])
        more = ", ..." if len(found.bad_pieces) > 8 else ""
        return (
            f"{file_name}: {len(found.bad_pieces)} of {manifest.num_pieces} pieces do not "
            f"match the manifest (piece {shown}{more}); the copy is corrupted"
        )
    return f"{file_name}: SHA-256 {found.sha256} does not match the manifest's {manifest.sha256}"


@dataclass(frozen=True)
class Bundle:
    """One issue's folder: the verified manifest and where its files are."""

    dir: Path
    manifest: Manifest
    file_path: Path
    torrent_path: Path

    @property
    def manifest_path(self) -> Path:
        """``<dir>/manifest.json``."""
        return self.dir / MANIFEST_NAME

    @classmethod
    def load(cls, dir: Path | str, trusted_keys: Collection[bytes] | None = None) -> Bundle:
        """Load and check a bundle folder without reading the issue file's content.

        Checks: the signature (and the signer against ``trusted_keys`` if given), the
        folder is named after the issue, the file exists with the signed size, and
        the torrent's info-hash is the signed one. ManifestError/BundleError if not.
        """
        dir = Path(dir)
        if not dir.is_dir():
            raise BundleError(f"bundle folder {dir} does not exist")
        manifest = read_manifest(dir / MANIFEST_NAME, trusted_keys)
        if dir.name != manifest.issue_id:
            raise BundleError(
                f"bundle folder {dir.name} holds the manifest of issue {manifest.issue_id}"
            )
        file_path = dir / manifest.file_name
        try:
            size = file_path.stat().st_size
        except FileNotFoundError:
            raise BundleError(f"bundle {dir} has no issue file {manifest.file_name}") from None
        if not file_path.is_file():
            raise BundleError(f"{file_path} is not a regular file")
        if size != manifest.size_bytes:
            raise BundleError(
                f"{file_path} is {size} bytes but the manifest says {manifest.size_bytes}"
            )
        torrent_path = dir / f"{manifest.issue_id}.torrent"
        check_torrent(manifest, torrent_path)
        return cls(dir=dir, manifest=manifest, file_path=file_path, torrent_path=torrent_path)

    def check_content(self, *, on_bytes: BytesDone | None = None) -> None:
        """Hash the issue file: every piece and the whole; BundleError if any differs."""
        found = check_file(self.manifest, self.file_path, on_bytes=on_bytes)
        if not found.matches(self.manifest):
            raise BundleError(describe_bad_pieces(self.manifest, self.file_path.name, found))


def list_bundles(
    content_dir: Path | str, trusted_keys: Collection[bytes] | None = None
) -> dict[str, Bundle]:
    """Every loadable bundle in ``content_dir`` by issue id, sorted.

    Folders that are not issue ids (including the hidden temp folders of a publish
    in progress) are ignored; broken bundles are skipped with a warning in the log.
    """
    content_dir = Path(content_dir)
    found: dict[str, Bundle] = {}
    try:
        entries = sorted(content_dir.iterdir())
    except FileNotFoundError:
        log.warning("content folder %s does not exist; no bundles", content_dir)
        return found
    except NotADirectoryError:
        log.warning("content folder %s is not a folder; no bundles", content_dir)
        return found
    for entry in entries:
        if not valid_issue_id(entry.name) or not entry.is_dir():
            continue
        try:
            found[entry.name] = Bundle.load(entry, trusted_keys)
        except ManifestError as err:
            log.warning("skipping bundle %s: %s", entry, err)
    return found


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify_issue`` checked and found good."""

    manifest: Manifest
    file_path: Path
    torrent_path: Path | None  # None: no torrent beside a lone issue file
    trusted: bool  # the signer was checked against trusted keys
    decrypted: bool = False  # a reader's decrypted copy, checked against plain_sha256

    def summary(self) -> str:
        """One line for ``pressrun verify``."""
        m = self.manifest
        if self.decrypted and m.encryption is not None:
            signer = "trusted publisher" if self.trusted else "publisher not checked"
            return (
                f"OK {m.issue_id}: {self.file_path.name}, {m.encryption.plain_size_bytes} "
                f"bytes, decrypted copy matches the signed SHA-256 (version "
                f"{m.encryption.version}), signed by {m.publisher_key[:16]}... ({signer})"
            )
        torrent = f", info-hash {m.info_hash}" if self.torrent_path else ", no torrent checked"
        signer = (
            "trusted publisher" if self.trusted else "publisher not checked against a trusted key"
        )
        return (
            f"OK {m.issue_id}: {self.file_path.name}, {m.size_bytes} bytes, "
            f"{m.num_pieces} pieces match{torrent}, signed by {m.publisher_key[:16]}... "
            f"({signer})"
        )


def verify_issue(
    target: Path | str,
    trusted_keys: Collection[bytes] | None = None,
    *,
    on_bytes: BytesDone | None = None,
) -> VerifyReport:
    """Fully verify a bundle folder, a ``manifest.json`` in one, or an issue file; or a
    reader's copy: a library's issue folder or the file in it (``.manifest.json``
    beside it).

    An issue file is checked against the ``manifest.json`` beside it (and against the
    torrent beside it if there is one: a reader's copy may come without). Checks the
    signature, the signer (if ``trusted_keys``), the torrent's info-hash, every piece
    and the whole-file hash (a decrypted copy of an encrypted issue: its size and
    SHA-256 against the signed plaintext ones). Raises ManifestError/BundleError with
    one line.
    """
    target = Path(target)
    folder = target if target.is_dir() else target.parent
    if (folder / COPY_MANIFEST_NAME).is_file():
        return _verify_copy(folder, None if target.is_dir() else target, trusted_keys, on_bytes)
    if target.is_dir():
        bundle = Bundle.load(target, trusted_keys)
        bundle.check_content(on_bytes=on_bytes)
        return VerifyReport(
            bundle.manifest, bundle.file_path, bundle.torrent_path, trusted_keys is not None
        )
    if not target.exists():
        raise BundleError(f"{target} does not exist")
    if target.name == MANIFEST_NAME:
        manifest = read_manifest(target, trusted_keys)
        file_path = target.parent / manifest.file_name
        torrent_path: Path | None = target.parent / f"{manifest.issue_id}.torrent"
        if not file_path.exists():
            raise BundleError(f"the issue file {manifest.file_name} is not beside {target}")
    else:
        manifest_path = target.parent / MANIFEST_NAME
        if not manifest_path.exists():
            raise BundleError(
                f"no {MANIFEST_NAME} beside {target}; give the bundle folder or the manifest"
            )
        manifest = read_manifest(manifest_path, trusted_keys)
        file_path = target
        torrent_path = target.parent / f"{manifest.issue_id}.torrent"
        if not torrent_path.exists():
            torrent_path = None
    if torrent_path is not None:
        check_torrent(manifest, torrent_path)
    if not file_path.is_file():
        raise BundleError(f"{file_path} is not a regular file")
    found = check_file(manifest, file_path, on_bytes=on_bytes)
    if not found.matches(manifest):
        raise BundleError(describe_bad_pieces(manifest, file_path.name, found))
    return VerifyReport(manifest, file_path, torrent_path, trusted_keys is not None)


def _verify_copy(
    folder: Path,
    file_path: Path | None,
    trusted_keys: Collection[bytes] | None,
    on_bytes: BytesDone | None,
) -> VerifyReport:
    """A reader's copy in a library folder against the ``.manifest.json`` beside it."""
    manifest = read_manifest(folder / COPY_MANIFEST_NAME, trusted_keys)
    enc = manifest.encryption
    name = manifest.file_name if enc is None else enc.plain_file_name
    if file_path is None:
        file_path = folder / name
    elif file_path.name != name:
        raise BundleError(f"{file_path.name} is not the issue file of {folder} ({name} is)")
    if not file_path.is_file():
        raise BundleError(f"the issue file {name} is not in {folder}")
    trusted = trusted_keys is not None
    if enc is None:
        found = check_file(manifest, file_path, on_bytes=on_bytes)
        if not found.matches(manifest):
            raise BundleError(describe_bad_pieces(manifest, file_path.name, found))
        return VerifyReport(manifest, file_path, None, trusted)
    size = file_path.stat().st_size
    if size != enc.plain_size_bytes:
        raise BundleError(
            f"{file_path.name} is {size} bytes but the manifest says {enc.plain_size_bytes} "
            "(truncated or wrong file)"
        )
    digest = file_sha256(file_path, on_bytes=on_bytes)
    if digest != enc.plain_sha256:
        raise BundleError(
            f"{file_path.name}: SHA-256 {digest} does not match the manifest's "
            f"{enc.plain_sha256}; the copy is corrupted"
        )
    return VerifyReport(manifest, file_path, None, trusted, decrypted=True)
