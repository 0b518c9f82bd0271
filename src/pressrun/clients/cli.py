"""``pressrun get``: download an issue through the balancer into a local library."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pressrun.clients.config import UPLOADER_POLICY_ENV

#: where ``pressrun get`` looks for the subscriber key when no flag or env var names one
DEFAULT_SUBSCRIBER_KEY = "subscriber.key"
SUBSCRIBER_KEY_ENV = "PRESSRUN_SUBSCRIBER_KEY"
#: a reader's client keeps trying this long without progress (a slow or restarting
#: balancer, origins failing) before it gives up
DEFAULT_GIVE_UP_AFTER_S = 300.0


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun get`` to the top-level commands."""
    p = subparsers.add_parser(
        "get",
        help="download an issue through the balancer, verified, into a library",
        description="Ask the balancer where to download ISSUE, fetch it in sections with "
        "Range requests (asking again between sections, so a long download can move to "
        "another origin), verify every piece and the publisher's signature, and only then "
        "put it in LIBRARY/<issue>/. A killed download resumes where it stopped; an issue "
        "already in the library is checked, not downloaded again.",
    )
    p.add_argument("issue", metavar="ISSUE", help="the issue id")
    p.add_argument(
        "--stun",
        default=None,
        metavar="HOST:PORT",
        help="STUN server for WebRTC peers (browser readers) while in a swarm "
        "(default $PRESSRUN_STUN, else none)",
    )
    p.add_argument(
        "--balancer",
        action="append",
        default=None,
        metavar="URL[,URL...]",
        help="the balancers' base URLs, tried in order: a comma-separated list or the "
        "flag repeated; the client moves to the next on a refused connection, a timeout "
        "or a 5xx, keeping what it has (default: $PRESSRUN_BALANCERS or "
        "$PRESSRUN_BALANCER)",
    )
    p.add_argument("--library", required=True, metavar="DIR", help="the local library folder")
    p.add_argument(
        "--profile",
        default="desktop",
        choices=["desktop", "mobile"],
        help="desktop: 2 connections, the file in 3 sections; mobile: 1 connection, "
        "sections of at most 8 MiB, metered (default desktop)",
    )
    p.add_argument(
        "--section-mb",
        type=float,
        default=None,
        metavar="N",
        help="section size in MiB (default: the file in 3 sections, so at most 2 handoffs)",
    )
    p.add_argument(
        "--publisher-key",
        default=None,
        metavar="HEX_OR_FILE",
        help="the publisher key to trust (64 hex or a .pub file); default: the keys in "
        "LIBRARY/trusted-publishers (add one with `pressrun trust add`)",
    )
    p.add_argument(
        "--trust-on-first-use",
        action="store_true",
        help="when neither --publisher-key nor LIBRARY/trusted-publishers names a key, "
        "trust the first manifest's key and record it (off by default: an attacker who "
        "answers first would be trusted)",
    )
    p.add_argument(
        "--subscriber-key",
        default=None,
        metavar="FILE",
        help="your subscriber key (from `pressrun keys new --subscriber`) for encrypted "
        "issues; default: $PRESSRUN_SUBSCRIBER_KEY, else LIBRARY/subscriber.key if it exists",
    )
    p.add_argument(
        "--subscriptions",
        default=None,
        metavar="URL",
        help="the subscription service to ask for your wrap (default: the one the "
        "issue's signed manifest names)",
    )
    p.add_argument(
        "--max-seed-s",
        type=float,
        default=None,
        metavar="S",
        help="in swarm mode, seed at most this long after finishing (default: the "
        "profile's, 30 min desktop, 5 min mobile; a fair ratio or nobody left who needs "
        "a piece ends it sooner)",
    )
    p.add_argument(
        "--share-while-receiving",
        action="store_true",
        help="multicast mode: join the issue's swarm while the carousel delivers and "
        "offer the pieces already held (default: only a complete copy seeds)",
    )
    p.add_argument(
        "--multicast-deadline-s",
        type=float,
        default=None,
        metavar="S",
        help="multicast mode: seconds the carousel gets before the fallbacks (default 60)",
    )
    p.add_argument(
        "--multicast-interface",
        default=None,
        metavar="ADDR",
        help="multicast mode: IPv4 address of the interface to join channels on "
        "(default: the directive's hint, else the kernel's choice)",
    )
    p.add_argument(
        "--amt",
        choices=("auto", "always", "never"),
        default="auto",
        help="multicast mode through an AMT relay (RFC 7450): auto when the native join "
        "hears nothing within 1.5 s and a relay is known (default), always, never",
    )
    p.add_argument(
        "--amt-relay",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="an AMT relay of the reader's own, tried before the directive's (repeat "
        "for more; port 2268 by default)",
    )
    p.add_argument(
        "--amt-dns",
        default=None,
        metavar="HOST[:PORT]|system",
        help="look AMT relays up by DNS (RFC 8777 AMTRELAY records) at this resolver",
    )
    p.add_argument(
        "--multicast-control-group",
        default=None,
        metavar="GROUP:PORT",
        help="swarm mode: watch the publisher's control channel here and move to the "
        "issue's carousel when one starts while less than half of the file has come "
        "(default: do not watch)",
    )
    p.add_argument(
        "--multicast-control-source",
        default=None,
        metavar="ADDRESS",
        help="the sender's address, by which a source-specific (232/8) "
        "--multicast-control-group and its channels are joined (required with one)",
    )
    p.add_argument(
        "--give-up-after-s",
        type=float,
        default=DEFAULT_GIVE_UP_AFTER_S,
        metavar="S",
        help="keep retrying (backoff, Retry-After honoured, another origin after a bad "
        "answer) while the balancer or the origins fail, and give up only after this "
        f"long without progress (default {DEFAULT_GIVE_UP_AFTER_S:g}; 0: after "
        "8 failures in a row)",
    )
    p.add_argument(
        "--supernode",
        metavar="HOST",
        default=None,
        help="in swarm mode, also run a Chord supernode of the issue's ring, listening on "
        "and announced as HOST (a reachable address of this machine); refused with "
        "--profile mobile (docs/chord.md)",
    )
    p.add_argument(
        "--uploader-policy",
        metavar="NAME",
        default=None,
        help="in swarm mode, who uploads which piece: libtorrent, stripes or chord (the "
        "issue's Chord ring chooses each piece's uploader; docs/chord.md); default: "
        f"${UPLOADER_POLICY_ENV}, else the peer's default",
    )
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="an embargoed issue (published with --release-at): download it now at the "
        "balancer's prefetch pace and open it at the release (the command waits until "
        "then); any other issue is downloaded as usual (docs/subscriptions.md, 'Embargo')",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, only errors")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the outcome as one JSON object on stdout (for scripts and the "
        "emulation: mode, seconds, bytes by source, the file's SHA-256); no progress bar",
    )
    p.set_defaults(func=run_get)

    trust = subparsers.add_parser(
        "trust",
        help="the publisher keys a library trusts (LIBRARY/trusted-publishers)",
        description="`pressrun get` accepts only issues signed by a key in "
        "LIBRARY/trusted-publishers (or given with --publisher-key).",
    )
    trust_sub = trust.add_subparsers(dest="trust_command", metavar="COMMAND", required=True)
    add = trust_sub.add_parser("add", help="trust a publisher key in a library")
    add.add_argument("key", metavar="KEY", help="the publisher's public key: 64 hex or a .pub file")
    add.add_argument("--library", required=True, metavar="DIR", help="the library folder")
    add.add_argument("--note", default="", help="a comment kept beside the key")
    add.set_defaults(func=run_trust)
    ls = trust_sub.add_parser("list", help="list the publisher keys a library trusts")
    ls.add_argument("--library", required=True, metavar="DIR", help="the library folder")
    ls.set_defaults(func=run_trust)


