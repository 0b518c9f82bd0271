"""``pressrun serve origin``: the HTTP origin with its status agent."""

from __future__ import annotations

import argparse
import os
from typing import Any

from pressrun.security import add_security_arguments


def register_serve(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve origin`` to the serve subcommands."""
    p = serve_subparsers.add_parser(
        "origin",
        help="HTTP origin for issue bundles (Range, ETag, sendfile), /stats, /metrics",
        description="Serve CONTENT/<issue_id>/<file> at /content/<issue_id>/<file> "
        "(also a BEP 19 web seed), the status agent at /stats, Prometheus text at "
        "/metrics, /healthz. Stops cleanly on SIGTERM/SIGINT.",
    )
    p.add_argument("--content", required=True, metavar="DIR", help="the content directory")
    p.add_argument("--port", type=int, required=True, help="TCP port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--name", default=None, help="name in /stats (default origin-<port>)")
    p.add_argument(
        "--capacity-mbps",
        type=float,
        required=True,
        help="link capacity in Mbit/s, reported to the balancer (limits nothing)",
    )
    p.add_argument(
        "--egress-cap-mbps",
        type=float,
        default=None,
        help="real cap in Mbit/s on all transfers together (default: none, sendfile at full speed)",
    )
    p.add_argument(
        "--stats-interval-s",
        type=float,
        default=1.0,
        help="interval of the /stats rates (default 1.0)",
    )
    p.add_argument(
        "--cache-window-s",
        type=float,
        default=300.0,
        help="an issue served within this many seconds is in cached_issues (default 300)",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=5.0,
        help="on SIGTERM/SIGINT, transfers still running after this long are cut (default 5)",
    )
    p.add_argument(
        "--sendfile-chunk-kib",
        type=int,
        default=1024,
        help="without a cap, hand each transfer to sendfile(2) in chunks of this many KiB; "
        "the byte counters behind /stats move once per chunk (default 1024)",
    )
    p.add_argument(
        "--cap-chunk-kib",
        type=int,
        default=64,
        help="with a cap, the size of each paced write in KiB (default 64)",
    )
    p.add_argument(
        "--cap-turn-kib",
        type=int,
        default=256,
        help="with a cap, the bytes (KiB) a transfer takes of the bucket at once: "
        "answers up to this size finish in the order asked (default 256)",
    )
    p.add_argument(
        "--send-buffer-kib",
        type=int,
        default=None,
        help="SO_SNDBUF of each connection sending a body, KiB (default: the kernel's "
        "autotuning); small, it keeps /stats' byte counters close to the wire",
    )
    p.add_argument(
        "--send-timeout-s",
        type=float,
        default=60.0,
        help="a client that takes no chunk of a body for this long (it stopped reading) "
        "is cut and its connection closed (default 60)",
    )
    p.add_argument(
        "--stalled-after-s",
        type=float,
        default=5.0,
        help="a transfer that moved no byte for this long is not counted as load in "
        "/stats (active_transfers, the per-transfer means) until it moves (default 5)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes serving the port (SO_REUSEPORT), with one egress cap and "
        "/stats, /metrics of the whole origin; a dead worker is replaced "
        "(default: one per CPU; 1: a single process, no supervisor)",
    )
    p.add_argument(
        "--supernodes",
        metavar="TRACKER",
        default=os.environ.get("PRESSRUN_ORIGIN_SUPERNODES") or None,
        help="run a Chord supernode beside the origin for every issue in --content, "
        "registered with this tracker base URL, e.g. http://tracker:6969 "
        "(env PRESSRUN_ORIGIN_SUPERNODES; docs/chord.md)",
    )
    p.add_argument(
        "--supernode-host",
        default=os.environ.get("PRESSRUN_SUPERNODE_HOST") or None,
        help="the address the supernodes listen on and announce (default: --host; "
        "required when --host is a wildcard; env PRESSRUN_SUPERNODE_HOST)",
    )
    add_security_arguments(p, token=False)
    p.set_defaults(func=run_origin)


def run_origin(args: argparse.Namespace) -> int:
    """Run the origin until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import asyncio
    import sys
    from pathlib import Path

    from pressrun.origin.config import OriginConfig
    from pressrun.security import ServiceSecurity

    try:
        config = OriginConfig(
            content_dir=Path(args.content),
            host=args.host,
            port=args.port,
            name=args.name,
            capacity_mbps=args.capacity_mbps,
            egress_cap_mbps=args.egress_cap_mbps,
            stats_interval_s=args.stats_interval_s,
            cache_window_s=args.cache_window_s,
            shutdown_grace_s=args.shutdown_grace_s,
            sendfile_chunk_bytes=args.sendfile_chunk_kib * 1024,
            cap_chunk_bytes=args.cap_chunk_kib * 1024,
            cap_turn_bytes=args.cap_turn_kib * 1024,
            send_buffer_bytes=None if args.send_buffer_kib is None else args.send_buffer_kib * 1024,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            send_timeout_s=args.send_timeout_s,
            stalled_after_s=args.stalled_after_s,
        )
        ServiceSecurity(args.tls_cert, args.tls_key).server_ssl_context()  # fail early
        sn_host = args.supernode_host or args.host
        if args.supernodes and sn_host in ("0.0.0.0", "::", ""):
            raise ValueError("--supernodes with a wildcard --host needs --supernode-host ADDRESS")
        workers = default_workers() if args.workers is None else args.workers
        if workers < 1:
            raise ValueError("--workers must be at least 1")
    except ValueError as err:
        print(f"pressrun serve origin: {err}", file=sys.stderr)
        return 2
    _raise_open_files_limit()
    try:
        if workers > 1:
            if not config.content_dir.is_dir():
                raise FileNotFoundError(
                    f"content directory {config.content_dir} does not exist: publish an "
                    "issue into it first (pressrun publish) or pass the right --content"
                )
            # imported before the fork: the workers do not import aiohttp each
            from pressrun.origin import aio  # noqa: F401
            from pressrun.origin.workers import Supervisor

            supervisor = Supervisor(
                config, workers, supernodes=args.supernodes, supernode_host=sn_host
            )
            return supervisor.run()
        asyncio.run(serve_until_signal(config, supernodes=args.supernodes, supernode_host=sn_host))
    except (FileNotFoundError, OSError) as err:
        print(f"pressrun serve origin: {err}", file=sys.stderr)
        return 1
    return 0


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    from pressrun.origin.workers import default_workers as count

    return count()


def _raise_open_files_limit() -> None:
    """Raise the soft limit on open files to the hard one: one per transfer."""
    import contextlib
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve_until_signal(
    config: Any,
    *,
    supernodes: str | None = None,
    supernode_host: str = "127.0.0.1",
    sock: Any = None,
    share: Any = None,
) -> None:
    """Start the origin (and its supernodes if ``supernodes`` names a tracker), wait
    for SIGTERM or SIGINT, stop it cleanly (the supernodes leave their rings first).
    `sock` and `share`: one worker of a supervised origin (`start_origin`)."""
    import logging

    from pressrun.chord.host import SupernodeHost
    from pressrun.origin.aio import start_origin
    from pressrun.service import stop_signals

    # the handlers first: a signal right after the "serving ... on" line is a clean stop
    with stop_signals() as stopped:
        origin = await start_origin(config, sock=sock, share=share)
        ring = None
        if supernodes:
            ring = SupernodeHost(
                tracker_base=supernodes, host=supernode_host, content_dir=config.content_dir
            )
            await ring.start()
        try:
            await stopped.wait()
        finally:
            if ring is not None:
                await ring.close()
            logging.getLogger("pressrun.origin").info(
                "origin %s: signal received, stopping (grace %.1f s)",
                origin.name,
                config.shutdown_grace_s,
            )
            await origin.stop()
