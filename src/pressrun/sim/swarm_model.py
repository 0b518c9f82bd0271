"""`pressrun sim swarm`: a flash crowd on one issue, three ways of choosing uploaders.

A piece-level model in synchronous slots (numpy, so 50,000 subscribers run in seconds):
one slot is the time the slowest subscriber takes to upload one piece; in a slot every
node uploads at most ``k_up`` pieces and downloads at most ``k_down`` (its class's rates
in units of that slowest upload, rounded), the origin uploads at most ``k_origin``. A
piece received in a slot can be passed on from the next. Every slot, each subscriber
still downloading asks for up to ``k_down`` pieces it lacks, and an uploader is chosen
for each request by one of:

- ``ring``: the Chord ring's choice (`pressrun.chord.pieces.PieceDirectory`): the
  supernode of the piece picks, among the holders with upload left in the slot, those
  that still owe upload first and then the least loaded, spreading the requests; a
  piece no subscriber holds is brought in from the origin by one asker; what holders
  cannot take this slot goes to the origin while it has capacity (the owed-piece
  fetch). Subscribers ask for pieces rarest first as they see it (libtorrent's own
  order, which the `chord` policy leaves alone outside the pieces it must bring in;
  see ``rarest``), and the rarest pieces claim their holders' upload first;
- ``random``: a holder of the piece drawn at random (the origin is one of the holders
  of every piece), pieces in random order; an uploader with more requests than
  capacity serves a random subset, the rest wait for the next slot;
- ``rarest``: BitTorrent's rarest-first: the pieces with the fewest copies among the
  subscriber's ``NEIGHBOURS`` connected peers (a binomial sample of the swarm's copies)
  asked for first, a random holder for each (as ``random``).

Measured per choice: each subscriber's completion time, the last one against the fluid
bound of Kumar and Ross, max(F/u_s, F/d_min, N*F/(u_s + sum u_i)); the origin's bytes
as a share of unicast (N*F); when each subscriber may leave fairly (uploaded at least
what it downloaded; everyone keeps seeding until the last finishes). F is the file
rounded up to whole pieces.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

CHOICES = ("ring", "random", "rarest")
#: peers a subscriber is connected to, whose pieces it sees (libtorrent's default
#: connections_limit per torrent is of this order)
NEIGHBOURS = 50


class SwarmScenarioError(ValueError):
    """A swarm scenario file is missing or wrong; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class PeerClass:
    share: float
    upload_mbps: float
    download_mbps: float


@dataclass(frozen=True, slots=True)
class SwarmScenario:
    name: str
    subscribers: int
    file_mb: float
    piece_kib: int
    origin_upload_mbps: float
    arrival_window_s: float
    classes: tuple[PeerClass, ...]

    @property
    def piece_bytes(self) -> int:
        return self.piece_kib * 1024

    @property
    def num_pieces(self) -> int:
        return math.ceil(self.file_mb * 1e6 / self.piece_bytes)

    @property
    def file_bytes(self) -> int:
        """F as modelled: whole pieces."""
        return self.num_pieces * self.piece_bytes


