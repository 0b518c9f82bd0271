"""Loopback swarm bench: last peer's completion time against the fluid lower bound.

N libtorrent peers (pressrun.peer, all in this process) arrive together and download
one published issue of F bytes; the only initial source is the origins' web seeds,
their total egress capped at u_s (pressrun.origin's token bucket); each peer uploads at
most u. Printed per N: the last peer's completion time T, the fluid lower bound of
Kumar and Ross,

    T_min = max(F / u_s, F / d_min, N * F / (u_s + N * u))

(d_min: the slowest peer's download cap; unlimited here, so that term is 0), T / T_min,
and the origins' bytes in copies of the file (their own counters).

    # N = 10, 20, 40; F = 20 MiB; u = 1 MB/s; u_s = 2 MB/s; policies stripes, libtorrent
    .venv/bin/python bench/swarm.py
    .venv/bin/python bench/swarm.py --n 20 --runs 3 --policy stripes
    # the Chord ring's choice (5 supernodes in this process) against both, same run
    .venv/bin/python bench/swarm.py --n 20,40 --policy chord,stripes,libtorrent
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pressrun.peer.aio as peer_aio
from pressrun.chord.aio import MAX_BRINGERS, Supernode
from pressrun.content.publish import DEFAULT_PIECE_SIZE
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.config import PeerConfig, desktop_profile
from pressrun.peer.loopback import loopback_swarm
from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY, uploader_policy_names


class LoopLoad:
    """The bench process's CPU and its event loop's lag over one run.

    CPU: user + system seconds of the whole process (libtorrent's threads included)
    and of the event loop's thread alone (the Python adapters), over the run's wall
    time; a share near 1.0 of the loop thread means the Python side is saturated.
    Lag: how late a 50 ms sleep wakes up (median, 99th percentile, max).
    """

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLoad:
        self._wall = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self._cpu = ru.ru_utime + ru.ru_stime
        self._thread = time.thread_time()
        self._task = asyncio.get_running_loop().create_task(self._sample())
        return self

    async def _sample(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.05)
            self.lags.append(time.perf_counter() - t - 0.05)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        wall = time.perf_counter() - self._wall
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.process_cpu_share = (ru.ru_utime + ru.ru_stime - self._cpu) / wall
        self.loop_cpu_share = (time.thread_time() - self._thread) / wall

    def figures(self) -> dict[str, float]:
        """The run's figures for the table."""
        lags = sorted(self.lags) or [0.0]
        return {
            "cpu_process": self.process_cpu_share,
            "cpu_loop": self.loop_cpu_share,
            "lag_p50_ms": 1000 * statistics.median(lags),
            "lag_p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))],
            "lag_max_ms": 1000 * lags[-1],
        }


async def one_run(n: int, policy: str, args: argparse.Namespace) -> dict[str, float]:
    size = int(args.size_mib * (1 << 20))
    u = args.peer_upload_mbps * 1e6 / 8
    u_s = args.origin_mbps * 1e6 / 8
    caps = tuple([args.origin_mbps / args.origins] * args.origins)
    with tempfile.TemporaryDirectory(prefix="pressrun-bench-") as tmp:
        async with loopback_swarm(
            Path(tmp),
            size_bytes=size,
            origin_cap_mbps=caps,
            piece_size=args.piece_kib * 1024,
            tracker_interval_s=args.tracker_interval_s,
        ) as swarm:
            config = desktop_profile(
                upload_limit_bps=int(u),
                counts_interval_s=1.0,
                drop_web_seeds=not args.keep_web_seeds,
                web_seed_share_factor=args.share_factor,
                not_needed_seeds_per_leecher=args.seeds_per_leecher,
            )
            supernodes: list[Supernode] = []
            if policy == "chord":
                # the ring: supernodes placed at equal shares by the tracker
                assert swarm.tracker is not None
                swarm.tracker.ring.expected_supernodes = args.supernodes
                for i in range(args.supernodes):
                    sn = Supernode(
                        tracker_base=swarm.tracker_base,
                        info_hash=swarm.manifest.info_hash,
                        num_pieces=swarm.manifest.num_pieces,
                        seed=i,
                        max_bringers=args.max_bringers or None,
                        max_bringing_per_peer=bringing_per_peer(args),
                        first_receivers=args.first_receivers or None,
                        order_askers=bool(getattr(args, "order_askers", 1)),
                        fair_bringing=bool(args.fair_bringing),
                        file_bytes=swarm.manifest.size_bytes,
                        origin_bps=int(u_s),
                    )
                    supernodes.append(sn)
                    await sn.start()
                    await sn.wait_on_ring()
            started = time.perf_counter()
            try:
                async with LoopLoad() as load:
                    results = await swarm.run_peers(n, config, uploader_policy=policy)
            finally:
                for sn in supernodes:
                    await sn.close()
            wall = time.perf_counter() - started
            ring = [s for p in swarm.peers if (s := p.ring_stats) is not None]
            ring_figures = (
                {
                    # the ring's cost: HTTP requests each peer sent to supernodes, the
                    # lookups the supernodes ran through the ring (all peers together)
                    "ring_requests_per_peer": sum(s.requests for s in ring) / n,
                    "ring_rounds_per_peer": sum(s.rounds for s in ring) / n,
                    "sn_lookups": float(sum(sn.stats.lookups for sn in supernodes)),
                    "sn_uploader_answers": float(
                        sum(sn.stats.uploader_answers for sn in supernodes)
                    ),
                }
                if ring
                else {}
            )
            bad = [r for r in results if not r.completed]
            if bad:
                raise SystemExit(f"{len(bad)} peers did not complete")
            last = max(r.download_s or 0.0 for r in results)
            t_min = max(size / u_s, n * size / (u_s + n * u))
            rules: dict[str, int] = {}
            for r in results:
                key = r.leave_rule.value if r.leave_rule else "none"
                rules[key] = rules.get(key, 0) + 1
            ratios = [r.ratio for r in results if r.ratio is not None]
            return {
                "last_s": last,
                "t_min_s": t_min,
                "x": last / t_min,
                "copies": swarm.origin_bytes_sent() / size,
                "wall_s": wall,
                "mean_ratio": statistics.mean(ratios) if ratios else 0.0,
                # what the peers downloaded beyond one copy each (libtorrent's payload
                # counters and the origin fetches: blocks downloaded twice, failed hashes)
                "beyond_nf": sum(r.downloaded_bytes for r in results) / (n * size) - 1,
                **ring_figures,
                **load.figures(),
                **{f"rule_{k}": float(v) for k, v in rules.items()},
            }


def override_session_settings(pairs: list[str]) -> None:
    """``--lt KEY=VALUE``: libtorrent settings on top of the peer's own, for every peer
    of every policy alike (to measure a setting before it goes into
    `pressrun.peer.session.session_settings`)."""
    if not pairs:
        return
    extra: dict[str, object] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        value: object = int(raw) if raw.lstrip("-").isdigit() else raw
        if raw in ("true", "false"):
            value = raw == "true"
        extra[key] = value
    base = peer_aio.session_settings

    def settings(*a: Any, **kw: Any) -> dict[str, Any]:
        return {**base(*a, **kw), **extra}

    peer_aio.session_settings = settings  # type: ignore[assignment]
    print("libtorrent settings for every peer:", extra)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def set_chord_peer_knobs(args: argparse.Namespace) -> None:
    """``--upload-slots``, ``--sole-upload-slots``: every chord peer's (to measure one)."""
    ChordPolicy.upload_slots = args.upload_slots or None
    ChordPolicy.sole_upload_slots = args.sole_upload_slots or None


def bringing_per_peer(args: argparse.Namespace) -> int | None:
    """``--bringing-per-peer``, else None: `Supernode`'s own, `BRINGING_BYTES` worth of
    pieces (`pressrun.chord.aio`: one of 128 KiB or more, two of 64 KiB)."""
    return int(args.bringing_per_peer) or None


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


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    p.add_argument("--tracker-interval-s", type=int, default=5, help="announce interval")
    p.add_argument("--supernodes", type=int, default=5, help="policy chord: supernodes on the ring")
    add_ring_arguments(p)
    p.add_argument("--runs", type=int, default=1, help="runs per N (medians printed)")
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
    args = p.parse_args()
    set_chord_peer_knobs(args)
    override_session_settings(args.lt)
    logging.basicConfig(level=logging.WARNING)
    print("load average (1, 5, 15 min) at the start:", _load())
    print(
        f"F = {args.size_mib} MiB, u = {args.peer_upload_mbps} Mbit/s per peer, "
        f"u_s = {args.origin_mbps} Mbit/s over {args.origins} origin(s), "
        f"pieces {args.piece_kib} KiB, web seeds "
        + ("kept" if args.keep_web_seeds else "dropped (libtorrent: at share)")
    )
    print(f"{'policy':>10} {'N':>4} {'T_last s':>9} {'T_min s':>8} {'T/T_min':>8} "
          f"{'origin copies':>14} {'mean ratio':>10}  leave rules")  # fmt: skip
    for policy, n in itertools.product(args.policy.split(","), map(int, args.n.split(","))):
        runs = [await one_run(n, policy, args) for _ in range(args.runs)]
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}
        rules = ", ".join(
            f"{k[5:]}={int(v)}" for k, v in sorted(med.items()) if k.startswith("rule_")
        )
        each = " ".join(f"{r['x']:.2f}x/{r['copies']:.2f}" for r in runs)
        print(
            f"{policy:>10} {n:>4} {med['last_s']:>9.1f} {med['t_min_s']:>8.1f} {med['x']:>8.2f} "
            f"{med['copies']:>14.2f} {med['mean_ratio']:>10.2f}  {rules}"
            + (f"   runs: {each}" if args.runs > 1 else ""),
            flush=True,
        )
        print(
            f"{'':>15} bench process: CPU {med['cpu_process']:.2f} cores (event loop thread "
            f"{med['cpu_loop']:.2f}), loop lag median {med['lag_p50_ms']:.0f} ms, "
            f"p99 {med['lag_p99_ms']:.0f} ms, max {med['lag_max_ms']:.0f} ms; peers "
            f"downloaded {100 * med['beyond_nf']:.1f}% beyond N F",
            flush=True,
        )
        if "ring_requests_per_peer" in med:
            print(
                f"{'':>15} ring: {med['ring_requests_per_peer']:.0f} requests and "
                f"{med['ring_rounds_per_peer']:.0f} rounds per peer, supernodes ran "
                f"{med['sn_lookups']:.0f} lookups and gave {med['sn_uploader_answers']:.0f} "
                "uploader answers",
                flush=True,
            )
    print("load average (1, 5, 15 min) at the end:", _load())


if __name__ == "__main__":
    asyncio.run(main())
