"""`pressrun sim swarm`: a flash crowd on one issue, three ways of choosing uploaders.

A block-level model in synchronous steps (numpy, so 50,000 subscribers run in a minute
or two per choice). A piece is cut into ``blocks_per_piece`` blocks; one step is the
time the slowest subscriber takes to upload one block. In a step every node uploads at
most its upload rate in blocks and downloads at most its download rate (rates as credit
that builds up, so 2.5 blocks a step is 2 or 3), the origin at most u_s. As in
BitTorrent, a piece is passed on only once it is complete (a peer announces a piece
after checking its hash), but its blocks come from any holders in parallel, and a
subscriber keeps requests out for several pieces at once: the pieces it has started
(most advanced first, as libtorrent finishes partial pieces first) and new ones, as
many as its download rate takes in a step plus ``EXTRA_PIECES`` (request pipelining:
an uploader with capacity left and a requester that wants one of its pieces is never
idle for want of a request).

Each step, for each piece, the requests of that piece are served from its holders'
upload left in the step, in the order each uploader choice gives:

- ``ring``: the Chord ring's choice (`pressrun.chord.pieces.PieceDirectory`): the
  supernode of the piece gives the requests to holders that still owe upload
  (downloaded more than uploaded) first, those that can pay it back soonest (what they
  owe over their upload rate) first, then to the least loaded (most upload left this
  step), ties at random; the rarest pieces claim their holders' upload first. Of the
  askers of a piece it serves first those whose upload went most unused by their last
  report (``REPORT_S``; a newcomer's is all unused): a piece there turns idle upload
  into upload, where a piece to a busy uploader adds none; then the most advanced.
  Subscribers ask for the pieces rarest as they see them (libtorrent's own order,
  which the `chord` policy leaves alone outside the pieces it must bring in). Beyond
  the requests, a holder's upload left goes in the same order, then to those whose
  own download rate leaves them the furthest from done (the most behind first, so
  everyone finishes together). All of this in up to three passes over the pieces
  (`_Swarm._passes`): first the critical askers (their own download rate would finish
  them no sooner than the swarm's upload finishes everyone), last those that will
  leave by the ratio rule the moment they finish and are ahead of the median asker
  (their last piece takes their upload away), the rest in between;
- ``random``: holders in random order, pieces in random order, and each subscriber
  asks for random pieces;
- ``rarest``: BitTorrent's rarest-first: each subscriber asks for the pieces with the
  fewest copies among its ``NEIGHBOURS`` connected peers (a binomial sample of the
  swarm's copies, in its normal approximation) first; holders and pieces in random
  order (as ``random``).

The origin is the same for all three: what the subscribers cannot serve each other in
a step it serves while it has upload left, pieces with the fewest copies first and the
most advanced requests of each first (super-seeding-like: distinct pieces out before
second copies, each brought in whole by few subscribers).

Measured per choice: each subscriber's completion time, the last one against the lower
bound of `swarm_scenario.fluid_bound_s`; the origin's bytes as a share of unicast (N*F);
when each subscriber may leave fairly (uploaded at least what it downloaded; everyone
keeps seeding until the last finishes). F is the file rounded up to whole pieces.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pressrun.sim.swarm_leave import BUSY_SHARE, LEAVE_RULES, departures
from pressrun.sim.swarm_scenario import SwarmScenario, draw_subscribers, fluid_bound_s

CHOICES = ("ring", "random", "rarest")
#: peers a subscriber is connected to, whose pieces it sees (libtorrent's default
#: connections_limit per torrent is of this order)
NEIGHBOURS = 50
#: pieces a subscriber requests beyond what its download rate takes in one step
EXTRA_PIECES = 2
#: blocks per piece by default: 64 KiB blocks of a 1 MiB piece (BitTorrent's requests
#: are 16 KiB; four of them pipelined to one uploader make one of these)
DEFAULT_BLOCKS_PER_PIECE = 16
#: how often a subscriber reports to the ring (the peer's ring client runs a round every
#: 2 s): a supernode knows a subscriber's unused upload as of its last report
REPORT_S = 2.0
#: the client's window for "a seed in use" (`pressrun.peer.status.UNUSED_WINDOW_S`)
BUSY_WINDOW_S = 2.0

Ints = npt.NDArray[np.int64]


@dataclass(slots=True)
class SwarmRun:
    """One choice's run."""

    choice: str
    step_s: float
    done_at_s: npt.NDArray[np.float64]  # per subscriber (inf: unfinished)
    fair_at_s: npt.NDArray[np.float64]  # per subscriber, first time uploaded >= downloaded
    origin_blocks: int
    blocks_per_piece: int
    steps: int
    wall_s: float = 0.0
    completed_per_step: list[int] = field(default_factory=list)
    #: share of the subscribers' upload credit used, per step
    upload_use_per_step: list[float] = field(default_factory=list)
    #: each subscriber's class (index into the scenario's classes)
    klass: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: per step, each class's upload credit and the blocks it uploaded
    class_upload_credit: list[Ints] = field(default_factory=list)
    class_uploaded: list[Ints] = field(default_factory=list)
    #: when subscribers leave (`swarm_leave`): the rule, each one's departure (inf:
    #: stayed to the end), how many left by each fair rule, and the steps a subscriber
    #: allowed to leave stayed as the last holder of a needed piece
    leave: str = "never"
    left_at_s: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    left_by_ratio: int = 0
    left_by_not_needed: int = 0
    held_steps: int = 0

    @property
    def last_done_s(self) -> float:
        return float(self.done_at_s.max())

    @property
    def origin_pieces(self) -> float:
        return self.origin_blocks / self.blocks_per_piece


