"""``pressrun keys new``, ``pressrun publish`` and ``pressrun verify``.

Every failure a user can cause prints one line on stderr, ``pressrun <command>:
<what went wrong and what to do>``, and exits 1 (argparse's own usage errors exit 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pressrun.content.codec import DEFAULT_PIECE_SIZE

LARGE_FILE_BYTES = 8 << 20  # show a progress bar when hashing at least this much


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``keys``, ``publish`` and ``verify`` to the top-level commands."""
    keys = subparsers.add_parser(
        "keys", help="key pairs: a publisher's (Ed25519) or a subscriber's (X25519)"
    )
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="KEYS_COMMAND", required=True)
    new = keys_sub.add_parser(
        "new",
        help="make a publisher (or, with --subscriber, a subscriber) key pair",
        description="Write a new Ed25519 publisher key pair (with --subscriber: an X25519 "
        "subscriber key pair): the secret key (64 hex) to OUT with mode 0600 and the "
        "public key (64 hex) to OUT.pub. A subscriber gives OUT.pub to the publisher.",
    )
    new.add_argument("--out", required=True, type=Path, help="secret key file to write")
    new.add_argument(
        "--subscriber",
        action="store_true",
        help="a reader's X25519 key pair for encrypted issues instead of a publisher's",
    )
    new.add_argument("--force", action="store_true", help="replace existing key files")
    new.set_defaults(func=run_keys_new)

    pub = subparsers.add_parser(
        "publish",
        help="make a signed issue bundle (file, torrent, manifest)",
        description="Copy FILE into CONTENT/<issue>/, make <issue>.torrent (v1, origins "
        "as web seeds) and the signed manifest.json. Atomic: a failure leaves nothing.",
    )
    pub.add_argument("file", type=Path, metavar="FILE", help="the issue (PDF, EPUB, ...)")
    pub.add_argument("--issue", required=True, help="issue id, e.g. weekly-2026-47")
    pub.add_argument("--title", required=True, help="title shown to readers")
    pub.add_argument("--key", required=True, type=Path, help="publisher secret key file")
    pub.add_argument("--content", required=True, type=Path, help="content folder (CONTENT)")
    pub.add_argument(
        "--web-seed",
        action="append",
        default=[],
        metavar="URL",
        help="origin base URL (http://host:port); repeatable; the torrent gets the web "
        "seed URL/content/<issue>/<file>",
    )
    pub.add_argument(
        "--tracker", action="append", default=[], metavar="URL", help="announce URL; repeatable"
    )
    pub.add_argument(
        "--no-webtorrent",
        action="store_true",
        help="do not name each HTTP tracker's ws:// twin (/webtorrent: browser readers)",
    )
    pub.add_argument(
        "--piece-size",
        type=int,
        default=DEFAULT_PIECE_SIZE,
        metavar="BYTES",
        help=f"piece size, a power of two (default {DEFAULT_PIECE_SIZE})",
    )
    pub.add_argument("--force", action="store_true", help="replace an existing bundle")
    pub.add_argument(
        "--encrypt",
        action="store_true",
        help="subscribers only: encrypt the issue with a new key and wrap the key for each "
        "subscriber of --subscriptions (docs/subscriptions.md)",
    )
    pub.add_argument(
        "--subscriptions",
        metavar="URL",
        default=None,
        help="with --encrypt: the subscription service's base URL (goes into the manifest)",
    )
    pub.add_argument(
        "--subscriptions-token",
        metavar="TOKEN",
        default=None,
        help="with --encrypt: the service's operator token (default: "
        "$PRESSRUN_SUBSCRIPTIONS_TOKEN)",
    )
    pub.add_argument(
        "--issue-version",
        type=int,
        default=None,
        metavar="N",
        help="with --encrypt: the issue version, above every version used before (default: "
        "one above the last reserved or published in CONTENT, or 1)",
    )
    pub.add_argument(
        "--release-at",
        metavar="TIME",
        default=None,
        help="with --encrypt: the embargo; no subscriber gets the key before TIME "
        "(2026-11-28T06:00:00Z, 2026-11-28T07:00+01:00, or +2h / +30m from now); the "
        "ciphertext may travel before it (docs/subscriptions.md, 'Embargo')",
    )
    pub.set_defaults(func=run_publish)

    ver = subparsers.add_parser(
        "verify",
        help="check an issue bundle or a copy against its signed manifest",
        description="Check the manifest's signature, every piece hash, the whole-file "
        "hash and the torrent's info-hash. TARGET is a bundle folder, its manifest.json, "
        "an issue file with manifest.json beside it, or a reader's copy: a library's "
        "LIBRARY/<issue> folder or the file in it (a decrypted copy against the signed "
        "plaintext SHA-256).",
    )
    ver.add_argument("target", type=Path, metavar="TARGET")
    ver.add_argument(
        "--publisher-key",
        action="append",
        default=[],
        metavar="HEX_OR_PUBFILE",
        help="trusted publisher public key (64 hex or a .pub file); repeatable; "
        "without it only the signature's consistency is checked",
    )
    ver.set_defaults(func=run_verify)


def _fail(command: str, message: str) -> int:
    print(f"pressrun {command}: {message}", file=sys.stderr)
    return 1


