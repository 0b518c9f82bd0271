"""Subscriber encryption: pieces sealed with XChaCha20-Poly1305, the key sealed per reader.

The construction (docs/protocols.md, "Encrypted issues"; FIELD-NOTES.md, "Encrypting
an issue once for every subscriber") is the STREAM construction with random access:

- one random 32-byte content key per issue *version* (a deterministic nonce is safe
  only while the key is never reused, so a republished issue gets a new key);
- the plaintext is cut into chunks of ``piece_size - 16`` bytes; chunk ``i`` is
  encrypted with ``crypto_aead_xchacha20poly1305_ietf_encrypt`` under the nonce
  ``nonce_prefix || u64be(i)`` and the associated data of
  :func:`pressrun.content.codec.piece_associated_data` (issue id, version, index,
  piece count, plaintext size), giving exactly one torrent piece of ciphertext;
  any piece decrypts on its own, in any order, and a piece moved to another index,
  another issue or another version, or a file cut short, fails authentication;
- the content key is wrapped for each subscriber with ``crypto_box_seal`` (80
  bytes) to the subscriber's X25519 public key; ``key_check`` (keyed BLAKE2b of a
  constant) lets a reader tell a wrong key from damaged pieces before decrypting.

Origins, peers and the multicast sender only ever see ciphertext: the manifest's
piece hashes and the torrent are over the ciphertext, so they verify without the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nacl.bindings
import nacl.encoding
import nacl.exceptions
import nacl.hash
import nacl.public

from pressrun.content.codec import (
    KEY_CHECK_MESSAGE,
    NONCE_PREFIX_BYTES,
    Manifest,
    ManifestError,
    num_pieces_for,
    piece_associated_data,
    piece_nonce,
    plain_piece_size,
)

__all__ = [
    "CONTENT_KEY_BYTES",
    "WRAP_BYTES",
    "DecryptError",
    "PieceCipher",
    "WrapError",
    "decrypt_file",
    "encrypt_stream",
    "key_check",
    "new_content_key",
    "new_nonce_prefix",
    "open_wrap",
    "wrap_key",
]

CONTENT_KEY_BYTES = 32
WRAP_BYTES = CONTENT_KEY_BYTES + 48  # crypto_box_SEALBYTES: ephemeral key + MAC


class DecryptError(ManifestError):
    """A piece or a file that does not decrypt (wrong key, swapped or damaged piece)."""


class WrapError(Exception):
    """A wrap that does not open with this subscriber's key, or opens to another key."""


def new_content_key() -> bytes:
    """A fresh random content key (one per issue version, never reused)."""
    return os.urandom(CONTENT_KEY_BYTES)


def new_nonce_prefix() -> bytes:
    """A fresh random 16-byte nonce prefix (one per issue version)."""
    return os.urandom(NONCE_PREFIX_BYTES)


def key_check(content_key: bytes) -> bytes:
    """BLAKE2b-256 of ``"pressrun-key-check-v1"`` keyed with the content key.

    libsodium's ``crypto_generichash(32, message, key)``; published in the manifest so
    a reader checks an opened wrap before decrypting a byte.
    """
    return nacl.hash.blake2b(
        KEY_CHECK_MESSAGE, digest_size=32, key=content_key, encoder=nacl.encoding.RawEncoder
    )


def wrap_key(content_key: bytes, subscriber_public_key: bytes) -> bytes:
    """The content key sealed to one subscriber's X25519 public key (80 bytes)."""
    return nacl.public.SealedBox(nacl.public.PublicKey(subscriber_public_key)).encrypt(content_key)


def open_wrap(wrap: bytes, subscriber_key: nacl.public.PrivateKey, expected_check: bytes) -> bytes:
    """Open a wrap with the subscriber's private key; the content key, checked.

    WrapError (one line) when the wrap is not sealed to this key, or opens to a key
    whose ``key_check`` is not the manifest's (a wrap of another issue or version).
    """
    try:
        key = nacl.public.SealedBox(subscriber_key).decrypt(wrap)
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise WrapError(
            "the wrap does not open with this subscriber key (it was sealed for another "
            "subscriber, or it is damaged)"
        ) from None
    if len(key) != CONTENT_KEY_BYTES or not hmac.compare_digest(key_check(key), expected_check):
        raise WrapError(
            "the wrap opens but holds another key than this issue version's (a wrap of "
            "another issue or version)"
        )
    return key