def swarm_scenario_names() -> list[str]:
    root = resources.files("pressrun.sim") / "swarm_scenarios"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_swarm_scenario(name_or_path: str) -> SwarmScenario:
    """A built-in scenario by name, or a TOML file (docs/chord.md has the format)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as err:
            raise SwarmScenarioError(f"cannot read {path}: {err}") from None
    else:
        res = resources.files("pressrun.sim") / "swarm_scenarios" / f"{name_or_path}.toml"
        if not res.is_file():
            raise SwarmScenarioError(
                f"no swarm scenario {name_or_path!r}; built-in: {', '.join(swarm_scenario_names())}"
            )
        raw = res.read_text(encoding="utf-8")
    try:
        doc = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as err:
        raise SwarmScenarioError(f"{name_or_path}: not valid TOML: {err}") from None
    return _parse(doc, name_or_path)


def _parse(doc: dict[str, Any], where: str) -> SwarmScenario:
    sw = doc.get("swarm")
    if not isinstance(sw, dict):
        raise SwarmScenarioError(f"{where}: needs a [swarm] table")

    def num(key: str, default: float | None = None, *, positive: bool = True) -> float:
        v = sw.get(key, default)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise SwarmScenarioError(f"{where}: swarm.{key} must be a number")
        if v <= 0 if positive else v < 0:
            raise SwarmScenarioError(
                f"{where}: swarm.{key} must be {'> 0' if positive else '>= 0'}"
            )
        return float(v)

    classes_raw = sw.get("classes")
    if not isinstance(classes_raw, list) or not classes_raw:
        raise SwarmScenarioError(f"{where}: needs at least one [[swarm.classes]]")
    classes: list[PeerClass] = []
    for i, c in enumerate(classes_raw):
        try:
            pc = PeerClass(float(c["share"]), float(c["upload_mbps"]), float(c["download_mbps"]))
        except (KeyError, TypeError, ValueError):
            raise SwarmScenarioError(
                f"{where}: swarm.classes[{i}] needs share, upload_mbps, download_mbps numbers"
            ) from None
        if pc.share <= 0 or pc.upload_mbps <= 0 or pc.download_mbps <= 0:
            raise SwarmScenarioError(f"{where}: swarm.classes[{i}]: every value must be > 0")
        classes.append(pc)
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > 1e-6:
        raise SwarmScenarioError(f"{where}: class shares add up to {total}, not 1")
    subs = int(num("subscribers"))
    if subs < 2:
        raise SwarmScenarioError(f"{where}: swarm.subscribers must be at least 2")
    return SwarmScenario(
        name=str(doc.get("name", Path(where).stem)),
        subscribers=subs,
        file_mb=num("file_mb"),
        piece_kib=int(num("piece_kib", 1024)),
        origin_upload_mbps=num("origin_upload_mbps"),
        arrival_window_s=num("arrival_window_s", 0.0, positive=False),
        classes=tuple(classes),
    )


def fluid_bound_s(
    sc: SwarmScenario, upload_bps: npt.NDArray[np.float64], d_min_bps: float
) -> float:
    """max(F/u_s, F/d_min, N*F/(u_s + sum u_i)) in seconds (Kumar and Ross)."""
    f_bits = sc.file_bytes * 8
    u_s = sc.origin_upload_mbps * 1e6
    return max(
        f_bits / u_s,
        f_bits / d_min_bps,
        sc.subscribers * f_bits / (u_s + float(upload_bps.sum())),
    )


@dataclass(slots=True)
class SwarmRun:
    """One choice's run."""

    choice: str
    slot_s: float
    done_at_s: npt.NDArray[np.float64]  # per subscriber (inf: unfinished)
    fair_at_s: npt.NDArray[np.float64]  # per subscriber, first time uploaded >= downloaded
    origin_pieces: int
    slots: int
    completed_per_slot: list[int] = field(default_factory=list)

    @property
    def last_done_s(self) -> float:
        return float(self.done_at_s.max())


def _classes(sc: SwarmScenario, rng: np.random.Generator) -> tuple[npt.NDArray[np.float64], ...]:
    n = sc.subscribers
    counts = [round(c.share * n) for c in sc.classes]
    counts[-1] = n - sum(counts[:-1])
    up = np.concatenate(
        [np.full(k, c.upload_mbps * 1e6) for k, c in zip(counts, sc.classes, strict=True)]
    )
    down = np.concatenate(
        [np.full(k, c.download_mbps * 1e6) for k, c in zip(counts, sc.classes, strict=True)]
    )
    perm = rng.permutation(n)
    return up[perm], down[perm]


