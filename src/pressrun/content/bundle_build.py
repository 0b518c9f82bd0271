"""The files of a bundle, written into its staging folder (`pressrun.content.publish`).

One read of the source file both copies it into the bundle and hashes it (per-piece
and whole-file SHA-256), so the manifest describes the bytes in the bundle even if the
source changes meanwhile (`copy_and_hash`); for an encrypted issue the same single read
encrypts it piece by piece and hashes the ciphertext (`encrypt_into`, docs/protocols.md,
"Encrypted issues"). libtorrent then hashes the bundle's copy for the torrent
(`make_torrent`; FIELD-NOTES.md: ``list_files`` / ``create_torrent(..., v1_only)`` /
``set_piece_hashes`` / ``bencode(generate())``; ``generate_buf()`` is broken in the
2.1.1 wheel). Every file is new (``O_EXCL``), written through `durable.write_all` and
fsynced; swapping the folder into place, the lock and the recovery are `publish`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from pressrun import __version__
from pressrun.content.codec import ENCRYPTION_SCHEME, Encryption, encrypted_size
from pressrun.content.encryption import PieceCipher, encrypt_stream, key_check, new_nonce_prefix
from pressrun.durable import write_all

__all__ = [
    "ProgressCallback",
    "SourceChanged",
    "copy_and_hash",
    "encrypt_into",
    "make_torrent",
    "web_seed_url",
    "write_synced",
]

COPY_CHUNK_BYTES = 1 << 20

# progress(stage, done_bytes, total_bytes): stage is "hashing" (the copy and its
# SHA-256 pass), "encrypting" (the same for an encrypted issue) or "torrent"
# (libtorrent's SHA-1 pass over the copy).
ProgressCallback = Callable[[str, int, int], None]


class SourceChanged(Exception):
    """The issue file changed while it was read; the message is one line saying so."""


def web_seed_url(origin_base_url: str, issue_id: str, file_name: str) -> str:
    """The BEP 19 URL of an issue on an origin: ``BASE/content/<issue_id>/<file_name>``."""
    return f"{origin_base_url.rstrip('/')}/content/{issue_id}/{file_name}"


def _create(path: Path) -> int:
    """A new file (never over an existing one), for os-level writes: every byte goes
    through `write_all`, so a short write is finished or is an error."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


class _Fd:
    """Closes an os-level file descriptor (for ``contextlib.closing``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def copy_and_hash(
    src: Path, dst: Path, piece_size: int, progress: ProgressCallback | None
) -> tuple[int, list[str], str]:
    """Copy ``src`` to ``dst`` hashing as it goes; (size, piece SHA-256s, file SHA-256)."""
    total = src.stat().st_size
    whole = hashlib.sha256()
    pieces: list[str] = []
    piece = hashlib.sha256()
    in_piece = 0
    done = 0
    out = _create(dst)
    with contextlib.closing(_Fd(out)), open(src, "rb") as fin:
        while chunk := fin.read(COPY_CHUNK_BYTES):
            write_all(out, chunk)
            whole.update(chunk)
            view = memoryview(chunk)
            while view:
                take = min(piece_size - in_piece, len(view))
                piece.update(view[:take])
                in_piece += take
                view = view[take:]
                if in_piece == piece_size:
                    pieces.append(piece.hexdigest())
                    piece = hashlib.sha256()
                    in_piece = 0
            done += len(chunk)
            if progress is not None:
                progress("hashing", done, max(total, done))
        os.fsync(out)
    if in_piece:
        pieces.append(piece.hexdigest())
    return done, pieces, whole.hexdigest()


def _encrypt_and_hash(
    cipher: PieceCipher, src: Path, dst: Path, progress: ProgressCallback | None
) -> tuple[int, list[str], str, str]:
    """Encrypt ``src`` into ``dst`` piece by piece, hashing the ciphertext as it goes.

    Returns (ciphertext size, ciphertext piece SHA-256s, ciphertext SHA-256,
    plaintext SHA-256).
    """
    whole = hashlib.sha256()
    pieces: list[str] = []
    size = 0
    out = _create(dst)
    try:

        def write(index: int, piece: bytes) -> None:
            nonlocal size
            write_all(out, piece)
            whole.update(piece)
            pieces.append(hashlib.sha256(piece).hexdigest())
            size += len(piece)

        def on_bytes(done: int) -> None:
            if progress is not None:
                progress("encrypting", done, cipher.plain_size_bytes)

        plain_sha = encrypt_stream(cipher, src, write, on_bytes=on_bytes)
        os.fsync(out)
    finally:
        os.close(out)
    return size, pieces, whole.hexdigest(), plain_sha


def encrypt_into(
    src: Path,
    dst: Path,
    *,
    issue_id: str,
    version: int,
    key: bytes,
    piece_size: int,
    subscriptions_url: str,
    progress: ProgressCallback | None,
) -> tuple[int, list[str], str, Encryption]:
    """Encrypt ``src`` into ``dst`` under ``key`` and a new nonce prefix.

    Returns (ciphertext size, ciphertext piece SHA-256s, ciphertext SHA-256, the
    manifest's ``encryption`` object).
    """
    plain_size = src.stat().st_size
    cipher = PieceCipher(
        key=key,
        issue_id=issue_id,
        version=version,
        nonce_prefix=new_nonce_prefix(),
        plain_size_bytes=plain_size,
        piece_size_bytes=piece_size,
    )
    size, piece_hashes, whole, plain_sha = _encrypt_and_hash(cipher, src, dst, progress)
    if size != encrypted_size(plain_size, piece_size):
        raise SourceChanged(f"issue file {src} changed size while it was encrypted")
    encryption = Encryption(
        scheme=ENCRYPTION_SCHEME,
        version=version,
        nonce_prefix=cipher.nonce_prefix,
        key_check=key_check(key),
        plain_file_name=src.name,
        plain_size_bytes=plain_size,
        plain_sha256=plain_sha,
        subscriptions_url=subscriptions_url.rstrip("/"),
    )
    return size, piece_hashes, whole, encryption


def make_torrent(
    file: Path,
    *,
    issue_id: str,
    piece_size: int,
    web_seeds: Sequence[str],
    trackers: Sequence[str],
    progress: ProgressCallback | None,
) -> bytes:
    """A v1 torrent of the single file ``file`` (already in the bundle folder)."""
    import libtorrent as lt

    ct = lt.create_torrent(lt.list_files(str(file)), piece_size, lt.create_torrent.v1_only)
    for base in web_seeds:
        ct.add_url_seed(web_seed_url(base, issue_id, file.name))
    # (with webtorrent, each HTTP tracker's ws:// twin is in the list: browsers and
    # desktop peers meet over WebRTC through it, docs/tracker.md "GET /webtorrent")
    for url in trackers:
        ct.add_tracker(url, 0)
    ct.set_creator(f"pressrun {__version__}")
    size = file.stat().st_size

    def on_piece(index: int) -> None:
        if progress is not None:
            progress("torrent", min((index + 1) * piece_size, size), size)

    lt.set_piece_hashes(ct, str(file.parent), on_piece)
    data: bytes = lt.bencode(ct.generate())
    return data


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to the new file ``path`` and fsync it."""
    fd = _create(path)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
