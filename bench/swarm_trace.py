"""Where a loopback swarm's time and origin copies go: one traced `bench/swarm.py` run.

One run of `bench/swarm.py`'s swarm (same sizes and defaults) with every peer traced:
when each piece arrived and from where (the owed-piece feed from the origins, a web
seed, another peer), each feed fetch's start and end, each question to the ring and its
answer (bring in, an uploader, wait), and the web-seed drops and restores with the
peer's counts at that moment. It prints what docs/chord.md ("Benches") reports
(`bench/swarm_trace_report.py`: the last copy's time decomposed against the fluid
bound, ramp, middle, tail, who idled and why; fetches from the origins and their
duplicates, by cause; how long the first ring answer took; the ramp's first pieces;
distinct pieces in the swarm and pieces delivered over time; the completion times).

This is a diagnosis tool: it wraps a few methods of the peer's classes (the feed's
fetch, the ring client's POST, the peer's alert handler and effects) for the run, and
turns on libtorrent's block alerts to learn each piece's source. The figures of record
come from `bench/swarm.py` itself (no wrapping).

    .venv/bin/python bench/swarm_trace.py --policy chord --n 40 [--json-out FILE]
    .venv/bin/python bench/swarm_trace.py --n 40 --replay FILE   # summarise it again
    # another issue size (20 MiB by default): a crowd larger than the pieces
    .venv/bin/python bench/swarm_trace.py --policy chord --n 80 --size-mib 5
    # main's (or any) code under the same trace: its src first on the path
    PYTHONPATH=OTHER/src .venv/bin/python bench/swarm_trace.py --policy stripes --n 40
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import libtorrent as lt

import pressrun.peer.aio as peer_aio
import pressrun.peer.feed as peer_feed
import pressrun.peer.ring_client as ring_client
from pressrun.content.publish import DEFAULT_PIECE_SIZE
from pressrun.peer.config import PeerConfig

_spec = importlib.util.spec_from_file_location("bench_swarm", Path(__file__).with_name("swarm.py"))
assert _spec is not None and _spec.loader is not None
bench_swarm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_swarm)
# the figures from the events (`summarise`, `decompose`, `merge_samples`)
report = bench_swarm.load_bench_module("swarm_trace_report")

EVENTS: list[dict[str, Any]] = []
_T0: list[float] = []
PEERS: list[Any] = []
SAMPLE_S = 0.5  # the upload sampler's period
#: the ramp's finer view (`_ramp_sample`, block events): every RAMP_SAMPLE_S for the
#: first RAMP_S seconds, each peer's connections; each block requested, received and
#: uploaded in that time
RAMP_S = 3.0
RAMP_SAMPLE_S = 0.1
SIZES: dict[str, Any] = {}  # n, u, u_s, size of the run, for the decomposition


def _ev(kind: str, **kw: Any) -> None:
    now = asyncio.get_running_loop().time()
    if not _T0:
        _T0.append(now)
    kw.update(t=round(now - _T0[0], 3), k=kind)
    EVENTS.append(kw)


bench_swarm_args_upload_bps: list[float] = []


def _pid(obj: Any) -> str:
    return str(getattr(obj, "_trace_pid", "?"))


def _install() -> None:
    settings = peer_aio.session_settings

    def traced_settings(*a: Any, **kw: Any) -> dict[str, Any]:
        s = settings(*a, **kw)
        s["alert_mask"] = (
            int(s["alert_mask"])
            | int(lt.alert.category_t.block_progress_notification)
            # (each block uploaded, in the ramp: `_ramp_block`)
            | int(lt.alert.category_t.upload_notification)
        )
        return s

    peer_aio.session_settings = traced_settings  # type: ignore[assignment]

    on_alert = peer_aio.SwarmPeer._on_alert

    def traced_alert(self: Any, a: Any) -> None:
        if isinstance(a, lt.block_finished_alert):
            self.__dict__.setdefault("_trace_src", {})[a.piece_index] = f"{a.endpoint[1]}"
            _ramp_block("got", self, a)
        elif isinstance(a, lt.block_downloading_alert):
            _ramp_block("req", self, a)
        elif isinstance(a, lt.block_uploaded_alert):
            _ramp_block("sent", self, a)
        elif isinstance(a, lt.piece_finished_alert):
            src = self.__dict__.get("_trace_src", {}).get(a.piece_index, "")
            _ev("piece", peer=self._peer_id[-6:], piece=int(a.piece_index), port=src)
        elif isinstance(a, lt.torrent_finished_alert):
            _ev("finished", peer=self._peer_id[-6:])
        on_alert(self, a)

    peer_aio.SwarmPeer._on_alert = traced_alert  # type: ignore[method-assign]

    start = peer_aio.SwarmPeer.start

    async def traced_start(self: Any) -> int:
        # the peer's arrival: its clock (download_s) starts inside start(), now (the
        # key: this process and the object, unique across the bench's workers)
        key = f"{os.getpid()}-{id(self)}"
        _ev("arrive", peer=key)
        port = await start(self)
        _ev("arrived", peer=key, pid=self._peer_id)
        PEERS.append(self)
        pid = self._peer_id[-6:]
        _ev("listen", peer=pid, port=port)
        self._feed._trace_pid = pid
        if self._ring is not None:
            self._ring._trace_pid = pid
        return port

    peer_aio.SwarmPeer.start = traced_start  # type: ignore[method-assign]

    connect = peer_aio.SwarmPeer._connect_peer

    def traced_connect(self: Any, host: str, port: int) -> None:
        # the ring named an uploader this peer had not connected to through the ring
        _ev("connect", peer=self._peer_id[-6:], port=port)
        connect(self, host, port)

    peer_aio.SwarmPeer._connect_peer = traced_connect  # type: ignore[method-assign]

    verified = peer_aio.SwarmPeer._verified

    def traced_verified(self: Any) -> None:
        _ev("verified", peer=self._peer_id[-6:])
        verified(self)

    peer_aio.SwarmPeer._verified = traced_verified  # type: ignore[method-assign]

    fetch = peer_feed.OwedPieceFeed._fetch_piece

    async def traced_fetch(self: Any, http: Any, url: str, piece: int) -> bytes | None:
        _ev("feed_start", peer=_pid(self), piece=piece, origin=url.split("/")[2])
        data = await fetch(self, http, url, piece)
        _ev("feed_end", peer=_pid(self), piece=piece, ok=data is not None)
        return data

    peer_feed.OwedPieceFeed._fetch_piece = traced_fetch  # type: ignore[method-assign]

    post = ring_client.RingClient._post

    async def traced_post(
        self: Any, sn: str, route: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any] | None:
        t = asyncio.get_running_loop().time()
        doc = await post(self, sn, route, body, timeout_s=timeout_s)
        dt = round(asyncio.get_running_loop().time() - t, 3)
        if route == "pieces":
            ans = doc.get("uploaders", []) if doc else []
            _ev(
                "ask",
                peer=_pid(self),
                dt=dt,
                # (the uploader each answer named: its peer id's last six digits)
                src={
                    str(a["piece"]): str(a.get("peer_id", ""))[-6:] for a in ans if a.get("first")
                },
                bring=[a["piece"] for a in ans if a.get("bring_in")],
                wait=[a["piece"] for a in ans if a.get("wait")],
                up=[a["piece"] for a in ans if not a.get("bring_in") and not a.get("wait")],
                first=[a["piece"] for a in ans if a.get("first")],
                # (the supernode, and the pieces it said it does not answer for)
                sn=sn,
                not_mine=list(doc.get("not_mine", [])) if doc else [],
            )
        return doc

    ring_client.RingClient._post = traced_post  # type: ignore[method-assign]

    apply = peer_aio.SwarmPeer._apply

    def traced_apply(self: Any, effects: list[Any]) -> None:
        for e in effects:
            name = type(e).__name__
            if name in ("DropWebSeeds", "RestoreWebSeeds", "Stalled"):
                _ev(name, peer=self._peer_id[-6:])
        apply(self, effects)

    peer_aio.SwarmPeer._apply = traced_apply  # type: ignore[method-assign]


def start_sampler(go: float, *, origin: Any) -> asyncio.Task[None]:
    """The samples of the run from ``go`` (a `time.monotonic` value, the common start of
    every process of the bench, and the events' zero): in a worker (``origin`` None)
    its peers' upload and connections; in the harness (``origin``: the
    `LoopbackSwarm`) the origins' bytes. Every process samples at ``go + k SAMPLE_S``,
    so the ticks of different workers line up."""
    _T0[:] = [go]
    return asyncio.get_running_loop().create_task(_sample_uploads(go, origin))


async def _sample_uploads(go: float, origin: Any) -> None:
    # every SAMPLE_S: each present peer's upload and connections (`_sample_idle`), or
    # the origins' bytes; every second also the peers still in the swarm (downloading
    # or seeding), how many are seeds, the payload all of them uploaded so far (their
    # last status poll); `merge_samples` adds up those of every worker
    tick = 0
    while True:
        await asyncio.sleep(max(0.0, go + tick * SAMPLE_S - time.monotonic()))
        if origin is not None:
            _ev("origin", sent=origin.origin_bytes_sent(), tick=tick)
            tick += 1
            continue
        present = [p for p in PEERS if p.core is not None and p.core.phase.value != "left"]
        if tick % round(1 / SAMPLE_S) == 0:
            seeds = sum(1 for p in present if p.core.phase.value == "seeding")
            up = sum(
                (p._status.last_progress.uploaded_bytes if p._status.last_progress else 0)
                for p in PEERS
            )
            conns = sorted(
                p._status.last_progress.connected_peers for p in present if p._status.last_progress
            )
            _ev("sample", tick=tick, present=len(present), seeds=seeds, uploaded=up, conns=conns)
        _sample_idle(present, tick)
        if PEERS and not present:
            return
        if tick * SAMPLE_S < RAMP_S:
            # the ramp's finer view between this tick and the next
            for k in range(round(SAMPLE_S / RAMP_SAMPLE_S)):
                await asyncio.sleep(
                    max(0.0, go + tick * SAMPLE_S + k * RAMP_SAMPLE_S - time.monotonic())
                )
                _ramp_sample([p for p in PEERS if p.core is not None])
        tick += 1


def _ramp_block(what: str, peer: Any, a: Any) -> None:
    # a block requested ("req"), received ("got") or uploaded ("sent") in the ramp:
    # the peer, the piece and block, the other end (its peer id's last six digits)
    if not _T0 or asyncio.get_running_loop().time() - _T0[0] > RAMP_S:
        return
    _ev(
        "blk",
        what=what,
        peer=peer._peer_id[-6:],
        piece=int(a.piece_index),
        block=int(a.block_index),
        other=a.pid.to_bytes().hex()[-6:],
    )


def _ramp_sample(present: list[Any]) -> None:
    # each peer's payload uploaded so far and its connections: the other end, and
    # flags: I (it is interested in the other), C (the other chokes it), i (the other
    # is interested in it), c (it chokes the other); its requests queued at the other
    # and the other's at it; its send side's state (libtorrent's write_state: 1 idle,
    # 2 waiting for the rate limiter, 4 for the network, 16 for the disk), its send
    # quota and send buffer; the payload rates each way
    for p in present:
        if p._handle is None:
            continue
        conns = []
        for pi in p._handle.get_peer_info():
            if pi.connection_type != lt.peer_info.standard_bittorrent:
                continue
            if pi.flags & (lt.peer_info.handshake | lt.peer_info.connecting):
                conns.append([pi.pid.to_bytes().hex()[-6:], "h"])
                continue
            f = pi.flags
            flags = (
                ("I" if f & lt.peer_info.interesting else "")
                + ("C" if f & lt.peer_info.remote_choked else "")
                + ("i" if f & lt.peer_info.remote_interested else "")
                + ("c" if f & lt.peer_info.choked else "")
            )
            conns.append(
                [
                    pi.pid.to_bytes().hex()[-6:],
                    flags,
                    int(pi.download_queue_length),
                    int(pi.upload_queue_length),
                    int(pi.write_state),
                    int(pi.send_quota),
                    int(pi.used_send_buffer),
                    int(pi.payload_up_speed),
                    int(pi.payload_down_speed),
                ]
            )
        st = p._handle.status()
        _ev("conns", peer=p._peer_id[-6:], up=int(st.total_payload_upload), conns=conns)


def _sample_idle(present: list[Any], tick: int) -> None:
    # why a peer's upload sits idle: per present peer (downloading or seeding), its
    # payload uploaded so far (and with the protocol's own bytes) and what its
    # connections say (libtorrent's peer infos): peers interested in it, of those the
    # ones it unchokes, and of those the ones with requests queued at it; and the
    # origins' bytes sent so far (the harness's own events, `start_sampler`)
    for p in present:
        if p._handle is None:
            continue
        interested = unchoked = asking = 0
        for pi in p._handle.get_peer_info():
            if pi.connection_type != lt.peer_info.standard_bittorrent:
                continue
            if pi.flags & lt.peer_info.remote_interested:
                interested += 1
                if not pi.flags & lt.peer_info.choked:
                    unchoked += 1
                    if pi.upload_queue_length > 0 or pi.up_speed > 0:
                        asking += 1
        st = p._handle.status()
        _ev(
            "idle",
            tick=tick,
            peer=p._peer_id,
            phase=p.core.phase.value,
            up=int(st.total_payload_upload),
            up_all=int(st.total_upload),
            # (bytes this peer downloaded twice, and those of pieces that failed the hash)
            redundant=int(st.total_redundant_bytes),
            failed=int(st.total_failed_bytes),
            interested=interested,
            unchoked=unchoked,
            asking=asking,
        )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=40, help="peers")
    p.add_argument("--policy", default="chord", help="uploader policy")
    p.add_argument("--json-out", type=Path, default=None, help="write the events here")
    p.add_argument(
        "--replay", type=Path, default=None, help="summarise the events of an earlier --json-out"
    )
    p.add_argument("--lt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--size-mib", type=float, default=20.0, help="file size F (MiB)")
    p.add_argument("--piece-kib", type=int, default=DEFAULT_PIECE_SIZE // 1024)
    p.add_argument("--peer-upload-mbps", type=float, default=8.0, help="u per peer (Mbit/s)")
    p.add_argument("--origin-mbps", type=float, default=16.0, help="u_s (Mbit/s)")
    p.add_argument("--peers-per-proc", type=int, default=20, help="peers per worker process")
    p.add_argument(
        "--worker-sessions",
        choices=("own", "shared"),
        default=bench_swarm.swarm_args.DEFAULT_WORKER_SESSIONS,
        help="as bench/swarm.py's",
    )
    bench_swarm.swarm_args.add_ring_arguments(p)
    a = p.parse_args()
    bench_swarm.set_chord_peer_knobs(a)
    bench_swarm.override_session_settings(a.lt)
    args = argparse.Namespace(
        size_mib=a.size_mib,
        peer_upload_mbps=a.peer_upload_mbps,
        origin_mbps=a.origin_mbps,
        origins=1,
        piece_kib=a.piece_kib,
        seeds_per_leecher=PeerConfig().not_needed_seeds_per_leecher,
        tracker_interval_s=5,
        supernodes=5,
        keep_web_seeds=False,
        share_factor=2.0,
        max_bringers=a.max_bringers,
        bringing_per_peer=a.bringing_per_peer,
        bring_ahead_s=a.bring_ahead_s,
        origin_fetch_s=a.origin_fetch_s,
        first_receivers=a.first_receivers,
        order_askers=a.order_askers,
        fair_bringing=a.fair_bringing,
        peers_per_proc=a.peers_per_proc,
        worker_sessions=a.worker_sessions,
        lt=a.lt,
        upload_slots=a.upload_slots,
        sole_upload_slots=a.sole_upload_slots,
        hold_unheld=a.hold_unheld,
        origin_chunk_kib=a.origin_chunk_kib,
    )
    bench_swarm_args_upload_bps.append(args.peer_upload_mbps * 1e6 / 8)
    SIZES.update(
        n=a.n,
        # the payload the upload limit carries, as bench/swarm.py's bound counts it
        u=bench_swarm.payload_upload_bps(
            args.peer_upload_mbps * 1e6 / 8,
            ip_overhead=bench_swarm.limiter_counts_ip_overhead(a.lt),
        ),
        u_s=args.origin_mbps * 1e6 / 8,
        size=int(args.size_mib * (1 << 20)),
    )
    cap = bench_swarm_args_upload_bps[0]
    if a.replay is not None:
        report.summarise(json.loads(a.replay.read_text()), upload_bps=cap, sizes=SIZES)
        return
    print("load average (1, 5, 15 min) at the start:", bench_swarm._load())
    try:
        # the peers in worker processes, each tracing its own (`_install` there); this
        # process samples the origins
        res = await bench_swarm.one_run(a.n, a.policy, args, trace=sys.modules[__name__])
        print(
            f"{a.policy} N = {a.n}: last peer {res['last_s']:.1f} s = {res['x']:.2f}x the bound, "
            f"origins {res['copies']:.2f} copies; {bench_swarm._harness(res)}: "
            + (f"REFUSED ({res['refused']})" if res["refused"] else "ok")
        )
    except SystemExit as err:
        print(f"{a.policy} N = {a.n}: {err}")
    print("load average (1, 5, 15 min) at the end:", bench_swarm._load())
    events = report.merge_samples(EVENTS)
    report.summarise(events, upload_bps=cap, sizes=SIZES)
    if a.json_out is not None:
        a.json_out.write_text(json.dumps(events))


if __name__ == "__main__":
    asyncio.run(main())