def run_trust(args: argparse.Namespace) -> int:
    """``pressrun trust add|list``."""
    import sys

    from pressrun.clients.library import Library, LibraryError
    from pressrun.content.keys import KeyFileError, load_public_key

    library = Library(args.library)
    try:
        if args.trust_command == "add":
            key = load_public_key(args.key)
            library.ensure()
            if key in library.trusted_keys():
                print(f"already trusted: {key.hex()}")
                return 0
            library.trust(key, args.note or "added with pressrun trust add")
            print(f"trusted: {key.hex()} (in {library.trusted_path})")
            return 0
        keys = sorted(k.hex() for k in library.trusted_keys())
    except (KeyFileError, LibraryError) as err:
        print(f"pressrun trust {args.trust_command}: {err}", file=sys.stderr)
        return 1 if isinstance(err, LibraryError) else 2
    except OSError as err:
        print(
            f"pressrun trust {args.trust_command}: cannot write {library.trusted_path}: "
            f"{err.strerror or err}",
            file=sys.stderr,
        )
        return 1
    for k in keys:
        print(k)
    if not keys:
        print(f"no trusted publisher key in {library.trusted_path}", file=sys.stderr)
    return 0


class _RichProgress:
    """The progress bar of ``pressrun get``: bytes, rate, ETA, the origin now used."""

    def __init__(self, console: Any) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = console
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("from [cyan]{task.fields[origin]}"),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.origin = "-"

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        self.task = self.bar.add_task(
            issue_id, total=total_bytes, completed=done_bytes, origin=self.origin
        )

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        if origin is not None:
            self.origin = origin
        if self.task is not None:
            self.bar.update(self.task, completed=done_bytes, origin=self.origin)

    def notice(self, text: str) -> None:
        self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)


