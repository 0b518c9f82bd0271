"""The signed manifest: parse, sign, verify, and check a file against it.

The data model and its JSON live in the pure ``codec`` module and are re-exported
here; this module adds what needs libsodium (Ed25519 through PyNaCl) or the disk
(streaming a file through SHA-256).

Typical use by a client that has downloaded an issue::

    signed = SignedManifest.from_json_bytes(manifest_json)
    manifest = signed.verify(trusted_keys={publisher_key})  # ManifestError if not
    if bad_pieces(manifest, path): ...  # re-fetch those pieces
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import nacl.exceptions
import nacl.signing

from pressrun.content.codec import (
    Manifest,
    ManifestError,
    decode_signed,
    encode_signed,
    piece_ok,
)

__all__ = [
    "FileCheck",
    "Manifest",
    "ManifestError",
    "SignedManifest",
    "bad_pieces",
    "check_file",
    "file_sha256",
    "piece_ok",
    "sign_manifest",
    "verify_signature",
]

READ_CHUNK_BYTES = 1 << 20

# Called with the number of bytes processed so far; used for progress bars.
BytesDone = Callable[[int], None]


def verify_signature(canonical: bytes, signature: bytes, public_key: bytes) -> None:
    """Check an Ed25519 detached signature; ManifestError if it does not match."""
    try:
        nacl.signing.VerifyKey(public_key).verify(canonical, signature)
    except (nacl.exceptions.CryptoError, ValueError):
        raise ManifestError(
            "manifest signature does not match its content (tampered or corrupted)"
        ) from None


@dataclass(frozen=True)
class SignedManifest:
    """A manifest and its Ed25519 signature, as stored in ``manifest.json``."""

    manifest: Manifest
    signature: bytes

    @classmethod
    def from_json_bytes(cls, data: bytes) -> SignedManifest:
        """Parse ``manifest.json``; ManifestError on malformed JSON, fields or hex.

        This does not check the signature: call :meth:`verify` before trusting it.
        """
        manifest, signature = decode_signed(data)
        return cls(manifest=manifest, signature=signature)

    def to_json_bytes(self) -> bytes:
        """The ``manifest.json`` bytes (indented JSON; the signature is over the
        canonical bytes, so the layout does not matter)."""
        return encode_signed(self.manifest, self.signature)

    def verify(self, trusted_keys: Collection[bytes] | None = None) -> Manifest:
        """Check the signature against the embedded publisher key and return the manifest.

        With ``trusted_keys`` the publisher key must also be one of them; without, any
        self-consistent manifest passes (integrity, not authenticity).
        """
        key = self.manifest.publisher_key_bytes
        verify_signature(self.manifest.canonical_bytes(), self.signature, key)
        if trusted_keys is not None and key not in {bytes(k) for k in trusted_keys}:
            raise ManifestError(
                f"manifest signed by {self.manifest.publisher_key} which is not a trusted publisher"
            )
        return self.manifest


def sign_manifest(manifest: Manifest, signing_key: nacl.signing.SigningKey) -> SignedManifest:
    """Sign ``manifest`` with the publisher's key.

    The manifest's ``publisher_key`` must be this key's public half, otherwise
    nobody could verify the result.
    """
    public = bytes(signing_key.verify_key).hex()
    if manifest.publisher_key != public:
        raise ManifestError(
            f"manifest names publisher key {manifest.publisher_key} "
            f"but is being signed with {public}"
        )
    signature = signing_key.sign(manifest.canonical_bytes()).signature
    return SignedManifest(manifest=manifest, signature=bytes(signature))


def file_sha256(path: Path | str, *, on_bytes: BytesDone | None = None) -> str:
    """SHA-256 hex of a whole file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK_BYTES):
            h.update(chunk)
            done += len(chunk)
            if on_bytes is not None:
                on_bytes(done)
    return h.hexdigest()


@dataclass(frozen=True)
class FileCheck:
    """What one pass over a copy of an issue found."""

    size_bytes: int  # the file's real size
    sha256: str  # of the whole file as it is
    bad_pieces: tuple[int, ...]  # indices that do not match the manifest

    def matches(self, manifest: Manifest) -> bool:
        """True if the copy is exactly the file the manifest describes."""
        return (
            not self.bad_pieces
            and self.size_bytes == manifest.size_bytes
            and self.sha256 == manifest.sha256
        )


def check_file(
    manifest: Manifest, path: Path | str, *, on_bytes: BytesDone | None = None
) -> FileCheck:
    """Read the file at ``path`` once: its size, whole-file SHA-256 and bad pieces.

    Pieces the file is too short to hold are bad; bytes past the manifest's size
    belong to no piece but change ``size_bytes`` and ``sha256``.
    """
    bad: list[int] = []
    whole = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        for index in range(manifest.num_pieces):
            _, length = manifest.piece_span(index)
            data = f.read(length)
            whole.update(data)
            if not piece_ok(manifest, index, data):
                bad.append(index)
            done += len(data)
            if on_bytes is not None:
                on_bytes(done)
        while chunk := f.read(READ_CHUNK_BYTES):
            whole.update(chunk)
            done += len(chunk)
            if on_bytes is not None:
                on_bytes(done)
    return FileCheck(size_bytes=done, sha256=whole.hexdigest(), bad_pieces=tuple(bad))


def bad_pieces(
    manifest: Manifest, path: Path | str, *, on_bytes: BytesDone | None = None
) -> list[int]:
    """Indices of the pieces of the file at ``path`` that do not match the manifest.

    Streams the file one piece at a time. Pieces the file is too short to hold are
    bad; bytes past the manifest's size are not a piece and are not reported here
    (see :func:`check_file` for the size and whole-file hash).
    """
    bad: list[int] = []
    done = 0
    with open(path, "rb") as f:
        for index in range(manifest.num_pieces):
            _, length = manifest.piece_span(index)
            data = f.read(length)
            if not piece_ok(manifest, index, data):
                bad.append(index)
            done += len(data)
            if on_bytes is not None:
                on_bytes(done)
    return bad