@contextmanager
def _progress_bar(total_bytes: int) -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress bar on stderr, one row per stage, for big files on a terminal.

    Yields ``update(stage, done_bytes, total_bytes)``, or None when no bar is shown
    (small file, or stderr is not a terminal: logs and pipes stay clean).
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    if total_bytes < LARGE_FILE_BYTES or not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description:<9}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


def _stage(
    progress: Callable[[str, int, int], None], stage: str, total: int
) -> Callable[[int], None]:
    return lambda done: progress(stage, done, max(total, done))


def run_keys_new(args: argparse.Namespace) -> int:
    """``pressrun keys new``: write the key pair and print both paths and the public key."""
    from pressrun.content.keys import KeyFileError, generate_keypair, load_public_key

    try:
        secret, public = generate_keypair(args.out, force=args.force, subscriber=args.subscriber)
        key_hex = load_public_key(str(public)).hex()
    except KeyFileError as err:
        return _fail("keys new", str(err))
    kind = "subscriber (X25519)" if args.subscriber else "publisher (Ed25519)"
    print(f"secret key: {secret} (mode 0600; keep it private)")
    print(f"public key: {public} {key_hex}  [{kind}]")
    return 0


def run_publish(args: argparse.Namespace) -> int:
    """``pressrun publish``: make the bundle; print its path and info-hash."""
    import json
    import os

    from pressrun.content.bundle import MANIFEST_NAME
    from pressrun.content.publish import PublishError, publish

    directory = None
    if args.encrypt:
        from pressrun.subscriptions.client import TOKEN_ENV, HttpSubscriberDirectory

        if not args.subscriptions:
            return _fail(
                "publish", "--encrypt needs --subscriptions URL (the subscription service)"
            )
        token = args.subscriptions_token or os.environ.get(TOKEN_ENV) or None
        if token is None:
            return _fail(
                "publish",
                f"--encrypt needs the operator token: set {TOKEN_ENV} or pass "
                "--subscriptions-token",
            )
        directory = HttpSubscriberDirectory(args.subscriptions, token)
    elif args.subscriptions or args.issue_version is not None or args.release_at:
        return _fail(
            "publish",
            "--subscriptions, --issue-version and --release-at only apply with --encrypt",
        )
    release_at = None
    if args.release_at:
        import time

        from pressrun.content.release import ReleaseError, parse_release_time

        try:
            # the CLI is an adapter: the wall clock only turns "+2h" into a time
            release_at = parse_release_time(args.release_at, now_unix=time.time())  # noqa: TID251
        except ReleaseError as err:
            return _fail("publish", str(err))
    try:
        size = args.file.stat().st_size
    except OSError:
        size = 0  # publish() reports the problem
    try:
        with _progress_bar(size) as progress:
            bundle = publish(
                args.file,
                issue_id=args.issue,
                title=args.title,
                key_path=args.key,
                content_dir=args.content,
                web_seeds=args.web_seed,
                trackers=args.tracker,
                webtorrent=not args.no_webtorrent,
                piece_size=args.piece_size,
                force=args.force,
                progress=progress,
                encrypt_for=directory,
                version=args.issue_version,
                release_at=release_at,
            )
    except PublishError as err:
        return _fail("publish", str(err))
    manifest = json.loads((bundle / MANIFEST_NAME).read_bytes())["manifest"]
    print(f"bundle: {bundle}")
    if "encryption" in manifest:
        enc = manifest["encryption"]
        print(
            f"encrypted: {enc['plain_file_name']} ({enc['plain_size_bytes']} bytes) as "
            f"{manifest['file_name']}, version {enc['version']}; wraps at "
            f"{enc['subscriptions_url']}"
        )
        if "release_at" in enc:
            print(f"embargo: no wrap is handed out before {enc['release_at']}")
    print(f"info-hash: {manifest['info_hash']}")
    print(
        f"{manifest['size_bytes']} bytes in {len(manifest['piece_sha256'])} pieces of "
        f"{manifest['piece_size_bytes']}; sha256 {manifest['sha256']}"
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """``pressrun verify``: one OK line (exit 0) or one error line (exit 1)."""
    from pressrun.content.bundle import verify_issue
    from pressrun.content.keys import KeyFileError, load_public_key
    from pressrun.content.manifest import ManifestError

    try:
        trusted = [load_public_key(k) for k in args.publisher_key] or None
    except KeyFileError as err:
        return _fail("verify", str(err))
    target: Path = args.target
    # Only to size the progress bar: the issue file, or the biggest file in its bundle.
    try:
        if target.is_file() and target.name != "manifest.json":
            size = target.stat().st_size
        else:
            folder = target if target.is_dir() else target.parent
            size = max((p.stat().st_size for p in folder.iterdir() if p.is_file()), default=0)
    except OSError:
        size = 0
    try:
        with _progress_bar(size) as progress:
            on_bytes = None if progress is None else _stage(progress, "verifying", size)
            report = verify_issue(target, trusted, on_bytes=on_bytes)
    except ManifestError as err:
        return _fail("verify", str(err))
    except OSError as err:
        return _fail("verify", f"cannot read {err.filename or target}: {err.strerror}")
    print(report.summary())
    return 0