class _PlainNotices:
    """No bar (``--quiet`` or not a terminal): warnings to stderr, nothing else."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        pass

    def notice(self, text: str) -> None:
        import sys

        if not self.quiet or text.startswith("warning:"):
            print(f"pressrun get: {text}", file=sys.stderr)


def result_document(result: Any) -> dict[str, Any]:
    """``pressrun get --json``'s object: the `FetchResult`'s fields, the bytes from the
    origins in all, the SHA-256 of the file as it lies in the library, and
    ``opened_at``: the wall-clock time (Unix seconds) the issue was readable in the
    library (with ``--prefetch``, when it was opened at the release: the emulation's
    release minute compares it with the release time, issue 35; a copy installed
    before its seeding: ``ready_s`` after the start, not when the seeding ended)."""
    import dataclasses
    import hashlib
    import time

    # compared with the release's wall-clock time
    seeded_after = 0.0 if result.ready_s is None else max(0.0, result.seconds - result.ready_s)
    opened_at = time.time() - seeded_after  # noqa: TID251
    doc = dataclasses.asdict(result)
    doc["opened_at"] = round(opened_at, 3)
    doc["path"] = str(result.path)
    doc["bytes_from_origins"] = result.bytes_from_origins
    doc["download_s"] = result.download_s
    h = hashlib.sha256()
    with open(result.path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    doc["sha256"] = h.hexdigest()
    return doc


def run_get(args: argparse.Namespace) -> int:
    """Download the issue; 0 when it is in the library, 1 when it cannot be, 2 bad flags."""
    import asyncio
    import dataclasses
    import ipaddress
    import logging
    import os
    import sys
    from pathlib import Path

    from rich.console import Console

    from pressrun.clients.aio import FetchError, fetch_issue
    from pressrun.clients.config import BALANCER_ENVS, parse_balancer_urls, profile
    from pressrun.content.keys import (
        KeyFileError,
        is_private_mode,
        load_public_key,
        load_subscriber_key,
    )
    from pressrun.multicast.net import parse_group

    def fail(message: str, code: int = 1) -> int:
        print(f"pressrun get: {message}", file=sys.stderr)
        return code

    try:
        given = (
            args.balancer
            or [os.environ[name] for name in BALANCER_ENVS if os.environ.get(name, "").strip()][:1]
        )
        if not given:
            raise ValueError("name the balancer: --balancer URL[,URL...] (or $PRESSRUN_BALANCERS)")
        balancers = parse_balancer_urls(given)
        config = profile(args.profile).with_section_mb(args.section_mb)
        config = dataclasses.replace(
            config,
            give_up_after_s=args.give_up_after_s,
            supernode_host=args.supernode,
            uploader_policy=args.uploader_policy or os.environ.get(UPLOADER_POLICY_ENV) or None,
        )
        if args.max_seed_s is not None:
            config = dataclasses.replace(config, swarm_max_seed_s=args.max_seed_s)
        if args.share_while_receiving:
            config = dataclasses.replace(config, carousel_share=True)
        if args.amt != "auto" or args.amt_relay or args.amt_dns:
            from pressrun.multicast.gateway import parse_relay

            for relay in args.amt_relay:
                parse_relay(relay)  # a bad value fails here
            config = dataclasses.replace(
                config, amt=args.amt, amt_relays=tuple(args.amt_relay), amt_dns=args.amt_dns
            )
        if args.multicast_control_group:
            from pressrun.multicast.config import is_ssm

            group, _ = parse_group(args.multicast_control_group)  # a bad value fails here
            source = args.multicast_control_source
            if source is not None:
                ipaddress.IPv4Address(source)  # a bad value fails here
            elif is_ssm(group):
                raise ValueError(
                    f"{group} is a source-specific group: give the sender's address "
                    "with --multicast-control-source"
                )
            config = dataclasses.replace(
                config,
                carousel_control_group=args.multicast_control_group,
                carousel_control_source=source,
            )
        if args.multicast_deadline_s is not None or args.multicast_interface is not None:
            config = dataclasses.replace(
                config,
                multicast_deadline_s=args.multicast_deadline_s or config.multicast_deadline_s,
                multicast_interface=args.multicast_interface,
            )
    except ValueError as err:
        return fail(str(err), 2)
    trusted: set[bytes] | None = None
    if args.publisher_key:
        try:
            trusted = {load_public_key(args.publisher_key)}
        except KeyFileError as err:
            return fail(str(err), 2)
    subscriber_key = None
    key_file = args.subscriber_key or os.environ.get(SUBSCRIBER_KEY_ENV)
    if key_file is None and (Path(args.library) / DEFAULT_SUBSCRIBER_KEY).is_file():
        key_file = str(Path(args.library) / DEFAULT_SUBSCRIBER_KEY)
    if key_file is not None:
        try:
            subscriber_key = load_subscriber_key(key_file)
        except KeyFileError as err:
            return fail(str(err), 2)
        if not is_private_mode(Path(key_file)):
            print(
                f"pressrun get: warning: subscriber key {key_file} is readable by other "
                "users; chmod 600 it",
                file=sys.stderr,
            )
    console = Console(stderr=True)
    show_bar = not args.quiet and not args.json and console.is_terminal
    # what the client has to say goes through the progress object (above the bar, or
    # to stderr); log lines would break the bar's live display
    logging.getLogger("pressrun.clients").setLevel(logging.ERROR)
    progress: Any = _RichProgress(console) if show_bar else _PlainNotices(args.quiet or args.json)

    async def go() -> Any:
        if args.prefetch:
            from pressrun.clients.prefetch import prefetch_issue

            return await prefetch_issue(
                args.issue,
                balancer_url=balancers,
                library=Path(args.library),
                config=config,
                trusted_keys=trusted,
                progress=progress,
                trust_on_first_use=args.trust_on_first_use,
                subscriber_key=subscriber_key,
                subscriptions_url=args.subscriptions,
            )
        return await fetch_issue(
            args.issue,
            balancer_url=balancers,
            library=Path(args.library),
            config=config,
            trusted_keys=trusted,
            progress=progress,
            trust_on_first_use=args.trust_on_first_use,
            subscriber_key=subscriber_key,
            subscriptions_url=args.subscriptions,
        )

    from pressrun.peer import watchdog  # no libtorrent import

    if args.stun is not None:
        os.environ["PRESSRUN_STUN"] = args.stun  # what the swarm hand-off reads
    # a swarm peer's close and the exit are bounded (pressrun.peer.watchdog)
    try:
        watchdog.set_close_bound(watchdog.command_line_bound())
    except ValueError as err:
        return fail(str(err), 2)
    try:
        if show_bar:
            with progress:
                result = asyncio.run(go())
        else:
            result = asyncio.run(go())
    except FetchError as err:
        watchdog.bounded_exit()
        return fail(str(err))
    except BaseException:
        watchdog.bounded_exit()
        raise
    # the output before the exit's bound: the JSON document hashes the file in the
    # library, which took over the 8 s bound for a 50 MB issue on a host at load 60-115
    # (the emulated flash crowd of 29 Nov 05:23 at 4cf7817: two verified copies in the
    # library were counted failed, status 1 from the watchdog in result_document)
    try:
        _print_result(args, result)
    finally:
        watchdog.bounded_exit()
    return 0


def _print_result(args: argparse.Namespace, result: Any) -> None:
    """What ``pressrun get`` prints of its result: the JSON document (``--json``), or
    the lines a reader reads (none with ``--quiet``)."""
    if args.json:
        print(json.dumps(result_document(result)), flush=True)
        return
    if not args.quiet and result.already_in_library:
        print(
            f"{result.path}: already in the library; {result.size_bytes / 1e6:.1f} MB "
            "checked against the signed manifest, nothing downloaded"
        )
    elif not args.quiet:
        origins = ", ".join(
            f"{name} {n / 1e6:.1f} MB" for name, n in sorted(result.bytes_by_origin.items())
        )
        decrypted = " and decrypted" if result.encrypted else ""
        print(
            f"{result.path}: {result.size_bytes / 1e6:.1f} MB verified{decrypted} in "
            f"{result.seconds:.1f} s ({origins or 'nothing new'}; "
            f"{result.handoffs} handoff{'' if result.handoffs == 1 else 's'})"
        )
        if result.mode == "multicast":
            print(
                f"multicast: {result.bytes_from_multicast / 1e6:.1f} MB from the carousel "
                f"({result.multicast_note or 'no carousel'})"
            )
        if result.mode == "swarm" or result.bytes_from_peers or result.bytes_from_web_seeds:
            how = "stalled, the rest from origins" if result.swarm_stalled else "completed"
            print(
                f"swarm ({how}): {result.bytes_from_peers / 1e6:.1f} MB from peers, "
                f"{result.bytes_from_web_seeds / 1e6:.1f} MB from web seeds; left the "
                f"swarm by {result.leave_rule or 'no rule (the swarm ended early)'}"
            )
