"""``pressrun serve reader``: the mobile web reader (docs/reader.md)."""

from __future__ import annotations

import argparse
from typing import Any

from pressrun.security import add_security_arguments


def register_serve(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve reader`` to the serve subcommands."""
    p = serve_subparsers.add_parser(
        "reader",
        help="the mobile web reader: an installable app that downloads, verifies and "
        "shows issues offline",
        description="Serve the web reader (a PWA: service worker, offline library, pdf.js) "
        "and its config.json. The browser itself asks the balancer for directives and "
        "downloads from the origins, so both must be reachable from the phone. Stops "
        "cleanly on SIGTERM/SIGINT.",
    )
    p.add_argument(
        "--balancer",
        action="append",
        default=None,
        metavar="URL[,URL...]",
        help="the balancers the app asks for directives, as the browser reaches them, "
        "tried in order (comma-separated or the flag repeated; default "
        "$PRESSRUN_BALANCERS or $PRESSRUN_BALANCER)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=8443,
        help="TCP port (default 8443; 8080 is the balancer's; 0: any free port)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--publisher-key",
        action="append",
        default=[],
        metavar="HEX_OR_FILE",
        help="a publisher key the app trusts (64 hex or a .pub file); repeatable; at least "
        "one is needed unless --trust-on-first-use",
    )
    p.add_argument(
        "--trust-on-first-use",
        action="store_true",
        help="with no --publisher-key, pin the first manifest's key in the browser (opt-in)",
    )
    p.add_argument(
        "--profile",
        default="mobile",
        choices=["mobile", "desktop"],
        help="the client profile whose download settings the app uses (default mobile)",
    )
    # the app's WebRTC peers' STUN/TURN servers (SwarmSettings; docker-compose.yml's
    # turn service sets them through the environment)
    import os

    p.add_argument(
        "--ice-server",
        action="append",
        default=None,
        metavar="URL",
        help="a STUN/TURN server for the app's WebRTC peers (stun:HOST:PORT, "
        "turn:HOST:PORT, turns:...), repeatable; default $PRESSRUN_READER_ICE_SERVERS "
        "(comma-separated), else none",
    )
    p.add_argument(
        "--turn-username",
        default=os.environ.get("PRESSRUN_READER_TURN_USER") or None,
        help="the TURN servers' user (default $PRESSRUN_READER_TURN_USER)",
    )
    p.add_argument(
        "--turn-credential",
        default=os.environ.get("PRESSRUN_READER_TURN_PASSWORD") or None,
        help="its password, handed to every browser in config.json "
        "(default $PRESSRUN_READER_TURN_PASSWORD)",
    )
    p.add_argument(
        "--no-peers",
        action="store_true",
        help="the app never asks to be sent to a swarm: origins only (a baseline)",
    )
    add_security_arguments(p, token=False)
    p.set_defaults(func=run_reader)


def _balancers(given: list[str] | None) -> str:
    """``--balancer`` (repeatable, comma lists) or the environment, as one comma list."""
    import os

    from pressrun.clients.config import BALANCER_ENVS

    if not given:
        given = [os.environ[n] for n in BALANCER_ENVS if os.environ.get(n, "").strip()][:1]
    if not given:
        raise ValueError("name the balancer: --balancer URL[,URL...] (or $PRESSRUN_BALANCERS)")
    return ",".join(given)


def run_reader(args: argparse.Namespace) -> int:
    """Run the reader service until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import asyncio
    import os
    import sys

    from pressrun.clients.config import profile
    from pressrun.content.keys import KeyFileError, load_public_key
    from pressrun.reader.config import ReaderConfig, SwarmSettings
    from pressrun.security import ServiceSecurity

    try:
        keys = tuple(load_public_key(k).hex() for k in args.publisher_key)
        given = args.ice_server or [os.environ.get("PRESSRUN_READER_ICE_SERVERS", "")]
        ice = [url for text in given for url in text.split(",")]
        swarm = SwarmSettings(
            ice_servers=tuple(u.strip() for u in ice if u.strip()),
            turn_username=args.turn_username,
            turn_credential=args.turn_credential,
            enabled=not args.no_peers,
        )
        config = ReaderConfig(
            balancer_url=_balancers(args.balancer),
            host=args.host,
            port=args.port,
            publisher_keys=keys,
            trust_on_first_use=args.trust_on_first_use,
            download=profile(args.profile),
            tls=ServiceSecurity(args.tls_cert, args.tls_key),
            swarm=swarm,
        )
        config.tls.server_ssl_context()  # a bad --tls-cert/--tls-key fails here
    except (ValueError, KeyFileError) as err:
        print(f"pressrun serve reader: {err}", file=sys.stderr)
        return 2
    from pressrun.reader.aio import AssetsMissing

    try:
        asyncio.run(serve_until_signal(config))
    except (AssetsMissing, OSError) as err:
        print(f"pressrun serve reader: {err}", file=sys.stderr)
        return 1
    return 0


async def serve_until_signal(config: Any) -> None:
    """Start the reader service, wait for SIGTERM or SIGINT, stop it."""
    import logging

    from pressrun.reader.aio import start_reader
    from pressrun.service import stop_signals

    with stop_signals() as stopped:
        reader = await start_reader(config)
        try:
            await stopped.wait()
        finally:
            logging.getLogger("pressrun.reader").info("reader: signal received, stopping")
            await reader.stop()
