"""`pressrun supernode`: run one supernode of an issue's Chord ring (docs/chord.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add `supernode`."""
    p = subparsers.add_parser(
        "supernode",
        help="run a supernode of an issue's Chord ring (origins, desktops with a reachable port)",
        description="Register with the tracker (it places the ring id), join the issue's "
        "ring, answer for piece keys: which node uploads each piece to a newcomer. "
        "SIGTERM/SIGINT leave the ring gracefully (the pieces go to the successor).",
    )
    p.add_argument("--tracker", required=True, help="tracker base URL, e.g. http://127.0.0.1:6969")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--torrent", type=Path, help="the issue's .torrent (info-hash, pieces)")
    what.add_argument("--info-hash", help="the issue's v1 info-hash (hex), with --num-pieces")
    p.add_argument("--num-pieces", type=int, help="the issue's piece count (with --info-hash)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on and announce")
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    p.add_argument(
        "--heartbeat-s", type=float, default=5.0, help="re-register with the tracker every (s)"
    )
    p.set_defaults(func=run_supernode)


def run_supernode(args: argparse.Namespace) -> int:
    """Handler of `pressrun supernode`."""
    if args.torrent is not None:
        from pressrun.content.codec import ManifestError, parse_torrent

        try:
            meta = parse_torrent(args.torrent.read_bytes())
        except (OSError, ManifestError) as err:
            print(f"pressrun supernode: cannot read {args.torrent}: {err}", file=sys.stderr)
            return 2
        info_hash, num_pieces, file_bytes = meta.info_hash, meta.num_pieces, meta.length
    else:
        info_hash, num_pieces = str(args.info_hash).lower(), args.num_pieces
        file_bytes = 0  # (unknown)
        if num_pieces is None or num_pieces < 1 or len(info_hash) != 40:
            print(
                "pressrun supernode: --info-hash needs 40 hex digits and --num-pieces >= 1",
                file=sys.stderr,
            )
            return 2
    return asyncio.run(_serve(args, info_hash, num_pieces, file_bytes))


async def _serve(args: argparse.Namespace, info_hash: str, num_pieces: int, file_bytes: int) -> int:
    from pressrun.chord.host import SupernodeHost
    from pressrun.service import stop_signals

    ring = SupernodeHost(
        tracker_base=args.tracker, host=args.host, port=args.port, heartbeat_s=args.heartbeat_s
    )
    with stop_signals() as stopped:
        try:
            node = await ring.add(info_hash, num_pieces, file_bytes)
            if node is None or node.node is None:
                print(
                    "pressrun supernode: could not start (the reason is logged above)",
                    file=sys.stderr,
                )
                return 1
            print(f"supernode {node.node.me.id:040x} listening on {node.address}", flush=True)
            await stopped.wait()
        finally:
            await ring.close()
    return 0
