"""``publish``: turn an issue file into a signed bundle (docs/protocols.md).

The bundle ``CONTENT/<issue_id>/`` holds the file, ``<issue_id>.torrent`` (v1, made
by libtorrent, the origins as BEP 19 web seeds) and ``manifest.json`` (so an issue file
may have neither of those two names). It is built in a hidden folder
``CONTENT/.<issue_id>.publishing-*`` and swapped into place (`durable.FolderSwaps`: one
``renameat2(RENAME_EXCHANGE)``, journaled), so the origins that scan CONTENT see no
bundle, the old one or the new one, never none where there was one; on any failure
the temp folder is removed and an existing bundle is left as it was. A publish holds
the issue's lock (``CONTENT/.pressrun/<issue_id>.lock``) and first recovers what a
crash left in CONTENT (finishes a journaled swap, removes unfinished temp folders),
with one log line per action.

The bundle's files (the copy hashed in the same read, or the ciphertext; the torrent;
each written new and fsynced) are made by `pressrun.content.bundle_build`; this module
is the flow around them: the checks, the lock and recovery, the manifest, the wraps,
the swap.

With ``encrypt_for`` (``pressrun publish --encrypt``) the bundle holds the ciphertext
``<file>.enc`` instead (docs/protocols.md, "Encrypted issues"): a new content key and
nonce prefix for this issue version, the file encrypted piece by piece in the same
single read, the torrent and every hash over the ciphertext, the key wrapped for each
subscriber the directory lists and the wraps stored there *before* the bundle is
renamed into place (a failure leaves no bundle a subscriber could not open). The
content key is never written anywhere. The version is reserved before any wrap is
stored, in ``CONTENT/.pressrun/<issue_id>.version`` (fsynced): a version whose wraps
may exist is never used again, whatever a crash removed (`pressrun.content.versions`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar
from urllib.parse import urlsplit

from pressrun.content.bundle import MANIFEST_NAME
from pressrun.content.bundle_build import (
    ProgressCallback,
    SourceChanged,
    copy_and_hash,
    encrypt_into,
    make_torrent,
    write_synced,
)
from pressrun.content.codec import (
    DEFAULT_PIECE_SIZE,
    FORMAT,
    MAX_TITLE_CHARS,
    Encryption,
    Manifest,
    ManifestError,
    parse_torrent,
    valid_file_name,
    valid_issue_id,
)
from pressrun.content.encryption import new_content_key, wrap_key
from pressrun.content.keys import KeyFileError, is_private_mode, load_signing_key
from pressrun.content.manifest import sign_manifest
from pressrun.content.release import ReleaseNotice, SignedRelease, sign_release
from pressrun.content.versions import VersionRefused, reserve_version
from pressrun.durable import FolderSwaps, ItemBusy, fsync_dir
from pressrun.tracker.websocket_urls import with_webtorrent_trackers

__all__ = [
    "DEFAULT_PIECE_SIZE",
    "ENCRYPTED_SUFFIX",
    "PublishError",
    "SubscriberDirectory",
    "publish",
]

if TYPE_CHECKING:
    import nacl.signing

log = logging.getLogger(__name__)

MIN_PIECE_SIZE = 16384  # one BitTorrent block
MAX_PIECE_SIZE = 64 << 20
T = TypeVar("T")
ENCRYPTED_SUFFIX = ".enc"  # the ciphertext file of an encrypted issue: <file_name>.enc


class PublishError(Exception):
    """Publishing failed; the message is one line saying what and what to do."""


class SubscriberDirectory(Protocol):
    """Where an encrypted issue's subscribers and wraps live (the subscription service).

    ``pressrun.subscriptions.client.HttpSubscriberDirectory`` is the real one. Its
    methods may raise any exception with a one-line message; publish reports it.
    """

    @property
    def url(self) -> str:
        """The service's base URL, written into the manifest as ``subscriptions_url``."""
        ...

    def subscriber_keys(self) -> list[bytes]:
        """The X25519 public keys of every current subscriber."""
        ...

    def store_wraps(
        self,
        issue_id: str,
        version: int,
        wraps: Mapping[bytes, bytes],
        release: SignedRelease | None = None,
    ) -> list[bytes]:
        """Store one issue version's wraps (replacing any) and, with ``release``, its
        embargo in the same step; the keys skipped (removed)."""
        ...


