"""`bench/swarm.py`'s options: its own (`add_arguments`) and the supernodes' knobs that
`bench/swarm_trace.py` takes as well (`add_ring_arguments`). Loaded as a sibling script
(`bench/swarm.py`'s `load_bench_module`)."""

from __future__ import annotations

import argparse

from pressrun.chord.aio import MAX_BRINGERS, ORIGIN_FETCH_S
from pressrun.content.publish import DEFAULT_PIECE_SIZE
from pressrun.peer.config import PeerConfig
from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY, uploader_policy_names

#: where the harness's processes run (``--worker-sessions``): ``own``, each worker and
#: the supernodes' process in a session of its own. With the kernel's autogroup
#: scheduling (on here: /proc/sys/kernel/sched_autogroup_enabled) a session is a
#: scheduling group, and the CPU is shared between groups first: with ``shared`` every
#: event loop of the bench queued behind the whole bench's threads (83 a worker of 20
#: peers), as no peer on a host of its own does, and at N = 80 every run was refused
#: for the loops' lag (373-1,338 ms at p99) while the same runs with ``own`` were clean
#: (170-195 ms) at the same CPU (docs/results/2026-11-28-swarm-limit.md, sections 10,
#: 12 and 13). It changes who waits, not how much CPU the peers take, nor the refusal.
DEFAULT_WORKER_SESSIONS = "own"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of `bench/swarm.py`: the sizes and rates, the policies, the peers'
    and the supernodes' knobs (`add_ring_arguments`), the harness's processes."""
    p.add_argument("--n", default="10,20,40", help="peer counts, comma-separated")
    p.add_argument(
        "--policy",
        default=f"{DEFAULT_UPLOADER_POLICY},libtorrent",
        help=f"uploader policies, comma-separated ({', '.join(uploader_policy_names())})",
    )
    p.add_argument("--size-mib", type=float, default=20.0, help="file size F (MiB)")
    p.add_argument("--peer-upload-mbps", type=float, default=8.0, help="u per peer (Mbit/s)")
    p.add_argument("--origin-mbps", type=float, default=16.0, help="u_s, all origins (Mbit/s)")
    p.add_argument("--origins", type=int, default=1, help="origins sharing u_s")
    p.add_argument(
        "--piece-kib",
        type=int,
        default=DEFAULT_PIECE_SIZE // 1024,
        help="piece size (KiB; default: the publisher's)",
    )
    p.add_argument(
        "--seeds-per-leecher",
        type=float,
        default=PeerConfig().not_needed_seeds_per_leecher,
        help="the not_needed rule's seeds per leecher (0: rule off; default: the peer's)",
    )
    p.add_argument(
        "--busy-share",
        type=float,
        default=PeerConfig().not_needed_busy_share,
        help="a seed uploading at least this share of its capacity is not let go by "
        "not_needed (0: check off; default: the peer's)",
    )
    p.add_argument("--tracker-interval-s", type=int, default=5, help="announce interval")
    p.add_argument("--supernodes", type=int, default=5, help="policy chord: supernodes on the ring")
    add_ring_arguments(p)
    p.add_argument("--runs", type=int, default=1, help="runs per N (medians printed)")
    p.add_argument(
        "--worker-sessions",
        choices=("own", "shared"),
        default=DEFAULT_WORKER_SESSIONS,
        help="each worker process in a session of its own (own, the default: with the "
        "kernel's autogroup scheduling, a scheduling group of its own, as a host of its "
        "own) or all in the bench's (shared, the bench before 28 Nov)",
    )
    p.add_argument(
        "--peers-per-proc",
        type=int,
        default=20,
        help="peers per worker process (the supernodes have one of their own)",
    )
    p.add_argument(
        "--keep-web-seeds", action="store_true", help="never drop the web seeds (baseline)"
    )
    p.add_argument(
        "--share-factor",
        type=float,
        default=2.0,
        help="policy libtorrent: shares of the file a peer takes from the web seeds "
        "before dropping them",
    )
    p.add_argument(
        "--lt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a libtorrent setting for every peer (repeatable; to measure one)",
    )
    p.add_argument(
        "--watchdog-ms",
        type=float,
        default=0,
        help="policy chord: print the supernodes' loop thread stacks while their loop "
        "is this late (0: off)",
    )


def add_ring_arguments(p: argparse.ArgumentParser) -> None:
    """The supernodes' knobs (policy chord), to measure one; defaults: `Supernode`'s."""
    p.add_argument(
        "--max-bringers",
        type=int,
        default=MAX_BRINGERS,
        help=f"policy chord: bringers per supernode (0: any; default {MAX_BRINGERS})",
    )
    p.add_argument(
        "--bringing-per-peer",
        type=int,
        default=0,
        help="policy chord: pieces a bringer brings (0: 128 KiB worth)",
    )
    p.add_argument(
        "--bring-ahead-s",
        type=float,
        default=2.0,
        help="policy chord: a bringer brings in what it fetches in this long at its "
        "last origin rate (0: one piece at a time; default 2)",
    )
    p.add_argument(
        "--origin-fetch-s",
        type=float,
        default=ORIGIN_FETCH_S,
        help="policy chord: fetches from the origins at once are what they complete in "
        f"this long (0: no limit; default {ORIGIN_FETCH_S})",
    )
    p.add_argument(
        "--first-receivers",
        type=int,
        default=2,
        help="policy chord: first receivers of a piece with one source (0: none named)",
    )
    p.add_argument(
        "--upload-slots",
        type=int,
        default=0,
        help="policy chord: peers a chord peer unchokes at most (0: the session's)",
    )
    p.add_argument(
        "--sole-upload-slots",
        type=int,
        default=0,
        help="policy chord: the same while it holds a piece no connected peer holds",
    )
    p.add_argument(
        "--hold-unheld",
        type=int,
        default=0,
        help="policy chord: 1 a peer holds off the pieces nobody connected holds that "
        "the ring gave it nothing for (but three)",
    )
    p.add_argument(
        "--origin-chunk-kib",
        type=int,
        default=0,
        help="diagnosis: the origins' paced write (0: the origin's own, 64 KiB); since "
        "575475a a piece request is granted whole (a turn), in the order asked, at any size",
    )
    p.add_argument(
        "--fair-bringing",
        type=int,
        default=0,
        help="policy chord: 1 an asker two pieces ahead in bringing waits (0: off)",
    )
    p.add_argument(
        "--order-askers",
        type=int,
        default=1,
        help="policy chord: 1 critical askers first, leavers-ahead last (0: off)",
    )
