"""`pressrun seed`: keep an issue from the library in its swarm (the desktop profile
seeds in the background).

    pressrun seed LIBRARY/weekly-47.pdf --torrent weekly-47.torrent \
        --manifest manifest.json --trusted-key publisher.key.pub [--until-stopped]

The file is checked (libtorrent rechecks it, then the manifest's SHA-256 of every piece
and of the whole file) before a single byte is offered. Without ``--until-stopped``
the peer leaves by the fair-exit rules (ratio, not needed, maximum seeding time;
docs/swarm.md); with it, only Ctrl-C / SIGTERM stop it (rule `user`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY, uploader_policy_names


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``pressrun seed``."""
    p = subparsers.add_parser(
        "seed",
        help="seed an issue from the library in its swarm (fair-exit rules)",
        description="Join an issue's BitTorrent swarm with a copy you hold and upload it "
        "to other readers. The copy is verified against the signed manifest first. The "
        "peer leaves once it has uploaded --ratio times what it downloaded, when the "
        "tracker says nobody needs it, or after --max-seed-time-s; --until-stopped seeds "
        "until Ctrl-C.",
    )
    p.add_argument("file", help="the issue file (its name must be the manifest's file_name)")
    p.add_argument("--torrent", required=True, help="the issue's .torrent")
    p.add_argument("--manifest", required=True, help="the issue's signed manifest.json")
    p.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="KEY",
        help="publisher public key (.pub file or 64 hex); repeatable; none: the manifest's own",
    )
    p.add_argument("--tracker", help="announce URL (default: the torrent's trackers)")
    p.add_argument(
        "--web-seed", action="append", default=[], metavar="URL", help="extra origin web seed"
    )
    p.add_argument("--profile", choices=("desktop", "mobile"), default="desktop")
    p.add_argument("--metered", action="store_true", help="the link is metered (mobile data)")
    p.add_argument("--ratio", type=float, default=1.0, help="share ratio to reach (default 1.0)")
    p.add_argument(
        "--max-seed-time-s", type=float, default=None, help="leave after seeding this long"
    )
    p.add_argument("--until-stopped", action="store_true", help="ignore the rules; Ctrl-C stops")
    p.add_argument(
        "--upload-limit-kbps", type=float, default=None, help="upload cap in kB/s (0: none)"
    )
    p.add_argument("--listen", default="0.0.0.0:0", help="libtorrent listen_interfaces")
    p.add_argument(
        "--stun",
        default=os.environ.get("PRESSRUN_STUN", ""),
        metavar="HOST:PORT",
        help="STUN server (HOST:PORT) for WebRTC peers, the browser readers that reach this "
        "peer through the torrent's ws:// tracker; default $PRESSRUN_STUN, else none",
    )
    p.add_argument(
        "--uploader-policy",
        default=DEFAULT_UPLOADER_POLICY,
        choices=uploader_policy_names(),
        help="uploader-choice policy (docs/swarm.md; default %(default)s)",
    )
    p.add_argument(
        "--supernode",
        metavar="HOST",
        default=None,
        help="also run a Chord supernode of this issue's ring while seeding, listening "
        "on and announced as HOST (a reachable address of this machine); needs --tracker; "
        "refused with --profile mobile (docs/chord.md)",
    )
    p.set_defaults(func=_seed)


def _seed(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    import sys
    from pathlib import Path

    from pressrun.content.bundle import read_manifest
    from pressrun.content.codec import ManifestError
    from pressrun.content.keys import KeyFileError, load_public_key
    from pressrun.peer import watchdog
    from pressrun.peer.aio import SwarmError, SwarmPeer
    from pressrun.peer.config import profile_config

    file = Path(args.file)
    try:
        keys = [load_public_key(k) for k in args.trusted_key] or None
        manifest = read_manifest(Path(args.manifest), keys)
    except (OSError, ManifestError, KeyFileError, ValueError) as err:
        print(f"pressrun seed: {err}", file=sys.stderr)
        return 1
    if file.name != manifest.file_name:
        print(
            f"pressrun seed: {file} is not named {manifest.file_name!r} as the manifest says; "
            "rename or link it",
            file=sys.stderr,
        )
        return 1
    if not file.is_file():
        print(f"pressrun seed: {file} does not exist", file=sys.stderr)
        return 1
    # the copy counts as downloaded: seed it back (ratio x its size) before leaving
    overrides: dict[str, object] = {
        "share_ratio": args.ratio,
        "ratio_basis_bytes": manifest.size_bytes,
        "stun_server": args.stun,
    }
    if args.max_seed_time_s is not None:
        overrides["max_seed_time_s"] = args.max_seed_time_s
    if args.upload_limit_kbps is not None:
        overrides["upload_limit_bps"] = int(args.upload_limit_kbps * 1000)
    if args.until_stopped:
        overrides["seed_until_stopped"] = True
    try:
        config = profile_config(args.profile, metered=args.metered, **overrides)
    except ValueError as err:
        print(f"pressrun seed: {err}", file=sys.stderr)
        return 2
    if args.supernode is not None and (args.profile == "mobile" or args.tracker is None):
        print(
            "pressrun seed: --supernode needs --tracker, and a mobile profile never runs "
            "a supernode (it uses the ring only as a client)",
            file=sys.stderr,
        )
        return 2

    async def run() -> int:
        peer = SwarmPeer(
            torrent=Path(args.torrent),
            manifest=manifest,
            partial_dir=file.parent,
            config=config,
            tracker_url=args.tracker,
            web_seeds=args.web_seed,
            listen_interfaces=args.listen,
            uploader_policy=args.uploader_policy,
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        ring = None
        if args.supernode is not None:
            import yarl

            from pressrun.chord.host import SupernodeHost

            ring = SupernodeHost(
                tracker_base=str(yarl.URL(args.tracker).origin()), host=args.supernode
            )
            node = await ring.add(manifest.info_hash, manifest.num_pieces)
            if node is not None:
                print(f"supernode listening on {node.address}", flush=True)
        try:
            port = await peer.start()
            print(f"checking {file} ({manifest.issue_id}); listening on port {port}", flush=True)
            if not await peer.downloaded():
                print("pressrun seed: the copy could not be completed", file=sys.stderr)
                await peer.stop()
                return 1
            print(f"seeding {manifest.issue_id}; Ctrl-C stops", flush=True)
            finished = asyncio.ensure_future(peer.finished())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({finished, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            result = await finished if finished.done() else await peer.stop()
            if not finished.done():
                finished.cancel()
            rule = result.leave_rule.value if result.leave_rule else "none"
            ratio = "n/a" if result.ratio is None else f"{result.ratio:.2f}"
            print(
                f"left the swarm by rule {rule}: uploaded {result.uploaded_bytes} bytes, "
                f"downloaded {result.downloaded_bytes}, ratio {ratio}, "
                f"seeded {result.seeding_s or 0:.0f} s",
                flush=True,
            )
            return 0
        except SwarmError as err:
            print(f"pressrun seed: {err}", file=sys.stderr)
            return 1
        finally:
            await peer.close()
            if ring is not None:
                await ring.close()

    # the session's close and the exit are bounded (a WebSocket tracker that stops
    # answering mid-close must not hold the process: pressrun.peer.watchdog)
    try:
        watchdog.set_close_bound(watchdog.command_line_bound())
    except ValueError as err:
        print(f"pressrun seed: {err}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run())
    finally:
        watchdog.bounded_exit()
