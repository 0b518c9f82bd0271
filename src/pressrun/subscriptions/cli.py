"""``pressrun serve subscriptions`` and ``pressrun subscribers add|remove|list``.

The service needs an operator token (``--operator-token`` or the environment variable
``PRESSRUN_SUBSCRIPTIONS_TOKEN``); ``pressrun subscribers`` and ``pressrun publish
--encrypt`` send the same token. Errors: one line on stderr, exit 1 (2 for bad flags).
"""

from __future__ import annotations

import argparse
import os
import sys
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
    try:
        store = SubscriptionStore(args.db)
        service = SubscriptionService(
            store,
            operator_token=token,
            cors_origins=args.cors_origin or ["*"],
            token_ttl_s=args.token_ttl_s,
            security=ServiceSecurity(args.tls_cert, args.tls_key),
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
    """Add ``pressrun subscribers add|remove|list``."""
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
    ls = sub.add_parser("list", help="list the subscribers")
    common(ls)
    ls.set_defaults(func=run_subscribers)


def run_subscribers(args: argparse.Namespace) -> int:
    """``pressrun subscribers add|remove|list``."""
    import asyncio

    import aiohttp

    from pressrun.content.keys import KeyFileError, load_public_key
    from pressrun.subscriptions.client import TOKEN_ENV, SubscriptionError, SubscriptionsClient

    command = f"subscribers {args.subscribers_command}"
    key = b""
    if args.subscribers_command in ("add", "remove"):
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
            subs = await client.subscribers()
            lines = [f"{s['public_key']}  {s['added_at']}  {s['name']}" for s in subs]
            return "\n".join([*lines, f"{len(subs)} subscriber{'' if len(subs) == 1 else 's'}"])

    try:
        print(asyncio.run(go()))
    except SubscriptionError as err:
        return _fail(command, str(err))
    return 0
