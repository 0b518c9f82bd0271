"""The figures of a traced loopback swarm run (`bench/swarm_trace.py`), from its events:
what docs/chord.md ("Benches") and docs/results/2026-11-28-swarm-limit.md report.

`summarise` prints them all: where the pieces came from; the origin fetches and their
duplicates, by cause; the first ring answers; pieces per second; the ramp (the origins'
first pieces, each peer's first piece, how long a piece's first holders waited for its
second); second holders and the named first receivers; why the peers' upload idled;
the completion times; `decompose`, the last copy's time against the fluid bound (ramp,
middle, tail; who idled and why); the tail and the bytes downloaded twice. Split from
`bench/swarm_trace.py` (which runs and instruments the swarm) on 29 November: the same
figures, from the same events (a saved ``--json-out`` replays here).
"""

from __future__ import annotations

import collections
import itertools
import statistics
from typing import Any


def merge_samples(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-second samples of every worker added up, one per tick (the others'
    events unchanged)."""
    merged: dict[int, dict[str, Any]] = {}
    rest = []
    for e in events:
        if e["k"] != "sample" or "tick" not in e:
            rest.append(e)
            continue
        m = merged.setdefault(
            e["tick"], {**e, "present": 0, "seeds": 0, "uploaded": 0, "conns": []}
        )
        m["t"] = min(m["t"], e["t"])
        for k in ("present", "seeds", "uploaded"):
            m[k] += e[k]
        m["conns"] = sorted([*m["conns"], *e["conns"]])
    return sorted([*rest, *merged.values()], key=lambda e: e["t"])


def _idle_report(events: list[dict[str, Any]], cap: float) -> None:
    # the downloading peers' upload use, and the peers using under half their upload
    # by cause: nobody interested in it; interested peers but all choked; unchoked
    # ones that ask nothing; asked but slow (the rest)
    rows = [e for e in events if e["k"] == "idle" and e["phase"] == "downloading"]
    if not rows:
        return
    last: dict[str, dict[str, Any]] = {}
    for e in rows:
        # (the payload uploaded since the peer's last sample, over its upload cap: not
        # libtorrent's smoothed upload_payload_rate, which lags by seconds)
        before = last.get(e["peer"])
        e["use"] = (
            round((e["up"] - before["up"]) / max(1e-3, e["t"] - before["t"]) / cap, 2)
            if before
            else 0.0
        )
        last[e["peer"]] = e
    by_s: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in rows:
        by_s[int(e["t"])].append(e)
    print(
        "downloading peers per second: mean upload use / under half: nobody interested, "
        "all interested choked, unchoked but no requests, requests but slow"
    )
    out = []
    for t in sorted(by_s):
        es = by_s[t]
        low = [e for e in es if e["use"] < 0.5]
        causes = collections.Counter(
            "none"
            if e["interested"] == 0
            else "choked"
            if e["unchoked"] == 0
            else "quiet"
            if e["asking"] == 0
            else "slow"
            for e in low
        )
        mean = sum(e["use"] for e in es) / len(es)
        out.append(
            f"{t}:{mean:.2f}/{causes['none']},{causes['choked']},{causes['quiet']},{causes['slow']}"
        )
    print("  " + " ".join(out))
    mid = [e for e in rows if 10 <= e["t"] <= 25]
    if mid:
        print(
            f"  10-25 s: upload use {statistics.mean(e['use'] for e in mid):.2f}; interested "
            f"peers median {statistics.median(e['interested'] for e in mid)}, unchoked "
            f"{statistics.median(e['unchoked'] for e in mid)}, with requests "
            f"{statistics.median(e['asking'] for e in mid)}"
        )


#: the swarm's upload counts as in use from the first sample interval at this share
RAMP_END_USE = 0.8


def decompose(
    events: list[dict[str, Any]], *, n: int, u: float, u_s: float, size: int
) -> dict[str, Any]:
    """Where T went against the fluid bound, from the samples of one traced run.

    With C = u_s + N u and t0 the first arrival, every second of the run either
    delivers C bytes or loses part of it, so exactly

        t_end - t0 = N F / C + (lost capacity) / C + (bytes beyond N F) / C

    (t_end: the last copy verified; N F / C the bound when it is the largest term).
    The lost capacity is split by phase (ramp: until the peers' upload first reaches
    RAMP_END_USE of N u; middle; tail: from the first verified copy) and by who idled
    and why: the origins (u_s minus what they sent); a peer not started yet or whose
    session is being made (`start`); a downloading peer that nobody is interested in
    (`none`), whose interested peers are all choked (`choked`), whose unchoked peers
    ask nothing (`quiet`) or with requests queued (`slow`: the rate limiter, TCP, the
    process); a seed (`seed`); a peer that has left (`left`). The residual is what the
    samples miss (bytes between a peer's last sample and its leaving, sampling
    jitter)."""
    c = u_s + n * u
    arrive = sorted(e["t"] for e in events if e["k"] == "arrive")
    t0 = arrive[0]
    ticks = [e for e in events if e["k"] == "origin"]
    rows: dict[int, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for e in events:
        if e["k"] == "idle":
            rows[e["tick"]][e["peer"]] = e
    tick_rows = [(tk["t"], tk["sent"], rows[tk["tick"]]) for tk in ticks]
    verified = sorted(e["t"] for e in events if e["k"] == "verified")
    t_end, t_first = verified[-1], verified[0]
    seen: dict[str, dict[str, Any]] = {}  # each peer's last row
    # interval by interval: (start, length, origin bytes, peers' bytes, idle by cause)
    intervals: list[tuple[float, float, float, float, collections.Counter[str]]] = []
    first_t = tick_rows[0][0]
    not_sampled = collections.Counter(start=n * u * (first_t - t0))
    intervals.append((t0, first_t - t0, 0.0, 0.0, not_sampled))
    for (ta, sa, ra), (tb, sb, rb) in itertools.pairwise(tick_rows):
        dt = tb - ta
        idle: collections.Counter[str] = collections.Counter()
        peers_bytes = 0.0
        for pid, b in rb.items():
            a = ra.get(pid) or seen.get(pid)
            seen[pid] = b
            d = b["up"] - a["up"] if a else b["up"]
            peers_bytes += d
            if b["phase"] == "seeding":
                cause = "seed"
            elif b["interested"] == 0:
                cause = "none"
            elif b["unchoked"] == 0:
                cause = "choked"
            elif b["asking"] == 0:
                cause = "quiet"
            else:
                cause = "slow"
            idle[cause] += u * dt - d
        gone = {pid for pid in seen if pid not in rb}
        idle["left"] += u * dt * len(gone)
        idle["start"] += u * dt * (n - len(rb) - len(gone))
        intervals.append((ta, dt, float(sb - sa), peers_bytes, idle))
        if tb >= t_end:
            break
    if intervals[-1][0] + intervals[-1][1] < t_end:  # after the last sample
        ta = intervals[-1][0] + intervals[-1][1]
        dt = t_end - ta
        intervals.append((ta, dt, 0.0, 0.0, collections.Counter(left=n * u * dt)))
    t_ramp = next(
        (ta for ta, dt, _o, pb, _i in intervals if dt > 0 and pb / (n * u * dt) >= RAMP_END_USE),
        t_first,
    )
    phases = (("ramp", t0, t_ramp), ("middle", t_ramp, t_first), ("tail", t_first, t_end))
    out: dict[str, Any] = {"c": c, "t0": t0, "t_end": t_end, "phases": {}}
    for name, lo, hi in phases:
        origin_idle = 0.0
        idle: collections.Counter[str] = collections.Counter()
        for ta, dt, ob, _pb, i in intervals:
            # the share of the interval inside [lo, hi)
            share = max(0.0, min(ta + dt, hi) - max(ta, lo)) / dt if dt > 0 else 0.0
            if share <= 0:
                continue
            origin_idle += share * (u_s * dt - ob)
            for k, v in i.items():
                idle[k] += share * v
        out["phases"][name] = {
            "from": lo - t0,
            "to": hi - t0,
            "origin": origin_idle / c,
            **{k: v / c for k, v in idle.items()},
        }
    origin_total = tick_rows[-1][1]
    peers_total = sum(pb for _ta, _dt, _ob, pb, _i in intervals)
    out["bound"] = max(size / u_s, n * size / c)
    out["waste"] = (origin_total + peers_total - n * size) / c
    out["lost"] = sum(
        sum(v for k, v in ph.items() if k not in ("from", "to")) for ph in out["phases"].values()
    )
    out["residual"] = (t_end - t0) - out["bound"] - out["lost"] - out["waste"]
    by_arrival = {e["pid"][-6:]: e["t"] for e in events if e["k"] == "arrived"}
    first_arrive = {
        e["peer"]: e["t"] for e in events if e["k"] == "arrive"
    }  # id -> t; matched through "arrived"
    start_of = {e["pid"][-6:]: first_arrive[e["peer"]] for e in events if e["k"] == "arrived"}
    ver = {e["peer"]: e["t"] for e in events if e["k"] == "verified"}
    last = max(ver, key=lambda pid: ver[pid] - start_of.get(pid, t0))
    out["last_peer"] = {
        "arrived": start_of.get(last, t0) - t0,
        "listening": by_arrival.get(last, t0) - t0,
        "t_last": ver[last] - start_of.get(last, t0),
    }
    out["arrivals_span"] = arrive[-1] - t0
    return out


def _decomposition_report(d: dict[str, Any]) -> None:
    causes = ("origin", "start", "none", "choked", "quiet", "slow", "seed", "left")
    print(
        f"decomposition against the bound (C = {d['c'] / 1e6:.1f} MB/s; seconds of T, "
        "lost capacity / C):"
    )
    print(f"  {'phase':<7} {'from-to s':>11} {'lost':>5}  " + " ".join(f"{c:>6}" for c in causes))
    for name, ph in d["phases"].items():
        lost = sum(v for k, v in ph.items() if k not in ("from", "to"))
        print(
            f"  {name:<7} {ph['from']:>5.1f}-{ph['to']:<5.1f} {lost:>5.2f}  "
            + " ".join(f"{ph.get(c, 0.0):>6.2f}" for c in causes)
        )
    print(
        f"  t_end - t0 = {d['t_end'] - d['t0']:.2f} s = bound {d['bound']:.2f} + lost "
        f"{d['lost']:.2f} + bytes beyond N F {d['waste']:.2f} + residual {d['residual']:.2f}"
    )
    lp = d["last_peer"]
    print(
        f"  the last finisher (its own clock, as bench/swarm.py counts): {lp['t_last']:.2f} s; it "
        f"arrived {lp['arrived']:.2f} s after the first (arrivals spread over "
        f"{d['arrivals_span']:.2f} s: the sessions are made one after the other), listening "
        f"at {lp['listening']:.2f} s"
    )


def _at(times: list[float], marks: tuple[float, ...]) -> str:
    return ", ".join(f"{m} s: {sum(1 for t in times if t <= m)}" for m in marks)


def summarise(
    events: list[dict[str, Any]], *, upload_bps: float, sizes: dict[str, Any] | None = None
) -> None:
    """Print the figures of docs/chord.md's "Benches": ``upload_bps``, a peer's upload
    limit (its upload use); ``sizes`` (n, u, u_s, size: `decompose`'s) for the
    decomposition against the bound."""
    listen = {e["peer"]: e for e in events if e["k"] == "listen"}
    origins = {e["origin"].rsplit(":", 1)[-1] for e in events if e["k"] == "feed_start"}
    fed_by: dict[str, set[int]] = collections.defaultdict(set)  # peer -> pieces fed
    assigned: dict[str, set[int]] = collections.defaultdict(set)
    first_answer: dict[str, float] = {}
    held: dict[int, float] = {}
    fetching: dict[int, set[str]] = collections.defaultdict(set)
    causes: collections.Counter[str] = collections.Counter()
    dups: collections.Counter[str] = collections.Counter()
    sources: collections.Counter[str] = collections.Counter()
    arrivals: list[float] = []
    done: dict[str, float] = {}
    feed_ok: list[dict[str, Any]] = []
    for e in events:
        k = e["k"]
        if k == "ask":
            assigned[e["peer"]].update(e["bring"])
            if e["bring"] or e["up"] or e["wait"]:
                first_answer.setdefault(e["peer"], e["t"])
        elif k == "feed_start":
            peer, p = e["peer"], e["piece"]
            cause = (
                "assigned by the ring"
                if p in assigned[peer]
                else ("before the first ring answer" if peer not in first_answer else "other")
            )
            causes[cause] += 1
            if p in held or fetching[p] - {peer}:
                dups[cause] += 1
            fetching[p].add(peer)
        elif k == "feed_end":
            fetching[e["piece"]].discard(e["peer"])
            if e["ok"]:
                feed_ok.append(e)
                fed_by[e["peer"]].add(e["piece"])
        elif k == "piece":
            held.setdefault(e["piece"], e["t"])
            arrivals.append(e["t"])
            done[e["peer"]] = e["t"]
            if e["piece"] in fed_by[e["peer"]]:
                sources["the origins (feed)"] += 1
            elif e["port"] in origins:
                sources["a web seed"] += 1
            else:
                sources["a peer"] += 1
    per_piece = collections.Counter(e["piece"] for e in feed_ok)
    print(f"pieces arrived from: {dict(sources)}")
    print(
        f"origin fetches (feed): {len(feed_ok)} of {len(per_piece)} distinct pieces, "
        f"{sum(v - 1 for v in per_piece.values())} fetched again; by cause {dict(causes)}, "
        f"of which another peer held or was fetching the piece: {dict(dups)}"
    )
    waits = [first_answer[p] - listen[p]["t"] for p in first_answer if p in listen]
    if waits:
        print(
            f"first ring answer after the peer listened: median {statistics.median(waits):.2f} s, "
            f"max {max(waits):.2f} s"
        )
    bringers = collections.Counter(e["peer"] for e in feed_ok)
    print(f"pieces brought in per bringer: {sorted(bringers.values(), reverse=True)}")
    feed_at = collections.Counter(int(e["t"]) for e in feed_ok)
    last = int(max(arrivals, default=0)) + 1
    print(f"origin pieces per second: {[feed_at.get(i, 0) for i in range(last)]}")
    got_at = collections.Counter(int(t) for t in arrivals)
    print(f"pieces delivered per second: {[got_at.get(i, 0) for i in range(last)]}")
    samples = [e for e in events if e["k"] == "sample"]
    if len(samples) > 1:
        cap = upload_bps
        rows = []
        for a, b in itertools.pairwise(samples):
            rate = (b["uploaded"] - a["uploaded"]) / max(1e-3, b["t"] - a["t"])
            use = rate / (cap * a["present"]) if a["present"] else 0.0
            conns = a.get("conns") or [0]
            rows.append(
                f"{a['t']:.0f}:{a['present']}/{a['seeds']}/{use:.2f}/{conns[0]}-{conns[-1]}"
            )
        print(
            "per second, peers present / seeds among them / upload use / "
            "connected peers min-max: " + " ".join(rows)
        )
    print(f"distinct pieces in the swarm at {_at(sorted(held.values()), (2, 4, 6, 8, 10, 12, 15))}")
    _second_holders(events)
    _ramp_report(events)
    _ramp_detail(events, upload_bps)
    _idle_report(events, upload_bps)
    for k in ("DropWebSeeds", "RestoreWebSeeds", "Stalled"):
        print(f"{k}: {sum(1 for e in events if e['k'] == k)}")
    fin = {e["peer"]: e["t"] for e in events if e["k"] == "finished"}
    ver = {e["peer"]: e["t"] for e in events if e["k"] == "verified"}
    checks = sorted(ver[p] - fin[p] for p in ver if p in fin)
    if checks:
        print(
            f"last piece -> verified (final check): median {statistics.median(checks):.2f} s, "
            f"max {checks[-1]:.2f} s; last verified at {max(ver.values()):.1f} s"
        )
    print(f"completion times (s): {sorted(round(t, 1) for t in done.values())}")
    if sizes:
        _decomposition_report(decompose(events, **sizes))
    _tail_report(events)
    _redundant_report(events)


def _redundant_report(events: list[dict[str, Any]]) -> None:
    # the bytes peers downloaded twice (libtorrent's total_redundant_bytes: a block
    # that arrived from a second peer, end-game, time-critical pieces) and that failed
    # the hash, from each peer's last sample, in all and by the second it accrued
    last: dict[str, dict[str, Any]] = {}
    by_s: collections.Counter[int] = collections.Counter()
    for e in events:
        if e["k"] != "idle" or "redundant" not in e:
            continue
        before = last.get(e["peer"])
        by_s[int(e["t"])] += e["redundant"] - (before["redundant"] if before else 0)
        last[e["peer"]] = e
    if not last:
        return
    red = sorted((e["redundant"] for e in last.values()), reverse=True)
    failed = sum(e["failed"] for e in last.values())
    print(
        f"redundant bytes (downloaded twice): {sum(red) / 1e6:.2f} MB over {len(red)} peers "
        f"(most: {[round(r / 1e3) for r in red[:8]]} kB), failed the hash {failed / 1e6:.2f} MB"
    )
    print(
        "  redundant by second (s:kB): "
        + " ".join(f"{t}:{v / 1e3:.0f}" for t, v in sorted(by_s.items()) if v)
    )


def _tail_report(events: list[dict[str, Any]]) -> None:
    # the tail: at the first verified copy, how many pieces each peer still lacked;
    # the last finisher's last pieces (when, and from which port)
    verified = sorted((e["t"], e["peer"]) for e in events if e["k"] == "verified")
    pieces = [e for e in events if e["k"] == "piece"]
    if not verified or not pieces:
        return
    total = 1 + max(e["piece"] for e in pieces)
    t_first = verified[0][0]
    got: collections.Counter[str] = collections.Counter(
        e["peer"] for e in pieces if e["t"] <= t_first
    )
    peers = {e["peer"] for e in pieces}
    lacking = sorted((total - got[p] for p in peers if total - got[p] > 0), reverse=True)
    print(
        f"tail: at the first verified copy ({t_first:.1f} s) {len(lacking)} peers lacked "
        f"pieces: {lacking}"
    )
    last = verified[-1][1]
    mine = sorted((e["t"], e["piece"], e["port"]) for e in pieces if e["peer"] == last)
    print(
        f"tail: the last copy's ({last}, verified {verified[-1][0]:.1f} s) last pieces "
        "(s, piece, from port): " + " ".join(f"{t:.1f}/{k}/{port}" for t, k, port in mine[-6:])
    )


def _pct(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "none"
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return (
        f"median {statistics.median(xs):.2f} s, p90 {p90:.2f} s, max {xs[-1]:.2f} s (n = {len(xs)})"
    )


def _second_holders(events: list[dict[str, Any]]) -> None:
    # how long a piece stays with its first holder (its bringer) before a second peer
    # has it; and for the first receivers the ring named, from the naming to the piece
    holders: dict[int, list[float]] = collections.defaultdict(list)
    got: dict[tuple[str, int], float] = {}
    for e in events:
        if e["k"] == "piece":
            holders[e["piece"]].append(e["t"])
            got.setdefault((e["peer"], e["piece"]), e["t"])
    waits = [ts[1] - ts[0] for ts in holders.values() if len(ts) > 1]
    print(f"second holder after the first: {_pct(waits)}")
    named: dict[tuple[str, int], float] = {}
    for e in events:
        if e["k"] == "ask":
            for p in e.get("first", ()):
                named.setdefault((e["peer"], p), e["t"])
    if named:
        took = [got[k] - t for k, t in named.items() if k in got and got[k] >= t]
        print(f"first receivers named: {len(named)}; named -> piece: {_pct(took)}")


def _ramp_report(events: list[dict[str, Any]]) -> None:
    # the ramp: origin fetches in flight and the first completed; each peer's first
    # piece; for the pieces first held in the first 3 s, how long until a second peer
    # held them (the source holding a piece nobody else can use yet)
    flight, inflight = [], 0
    for e in events:
        if e["k"] in ("feed_start", "feed_end"):
            inflight += 1 if e["k"] == "feed_start" else -1
            flight.append((e["t"], inflight))
    marks = (0.5, 1.0, 1.5, 2.0, 2.5)

    def at(t: float) -> int:
        return next((i for tt, i in reversed(flight) if tt <= t), 0)

    ends = sorted(e["t"] for e in events if e["k"] == "feed_end" and e["ok"])
    print(
        "ramp: origin fetches in flight at "
        + ", ".join(f"{m} s: {at(m)}" for m in marks)
        + f"; the first five whole at {', '.join(f'{t:.2f}' for t in ends[:5])} s"
    )
    first: dict[str, float] = {}
    held: dict[int, list[float]] = collections.defaultdict(list)
    for e in events:
        if e["k"] == "piece":
            first.setdefault(e["peer"], e["t"])
            held[e["piece"]].append(e["t"])
    ts = sorted(first.values())
    if ts:
        print(
            f"  a peer's first piece: median {statistics.median(ts):.2f} s; peers with one by "
            + _at(ts, marks)
        )
    early = [h[1] - h[0] for h in held.values() if len(h) > 1 and h[0] < 3.0]
    print(f"  pieces first held before 3 s, their second holder after the first: {_pct(early)}")


def _first_at(samples: list[tuple[float, Any]], test: Any) -> float | None:
    return next((t for t, x in samples if test(x)), None)


def _fmt(t: float | None, since: float) -> str:
    return "-" if t is None else f"{t - since:+.2f}"


def _ramp_detail(events: list[dict[str, Any]], upload_bps: float) -> None:
    """The ramp's finer view (`bench/swarm_trace.py`'s ``conns`` samples every 0.1 s and
    block events in the first seconds): the swarm's upload and its holders tenth by
    tenth, and for the first pieces whole at their bringers, each first receiver's
    steps from its naming to the piece."""
    conns = [e for e in events if e["k"] == "conns"]
    if not conns:
        return
    pieces = [e for e in events if e["k"] == "piece"]
    # tenth by tenth: peers holding a piece; the payload the peers uploaded; the
    # holders' connections with requests queued at them, by the send side's state
    # (2: waiting for the rate limiter, 4: the network, 16: the disk, 1: idle)
    by_tenth: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in conns:
        by_tenth[round(e["t"] * 10)].append(e)
    last_up: dict[str, tuple[float, int]] = {}
    rows = []
    n = len({e["peer"] for e in conns})
    for tenth in sorted(by_tenth):
        es = by_tenth[tenth]
        t = tenth / 10
        holders = len({e["peer"] for e in pieces if e["t"] <= t})
        rate = 0.0
        states: collections.Counter[int] = collections.Counter()
        for e in es:
            before = last_up.get(e["peer"])
            if before is not None and e["t"] > before[0]:
                rate += (e["up"] - before[1]) / (e["t"] - before[0])
            last_up[e["peer"]] = (e["t"], e["up"])
            for c in e["conns"]:
                if len(c) > 3 and c[3] > 0:
                    states[c[4]] += 1
        rows.append(
            f"{t:.1f}:{holders}/{rate / max(1.0, n * upload_bps):.2f}/"
            + ",".join(f"{k}x{v}" for k, v in sorted(states.items()))
        )
    print(
        "ramp by tenth (s: peers holding a piece / the peers' upload over N u / "
        "connections with requests queued at a holder, by its send state 1 idle, "
        "2 rate limiter, 4 network, 16 disk x count):"
    )
    for i in range(0, len(rows), 10):
        print("  " + " ".join(rows[i : i + 10]))
    # the first pieces whole at their bringers, and each first receiver's steps
    fed = sorted(
        (e["t"], e["piece"], e["peer"]) for e in events if e["k"] == "feed_end" and e["ok"]
    )
    seen: set[int] = set()
    first_fed = []
    for t, piece, peer in fed:
        if piece not in seen:
            seen.add(piece)
            first_fed.append((t, piece, peer))
    named: dict[tuple[int, str], tuple[float, str]] = {}
    for e in events:
        if e["k"] == "ask":
            for piece in e.get("first", ()):
                src = e.get("src", {}).get(str(piece), "")
                named.setdefault((piece, e["peer"]), (e["t"], src))
    got = {(e["peer"], e["piece"]): e["t"] for e in pieces}
    blocks = [e for e in events if e["k"] == "blk"]
    by_peer: dict[str, list[tuple[float, dict[str, list[Any]]]]] = collections.defaultdict(list)
    for e in conns:
        by_peer[e["peer"]].append((e["t"], {c[0]: c for c in e["conns"]}))
    print(
        "ramp hops (the first pieces whole at their bringers; each named receiver, from its "
        "naming: connected to the source, interested, unchoked, first request, first block, "
        "the piece; s):"
    )
    for t_fed, piece, bringer in first_fed[:8]:
        print(f"  piece {piece} whole at {bringer} at {t_fed:.2f} s")
        for (p, r), (t_named, src) in sorted(named.items(), key=lambda x: x[1][0]):
            if p != piece or src != bringer:
                continue
            samples = by_peer.get(r, [])
            link = [(t, cs.get(bringer)) for t, cs in samples if t >= t_named - 0.1]
            conn = _first_at(link, lambda c: c is not None and c[1] != "h")
            intr = _first_at(link, lambda c: c is not None and c[1] != "h" and "I" in c[1])
            unch = _first_at(
                link, lambda c: c is not None and c[1] != "h" and "I" in c[1] and "C" not in c[1]
            )
            req = min(
                (b["t"] for b in blocks if b["what"] == "req" and b["peer"] == r
                 and b["piece"] == piece),
                default=None,
            )  # fmt: skip
            got0 = min(
                (b["t"] for b in blocks if b["what"] == "got" and b["peer"] == r
                 and b["piece"] == piece),
                default=None,
            )  # fmt: skip
            print(
                f"    {r} named {t_named:.2f}: connected {_fmt(conn, t_named)} interested "
                f"{_fmt(intr, t_named)} unchoked {_fmt(unch, t_named)} request "
                f"{_fmt(req, t_named)} block {_fmt(got0, t_named)} piece "
                f"{_fmt(got.get((r, piece)), t_named)}"
            )
        # the bringer's sending meanwhile: its upload and the pieces it sent to whom
        sent = collections.Counter(
            (b["piece"], b["other"])
            for b in blocks
            if b["what"] == "sent" and b["peer"] == bringer and b["t"] <= t_fed + 1.5
        )
        ups = [(t, cs) for t, cs in by_peer.get(bringer, []) if t_fed <= t <= t_fed + 1.0]
        states = collections.Counter(
            c[4] for _t, cs in ups for c in cs.values() if len(c) > 3 and c[3] > 0
        )
        print(
            f"    the bringer within 1.5 s: blocks sent (piece, to): {dict(sent)}; its "
            f"connections with requests queued, by send state, within 1 s: {dict(states)}"
        )
