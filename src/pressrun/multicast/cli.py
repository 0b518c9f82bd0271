"""``pressrun serve multicast``: the FLUTE carousel sender (docs/multicast.md)."""

from __future__ import annotations

import argparse
from typing import Any

from pressrun.multicast.config import FEC_SCHEMES, TOKEN_ENV, CarouselConfig
from pressrun.security import ServiceSecurity, add_security_arguments

_DEFAULTS = CarouselConfig()


def register_serve(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve multicast`` to the serve subcommands."""
    p = serve_subparsers.add_parser(
        "multicast",
        help="FLUTE carousel sender (RaptorQ channels, signed control channel, control API)",
        description="Carousel issues from CONTENT over UDP multicast (FLUTE/ALC with "
        "RaptorQ or no FEC, N channels each), announce them on the control group signed "
        "with the publisher's key, and take start/stop orders on a token-protected HTTP "
        "API (/v1/carousels); Prometheus text at /metrics. The token is read from the "
        f"environment variable named by --token-env (default {TOKEN_ENV}) or from "
        "--token-file. Stops cleanly on SIGTERM/SIGINT.",
    )
    p.add_argument("--content", required=True, metavar="DIR", help="the content directory")
    p.add_argument(
        "--control-group",
        required=True,
        metavar="GROUP:PORT",
        help="multicast group and port of the control channel (e.g. 239.255.70.1:5400)",
    )
    p.add_argument(
        "--key", required=True, metavar="FILE", help="the publisher's Ed25519 secret key file"
    )
    p.add_argument(
        "--interface",
        default="127.0.0.1",
        help="IPv4 address of the interface to send on (default 127.0.0.1)",
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="HTTP API port (default 0: any free)")
    p.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        metavar="NAME",
        help=f"environment variable holding the API token (default {TOKEN_ENV})",
    )
    p.add_argument(
        "--token-file", default=None, metavar="FILE", help="read the API token from FILE instead"
    )
    p.add_argument(
        "--fec",
        choices=FEC_SCHEMES,
        default=_DEFAULTS.fec,
        help=f"FEC of new carousels (default {_DEFAULTS.fec}; none: RFC 6726 no-code)",
    )
    p.add_argument(
        "--channels",
        type=int,
        default=_DEFAULTS.channels,
        help=f"channels per carousel (default {_DEFAULTS.channels})",
    )
    p.add_argument(
        "--rate-mbps",
        type=float,
        default=_DEFAULTS.rate_bps / 1e6,
        help=f"rate of each channel, Mbit/s of UDP payload (default {_DEFAULTS.rate_bps / 1e6:g})",
    )
    p.add_argument(
        "--cycle-overhead",
        type=float,
        default=_DEFAULTS.cycle_overhead,
        help="RaptorQ: each channel's cycle carries K x (1 + this) symbols per block "
        f"(default {_DEFAULTS.cycle_overhead:g})",
    )
    p.add_argument(
        "--symbol-bytes",
        type=int,
        default=_DEFAULTS.symbol_bytes,
        help=f"encoding symbol (packet payload) size (default {_DEFAULTS.symbol_bytes})",
    )
    p.add_argument(
        "--group-base",
        default="239.255.71.1",
        help="the first group of the carousels' range (default 239.255.71.1)",
    )
    p.add_argument(
        "--group-count",
        type=int,
        default=None,
        help="groups in the carousels' range; an issue's carousel takes the groups its id "
        "hashes to, the same after every restart (default 1024, or as many as there are "
        "up to 239.255.255.255)",
    )
    p.add_argument(
        "--channel-port-base",
        type=int,
        default=0,
        help="channel c of a carousel uses this port + c (default 0: a port derived from "
        "the issue id, 10000-29999, + c: under the hosts' ephemeral ports)",
    )
    p.add_argument(
        "--state-file",
        default=None,
        metavar="FILE",
        help="keep each issue's groups, ports and TSI in FILE (JSON, written atomically), "
        "so a plan moved off a taken group or a TSI set by hand survives a restart "
        "(default: none; plans are derived from the issue id)",
    )
    p.add_argument(
        "--fdt-renew-s",
        type=float,
        default=600.0,
        help="a running carousel's FDT is built again (fresh Expires, next FDT Instance "
        "ID) this often (default 600; it expires 86400 s after it is built)",
    )
    p.add_argument(
        "--announce-interval-s",
        type=float,
        default=0.5,
        help="seconds between announcements (default 0.5)",
    )
    p.add_argument(
        "--announcement-ttl-s",
        type=float,
        default=5.0,
        help="an announcement expires this long after it is sent (default 5)",
    )
    p.add_argument(
        "--multicast-ttl",
        type=int,
        default=2,
        help="IP TTL of multicast packets (default 2: a relay or router one hop away gets them)",
    )
    p.add_argument(
        "--prepare-issues",
        type=int,
        default=2,
        metavar="N",
        help="encode the N newest issues of --content as soon as they are published, so "
        "a carousel start costs no encoding (each holds one pass in memory; 0: encode at "
        "the start; default 2)",
    )
    p.add_argument(
        "--prepare-interval-s",
        type=float,
        default=10.0,
        help="how often --content is looked at for newly published issues (default 10)",
    )
    p.add_argument(
        "--start",
        action="append",
        default=[],
        metavar="ISSUE",
        help="start a carousel for ISSUE at once (repeatable); ISSUE=TSI sets its TSI",
    )
    add_security_arguments(p, token=False)
    p.set_defaults(func=run_sender)
    _register_relay(serve_subparsers)


def _register_relay(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve amt-relay``."""
    r = serve_subparsers.add_parser(
        "amt-relay",
        help="AMT relay (RFC 7450): the carousel's SSM channels to gateways without multicast",
        description="Answer AMT gateways on --listen (UDP, default port 2268): discovery, "
        "request, membership query with a response MAC, membership updates that join "
        "source-specific (232/8) channels on --interface; every datagram of a joined "
        "channel goes whole to each gateway that asked for it. Needs root or "
        "CAP_NET_RAW (a raw socket reads the channels). Stops on SIGTERM/SIGINT.",
    )
    r.add_argument(
        "--listen", default="0.0.0.0:2268", metavar="HOST:PORT", help="default 0.0.0.0:2268"
    )
    r.add_argument(
        "--interface",
        default="127.0.0.1",
        help="IPv4 address of the interface the channels are joined on (default 127.0.0.1)",
    )
    r.add_argument(
        "--relay-address",
        default=None,
        help="the address Relay Advertisements name (default: the --listen host, or "
        "--interface when that is 0.0.0.0)",
    )
    r.add_argument("--max-tunnels", type=int, default=1000, help="gateways at once (1000)")
    r.add_argument("--max-channels", type=int, default=64, help="channels per gateway (64)")
    r.add_argument(
        "--query-interval-s",
        type=int,
        default=20,
        help="how often gateways report again (20 s: shorter than NAT bindings last)",
    )
    r.set_defaults(func=run_relay)


def run_relay(args: argparse.Namespace) -> int:
    """Run the AMT relay until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import asyncio
    import logging
    import sys

    from pressrun.multicast.relay import AmtRelay, RelayConfig

    log = logging.getLogger("pressrun.multicast.relay")
    try:
        host, _, port = args.listen.rpartition(":")
        listen = (host or "0.0.0.0", int(port))
        relay_address = args.relay_address or (
            args.interface if listen[0] == "0.0.0.0" else listen[0]
        )
        config = RelayConfig(
            relay_address=relay_address,
            max_tunnels=args.max_tunnels,
            max_channels=args.max_channels,
            query_interval_s=args.query_interval_s,
            tunnel_timeout_s=3.25 * args.query_interval_s,
        )
    except ValueError as err:
        print(f"pressrun serve amt-relay: {err}", file=sys.stderr)
        return 2

    async def main() -> None:
        from pressrun.service import stop_signals

        relay = AmtRelay(config, listen=listen, interface=args.interface)
        with stop_signals() as stopped:
            try:
                address = await relay.start()
                log.info("AMT relay on %s:%d (interface %s)", *address, args.interface)
                await stopped.wait()
            finally:
                await relay.close()

    try:
        asyncio.run(main())
    except (OSError, PermissionError) as err:
        print(f"pressrun serve amt-relay: {err}", file=sys.stderr)
        return 1
    return 0


def _start_order(order: str) -> tuple[str, int | None]:
    """``--start ISSUE`` or ``--start ISSUE=TSI``: the issue and its TSI (or None)."""
    issue, sep, tsi = order.partition("=")
    if not sep:
        return issue, None
    try:
        return issue, int(tsi)
    except ValueError:
        raise ValueError(f"--start {order}: the TSI after '=' must be a number") from None


def _read_token(args: argparse.Namespace) -> str:
    import os
    from pathlib import Path

    if args.token_file:
        return Path(args.token_file).read_text().strip()
    token = os.environ.get(args.token_env, "").strip()
    if not token:
        raise ValueError(
            f"no API token: set the environment variable {args.token_env} "
            "(at least 16 characters) or give --token-file"
        )
    return token


def run_sender(args: argparse.Namespace) -> int:
    """Run the sender until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import asyncio
    import logging
    import sys
    from pathlib import Path

    from pressrun.content.keys import KeyFileError, load_signing_key
    from pressrun.multicast.net import parse_group
    from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

    log = logging.getLogger("pressrun.multicast.sender")
    try:
        import pressrun_flute  # noqa: F401  (fail here, clearly, when it is not built)
    except ImportError:
        print(
            "pressrun serve multicast: the FLUTE binding pressrun_flute is not installed; "
            "run `make setup` (it installs Rust 1.88+ and builds it, docs/multicast.md)",
            file=sys.stderr,
        )
        return 2
    try:
        config = SenderServiceConfig(
            content_dir=Path(args.content),
            control_group=parse_group(args.control_group),
            signing_key=load_signing_key(args.key),
            token=_read_token(args),
            interface=args.interface,
            host=args.host,
            port=args.port,
            carousel=CarouselConfig(
                fec=args.fec,
                channels=args.channels,
                rate_bps=args.rate_mbps * 1e6,
                symbol_bytes=args.symbol_bytes,
                cycle_overhead=args.cycle_overhead,
            ),
            group_base=args.group_base,
            group_count=args.group_count,
            channel_port_base=args.channel_port_base,
            state_file=Path(args.state_file) if args.state_file else None,
            fdt_renew_s=args.fdt_renew_s,
            announce_interval_s=args.announce_interval_s,
            announcement_ttl_s=args.announcement_ttl_s,
            multicast_ttl=args.multicast_ttl,
            tls=ServiceSecurity(args.tls_cert, args.tls_key),
            prepare_issues=args.prepare_issues,
            prepare_interval_s=args.prepare_interval_s,
        )
        starts = [_start_order(order) for order in args.start]
        config.tls.server_ssl_context()  # a bad --tls-cert/--tls-key fails here
    except (ValueError, OSError, KeyFileError) as err:
        print(f"pressrun serve multicast: {err}", file=sys.stderr)
        return 2
    if not config.content_dir.is_dir():
        print(f"pressrun serve multicast: {config.content_dir} is not a folder", file=sys.stderr)
        return 2

    async def main() -> None:
        from pressrun.multicast.prepare import CarouselError
        from pressrun.service import stop_signals

        sender = MulticastSender(config)
        # the handlers first: a signal right after the "control API on" line is a clean stop
        with stop_signals() as stopped:
            try:
                url = await sender.start()
                for issue, tsi in starts:
                    try:
                        await sender.start_carousel(issue, config.carousel, tsi=tsi)
                    except CarouselError as err:
                        log.error("cannot start the carousel of %s: %s", issue, err)
                log.info(
                    "multicast sender control API on %s (control group %s:%d, interface %s)",
                    url,
                    *config.control_group,
                    config.interface,
                )
                await stopped.wait()
            finally:
                await sender.close()

    try:
        asyncio.run(main())
    except OSError as err:
        print(f"pressrun serve multicast: {err}", file=sys.stderr)
        return 1
    return 0