def run_swarm(
    sc: SwarmScenario,
    choice: str,
    *,
    seed: int = 1,
    slots_per_piece: int = 1,
    max_slots: int = 20000,
) -> SwarmRun:
    """Simulate ``sc`` with one uploader choice (module docstring)."""
    if choice not in CHOICES:
        raise ValueError(f"unknown uploader choice {choice!r}; choose from {', '.join(CHOICES)}")
    rng = np.random.default_rng(seed)
    n, p = sc.subscribers, sc.num_pieces
    up_bps, down_bps = _classes(sc, rng)
    base = float(up_bps.min())
    if slots_per_piece < 1:
        raise ValueError("slots_per_piece must be at least 1")
    slot_s = sc.piece_bytes * 8 / base / slots_per_piece
    # pieces per slot, as credit that builds up (a slow node uploads one piece every
    # slots_per_piece slots); unused credit is not hoarded beyond one piece or one slot
    up_rate = np.append(up_bps, sc.origin_upload_mbps * 1e6) / base / slots_per_piece
    up_credit = np.zeros(n + 1)
    down_rate = down_bps / base / slots_per_piece
    down_credit = np.zeros(n)
    arrive_slot = np.floor(rng.uniform(0, sc.arrival_window_s, n) / slot_s).astype(np.int64)

    have = np.zeros((n, p), dtype=bool)
    copies = np.zeros(p, dtype=np.int64)
    holders = np.zeros((p, n), dtype=np.int64)
    hcount = np.zeros(p, dtype=np.int64)
    uploaded = np.zeros(n, dtype=np.int64)
    downloaded = np.zeros(n, dtype=np.int64)
    done_at = np.full(n, np.inf)
    fair_at = np.full(n, np.inf)
    origin_pieces = 0
    run = SwarmRun(choice, slot_s, done_at, fair_at, 0, 0)
    origin = n  # the origin's index in the uploader arrays

    for t in range(max_slots):
        active = np.flatnonzero((arrive_slot <= t) & ~np.isfinite(done_at))
        if active.size == 0 and np.isfinite(done_at).all():
            break
        if active.size:
            # --- which pieces each active subscriber asks for
            noise = rng.random((active.size, p), dtype=np.float32)
            if choice == "random":
                key = noise.astype(np.float64)
            else:
                # rarest first as a peer sees it: copies among its NEIGHBOURS connected
                # peers (a binomial sample of the swarm, in its normal approximation),
                # ties at random
                q = np.minimum(1.0, copies / n)
                mean, sd = NEIGHBOURS * q, np.sqrt(NEIGHBOURS * q * (1 - q))
                z = rng.standard_normal((active.size, p), dtype=np.float32)
                key = np.maximum(0.0, mean[None, :] + sd[None, :] * z) + noise * 0.5
            key = np.where(have[active], np.inf, key)
            down_credit[active] = np.minimum(
                down_credit[active] + down_rate[active], np.maximum(1.0, down_rate[active])
            )
            k_down = np.minimum(p, np.floor(down_credit[active])).astype(np.int64)
            kk = max(1, min(int(k_down.max()), p))
            part = (
                np.argpartition(key, kk - 1, axis=1)[:, :kk]
                if kk < p
                else np.tile(np.arange(p), (active.size, 1))
            )
            pk = np.take_along_axis(key, part, axis=1)
            order = np.argsort(pk, axis=1)
            part = np.take_along_axis(part, order, axis=1)
            pk = np.take_along_axis(pk, order, axis=1)
            take = (np.arange(kk)[None, :] < k_down[:, None]) & np.isfinite(pk)
            req_node = np.repeat(active, kk).reshape(active.size, kk)[take]
            req_piece = part[take]
            # requests in random order: whoever asks first must not be the same node
            # every time (the first asker of a piece is its bringer)
            shuffle = rng.permutation(req_node.size)
            req_node, req_piece = req_node[shuffle], req_piece[shuffle]
            # --- who uploads each
            up_credit = np.minimum(up_credit + up_rate, np.maximum(1.0, up_rate))
            cap = np.floor(up_credit).astype(np.int64)
            if choice == "ring":
                req_up = _ring_assign(
                    req_piece, hcount, holders, cap, uploaded, downloaded, origin, rng
                )
            else:
                req_up = _random_assign(req_piece, hcount, holders, cap, origin, rng)
            ok = req_up >= 0
            req_node, req_piece, req_up = req_node[ok], req_piece[ok], req_up[ok]
            # --- the transfers of the slot
            have[req_node, req_piece] = True
            np.add.at(downloaded, req_node, 1)
            np.subtract.at(down_credit, req_node, 1.0)
            np.subtract.at(up_credit, req_up, 1.0)
            peer_up = req_up[req_up != origin]
            np.add.at(uploaded, peer_up, 1)
            origin_pieces += int((req_up == origin).sum())
            _add_holders(req_piece, req_node, holders, hcount, copies)
        end_s = (t + 1) * slot_s
        finished = (~np.isfinite(done_at)) & (downloaded >= p)
        done_at[finished] = end_s
        fair = (~np.isfinite(fair_at)) & np.isfinite(done_at) & (uploaded >= downloaded)
        fair_at[fair] = end_s
        run.completed_per_slot.append(int(np.isfinite(done_at).sum()))
        run.slots = t + 1
    run.origin_pieces = origin_pieces
    return run