def run_swarm(
    sc: SwarmScenario,
    choice: str,
    *,
    seed: int = 1,
    blocks_per_piece: int = DEFAULT_BLOCKS_PER_PIECE,
    max_steps: int | None = None,
    leave: str = "never",
) -> SwarmRun:
    """Simulate ``sc`` with one uploader choice (module docstring) and a leave rule
    (`swarm_leave`)."""
    if choice not in CHOICES:
        raise ValueError(f"unknown uploader choice {choice!r}; choose from {', '.join(CHOICES)}")
    if leave not in LEAVE_RULES:
        raise ValueError(f"unknown leave rule {leave!r}; choose from {', '.join(LEAVE_RULES)}")
    if not 1 <= blocks_per_piece <= 255:
        raise ValueError("blocks_per_piece must be between 1 and 255")
    started = time.perf_counter()
    swarm = _Swarm(sc, choice, seed, blocks_per_piece, leave)
    if max_steps is None:
        max_steps = int(20 * swarm.bound_s / swarm.run.step_s) + 1000
    for t in range(max_steps):
        if not swarm.step(t):
            break
    swarm.run.wall_s = time.perf_counter() - started
    return swarm.run


class _Swarm:
    """The state of one run; `step` moves it on by one step."""

    def __init__(
        self, sc: SwarmScenario, choice: str, seed: int, b: int, leave: str = "never"
    ) -> None:
        self.choice = choice
        self.rng = rng = np.random.default_rng(seed)
        self.n, self.p, self.b = n, p, _ = sc.subscribers, sc.num_pieces, b
        subs = draw_subscribers(sc, rng)
        self.bound_s = fluid_bound_s(sc, subs)
        block_bits = sc.piece_bytes * 8 / b
        step_s = block_bits / float(subs.upload_bps.min())
        self.origin = n  # the origin's index in the upload arrays
        self.up_rate = np.append(subs.upload_bps, sc.origin_upload_mbps * 1e6) * step_s / block_bits
        self.down_rate = subs.download_bps * step_s / block_bits
        # credit builds up by the rate each step; unused credit is not hoarded beyond one
        # block or one step's worth
        self.up_cap = np.maximum(1.0, self.up_rate)
        self.down_cap = np.maximum(1.0, self.down_rate)
        self.up_credit = np.zeros(n + 1)
        self.down_credit = np.zeros(n)
        # a subscriber takes part from the first step that starts at or after its arrival
        self.arrive_step = np.ceil(subs.arrive_s / step_s).astype(np.int64)
        self.progress = np.zeros((n, p), dtype=np.uint8)  # blocks held of each piece
        self.have_t = np.zeros((p, n), dtype=bool)  # complete pieces, piece-major
        self.copies = np.zeros(p, dtype=np.int64)
        self.pieces_had = np.zeros(n, dtype=np.int64)
        self.uploaded = np.zeros(n, dtype=np.int64)  # blocks
        self.downloaded = np.zeros(n, dtype=np.int64)
        self.run = SwarmRun(choice, step_s, np.full(n, np.inf), np.full(n, np.inf), 0, b, 0)
        self.run.klass = self.klass = subs.klass
        self.run.leave = self.leave = leave
        self.run.left_at_s = np.full(n, np.inf)
        self.gone = np.zeros(n, dtype=bool)  # left the swarm
        # each subscriber's upload lately, blocks a step, averaged over about
        # BUSY_WINDOW_S (the client's two seconds): a seed in use stays (`swarm_leave`)
        self.use_decay = float(np.exp(-step_s / BUSY_WINDOW_S))
        self.recent_up = np.zeros(n)
        self.classes = len(sc.classes)
        # Random keys for the subscribers' piece order: drawing n*p normals every step
        # cost more than the rest of the step, so they come from a pool drawn once per
        # run and read at a random offset each step.
        size = max(1 << 20, 4 * n * p)
        # a started piece's key is minus its blocks held (before any other); held: inf
        self.started_key = np.full(256, np.inf, dtype=np.float32)
        self.started_key[1:b] = -np.arange(1, b, dtype=np.float32)
        self.pool_u = rng.random(size, dtype=np.float32)
        if choice != "random":
            self.pool_u *= 0.5  # (a tie-break under one copy)
        self.pool_z = rng.standard_normal(size, dtype=np.float32)
        # The ring's view of each subscriber's upload: the blocks a step it left unused,
        # as of its last report (every REPORT_S, each at its own phase); a newcomer
        # holds nothing yet, so all of its upload is unused.
        self.report_steps = max(1, round(REPORT_S / step_s))
        self.report_phase = np.arange(n) % self.report_steps
        self.unused_reported = self.up_rate[:n].copy()
        self.unused_since = np.zeros(n)
        self.steps_since = np.zeros(n, dtype=np.int64)

    def _pool(self, pool: npt.NDArray[np.float32], shape: tuple[int, int]) -> Any:
        count = shape[0] * shape[1]
        at = int(self.rng.integers(0, pool.size - count + 1))
        return pool[at : at + count].reshape(shape)

    def step(self, t: int) -> bool:
        """One step; False once everyone has finished."""
        n, p, b, rng, run = self.n, self.p, self.b, self.rng, self.run
        done_at = run.done_at_s
        arrived = self.arrive_step <= t
        active = np.flatnonzero(arrived & ~np.isfinite(done_at))
        present = arrived & ~self.gone
        if active.size == 0 and np.isfinite(done_at).all():
            return False
        up_credit, down_credit = self.up_credit, self.down_credit
        up_credit[:n] = np.where(
            present, np.minimum(up_credit[:n] + self.up_rate[:n], self.up_cap[:n]), 0
        )
        o = self.origin
        up_credit[o] = min(up_credit[o] + self.up_rate[o], self.up_cap[o])
        left = np.floor(up_credit).astype(np.int64)
        down_credit[active] = np.minimum(
            down_credit[active] + self.down_rate[active], self.down_cap[active]
        )
        dleft = np.zeros(n, dtype=np.int64)
        dleft[active] = np.floor(down_credit[active]).astype(np.int64)

        req_node, req_piece = self._requests(active, dleft)
        order = self._holder_order(left[:n])
        # each request's pass over the pieces (`_passes`: the ring's critical askers
        # first, those that would leave at once when done and are ahead last)
        tier = self._passes(active, present)
        passes = int(tier.max()) + 1
        piece_rank = self._piece_order()
        by_rank = np.argsort(piece_rank)  # rank -> piece
        slot = piece_rank[req_piece] + p * tier[req_node]
        # requests by pass and piece (in the choice's piece order), then in the choice's
        # asker order, the most advanced first, ties at random: the order in which the
        # holders' upload serves them
        progress = self.progress
        srt = np.argsort(
            (slot << 48)
            | (self._request_priority(req_node) << 40)
            | ((255 - progress[req_node, req_piece].astype(np.int64)) << 32)
            | rng.integers(0, 1 << 32, req_node.size)
        )
        req_node, req_piece, slot = req_node[srt], req_piece[srt], slot[srt]
        bounds = np.searchsorted(slot, np.arange(passes * p + 1))
        have_o = self.have_t[:, order]
        left_o = left[order]
        askers = self._asker_order(active)
        prog_a = progress[askers].T.copy()  # piece-major, as at the start of the step
        open_a = dleft[askers] > 0
        # beyond the requests, a pass's upload goes to the askers of that pass and before
        at_a = np.empty(n, dtype=np.int64)
        at_a[askers] = np.arange(askers.size)
        in_pass = [open_a & (tier[askers] <= g) for g in range(passes)]
        for r in range(passes * p):
            d = req_node[bounds[r] : bounds[r + 1]]
            may = in_pass[r // p]
            if d.size == 0 and not may.any():
                continue
            k = int(by_rank[r % p])
            hpos = np.flatnonzero(have_o[k] & (left_o > 0))
            if hpos.size == 0:
                continue
            if d.size:
                hpos = self._serve(k, d, order, hpos, left_o, dleft)
                for m in in_pass:
                    m[at_a[d]] &= dleft[d] > 0
                if hpos.size == 0:
                    continue
            # pipelining: anyone else still able to take blocks that lacks the piece
            # (those that have started it first, the most advanced first); an uploader
            # with capacity left is not idle while someone wants one of its pieces
            cand = np.flatnonzero(may & (prog_a[k] < b))
            if cand.size == 0:
                continue
            begun = prog_a[k, cand] > 0
            first = cand[begun]
            first = first[np.argsort(-prog_a[k, first].astype(np.int64), kind="stable")]
            cand = np.concatenate((first, cand[~begun]))[: int(left_o[hpos].sum())]
            more = askers[cand]
            self._serve(k, more, order, hpos, left_o, dleft)
            for m in in_pass:
                m[cand] &= dleft[more] > 0
        used_up = left[:n] - left_o[np.argsort(order)]
        up_credit[:n] -= used_up
        self.recent_up = self.use_decay * self.recent_up + (1 - self.use_decay) * used_up
        if self.choice == "ring":
            self._report(t, present, left[:n] - used_up)
        run.upload_use_per_step.append(float(used_up.sum() / max(1, int(left[:n].sum()))))
        run.class_upload_credit.append(np.bincount(self.klass, left[:n], self.classes))
        run.class_uploaded.append(np.bincount(self.klass, used_up, self.classes))
        if left[o] > 0 and req_node.size:
            used = self._origin(req_node, req_piece, int(left[o]), dleft)
            up_credit[o] -= used
            run.origin_blocks += used
        down_credit[active] -= np.floor(down_credit[active]) - dleft[active]
        # pieces completed in the step become available from the next
        fp, fn = np.nonzero((progress >= b).T & ~self.have_t & ~self.gone)
        self.have_t[fp, fn] = True
        self.copies += np.bincount(fp, minlength=p)
        self.pieces_had += np.bincount(fn, minlength=n)
        end_s = (t + 1) * run.step_s
        finished = ~np.isfinite(done_at) & (self.pieces_had >= p)
        done_at[finished] = end_s
        fair_at = run.fair_at_s
        fair = ~np.isfinite(fair_at) & np.isfinite(done_at) & (self.uploaded >= self.downloaded)
        fair_at[fair] = end_s
        run.completed_per_step.append(int(np.isfinite(done_at).sum()))
        run.steps = t + 1
        if self.leave != "never":
            self._leave(present, end_s)
        return True

    def _leave(self, present: npt.NDArray[np.bool_], end_s: float) -> None:
        """Subscribers that leave at the end of the step (`swarm_leave`): they upload
        no more and their pieces no longer count."""
        run, done = self.run, np.isfinite(self.run.done_at_s)
        dep = departures(
            self.leave,
            seeds=present & done,
            leechers=present & ~done,
            uploaded=self.uploaded,
            downloaded=self.downloaded,
            have_t=self.have_t,
            rng=self.rng,
            busy=self.recent_up >= BUSY_SHARE * self.up_rate[: self.origin],
        )
        run.held_steps += dep.held.size
        go = dep.leaving
        if go.size == 0:
            return
        self.copies -= self.have_t[:, go].sum(axis=1)
        self.have_t[:, go] = False
        self.gone[go] = True
        run.left_at_s[go] = end_s
        run.left_by_ratio += dep.by_ratio.size
        run.left_by_not_needed += dep.by_not_needed.size

    def _serve(self, k: int, d: Ints, order: Ints, hpos: Ints, left_o: Ints, dleft: Ints) -> Ints:
        """Blocks of piece ``k`` to ``d`` (in order) from the holders at ``hpos`` of
        ``order`` (in order); the holders with upload left after it."""
        served = _fill(left_o[hpos], np.minimum(self.b - self.progress[d, k], dleft[d]))
        if served is None:
            return hpos
        used, got = served
        left_o[hpos] -= used
        self.uploaded[order[hpos]] += used
        self._receive(d, k, got, dleft)
        return hpos[left_o[hpos] > 0]

    def _receive(self, d: Ints, k: int, got: Ints, dleft: Ints) -> None:
        # (each subscriber is at most once in d: no repeated indices)
        dleft[d] -= got
        self.progress[d, k] += got.astype(np.uint8)
        self.downloaded[d] += got

    def _origin(self, req_node: Ints, req_piece: Ints, o_left: int, dleft: Ints) -> int:
        """What the holders could not serve, from the origin: fewest copies first, and of
        those the pieces it has started first (each brought in whole before the next),
        the most advanced requests first. Blocks it sent."""
        p, progress = self.p, self.progress
        by_piece = np.argsort(req_piece, kind="stable")  # keeps the order within a piece
        pb = np.searchsorted(req_piece[by_piece], np.arange(p + 1))
        begun = np.zeros(p, dtype=np.int64)
        np.maximum.at(begun, req_piece, progress[req_node, req_piece].astype(np.int64))
        sent = 0
        for k in np.lexsort((self.rng.random(p), -begun, self.copies)):
            lo, hi = pb[k], pb[k + 1]
            if lo == hi:
                continue
            d = req_node[by_piece[lo:hi]]
            served = _fill(np.array([o_left - sent]), np.minimum(self.b - progress[d, k], dleft[d]))
            if served is None:
                continue
            sent += int(served[0][0])
            self._receive(d, int(k), served[1], dleft)
            if sent == o_left:
                break
        return sent

    def _requests(self, active: Ints, dleft: Ints) -> tuple[Ints, Ints]:
        """(subscriber, piece) of every request out this step."""
        if active.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        n, p, b = self.n, self.p, self.b
        prog = self.progress[active]
        noise = self._pool(self.pool_u, prog.shape)
        if self.choice == "random":
            key = noise
        else:
            # rarest first as a peer sees it: copies among its NEIGHBOURS connected peers
            # (a binomial sample of the swarm, in its normal approximation), ties at random
            q = np.minimum(1.0, self.copies / n).astype(np.float32)
            mean, sd = NEIGHBOURS * q, np.sqrt(NEIGHBOURS * q * (1 - q))
            key = self._pool(self.pool_z, prog.shape) * sd[None, :]
            key += mean[None, :]
            np.maximum(key, 0.0, out=key)
            key += noise  # (the pool is uniform on [0, 0.5) for these choices)
        # started pieces first, the most advanced first; pieces held never
        order_key = np.where(prog == 0, key, self.started_key[prog])
        m = np.minimum(p, -(-dleft[active] // b) + EXTRA_PIECES)
        kk = int(m.max())
        part = (
            np.argpartition(order_key, kk - 1, axis=1)[:, :kk]
            if kk < p
            else np.tile(np.arange(p), (active.size, 1))
        )
        pk = np.take_along_axis(order_key, part, axis=1)
        take = (np.arange(kk)[None, :] < m[:, None]) & np.isfinite(pk)
        req_node = np.repeat(active, kk).reshape(active.size, kk)[take]
        return req_node, part[take].astype(np.int64)

    def _holder_order(self, left: Ints) -> Ints:
        """The order in which holders' upload is given out this step (subscribers)."""
        if self.choice != "ring":
            return self.rng.permutation(left.size).astype(np.int64)
        # owing first, those that can pay it back soonest first (what they owe over
        # what they can upload), then the least loaded (most upload left), ties at random
        owed = self.downloaded - self.uploaded
        payback = np.where(owed > 0, owed / self.up_rate[: self.n], np.inf)
        return np.lexsort((self.rng.random(left.size), -left, payback))

    def _asker_order(self, active: Ints) -> Ints:
        """The order in which subscribers beyond a piece's requests get its holders'
        upload."""
        if self.choice != "ring":
            return self.rng.permutation(active)
        # the supernodes serve first whoever left the most upload unused (a piece there
        # adds upload to the swarm), then the most behind (what it misses over its own
        # download rate), so that everyone finishes together
        total = self.p * self.b
        finish_steps = (total - self.downloaded[active]) / self.down_rate[active]
        return active[
            np.lexsort((self.rng.random(active.size), -finish_steps, -self.unused_reported[active]))
        ]

    def _passes(self, active: Ints, present: npt.NDArray[np.bool_]) -> Ints:
        """Each subscriber's pass over the pieces (0 first): the ring serves the requests
        of the askers in pass 0 from every piece's holders before those of pass 1, and
        so on; the other choices make one pass. Numbered without gaps.

        From what the supernodes know of each asker (its reports: bytes downloaded and
        uploaded, its rates, the upload it left unused; the pieces it holds) and of the
        swarm (every present subscriber's upload rate and missing pieces):

        0. *critical*: its own download rate, at full use, would finish it no sooner
           than the swarm's upload would finish everyone (its missing blocks over its
           download rate against all the missing blocks over all the upload present and
           the origin's): every block it does not get delays the end;
        1. the rest, except
        2. *leaving when done, and ahead*: it will have uploaded the file's size by the
           time it finishes at its download rate (what it uploaded so far, plus its
           upload rate less the unused upload it last reported, over that time), so it
           leaves by the ratio rule with its last piece and its upload with it; and it
           has downloaded at least the median asker's bytes. Holding it back keeps its
           upload in the swarm until the others catch up, not beyond.
        """
        passes = np.zeros(self.n, dtype=np.int64)
        if self.choice != "ring" or active.size == 0:
            return passes
        n, total = self.n, self.p * self.b
        got = self.downloaded[active]
        missing = total - got
        finish = missing / self.down_rate[active]  # steps at its own download rate
        swarm = missing.sum() / (self.up_rate[:n][present].sum() + self.up_rate[n])
        used = np.maximum(0.0, self.up_rate[active] - self.unused_reported[active])
        leaves = self.uploaded[active] + used * finish >= total
        ahead = got >= np.median(got)
        tier = np.where(finish >= swarm, 0, np.where(leaves & ahead, 2, 1))
        passes[active] = np.unique(tier, return_inverse=True)[1]
        return passes

    def _report(self, t: int, arrived: npt.NDArray[np.bool_], unused: Ints) -> None:
        """Each subscriber's report to the ring: its upload left unused per step, on
        average since its last report."""
        self.unused_since += unused
        self.steps_since += arrived
        due = arrived & ((t - self.report_phase) % self.report_steps == 0)
        self.unused_reported[due] = self.unused_since[due] / self.steps_since[due]
        self.unused_since[due] = 0.0
        self.steps_since[due] = 0

    def _request_priority(self, req_node: Ints) -> Ints:
        """Each request's rank within its piece, 0 to 255 (lower first): the ring serves
        the askers whose upload went most unused first; the other choices make no
        difference."""
        if self.choice != "ring":
            return np.zeros(req_node.size, dtype=np.int64)
        top = float(self.up_rate[: self.n].max())
        unused = np.minimum(self.unused_reported[req_node] / top, 1.0)
        prio: Ints = (255 - np.floor(unused * 255)).astype(np.int64)
        return prio

    def _piece_order(self) -> Ints:
        """Each piece's rank: lower ranks claim their holders' upload first."""
        if self.choice == "ring":
            order = np.lexsort((self.rng.random(self.p), self.copies))  # rarest first
        else:
            order = self.rng.permutation(self.p)
        rank = np.empty(self.p, dtype=np.int64)
        rank[order] = np.arange(self.p)
        return rank


def _fill(cap: Ints, want: Ints) -> tuple[Ints, Ints] | None:
    """Serve ``want`` (in order) from ``cap`` (in order), each filled before the next:
    (used of each cap, got of each want), or None when nothing moves."""
    total = min(int(cap.sum()), int(want.sum()))
    if total <= 0:
        return None
    cc = np.cumsum(cap)
    used = np.clip(total - (cc - cap), 0, cap)
    ww = np.cumsum(want)
    got = np.clip(total - (ww - want), 0, want)
    return used, got