@dataclass(frozen=True)
class PieceCipher:
    """Encrypt and decrypt the pieces of one issue version (one content key).

    Build it with :meth:`for_manifest` when reading and directly when publishing;
    ``piece_size_bytes`` is the torrent's (ciphertext) piece size.
    """

    key: bytes
    issue_id: str
    version: int
    nonce_prefix: bytes
    plain_size_bytes: int
    piece_size_bytes: int

    @classmethod
    def for_manifest(cls, manifest: Manifest, key: bytes) -> PieceCipher:
        """The cipher of an encrypted manifest (ValueError for a plain one)."""
        enc = manifest.encryption
        if enc is None:
            raise ValueError(f"issue {manifest.issue_id} is not encrypted")
        return cls(
            key=key,
            issue_id=manifest.issue_id,
            version=enc.version,
            nonce_prefix=enc.nonce_prefix,
            plain_size_bytes=enc.plain_size_bytes,
            piece_size_bytes=manifest.piece_size_bytes,
        )

    @property
    def plain_piece_bytes(self) -> int:
        """Plaintext bytes in every piece but the last."""
        return plain_piece_size(self.piece_size_bytes)

    @property
    def num_pieces(self) -> int:
        """How many pieces the issue has."""
        return num_pieces_for(self.plain_size_bytes, self.plain_piece_bytes)

    def _ad(self, index: int) -> bytes:
        return piece_associated_data(
            self.issue_id, self.version, index, self.num_pieces, self.plain_size_bytes
        )

    def encrypt(self, index: int, plaintext: bytes) -> bytes:
        """Piece ``index`` of ciphertext (``len(plaintext) + 16`` bytes)."""
        if not 0 <= index < self.num_pieces:
            raise IndexError(f"piece {index} out of range 0..{self.num_pieces - 1}")
        out: bytes = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
            plaintext, self._ad(index), piece_nonce(self.nonce_prefix, index), self.key
        )
        return out

    def decrypt(self, index: int, ciphertext: bytes) -> bytes:
        """The plaintext of piece ``index``; DecryptError if it does not authenticate."""
        if not 0 <= index < self.num_pieces:
            raise DecryptError(f"piece {index} is outside the issue (0..{self.num_pieces - 1})")
        try:
            out: bytes = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(
                ciphertext, self._ad(index), piece_nonce(self.nonce_prefix, index), self.key
            )
        except (nacl.exceptions.CryptoError, ValueError, TypeError):
            raise DecryptError(
                f"piece {index} of {self.issue_id} fails authentication (swapped, reordered, "
                "truncated or damaged, or the wrong key)"
            ) from None
        return out


# Called with the number of plaintext bytes processed so far.
BytesDone = Callable[[int], None]


def encrypt_stream(
    cipher: PieceCipher,
    src: Path,
    on_piece: Callable[[int, bytes], None],
    *,
    on_bytes: BytesDone | None = None,
) -> str:
    """Read ``src`` chunk by chunk, encrypt each, hand ``(index, ciphertext)`` on.

    Returns the SHA-256 (hex) of the plaintext read; ManifestError if ``src`` is not
    ``cipher.plain_size_bytes`` long (it changed while being published).
    """
    whole = hashlib.sha256()
    done = 0
    with open(src, "rb") as f:
        for index in range(cipher.num_pieces):
            chunk = f.read(cipher.plain_piece_bytes)
            whole.update(chunk)
            done += len(chunk)
            expect = min(
                cipher.plain_piece_bytes, cipher.plain_size_bytes - index * cipher.plain_piece_bytes
            )
            if len(chunk) != expect:
                raise ManifestError(f"{src} changed size while it was being encrypted")
            on_piece(index, cipher.encrypt(index, chunk))
            if on_bytes is not None:
                on_bytes(done)
        if f.read(1):
            raise ManifestError(f"{src} grew while it was being encrypted")
    return whole.hexdigest()


def decrypt_file(
    manifest: Manifest,
    key: bytes,
    ciphertext_path: Path,
    plaintext_path: Path,
    *,
    on_bytes: BytesDone | None = None,
) -> None:
    """Decrypt a whole ciphertext file into a new file ``plaintext_path``.

    Every piece is authenticated, then the plaintext's SHA-256 is checked against the
    manifest's ``plain_sha256``. On any failure (DecryptError) ``plaintext_path`` is
    removed: the caller never sees a half-decrypted file. The caller renames the
    result into place.
    """
    enc = manifest.encryption
    if enc is None:
        raise ValueError(f"issue {manifest.issue_id} is not encrypted")
    cipher = PieceCipher.for_manifest(manifest, key)
    whole = hashlib.sha256()
    done = 0
    fout = open(plaintext_path, "xb")  # noqa: SIM115 (never over an existing file; closed below)
    try:
        with open(ciphertext_path, "rb") as fin, fout:
            for index in range(manifest.num_pieces):
                _, length = manifest.piece_span(index)
                data = fin.read(length)
                if len(data) != length:
                    raise DecryptError(
                        f"{ciphertext_path.name} ends in piece {index} of "
                        f"{manifest.num_pieces} (truncated)"
                    )
                plain = cipher.decrypt(index, data)
                whole.update(plain)
                fout.write(plain)
                done += len(plain)
                if on_bytes is not None:
                    on_bytes(done)
            if fin.read(1):
                raise DecryptError(f"{ciphertext_path.name} is longer than the manifest says")
            if whole.hexdigest() != enc.plain_sha256:
                raise DecryptError(
                    f"the decrypted {enc.plain_file_name} does not match the manifest's "
                    "plain_sha256 (a publisher error)"
                )
            fout.flush()
            os.fsync(fout.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            plaintext_path.unlink()
        raise