def _random_assign(
    req_piece: npt.NDArray[np.int64],
    hcount: npt.NDArray[np.int64],
    holders: npt.NDArray[np.int64],
    cap: npt.NDArray[np.int64],
    origin: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    # a random holder, the origin counted as one more holder of every piece
    h = hcount[req_piece]
    pick = np.floor(rng.random(req_piece.size) * (h + 1)).astype(np.int64)
    up = np.where(pick >= h, origin, holders[req_piece, np.minimum(pick, np.maximum(h - 1, 0))])
    return _within_capacity(up, cap, rng)


def _within_capacity(
    up: npt.NDArray[np.int64], cap: npt.NDArray[np.int64], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    # each uploader serves a random subset of its requests, up to its capacity
    if up.size == 0:
        return up
    order = rng.permutation(up.size)
    shuffled = up[order]
    srt = np.argsort(shuffled, kind="stable")
    grouped = shuffled[srt]
    starts = np.r_[0, np.flatnonzero(np.diff(grouped)) + 1]
    rank = np.arange(grouped.size) - np.repeat(starts, np.diff(np.r_[starts, grouped.size]))
    keep_sorted = rank < cap[grouped]
    keep = np.empty(up.size, dtype=bool)
    keep[order[srt]] = keep_sorted
    return np.where(keep, up, -1)


def _ring_assign(
    req_piece: npt.NDArray[np.int64],
    hcount: npt.NDArray[np.int64],
    holders: npt.NDArray[np.int64],
    cap: npt.NDArray[np.int64],
    uploaded: npt.NDArray[np.int64],
    downloaded: npt.NDArray[np.int64],
    origin: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    out = np.full(req_piece.size, -1, dtype=np.int64)
    left = cap.copy()
    owes = downloaded > uploaded
    pieces = np.unique(req_piece)
    rng.shuffle(pieces)
    # the rarest pieces claim their holders' upload first
    pieces = pieces[np.argsort(hcount[pieces], kind="stable")]
    # 1. pieces nobody holds: one asker each brings it in from the origin
    for piece in pieces[hcount[pieces] == 0]:
        if left[origin] <= 0:
            break
        out[np.flatnonzero(req_piece == piece)[0]] = origin
        left[origin] -= 1
    # 2. the holders' upload: owing first, then the most upload left (least loaded),
    # ties at random; round by round, one request per holder per round
    for piece in pieces[hcount[pieces] > 0]:
        idx = np.flatnonzero(req_piece == piece)
        hs = holders[piece, : hcount[piece]]
        hs = hs[left[hs] > 0]
        if hs.size == 0:
            continue
        tie = rng.random(hs.size)
        hs = hs[np.lexsort((tie, -left[hs], ~owes[hs]))]
        reps = np.minimum(left[hs], math.ceil(idx.size / hs.size))
        slots_h = np.repeat(hs, reps)
        slots_j = np.arange(slots_h.size) - np.repeat(np.cumsum(reps) - reps, reps)
        pos = np.repeat(np.arange(hs.size), reps)
        chosen = slots_h[np.lexsort((pos, slots_j))[: idx.size]]
        out[idx[: chosen.size]] = chosen
        np.subtract.at(left, chosen, 1)
    # 3. what the holders cannot take this slot: the origin, rarest pieces first (the
    # owed-piece fetch), while it has upload left
    if left[origin] > 0:
        waiting = np.flatnonzero(out < 0)
        waiting = waiting[np.argsort(hcount[req_piece[waiting]], kind="stable")]
        # not a second copy of a piece it brings in this very slot
        take = waiting[hcount[req_piece[waiting]] > 0][: int(left[origin])]
        out[take] = origin
        left[origin] -= take.size
    return out


def _add_holders(
    req_piece: npt.NDArray[np.int64],
    req_node: npt.NDArray[np.int64],
    holders: npt.NDArray[np.int64],
    hcount: npt.NDArray[np.int64],
    copies: npt.NDArray[np.int64],
) -> None:
    if req_piece.size == 0:
        return
    srt = np.argsort(req_piece, kind="stable")
    ps, ns = req_piece[srt], req_node[srt]
    starts = np.r_[0, np.flatnonzero(np.diff(ps)) + 1]
    lens = np.diff(np.r_[starts, ps.size])
    rank = np.arange(ps.size) - np.repeat(starts, lens)
    holders[ps, hcount[ps] + rank] = ns
    np.add.at(hcount, ps[starts], lens)
    np.add.at(copies, ps[starts], lens)


@dataclass(slots=True)
class SwarmComparison:
    scenario: SwarmScenario
    seed: int
    bound_s: float
    runs: list[SwarmRun]

    def rows(self) -> list[dict[str, float | str]]:
        unicast = self.scenario.subscribers * self.scenario.file_bytes
        out: list[dict[str, float | str]] = []
        for r in self.runs:
            fair = r.fair_at_s[np.isfinite(r.fair_at_s)]
            # a subscriber leaves by the ratio rule when it gets there, else when nobody
            # needs it any more (the last one finished: the not_needed rule)
            leave = np.minimum(r.fair_at_s, r.last_done_s)
            out.append(
                {
                    "choice": r.choice,
                    "last_done_s": round(r.last_done_s, 1),
                    "vs_bound": round(r.last_done_s / self.bound_s, 3),
                    "median_done_s": round(float(np.median(r.done_at_s)), 1),
                    "origin_share_of_unicast": round(
                        r.origin_pieces * self.scenario.piece_bytes / unicast, 6
                    ),
                    "origin_copies": round(r.origin_pieces / self.scenario.num_pieces, 2),
                    "ratio_by_end": round(fair.size / self.scenario.subscribers, 4),
                    "leave_median_s": round(float(np.median(leave)), 1),
                    "leave_p90_s": round(float(np.percentile(leave, 90)), 1),
                }
            )
        return out


def compare(
    sc: SwarmScenario,
    choices: tuple[str, ...] = CHOICES,
    *,
    seed: int = 1,
    slots_per_piece: int = 1,
    progress: bool = False,
) -> SwarmComparison:
    """Run each choice on the same scenario and seed."""
    rng = np.random.default_rng(seed)
    up, down = _classes(sc, rng)
    bound = fluid_bound_s(sc, up, float(down.min()))
    runs = []
    for c in choices:
        if progress:
            print(f"pressrun sim swarm: {sc.name}, uploader choice {c}", flush=True)
        runs.append(run_swarm(sc, c, seed=seed, slots_per_piece=slots_per_piece))
    return SwarmComparison(sc, seed, bound, runs)


def format_comparison(cmp: SwarmComparison) -> str:
    sc = cmp.scenario
    lines = [
        f"{sc.name}: {sc.subscribers} subscribers, {sc.file_bytes / 1e6:.1f} MB in "
        f"{sc.num_pieces} pieces, origin {sc.origin_upload_mbps:g} Mbit/s, seed {cmp.seed}",
        f"fluid bound max(F/u_s, F/d_min, N*F/(u_s + sum u_i)) = {cmp.bound_s:.1f} s",
        f"{'choice':<8}{'last done':>11}{'x bound':>9}{'median':>9}{'origin/unicast':>16}"
        f"{'origin copies':>15}{'ratio>=1':>10}{'leave p50':>11}{'leave p90':>11}",
    ]
    for row in cmp.rows():
        lines.append(
            f"{row['choice']:<8}{row['last_done_s']:>10.1f}s{row['vs_bound']:>9.3f}"
            f"{row['median_done_s']:>8.1f}s{row['origin_share_of_unicast']:>16.4%}"
            f"{row['origin_copies']:>15.2f}{row['ratio_by_end']:>10.2%}"
            f"{row['leave_median_s']:>10.1f}s{row['leave_p90_s']:>10.1f}s"
        )
    lines.append(
        "ratio>=1: share that uploaded as much as it downloaded before the last finished; "
        "leave: then, or when nobody needs it any more (the last finished: not_needed)"
    )
    return "\n".join(lines)


def plot_comparison(cmp: SwarmComparison, path: Path) -> Path:
    """Completed subscribers over time per choice, the bound marked, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    n = cmp.scenario.subscribers
    for r in cmp.runs:
        ts = [(i + 1) * r.slot_s for i in range(len(r.completed_per_slot))]
        ax.step(
            ts,
            [c / n for c in r.completed_per_slot],
            where="post",
            label=f"{r.choice} (last {r.last_done_s:.0f} s)",
        )
    ax.axvline(cmp.bound_s, color="k", linestyle="--", label=f"fluid bound {cmp.bound_s:.0f} s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share of subscribers done")
    ax.set_title(f"{cmp.scenario.name}: uploader choices")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
