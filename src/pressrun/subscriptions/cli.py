"""``pressrun serve subscriptions``, ``pressrun subscribers add|remove|list`` and
``pressrun release show|move|revoke`` (the embargo of an encrypted issue version).

The service needs an operator token (``--operator-token`` or the environment variable
``PRESSRUN_SUBSCRIPTIONS_TOKEN``); ``pressrun subscribers`` and ``pressrun publish
--encrypt`` send the same token. Errors: one line on stderr, exit 1 (2 for bad flags).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pressrun.security import add_security_arguments

DEFAULT_PORT = 8090


def _fail(command: str, message: str, code: int = 1) -> int:
    print(f"pressrun {command}: {message}", file=sys.stderr)
    return code


def register_serve(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve subscriptions``."""
    p = serve_subparsers.add_parser(
        "subscriptions",
        help="subscription service: subscribers' keys, each issue's wraps (SQLite)",
        description="Keep subscribers (X25519 public keys) and the wraps of each encrypted "
        "issue version in SQLite; hand each subscriber only its own wrap after a sealed "
        "challenge. Subscriber routes carry CORS headers; operator routes need the "
        "operator token. API: docs/protocols.md; operating: docs/subscriptions.md.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--db", default="subscriptions.db", help="SQLite file (default subscriptions.db)"
    )
    p.add_argument(
        "--operator-token",
        default=None,
        metavar="TOKEN",
        help="token for the operator routes (default: $PRESSRUN_SUBSCRIPTIONS_TOKEN; "
        "required one way or the other)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin allowed to call the subscriber routes from a browser "
        "(https://reader.example); repeatable; default: any origin",
    )
    p.add_argument(
        "--token-ttl-s",
        type=int,
        default=300,
        help="how long a challenge token stays valid (default 300)",
    )
    p.add_argument(
        "--publisher-key",
        action="append",
        default=[],
        metavar="HEX_OR_PUBFILE",
        help="accept release notices (embargoes) signed by this publisher key only; "
        "repeatable; default: any key, pinned per issue version by its first notice",
    )
    p.add_argument(
        "--max-devices",
        type=int,
        default=5,
        metavar="N",
        help="devices per subscriber, their own key counted (default 5); a device "
        "linked past it is refused with code device_limit",
    )
    add_security_arguments(p, token=False)
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT."""
    import asyncio
    import logging
    import sqlite3

    from pressrun.security import ServiceSecurity
    from pressrun.subscriptions.aio import SubscriptionService, serve
    from pressrun.subscriptions.client import TOKEN_ENV
    from pressrun.subscriptions.store import SubscriptionStore

    command = "serve subscriptions"
    token = args.operator_token or os.environ.get(TOKEN_ENV, "")
    if not token:
        return _fail(command, f"no operator token: set {TOKEN_ENV} or pass --operator-token", 2)
    log = logging.getLogger("pressrun.subscriptions")
    from pressrun.content.keys import KeyFileError, load_public_key

    try:
        publisher_keys = [load_public_key(k) for k in args.publisher_key]
    except KeyFileError as err:
        return _fail(command, str(err), 2)
    try:
        store = SubscriptionStore(args.db)
        service = SubscriptionService(
            store,
            operator_token=token,
            cors_origins=args.cors_origin or ["*"],
            token_ttl_s=args.token_ttl_s,
            security=ServiceSecurity(args.tls_cert, args.tls_key),
            publisher_keys=publisher_keys,
            max_devices=args.max_devices,
        )
        service.security.server_ssl_context()  # a bad --tls-cert/--tls-key fails here
    except (sqlite3.Error, OSError) as err:
        return _fail(command, f"cannot open the database {args.db}: {err}")
    except ValueError as err:
        return _fail(command, str(err), 2)

    def ready(port: int) -> None:
        url = f"{service.security.scheme}://{args.host}:{port}"
        log.info("subscription service on %s (sqlite %s)", url, args.db)
        print(f"subscriptions listening on {url}", flush=True)

    try:
        asyncio.run(serve(service, host=args.host, port=args.port, ready=ready))
    except OSError as err:
        return _fail(command, f"cannot start: {err}; check --port/--host")
    return 0


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun subscribers add|remove|list|devices|remove-device``."""
    p = subparsers.add_parser(
        "subscribers",
        help="add, remove or list the subscribers of a subscription service",
        description="Manage the subscribers of `pressrun serve subscriptions`. Needs the "
        "operator token ($PRESSRUN_SUBSCRIPTIONS_TOKEN or --token). A subscriber added "
        "gets wraps of the issues published from then on; one removed gets no wrap of "
        "any issue any more.",
    )
    sub = p.add_subparsers(dest="subscribers_command", metavar="COMMAND", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--service", required=True, metavar="URL", help="the service's base URL")
        q.add_argument(
            "--token", default=None, help="operator token (default: $PRESSRUN_SUBSCRIPTIONS_TOKEN)"
        )

    add = sub.add_parser("add", help="add (or rename) a subscriber")
    add.add_argument(
        "key", metavar="KEY", help="the subscriber's public key: 64 hex or a .pub file"
    )
    add.add_argument("--name", default="", help="a name to recognise them by")
    common(add)
    add.set_defaults(func=run_subscribers)
    remove = sub.add_parser("remove", help="remove a subscriber and every wrap of theirs")
    remove.add_argument(
        "key", metavar="KEY", help="the subscriber's public key: 64 hex or a .pub file"
    )
    common(remove)
    remove.set_defaults(func=run_subscribers)
    ls = sub.add_parser("list", help="list the subscribers (with how many devices each)")
    common(ls)
    ls.set_defaults(func=run_subscribers)
    devices = sub.add_parser(
        "devices", help="list a subscriber's devices (each has its own key and wraps)"
    )
    devices.add_argument(
        "key", metavar="KEY", help="the subscriber's public key: 64 hex or a .pub file"
    )
    common(devices)
    devices.set_defaults(func=run_subscribers)
    remove_device = sub.add_parser(
        "remove-device",
        help="remove one device of a subscriber: it gets no wrap of the next issue",
    )
    remove_device.add_argument(
        "key", metavar="DEVICE_KEY", help="the device's public key (from `subscribers devices`)"
    )
    common(remove_device)
    remove_device.set_defaults(func=run_subscribers)
    register_release(subparsers)


def register_release(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun release show|move|revoke``."""
    p = subparsers.add_parser(
        "release",
        help="the embargo of an encrypted issue version: show, move or revoke its release",
        description="An issue published with --encrypt --release-at has its wraps handed "
        "out only from that time, by the subscription service's clock. `move` signs a new "
        "release time with the publisher key, `revoke` withdraws the issue (no wrap at all "
        "until a later `move`); both need the operator token. docs/subscriptions.md.",
    )
    sub = p.add_subparsers(dest="release_command", metavar="COMMAND", required=True)

    def common(q: argparse.ArgumentParser, *, signed: bool) -> None:
        q.add_argument("issue", metavar="ISSUE", help="the issue id")
        q.add_argument(
            "--issue-version", type=int, required=True, metavar="N", help="the issue version"
        )
        q.add_argument("--service", required=True, metavar="URL", help="the service's base URL")
        if signed:
            q.add_argument(
                "--key", required=True, type=Path, help="the publisher's secret key file"
            )
        q.add_argument(
            "--token",
            default=None,
            help="operator token (default: $PRESSRUN_SUBSCRIPTIONS_TOKEN)",
        )

    show = sub.add_parser("show", help="the release notice the service holds")
    common(show, signed=False)
    show.set_defaults(func=run_release)
    move = sub.add_parser("move", help="set a new release time (earlier or later)")
    common(move, signed=True)
    move.add_argument(
        "--at",
        required=True,
        metavar="TIME",
        help="2026-11-28T06:00:00Z, 2026-11-28T07:00+01:00, or +2h / +30m from now",
    )
    move.set_defaults(func=run_release)
    revoke = sub.add_parser("revoke", help="withdraw the issue version: no wrap is handed out")
    common(revoke, signed=True)
    revoke.set_defaults(func=run_release)


def run_release(args: argparse.Namespace) -> int:
    """``pressrun release show|move|revoke``."""
    import asyncio
    import time

    import aiohttp

    from pressrun.content.keys import KeyFileError, load_signing_key
    from pressrun.content.release import (
        ReleaseError,
        ReleaseNotice,
        SignedRelease,
        parse_release_time,
        sign_release,
        utc_text,
    )
    from pressrun.subscriptions.client import TOKEN_ENV, SubscriptionError, SubscriptionsClient

    command = f"release {args.release_command}"
    # an adapter: the wall clock turns "+2h" into a time and dates the notice
    now_unix = time.time()  # noqa: TID251
    at = None
    key = None
    try:
        if args.release_command == "move":
            at = parse_release_time(args.at, now_unix=now_unix)
        if args.release_command != "show":
            key = load_signing_key(args.key)
    except (ReleaseError, KeyFileError) as err:
        return _fail(command, str(err), 2)
    token = args.token or os.environ.get(TOKEN_ENV) or None

    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            client = SubscriptionsClient(args.service, session, operator_token=token)
            doc = await client.release(args.issue, args.issue_version)
            what = f"{args.issue} version {args.issue_version}"
            if args.release_command == "show":
                if doc is None:
                    return f"{what}: no embargo (its wraps are handed out at once)"
                n = SignedRelease.from_json(
                    {"release": doc["release"], "signature": doc["signature"]}
                ).notice
                if n.revoked:
                    return f"{what}: revoked (sequence {n.sequence}); no wrap is handed out"
                state = (
                    "released"
                    if doc.get("released")
                    else f"embargoed, {doc.get('retry_after_s')} s left by the service's clock"
                )
                return f"{what}: release at {n.release_at} (sequence {n.sequence}): {state}"
            assert key is not None
            sequence = 1
            if doc is not None:
                sequence = int(doc["release"]["sequence"]) + 1
            notice = ReleaseNotice(
                issue_id=args.issue,
                version=args.issue_version,
                release_at=at,
                revoked=at is None,
                sequence=sequence,
                publisher_key=bytes(key.verify_key).hex(),
                signed_at=utc_text(now_unix),
            )
            await client.put_release(sign_release(notice, key))
            if at is None:
                return f"{what}: revoked (sequence {sequence}); no wrap is handed out"
            return f"{what}: release moved to {at} (sequence {sequence})"

    try:
        print(asyncio.run(go()))
    except (SubscriptionError, ReleaseError) as err:
        return _fail(command, str(err))
    return 0


def run_subscribers(args: argparse.Namespace) -> int:
    """``pressrun subscribers add|remove|list|devices|remove-device``."""
    import asyncio

    import aiohttp

    from pressrun.content.keys import KeyFileError, load_public_key
    from pressrun.subscriptions.client import TOKEN_ENV, SubscriptionError, SubscriptionsClient

    command = f"subscribers {args.subscribers_command}"
    key = b""
    if args.subscribers_command in ("add", "remove", "devices", "remove-device"):
        try:
            key = load_public_key(args.key, "subscriber key")
        except KeyFileError as err:
            return _fail(command, str(err), 2)
    token = args.token or os.environ.get(TOKEN_ENV) or None

    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            client = SubscriptionsClient(args.service, session, operator_token=token)
            if args.subscribers_command == "add":
                record, created = await client.add_subscriber(key, args.name)
                verb = "added" if created else "already a subscriber; name set"
                return f"{verb}: {record.get('public_key')} {record.get('name', '')}".rstrip()
            if args.subscribers_command == "remove":
                n = await client.remove_subscriber(key)
                return f"removed: {key.hex()} ({n} wrap{'' if n == 1 else 's'} deleted)"
            if args.subscribers_command == "devices":
                devices, limit = await client.devices(key)
                lines = [
                    f"{d['public_key']}  {d['added_at']}  {d['name']}"
                    + (f" (linked by {str(d['linked_by'])[:16]}...)" if d.get("linked_by") else "")
                    for d in devices
                ]
                return "\n".join([*lines, f"{len(devices)} of at most {limit} devices"])
            if args.subscribers_command == "remove-device":
                device, n = await client.remove_device(key)
                return (
                    f"removed device {key.hex()} of subscriber {device.get('subscriber')} "
                    f"({n} wrap{'' if n == 1 else 's'} deleted; no wrap of the next issue)"
                )
            subs = await client.subscribers()
            lines = [
                f"{s['public_key']}  {s['added_at']}  {len(s.get('devices') or [])} device(s)"
                f"  {s['name']}"
                for s in subs
            ]
            return "\n".join([*lines, f"{len(subs)} subscriber{'' if len(subs) == 1 else 's'}"])

    try:
        print(asyncio.run(go()))
    except SubscriptionError as err:
        return _fail(command, str(err))
    return 0