def _check_url(url: str, what: str, schemes: Sequence[str]) -> None:
    parts = urlsplit(url)
    if parts.scheme not in schemes or not parts.netloc:
        raise PublishError(
            f"{what} {url!r} is not a URL ({' or '.join(schemes)}://host[:port]/...)"
        )


def _check_inputs(
    file: Path,
    issue_id: str,
    title: str,
    piece_size: int,
    web_seeds: Sequence[str],
    trackers: Sequence[str],
) -> int:
    """Everything that can be refused before any byte is written; returns the size."""
    if not valid_issue_id(issue_id):
        raise PublishError(
            f"issue id {issue_id!r} is not allowed: use 1-128 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    if not valid_file_name(file.name):
        raise PublishError(
            f"file name {file.name!r} is not allowed in a bundle: rename it to letters, "
            "digits, '.', '_' or '-' (at most 128, starting with a letter or digit)"
        )
    if not title.strip():
        raise PublishError("the title is empty; pass --title")
    if len(title) > MAX_TITLE_CHARS:
        raise PublishError(f"the title is longer than {MAX_TITLE_CHARS} characters")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:
        # Non-UTF-8 bytes on the command line arrive as lone surrogates.
        raise PublishError("the title is not valid UTF-8 text") from None
    if piece_size < MIN_PIECE_SIZE or piece_size > MAX_PIECE_SIZE or piece_size & (piece_size - 1):
        raise PublishError(
            f"piece size {piece_size} must be a power of two from {MIN_PIECE_SIZE} "
            f"to {MAX_PIECE_SIZE} bytes"
        )
    for url in web_seeds:
        _check_url(url, "web seed", ("http", "https"))
        if urlsplit(url).query:
            # FIELD-NOTES: libtorrent refuses query strings on loopback web seeds.
            raise PublishError(f"web seed {url!r} has a query string; give the origin's base URL")
    for url in trackers:
        _check_url(url, "tracker", ("http", "https", "udp", "ws", "wss"))
    try:
        st = file.stat()
    except FileNotFoundError:
        raise PublishError(f"issue file {file} does not exist") from None
    except OSError as err:
        raise PublishError(f"cannot read issue file {file}: {err.strerror}") from None
    if not file.is_file():
        raise PublishError(f"{file} is not a regular file")
    if st.st_size == 0:
        raise PublishError(f"issue file {file} is empty; there is nothing to publish")
    return st.st_size


def bundle_names(issue_id: str) -> tuple[str, str]:
    """The names pressrun itself writes in a bundle folder (the protocol's, served as
    ``/content/<issue_id>/<name>``): no issue file may have one of them."""
    return (MANIFEST_NAME, f"{issue_id}.torrent")


def publish(
    file: Path,
    *,
    issue_id: str,
    title: str,
    key_path: Path,
    content_dir: Path,
    web_seeds: Sequence[str] = (),
    trackers: Sequence[str] = (),
    piece_size: int = DEFAULT_PIECE_SIZE,
    force: bool = False,
    progress: ProgressCallback | None = None,
    encrypt_for: SubscriberDirectory | None = None,
    version: int | None = None,
    release_at: str | None = None,
    webtorrent: bool = False,
) -> Path:
    """Make the signed bundle ``content_dir/<issue_id>/`` for ``file``; returns its path.

    ``web_seeds`` are origin base URLs (``http://host:port``); each becomes the web
    seed ``BASE/content/<issue_id>/<file_name>``. An existing bundle for the issue is
    an error unless ``force``, in which case it is replaced atomically. Every failure
    raises PublishError (one line) and leaves CONTENT as it was.

    ``encrypt_for``: publish the issue encrypted for the subscribers of that
    directory (module docstring). ``version``: the issue version of an encrypted
    issue, above every version reserved or published before (default: one above the
    last, or 1; recorded in ``CONTENT/.pressrun/<issue_id>.version`` before any wrap
    of it is stored; ``release_at`` (UTC text, ``2026-11-28T06:00:00Z``): the embargo,
    signed into the manifest and stored with the wraps as release notice sequence 1,
    ``pressrun.content.release``: no wrap is handed out before it). ``webtorrent``:
    name each HTTP tracker's WebSocket twin (`pressrun.tracker.websocket_urls`) too, so
    browsers reach desktop peers over WebRTC (``pressrun publish`` does unless
    ``--no-webtorrent``).
    """
    file, key_path, content_dir = Path(file), Path(key_path), Path(content_dir)
    if webtorrent:
        trackers = with_webtorrent_trackers(trackers)
    _check_inputs(file, issue_id, title, piece_size, web_seeds, trackers)
    if encrypt_for is None and version is not None:
        raise PublishError("an issue version only applies to an encrypted issue (--encrypt)")
    if encrypt_for is None and release_at is not None:
        raise PublishError("a release time only applies to an encrypted issue (--encrypt)")
    if encrypt_for is None and file.name in bundle_names(issue_id):
        # (encrypted, the bundle holds <name>.enc: a plaintext of any name is fine)
        raise PublishError(
            f"file name {file.name!r} is one of the bundle's own files "
            f"({', '.join(bundle_names(issue_id))}); rename the issue file"
        )
    if encrypt_for is not None:
        if not valid_file_name(file.name + ENCRYPTED_SUFFIX):
            raise PublishError(
                f"file name {file.name!r} is too long for an encrypted issue (at most "
                f"{128 - len(ENCRYPTED_SUFFIX)} characters); rename it"
            )
        _check_url(encrypt_for.url, "subscription service", ("http", "https"))
        if version is not None and not 1 <= version < 1 << 63:
            raise PublishError(f"issue version {version} must be an integer from 1")
    try:
        signing_key = load_signing_key(key_path)
        if not is_private_mode(key_path):
            log.warning("secret key %s is readable by other users; chmod 600 it", key_path)
    except KeyFileError as err:
        raise PublishError(str(err)) from None
    final = content_dir / issue_id
    try:
        content_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PublishError(f"cannot create content folder {content_dir}: {err.strerror}") from None
    swaps = FolderSwaps(content_dir, "publishing")
    try:
        with swaps.lock(issue_id):
            # what a crash left (this issue's or another's): finished or rolled back
            for line in swaps.recover(held=frozenset({issue_id})):
                log.warning("content folder %s: %s", content_dir, line)
            if os.path.lexists(final) and not force:
                raise PublishError(
                    f"a bundle for issue {issue_id} already exists at {final}; pass --force"
                )
            return _publish_locked(
                file,
                swaps,
                issue_id=issue_id,
                title=title,
                signing_key=signing_key,
                web_seeds=web_seeds,
                trackers=trackers,
                piece_size=piece_size,
                force=force,
                progress=progress,
                encrypt_for=encrypt_for,
                version=version,
                release_at=release_at,
            )
    except ItemBusy:
        raise PublishError(
            f"another pressrun publish of {issue_id} is running in {content_dir}; wait for "
            "it to finish"
        ) from None
    except OSError as err:
        raise PublishError(
            f"cannot use the content folder {content_dir}: {err.strerror or err}"
        ) from None


def _publish_locked(
    file: Path,
    swaps: FolderSwaps,
    *,
    issue_id: str,
    title: str,
    signing_key: nacl.signing.SigningKey,
    web_seeds: Sequence[str],
    trackers: Sequence[str],
    piece_size: int,
    force: bool,
    progress: ProgressCallback | None,
    encrypt_for: SubscriberDirectory | None,
    version: int | None,
    release_at: str | None = None,
) -> Path:
    """`publish` once the inputs are checked and the issue's lock is held."""
    content_dir = swaps.root
    final = content_dir / issue_id
    encryption: Encryption | None = None
    content_key = b""
    subscriber_keys: list[bytes] = []
    enc_version = 0
    if encrypt_for is not None:
        try:
            enc_version = reserve_version(content_dir, issue_id, version)
        except VersionRefused as err:
            raise PublishError(str(err)) from None
        subscriber_keys = _directory_call(encrypt_for, encrypt_for.subscriber_keys)
        if not subscriber_keys:
            log.warning(
                "the subscription service at %s lists no subscriber: nobody will be able "
                "to read %s version %d",
                encrypt_for.url,
                issue_id,
                enc_version,
            )
    tmp = swaps.new_staging(issue_id)
    try:
        if encrypt_for is None:
            copy = tmp / file.name
            size, piece_hashes, whole = copy_and_hash(file, copy, piece_size, progress)
        else:
            copy = tmp / (file.name + ENCRYPTED_SUFFIX)
            content_key = new_content_key()
            size, piece_hashes, whole, encryption = encrypt_into(
                file,
                copy,
                issue_id=issue_id,
                version=enc_version,
                key=content_key,
                piece_size=piece_size,
                subscriptions_url=encrypt_for.url,
                progress=progress,
            )
            encryption = dataclasses.replace(encryption, release_at=release_at)
        if size == 0:
            raise PublishError(f"issue file {file} is empty; there is nothing to publish")
        torrent = make_torrent(
            copy,
            issue_id=issue_id,
            piece_size=piece_size,
            web_seeds=web_seeds,
            trackers=trackers,
            progress=progress,
        )
        meta = parse_torrent(torrent)
        if meta.num_pieces != len(piece_hashes) or meta.length != size:
            raise PublishError(
                f"libtorrent's torrent has {meta.num_pieces} pieces over {meta.length} bytes "
                f"but the copied file {len(piece_hashes)} over {size}; please report this"
            )
        write_synced(tmp / f"{issue_id}.torrent", torrent)
        manifest = Manifest(
            format=FORMAT,
            issue_id=issue_id,
            title=title,
            file_name=copy.name,
            size_bytes=size,
            piece_size_bytes=piece_size,
            piece_sha256=tuple(piece_hashes),
            sha256=whole,
            info_hash=meta.info_hash,
            publisher_key=bytes(signing_key.verify_key).hex(),
            created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            encryption=encryption,
        )
        signed = sign_manifest(manifest, signing_key)
        signed.verify()  # never write a manifest this code itself would reject
        write_synced(tmp / MANIFEST_NAME, signed.to_json_bytes())
        fsync_dir(tmp)
        if encrypt_for is not None and encryption is not None:
            wrapping = time.perf_counter()
            wraps = {k: wrap_key(content_key, k) for k in subscriber_keys}
            release = None
            if release_at is not None:  # the embargo goes with the wraps, never after
                notice = ReleaseNotice(
                    issue_id=issue_id,
                    version=encryption.version,
                    release_at=release_at,
                    revoked=False,
                    sequence=1,
                    publisher_key=manifest.publisher_key,
                    signed_at=manifest.created_at,
                )
                release = sign_release(notice, signing_key)
            storing = time.perf_counter()
            skipped = _directory_call(
                encrypt_for,
                lambda: encrypt_for.store_wraps(issue_id, encryption.version, wraps, release),
            )
            stored = time.perf_counter()
            for k in skipped:
                log.warning("subscriber %s was removed meanwhile: no wrap stored", k.hex())
            log.info(
                "%s version %d: wraps stored for %d subscribers (wrapped in %.2f s, "
                "stored in %.2f s)",
                issue_id,
                encryption.version,
                len(wraps) - len(skipped),
                storing - wrapping,
                stored - storing,
            )
        if not force and os.path.lexists(final):
            raise PublishError(f"a bundle for issue {issue_id} appeared at {final} meanwhile")
        swaps.swap_in(tmp, issue_id)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, PublishError):
            raise
        if isinstance(err, (ManifestError, SourceChanged)):
            raise PublishError(str(err)) from None
        if isinstance(err, OSError):
            where = f" ({err.filename})" if err.filename else ""
            raise PublishError(
                f"could not write the bundle: {err.strerror or err}{where}"
            ) from None
        if isinstance(err, Exception):
            raise PublishError(f"could not make the torrent: {err}") from None
        raise
    return final


def _directory_call(directory: SubscriberDirectory, call: Callable[[], T]) -> T:
    """Run a call to the subscription service; its failure as a one-line PublishError."""
    try:
        return call()
    except PublishError:
        raise
    except Exception as err:
        raise PublishError(
            f"subscription service {directory.url}: {err}; nothing was published"
        ) from None
