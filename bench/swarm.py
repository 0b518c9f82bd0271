"""Loopback swarm bench: last peer's completion time against the fluid lower bound.

N libtorrent peers (pressrun.peer, in worker processes of at most --peers-per-proc
each: `bench/swarm_procs.py`; the tracker and the origins in this one, the ring's
supernodes in one of their own) arrive together and download
one published issue of F bytes; the only initial source is the origins' web seeds,
their total egress capped at u_s (pressrun.origin's token bucket); each peer uploads at
most u. Printed per N: the last peer's completion time T, the fluid lower bound of
Kumar and Ross,

    T_min = max(F / u_s, F / d_min, N * F / (u_s + N * u_p))

(d_min: the slowest peer's download cap; unlimited here, so that term is 0; u_p: the
payload a peer's upload limit u carries, `payload_upload_bps`: libtorrent's limiter
counts its estimate of the TCP/IP headers, so the bound counts them the same way, for
every policy; docs/swarm.md "The bound's yardstick"), T / T_min, and the origins'
bytes in copies of the file (their own counters). Beside each run:
the harness's processes' CPU (and a peer's share of its workers', with the part in
their event loops: the Python adapters), their worst event loop lag and the machine's
busy CPU; a run whose harness was saturated (`swarm_procs.verdict`: a process's loop lag p99 above
250 ms or its loop thread above 0.85 of a core) is printed REFUSED with the reason and
left out of the medians. The machine's CPU pressure (the share of the run in which
some task waited for a CPU, `/proc/pressure/cpu`) and its niced work are printed
beside it: a loop that is late while its thread uses little CPU waited for one
(`--watchdog-ms N` prints the supernodes' loop thread's stacks and scheduler state
while their loop is N ms late: at N = 80 on 28 November it was runnable, R, in every
sample of every stall, on a CPU 7-11% of the stalls' time: waiting for one, not blocked).

    # N = 10, 20, 40; F = 20 MiB; u = 1 MB/s; u_s = 2 MB/s; policies stripes, libtorrent
    .venv/bin/python bench/swarm.py
    .venv/bin/python bench/swarm.py --n 20 --runs 3 --policy stripes
    # the Chord ring's choice (5 supernodes) against both, same run; 80 and 160 peers
    flock /work/heavy.lock .venv/bin/python bench/swarm.py --n 80,160 --runs 3 \
        --policy chord,stripes,libtorrent
    .venv/bin/python bench/swarm.py --n 20,40 --policy chord,stripes,libtorrent
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pressrun.peer.aio as peer_aio
import pressrun.peer.loopback as peer_loopback
from pressrun.chord.aio import ORIGIN_FETCH_S
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.config import PeerConfig
from pressrun.peer.loopback import loopback_swarm


def load_bench_module(name: str) -> ModuleType:
    """A sibling bench script as a module (bench/ is scripts, not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


swarm_procs = load_bench_module("swarm_procs")
swarm_args = load_bench_module("swarm_args")
LoopLoad = swarm_procs.LoopLoad


#: libtorrent's estimate of one packet's TCP/IP headers (IPv4 20 + TCP 20 bytes) and
#: the payload of a 1,500-byte packet (`trancieve_ip_packet` in its session_impl.cpp)
IP_HEADER_BYTES = 40
PACKET_PAYLOAD_BYTES = 1500 - IP_HEADER_BYTES


def limiter_counts_ip_overhead(lt_pairs: list[str]) -> bool:
    """Whether the peers' rate limiter counts the IP overhead: libtorrent's
    ``rate_limit_ip_overhead``, on unless ``--lt rate_limit_ip_overhead=false``."""
    value = True
    for pair in lt_pairs:
        key, _, raw = pair.partition("=")
        if key == "rate_limit_ip_overhead":
            value = raw not in ("false", "0")
    return value


def payload_upload_bps(u_bps: float, *, ip_overhead: bool) -> float:
    """The payload a peer's upload limit ``u_bps`` carries between two peers, the u of
    the fluid bound.

    With ``rate_limit_ip_overhead`` libtorrent charges every transfer it makes, sent or
    received, ``IP_HEADER_BYTES`` per ``PACKET_PAYLOAD_BYTES`` (the packet's headers
    and its ACK's) to the upload limiter as well as the download one. A payload byte
    from one peer to another therefore costs the swarm's upload limits 1 + 2 h of a
    byte (h = 40 / 1460: the sender's packet and the receiver's ACK), and N peers'
    limits carry N u / (1 + 2 h) of payload, 5.2% less than N u. The bound is about
    payload over link capacity, so its links are counted as the limiter counts them;
    the same for every policy (what the `libtorrent` policy's web seeds add, the ACKs
    of origin bytes received through libtorrent, is that policy's own cost).
    """
    if not ip_overhead:
        return u_bps
    return u_bps / (1 + 2 * IP_HEADER_BYTES / PACKET_PAYLOAD_BYTES)


def fluid_bound_s(n: int, size_bytes: float, u_bps: float, u_s_bps: float) -> float:
    """Kumar and Ross's T_min = max(F / u_s, N F / (u_s + N u)), download unlimited."""
    return max(size_bytes / u_s_bps, n * size_bytes / (u_s_bps + n * u_bps))


def ring_knobs(args: argparse.Namespace, size_bytes: int, u_s: float) -> dict[str, Any]:
    """The supernodes' keyword arguments from the bench's flags."""
    return {
        "max_bringers": args.max_bringers or None,
        "max_bringing_per_peer": bringing_per_peer(args),
        "first_receivers": args.first_receivers or None,
        "order_askers": bool(getattr(args, "order_askers", 1)),
        "fair_bringing": bool(args.fair_bringing),
        "file_bytes": size_bytes,
        "origin_bps": int(u_s),
        "bring_ahead_s": float(getattr(args, "bring_ahead_s", 2.0)),
        "origin_fetch_s": float(getattr(args, "origin_fetch_s", ORIGIN_FETCH_S)),
    }


_ORIGIN_CONFIG = peer_loopback.OriginConfig


def set_origin_chunk(chunk_bytes: int) -> None:
    """A diagnosis knob (``--origin-chunk-kib``): the origins' paced writes of
    ``chunk_bytes`` (0: `pressrun.origin`'s own, 64 KiB). Before 575475a the egress
    bucket granted each write in the order asked, so fetches at once finished together
    when a piece was several writes, one after the other when it was one; since, a
    transfer takes a turn of up to 256 KiB at once (``cap_turn_bytes``) and pieces
    asked together end one after the other whatever the write size."""
    if chunk_bytes <= 0:
        peer_loopback.OriginConfig = _ORIGIN_CONFIG  # type: ignore[misc]
        return

    def config(**kw: Any) -> Any:
        return _ORIGIN_CONFIG(**kw, cap_chunk_bytes=chunk_bytes)

    peer_loopback.OriginConfig = config  # type: ignore[misc,assignment]


async def one_run(
    n: int, policy: str, args: argparse.Namespace, *, trace: Any = None
) -> dict[str, Any]:
    """One swarm of N peers over worker processes (`bench/swarm_procs.py`); its figures,
    with ``refused`` set when the harness was saturated. ``trace``: the
    `bench/swarm_trace.py` module, whose workers trace their peers (their events are
    merged into its ``EVENTS``) while this process samples the origins' bytes."""
    size = int(args.size_mib * (1 << 20))
    u = args.peer_upload_mbps * 1e6 / 8
    u_s = args.origin_mbps * 1e6 / 8
    caps = tuple([args.origin_mbps / args.origins] * args.origins)
    set_origin_chunk(int(getattr(args, "origin_chunk_kib", 0)) * 1024)
    with tempfile.TemporaryDirectory(prefix="pressrun-bench-") as tmp:
        async with loopback_swarm(
            Path(tmp),
            size_bytes=size,
            origin_cap_mbps=caps,
            piece_size=args.piece_kib * 1024,
            tracker_interval_s=args.tracker_interval_s,
        ) as swarm:
            bundle = swarm.work_dir / "content" / swarm.issue_id
            config = {
                "upload_limit_bps": int(u),
                "counts_interval_s": 1.0,
                "drop_web_seeds": not args.keep_web_seeds,
                "web_seed_share_factor": args.share_factor,
                "not_needed_seeds_per_leecher": args.seeds_per_leecher,
                "not_needed_busy_share": getattr(
                    args, "busy_share", PeerConfig().not_needed_busy_share
                ),
            }
            workers: list[Any] = []
            sn_worker = None
            if policy == "chord":
                # the ring: supernodes placed at equal shares by the tracker, in a
                # process of their own
                assert swarm.tracker is not None
                swarm.tracker.ring.expected_supernodes = args.supernodes
                sn_worker = swarm_procs.Worker(
                    "supernodes",
                    {
                        "role": "supernodes",
                        "count": args.supernodes,
                        "tracker_base": swarm.tracker_base,
                        "info_hash": swarm.manifest.info_hash,
                        "num_pieces": swarm.manifest.num_pieces,
                        "knobs": ring_knobs(args, swarm.manifest.size_bytes, u_s),
                        "watchdog_ms": getattr(args, "watchdog_ms", 0),
                    },
                    own_session=own_sessions(args),
                )
            first = 0
            for i, count in enumerate(swarm_procs.split(n, args.peers_per_proc)):
                workers.append(
                    swarm_procs.Worker(
                        f"peers-{i}",
                        {
                            "role": "peers",
                            "count": count,
                            "first_index": first,
                            "work_dir": str(swarm.work_dir),
                            "issue": swarm.issue_id,
                            "manifest": str(bundle / "manifest.json"),
                            "torrent": str(bundle / f"{swarm.issue_id}.torrent"),
                            "tracker_url": swarm.tracker_url,
                            "policy": policy,
                            "config": config,
                            "args": {k: v for k, v in vars(args).items() if _plain(v)},
                            "trace": trace is not None,
                        },
                        own_session=own_sessions(args),
                    )
                )
                first += count
            everyone = ([sn_worker] if sn_worker else []) + workers
            try:
                if sn_worker is not None:
                    await sn_worker.start()
                await asyncio.gather(*(w.start() for w in workers))
                go = time.monotonic() + swarm_procs.GO_AFTER_S
                for w in everyone:
                    await w.send({"go": go})
                sampler = trace.start_sampler(go, origin=swarm) if trace is not None else None
                await asyncio.sleep(max(0.0, go - time.monotonic()))
                machine = swarm_procs.MachineCpu()
                machine.start()
                started = time.perf_counter()
                async with LoopLoad() as load:
                    done = await asyncio.gather(*(w.receive() for w in workers))
                wall = time.perf_counter() - started
                machine_figures = machine.stop()
                sn_done: dict[str, Any] = {}
                if sn_worker is not None:
                    await sn_worker.send({"stop": True})
                    sn_done = await sn_worker.receive()
                if sampler is not None:
                    sampler.cancel()
            finally:
                for w in everyone:
                    await w.close()
            results = [r for d in done for r in d["results"]]
            loads = {"harness": load.figures()}
            loads.update({w.name: d["load"] for w, d in zip(workers, done, strict=True)})
            if sn_done:
                loads["supernodes"] = sn_done["load"]
            if trace is not None:
                for d in done:
                    trace.EVENTS.extend(d["events"])
                trace.EVENTS.sort(key=lambda e: e["t"])
            ring_figures = (
                {
                    # the ring's cost: HTTP requests each peer sent to supernodes, the
                    # lookups the supernodes ran through the ring (all peers together)
                    "ring_requests_per_peer": sum(d["ring_requests"] for d in done) / n,
                    "ring_rounds_per_peer": sum(d["ring_rounds"] for d in done) / n,
                    "ring_waits_per_peer": sum(d["ring_waits"] for d in done) / n,
                    "ring_lookups_per_peer": sum(d.get("ring_lookups", 0) for d in done) / n,
                    "ring_failures_per_peer": sum(d.get("ring_failures", 0) for d in done) / n,
                    "sn_lookups": float(sn_done.get("sn_lookups", 0)),
                    "sn_requests": float(sn_done.get("sn_requests", 0)),
                    "sn_rpcs_in": float(sn_done.get("sn_rpcs_in", 0)),
                    "sn_uploader_answers": float(sn_done.get("sn_uploader_answers", 0)),
                    "ring_settle_s": float(sn_done.get("ring_settle_s", 0.0)),
                }
                if any(d["ring"] for d in done)
                else {}
            )
            bad = [r for r in results if not r["completed"]]
            refused = swarm_procs.verdict(loads)
            if bad:
                # (printed with the harness's figures: a saturated harness stalls peers)
                refused = f"{len(bad)} peers did not complete" + (f"; {refused}" if refused else "")
            last = max(r["download_s"] or 0.0 for r in results)
            u_p = payload_upload_bps(u, ip_overhead=limiter_counts_ip_overhead(args.lt))
            t_min = fluid_bound_s(n, size, u_p, u_s)
            rules: dict[str, int] = {}
            for r in results:
                rules[r["leave_rule"]] = rules.get(r["leave_rule"], 0) + 1
            ratios = [r["ratio"] for r in results if r["ratio"] is not None]
            worst = {
                k: max(f[k] for f in loads.values())
                for k in ("lag_p50_ms", "lag_p99_ms", "lag_max_ms", "cpu_loop")
            }
            return {
                "last_s": last,
                "t_min_s": t_min,
                "x": last / t_min,
                # against the bound with u as the payload rate (the yardstick before 28
                # November's afternoon, for comparison with older figures)
                "x_nominal": last / fluid_bound_s(n, size, u, u_s),
                "copies": swarm.origin_bytes_sent() / size,
                "wall_s": wall,
                "mean_ratio": statistics.mean(ratios) if ratios else 0.0,
                # what the peers downloaded beyond one copy each (libtorrent's payload
                # counters and the origin fetches: blocks downloaded twice, failed hashes)
                "beyond_nf": sum(r["downloaded_bytes"] for r in results) / (n * size) - 1,
                **ring_figures,
                # the harness: every process's CPU summed, the worst loop among them
                "cpu_process": sum(f["cpu_process"] for f in loads.values()),
                # a peer's share of its worker processes' CPU, and of their event loop
                # threads (the Python adapters; the rest is libtorrent's threads)
                **peer_cpu(loads, n),
                "cpu_loop": worst["cpu_loop"],
                "lag_p50_ms": worst["lag_p50_ms"],
                "lag_p99_ms": worst["lag_p99_ms"],
                "lag_max_ms": worst["lag_max_ms"],
                "procs": float(len(loads)),
                **machine_figures,
                **{f"rule_{k}": float(v) for k, v in rules.items()},
                "loads": loads,
                "refused": refused,
            }


def peer_cpu(loads: dict[str, dict[str, float]], n: int) -> dict[str, float]:
    """What one peer cost: the peer workers' CPU (``peers-*`` in ``loads``, each
    process's `swarm_procs.LoopLoad.figures`) over the ``n`` peers, in cores, and the
    part of it in their event loop threads (empty where no worker measured itself)."""
    workers = [f for name, f in loads.items() if name.startswith("peers-")]
    if not workers or n <= 0:
        return {}
    return {
        "cpu_per_peer": sum(f["cpu_process"] for f in workers) / n,
        "cpu_loop_per_peer": sum(f["cpu_loop"] for f in workers) / n,
    }


def own_sessions(args: argparse.Namespace) -> bool:
    """``--worker-sessions own`` (the default): each worker process in a session of its
    own (`swarm_args.DEFAULT_WORKER_SESSIONS`)."""
    return getattr(args, "worker_sessions", swarm_args.DEFAULT_WORKER_SESSIONS) == "own"


def _plain(v: object) -> bool:
    return v is None or isinstance(v, (str, int, float, bool, list))


def override_session_settings(pairs: list[str], *, quiet: bool = False) -> None:
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
    if not quiet:
        print("libtorrent settings for every peer:", extra)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def set_chord_peer_knobs(args: argparse.Namespace) -> None:
    """``--upload-slots``, ``--sole-upload-slots``, ``--hold-unheld``: every chord
    peer's (to measure one)."""
    ChordPolicy.upload_slots = args.upload_slots or None
    ChordPolicy.sole_upload_slots = args.sole_upload_slots or None
    ChordPolicy.hold_unheld = bool(getattr(args, "hold_unheld", 0))


def bringing_per_peer(args: argparse.Namespace) -> int | None:
    """``--bringing-per-peer``, else None: `Supernode`'s own, `BRINGING_BYTES` worth of
    pieces (`pressrun.chord.aio`: one of 128 KiB or more, two of 64 KiB)."""
    return int(args.bringing_per_peer) or None


def _harness(r: dict[str, Any]) -> str:
    return (
        f"harness: {int(r['procs'])} processes, CPU {r['cpu_process']:.2f} cores in all "
        f"(worst event loop thread {r['cpu_loop']:.2f}), worst loop lag median "
        f"{r['lag_p50_ms']:.0f} ms, p99 {r['lag_p99_ms']:.0f} ms, max {r['lag_max_ms']:.0f} ms; "
        f"machine CPU busy {100 * r['machine_busy']:.0f}% of {r['cores']:.0f} cores "
        f"(and niced work {100 * r.get('machine_nice', 0.0):.0f}%) "
        f"(some task waiting for a CPU {100 * r.get('cpu_pressure', 0.0):.0f}% of the time), "
        f"load {r['load_start']:.2f} -> {r['load_end']:.2f}"
        + (
            f"; a peer {r['cpu_per_peer']:.4f} cores, {r['cpu_loop_per_peer']:.4f} of it "
            "in its worker's event loop"
            if "cpu_per_peer" in r
            else ""
        )
        + swarm_procs.busy_flag(r)
    )


def print_run_line(policy: str, n: int, k: int, r: dict[str, Any]) -> None:
    """One run: its figures and its harness, or why it is refused."""
    ring = (
        f"; ring {r['ring_requests_per_peer']:.0f} requests, {r['ring_rounds_per_peer']:.0f} "
        f"rounds, {r['ring_waits_per_peer']:.0f} waits per peer, "
        f"{r['sn_uploader_answers']:.0f} uploader answers, "
        f"{r.get('ring_lookups_per_peer', 0):.1f} lookup batches and "
        f"{r.get('ring_failures_per_peer', 0):.1f} unanswered requests per peer; "
        f"supernodes: {r.get('sn_requests', 0):.0f} client requests, "
        f"{r['sn_lookups']:.0f} ring lookups, {r.get('sn_rpcs_in', 0):.0f} Chord RPCs in, "
        f"ring settled {r.get('ring_settle_s', 0.0):.1f} s before the start"
        if "ring_requests_per_peer" in r
        else ""
    )
    state = f"REFUSED ({r['refused']})" if r["refused"] else "ok"
    cpu = ", ".join(f"{name} {f['cpu_process']:.2f}" for name, f in r["loads"].items())
    print(
        f"  run {k + 1}: {policy} N = {n}: {r['last_s']:.1f} s = {r['x']:.2f}x "
        f"({r['x_nominal']:.2f}x against the nominal u), "
        f"{r['copies']:.2f} copies{ring}; {_harness(r)} (CPU cores: {cpu}): {state}",
        flush=True,
    )


def print_medians(policy: str, n: int, runs: list[dict[str, Any]]) -> None:
    """The medians of the runs whose harness was not saturated (none: said so)."""
    kept = [r for r in runs if not r["refused"]]
    if not kept:
        print(f"{policy:>10} {n:>4}  no run to report: every run's harness was saturated")
        return
    keys = [k for k, v in kept[0].items() if isinstance(v, float)]
    med = {k: statistics.median(r.get(k, 0.0) for r in kept) for k in keys}
    rules = ", ".join(f"{k[5:]}={int(v)}" for k, v in sorted(med.items()) if k.startswith("rule_"))
    each = " ".join(f"{r['x']:.2f}x/{r['copies']:.2f}" for r in kept)
    refused = len(runs) - len(kept)
    print(
        f"{policy:>10} {n:>4} {med['last_s']:>9.1f} {med['t_min_s']:>8.1f} {med['x']:>8.2f} "
        f"{med['copies']:>14.2f} {med['mean_ratio']:>10.2f}  {rules}"
        f"   runs: {each}" + (f" ({refused} refused)" if refused else ""),
        flush=True,
    )
    print(
        f"{'':>15} {_harness(med)}; peers downloaded {100 * med['beyond_nf']:.1f}% beyond N F; "
        f"{med['x_nominal']:.2f}x against the bound with the nominal u",
        flush=True,
    )
    if "ring_requests_per_peer" in med:
        print(
            f"{'':>15} ring: {med['ring_requests_per_peer']:.0f} requests, "
            f"{med['ring_rounds_per_peer']:.0f} rounds and {med['ring_waits_per_peer']:.0f} "
            f"wait answers per peer, supernodes ran {med['sn_lookups']:.0f} lookups and gave "
            f"{med['sn_uploader_answers']:.0f} uploader answers",
            flush=True,
        )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    swarm_args.add_arguments(p)
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
        runs = []
        for k in range(args.runs):
            r = await one_run(n, policy, args)
            print_run_line(policy, n, k, r)
            runs.append(r)
        print_medians(policy, n, runs)
    print("load average (1, 5, 15 min) at the end:", _load())


if __name__ == "__main__":
    asyncio.run(main())
