"""``pressrun serve tracker``: the BitTorrent tracker service."""

from __future__ import annotations

import argparse
from typing import Any

from pressrun.security import add_security_arguments


def register_serve(serve_subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun serve tracker`` to the serve subcommands."""
    p = serve_subparsers.add_parser(
        "tracker",
        help="BitTorrent HTTP tracker with fairness accounting (SQLite or Redis)",
        description="BitTorrent HTTP tracker (BEP 3/23/48) with per-peer upload/download "
        "accounting and the fair-exit record. Endpoints: /announce, /scrape, /v1/swarms, "
        "/metrics. State in SQLite (default tracker.db) or, with --redis, shared by "
        "several instances. It serves only published issues: give --content with "
        "--publisher-key (signed bundles), --allow, or --allow-any for an open tracker.",
    )
    p.add_argument("--port", type=int, default=6969, help="TCP port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--db", default="tracker.db", help="SQLite file kept across restarts (default tracker.db)"
    )
    where.add_argument(
        "--redis", metavar="URL", help="redis://host:port/db shared by several tracker instances"
    )
    p.add_argument("--redis-prefix", default="pressrun:tracker:", help="Redis key prefix")
    p.add_argument("--interval-s", type=int, default=30, help="announce interval (default 30)")
    p.add_argument(
        "--min-interval-s", type=int, default=5, help="minimum announce interval (default 5)"
    )
    p.add_argument(
        "--peer-ttl-s",
        type=float,
        default=None,
        help="forget a peer silent this long (default 2.5 x interval)",
    )
    p.add_argument(
        "--max-numwant", type=int, default=200, help="cap on peers per answer (default 200)"
    )
    p.add_argument(
        "--flush-interval-s",
        type=float,
        default=0.1,
        help="SQLite write-behind interval: a crash loses at most this much (default 0.1)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the peer-sampling RNG")
    p.add_argument(
        "--ring-supernodes",
        type=int,
        default=0,
        help="supernodes expected per issue's Chord ring: placed at equal shares (docs/chord.md)",
    )
    p.add_argument(
        "--content",
        action="append",
        default=[],
        metavar="DIR",
        help="repeatable: a content folder of signed bundles (the origins'); their "
        "info-hashes are the allowlist (re-read every 10 s); with --publisher-key only "
        "bundles signed by those keys",
    )
    p.add_argument(
        "--publisher-key",
        action="append",
        default=[],
        metavar="KEY",
        help="repeatable: a publisher public key (file or 64 hex) the --content bundles must "
        "be signed with (default: each bundle's own signature, the folder is the operator's)",
    )
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="INFO_HASH",
        help="repeatable: allow this info-hash (40 hex digits) besides the published ones",
    )
    p.add_argument(
        "--allow-any",
        action="store_true",
        help="an open tracker: any info-hash (private test set-ups only)",
    )
    p.add_argument(
        "--record-ttl-s",
        type=float,
        default=3600.0,
        help="forget a peer this long after it left, and an empty swarm (default 3600)",
    )
    p.add_argument(
        "--max-swarms",
        type=int,
        default=10_000,
        help="the most swarms held; only live ones (an active peer) fill it, a new swarm "
        "evicts the swarm that died first (default 10000)",
    )
    p.add_argument(
        "--max-records-per-swarm",
        type=int,
        default=100_000,
        help="the most peer records a swarm holds; beyond, the record that left first is "
        "forgotten at once, its totals kept (default 100000)",
    )
    add_security_arguments(p)
    p.set_defaults(func=run_tracker)


def run_tracker(args: argparse.Namespace) -> int:
    """Run the tracker until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad flags."""
    import asyncio
    import logging
    import sqlite3
    import sys
    from pathlib import Path

    from redis.exceptions import RedisError

    from pressrun.content.keys import KeyFileError, load_public_key
    from pressrun.security import security_from_args
    from pressrun.tracker.aio import serve
    from pressrun.tracker.config import TrackerConfig
    from pressrun.tracker.redis_store import RedisStore
    from pressrun.tracker.sqlite_store import SqliteStore
    from pressrun.tracker.store import TrackerStore

    log = logging.getLogger("pressrun.tracker")
    try:
        config = TrackerConfig(
            interval_s=args.interval_s,
            min_interval_s=args.min_interval_s,
            peer_ttl_s=args.peer_ttl_s,
            max_numwant=args.max_numwant,
            ring_supernodes=args.ring_supernodes,
            record_ttl_s=args.record_ttl_s,
            max_swarms=args.max_swarms,
            max_records_per_swarm=args.max_records_per_swarm,
        )
        security = security_from_args(args)
        security.server_ssl_context()  # a bad --tls-cert/--tls-key fails here, clearly
        if not (args.content or args.allow or args.allow_any):
            raise ValueError(
                "say which issues to serve: --content DIR --publisher-key KEY (published "
                "bundles), --allow INFO_HASH, or --allow-any (an open tracker)"
            )
        keys = [load_public_key(k) for k in args.publisher_key]
        allowed: list[bytes] | None = None
        if not args.allow_any:
            allowed = [bytes.fromhex(h) for h in args.allow]
            if any(len(h) != 20 for h in allowed):
                raise ValueError("--allow takes an info-hash of 40 hex digits")
    except (ValueError, KeyFileError) as err:
        print(f"pressrun serve tracker: {err}", file=sys.stderr)
        return 2

    def make_store() -> TrackerStore:
        if args.redis:
            return RedisStore(args.redis, prefix=args.redis_prefix)
        return SqliteStore(args.db, flush_interval_s=args.flush_interval_s)

    def ready(port: int) -> None:
        where = f"redis {args.redis}" if args.redis else f"sqlite {args.db}"
        url = f"{security.scheme}://{args.host}:{port}/announce"
        log.info("tracker listening on %s (%s)", url, where)
        print(f"tracker listening on {url}", flush=True)

    async def main() -> None:
        await serve(
            config,
            make_store(),
            host=args.host,
            port=args.port,
            seed=args.seed,
            ready=ready,
            security=security,
            content_dirs=[Path(c) for c in args.content],
            trusted_keys=keys or None,
            allowed=allowed,
        )

    try:
        asyncio.run(main())
    except (OSError, sqlite3.Error, RedisError) as err:
        print(
            f"pressrun serve tracker: cannot start: {err}; check --port/--host, "
            "that the --db file's folder exists and is writable, or that Redis answers "
            "at --redis",
            file=sys.stderr,
        )
        return 1
    return 0
