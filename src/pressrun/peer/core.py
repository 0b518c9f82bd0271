"""The peer's decisions, pure: the fair-exit rule, the stall detector, web-seed use.

Policy (docs/swarm.md):

- **Fair exit** (004_3e4b985b4cf14853.txt, III.A: "once a node has uploaded as much
  content as it has downloaded, it can leave the network"): a finished, verified peer
  seeds until ``uploaded >= share_ratio x downloaded`` (`LeaveRule.RATIO`). In a closed
  swarm not everyone can get there (total upload = total download minus what the
  origins sent, so the mean ratio is 1 minus the origins' share), hence two escape
  hatches: the tracker's counts say nobody needs this seed any more
  (`LeaveRule.NOT_NEEDED`: the other seeds number at least
  ``not_needed_seeds_per_leecher`` (2.0) per leecher and at least
  ``not_needed_min_seeds``; with 1.0 and no floor that would be the tracker's own
  ``needs_seeds`` false), or it has seeded for ``max_seed_time_s``
  (`LeaveRule.MAX_SEED_TIME`). A peer that does not seed (mobile on a metered link)
  leaves as soon as its copy is verified (`LeaveRule.METERED`, unless the ratio already
  holds). `fair_to_leave` is the rule; the rules are tried in that order, so the
  reported rule is the most honourable one that holds.
- **Not all at once**: every seed reads the same counts, so on one set of counts only
  the seeds the rule can spare may go: each leaves by ``not_needed`` with probability
  (spare seeds) / seeds (`not_needed_share`), drawn once per set of counts. Before,
  every seed left on the same counts: the swarm lost its seeds together and the
  tracker, seeing too few seeds left, refused the last ones' claim
  (``claim_refused``, tests/peer/test_swarm.py, 20 peers).
- **Seeds for the next readers**: the readers of an issue arrive over its first hour
  in waves; between two waves the counts show no leecher, and with nobody
  downloading every seed is spare (share 1), so each seed left on its own next
  counts, one after the other, and the next wave found no seed and took the issue
  from the origins (flash-crowd-50-desktops at f1ea13d: the first wave's three seeds
  all gone 10 s before the second wave, 130 MB from the web seeds; docs/swarm.md).
  ``not_needed_min_seeds`` (`SEED_FLOOR`, 2, as the programs run: `profile_config`)
  is a floor the rule never spares: a seed leaves by ``not_needed`` only if at least
  that many others stay, so seeds leaving one set of counts after another stop at
  the floor. With 2.0 per leecher it binds only once nobody downloads (one leecher
  keeps two seeds anyway). The floor's seeds still leave by ``ratio`` (they paid the
  swarm back), ``max_seed_time`` (the bound the user accepted: 30 min desktop, 5 min
  mobile) or the user; a metered peer never seeds. A closed swarm (a bench, a
  loopback test) keeps 0: nobody comes after its peers.
- **A seed in use is needed**: the counts say how many seeds a swarm has per
  leecher, not whether the leechers can use them: a leecher takes as many seeds at
  once as its downlink is faster than their uplinks. A seed whose payload upload over
  the last two seconds is at least ``not_needed_busy_share`` (0.5) of its capacity
  (`Progress.upload_bps`, `Progress.upload_capacity_bps`) does not leave by
  ``not_needed`` while it is; once its upload falls, the counts' rule holds again.
  Measured on the loopback bench (N = 20, every peer left by ``not_needed``; docs/
  swarm.md): the last leechers lost most of their seeds within a second of the first
  copies, at rates their links could take, and the tail lasted 4.6 s.
- **A sudden fall is not "nobody"**: counts whose seeds + leechers fell under half of
  the last counts' while they turned from "needed" to "not needed", or that count no
  seed while this peer seeds (the tracker does not know it), are suspect:
  ``not_needed`` is not used until ``not_needed_settle_s`` after the last suspect
  counts, and then only on the counts of that moment. A tracker that lost its peers
  (its clock stepped, a restart, a failover) answers 0 / 0 until they announce again;
  before, every seed read "nobody needs me" and left within seconds (issue 24:
  (3, 7) to (0, 0), all three seeds gone). Ratio and the seeding bound are untouched.
- **The last holder stays**: the fair rules say a peer *may* leave, not that it must.
  A seed that is the only holder, among its connected peers, of a piece some connected
  peer still downloads (`Progress.sole_pieces`), with no other seed in the swarm (the
  tracker's fresh counts; a seed holds every piece), stays until that piece has a
  second holder; the maximum seeding time and the user still end it. Measured on the
  loopback bench (docs/chord.md): the last holder of a piece leaving by the ratio rule
  sent every peer that lacked it back to the origins at once, and the completions came
  in waves.
- **Stall detector**: while downloading, no growth of the payload received or of the
  verified bytes for
  ``stall_after_s`` emits `Stalled` once (again only after progress resumes); the
  client then fetches the missing pieces from origins.
- **Web seeds** (FIELD-NOTES.md, libtorrent): the origins are BEP 19 web seeds so the
  swarm always has a source. Once a downloading peer holds its share of the pieces
  (pieces / swarm size x ``web_seed_share_factor``, the swarm size being the larger of
  the tracker's seeds + leechers and the connected peers + 1) and has a peer to trade
  with, it drops the web seeds (`DropWebSeeds`) so the origins send about one copy in
  all; a guard puts them back (`RestoreWebSeeds`) at once when no connected peer holds
  a piece it lacks for ``web_seed_starved_s`` (starved: only the origins can help), or
  after ``web_seed_stall_s``
  without progress, and keeps them for ``web_seed_hold_s``. A web seed that libtorrent disabled
  (one non-2xx answer disables it for the session) is put back after
  ``web_seed_retry_s``.

Phases: DOWNLOADING -> (libtorrent says finished) VERIFYING -> (manifest check passed)
SEEDING -> (a rule, or the user) LEFT. Timers (status polls, tracker counts, stall,
guards, resume saves, the seeding bound) all go through `next_deadline()` /
`handle_timer(now=)`. No clock, no I/O: every entry point takes ``now``.
"""

from __future__ import annotations

import math
import random

from pressrun.peer.config import PeerConfig
from pressrun.peer.events import (
    AskSwarmCounts,
    DropWebSeeds,
    Effect,
    Leave,
    LeaveRule,
    PeerPhase,
    PollStatus,
    Progress,
    RestoreWebSeeds,
    SaveResumeData,
    Stalled,
    SwarmCounts,
)


class LocalProtocolError(Exception):
    """The caller used the core out of order (e.g. verified before finishing)."""


def share_ratio(uploaded_bytes: int, downloaded_bytes: int) -> float | None:
    """uploaded / downloaded, or None when nothing was downloaded."""
    if downloaded_bytes <= 0:
        return None
    return uploaded_bytes / downloaded_bytes


def seeds_kept(counts: SwarmCounts, seeds_per_leecher: float, min_seeds: int = 0) -> float:
    """The seeds `not_needed` keeps on these counts: ``seeds_per_leecher`` per leecher,
    and never fewer than ``min_seeds`` (module docstring, "Seeds for the next readers")."""
    return max(seeds_per_leecher * counts.leechers, min_seeds)


def not_needed(counts: SwarmCounts, seeds_per_leecher: float, min_seeds: int = 0) -> bool:
    """True if the tracker's counts say a (counted) seed is no longer needed.

    The other seeds (``seeds - 1``: this peer is one of them) number at least
    ``seeds_per_leecher`` per leecher and at least ``min_seeds``; with no floor, no
    leechers at all is enough. ``seeds_per_leecher`` 0 disables the rule. With 1.0 and
    no floor this is the tracker's ``needs_seeds`` false (docs/tracker.md).
    """
    if seeds_per_leecher <= 0:
        return False
    if counts.leechers <= 0 and min_seeds <= 0:
        return True
    return counts.seeds - 1 >= seeds_kept(counts, seeds_per_leecher, min_seeds)


def not_needed_share(counts: SwarmCounts, seeds_per_leecher: float, min_seeds: int = 0) -> float:
    """The share of the seeds that may leave on these counts: the seeds the rule can
    spare (as many as leave `seeds_kept` behind) over the seeds; 1 with no leechers and
    no floor, 0 where `not_needed` is false (module docstring)."""
    if not not_needed(counts, seeds_per_leecher, min_seeds):
        return 0.0
    if counts.leechers <= 0 and min_seeds <= 0:
        return 1.0
    spare = math.floor(counts.seeds - seeds_kept(counts, seeds_per_leecher, min_seeds))
    return min(1.0, spare / counts.seeds)


def fair_to_leave(
    config: PeerConfig,
    *,
    uploaded_bytes: int,
    downloaded_bytes: int,
    counts: SwarmCounts | None,
    seeding_for_s: float,
    draw: float = 0.0,
    busy: bool = False,
) -> LeaveRule | None:
    """The rule that lets a finished peer leave now, or None if it must keep seeding.

    Tried in order: ratio (004's fairness), not needed (the tracker's fresh counts,
    when ``draw``, uniform in [0, 1) once per set of counts, is under
    `not_needed_share`, and the seed is not ``busy``: its upload in use, `seed_in_use`),
    the maximum seeding time, and for a peer that never seeds, metered. A peer told to
    seed until stopped never leaves by a rule.
    """
    if config.seed_until_stopped and config.seeds:
        return None
    basis = max(downloaded_bytes, config.ratio_basis_bytes)
    if uploaded_bytes >= config.share_ratio * basis:
        return LeaveRule.RATIO
    if (
        counts is not None
        and not busy
        and draw
        < not_needed_share(counts, config.not_needed_seeds_per_leecher, config.not_needed_min_seeds)
    ):
        return LeaveRule.NOT_NEEDED
    if config.max_seed_time_s is not None and seeding_for_s >= config.max_seed_time_s:
        return LeaveRule.MAX_SEED_TIME
    if not config.seeds:
        return LeaveRule.METERED
    return None


def seed_in_use(config: PeerConfig, progress: Progress) -> bool:
    """True if the seed's payload upload lately is at least ``not_needed_busy_share``
    of its capacity (module docstring, "A seed in use is needed"); False while either
    is unknown or the check is off."""
    share = config.not_needed_busy_share
    capacity = progress.upload_capacity_bps
    if share <= 0 or capacity <= 0:
        return False
    return progress.upload_bps >= share * capacity


class PeerCore:
    """One peer's fairness, stall and web-seed decisions for one issue."""

    def __init__(
        self,
        config: PeerConfig,
        *,
        now: float,
        fetches_owed: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        """``fetches_owed``: the adapter fetches the pieces this peer owes itself
        (`UploaderPolicy.fetches_owed_pieces`); the peer starts without the web
        seeds, and owing pieces keeps it from being starved instead of calling them.
        ``rng``: the draw of each set of counts (module docstring, "Not all at once")."""
        self.config = config
        self._rng = rng or random.Random()
        self._draw = 0.0
        self.fetches_owed = fetches_owed
        self.phase = PeerPhase.DOWNLOADING
        self.progress: Progress | None = None
        self.counts: SwarmCounts | None = None
        self._counts_at = -math.inf
        self._counts_suspect_at = -math.inf  # the last counts that fell suddenly
        self._last_done = -1
        self._last_down = -1
        self._last_pieces = 0
        self.last_progress_at = now
        self._stall_reported = False
        self.web_seeds_on = not fetches_owed
        self._last_web = 0
        self._web_hold_until = now
        self._web_retry_at: float | None = None
        self._starved_since: float | None = None
        self._next_status_at = now
        self._next_counts_at = now + config.counts_interval_s
        self._resume_dirty = False
        self._last_resume_save = now
        self.seeding_since: float | None = None
        self.left: Leave | None = None
        self.stalls = 0
        self.web_seed_drops = 0
        self.web_seed_restores = 0

    # --- inputs -------------------------------------------------------------

    def handle_progress(self, progress: Progress, *, now: float) -> list[Effect]:
        """A status snapshot; may drop the web seeds or (seeding) let the peer go."""
        if self.phase is PeerPhase.LEFT:
            return []
        self.progress = progress
        # Progress is payload arriving (partial pieces count: a slow web seed fills a
        # piece for seconds before it completes) or a piece completing.
        if (
            progress.done_bytes > self._last_done
            or progress.downloaded_bytes > self._last_down
            or progress.web_seed_bytes > self._last_web
        ):
            self._last_done = max(self._last_done, progress.done_bytes)
            self._last_down = max(self._last_down, progress.downloaded_bytes)
            self._last_web = max(self._last_web, progress.web_seed_bytes)
            self.last_progress_at = now
            self._stall_reported = False
        if progress.pieces_have > self._last_pieces:
            self._last_pieces = progress.pieces_have
            self._resume_dirty = True
        effects: list[Effect] = []
        if self.phase is PeerPhase.DOWNLOADING:
            if self._may_drop_web_seeds(progress, now):
                self.web_seeds_on = False
                self.web_seed_drops += 1
                effects.append(DropWebSeeds())
            elif not self.web_seeds_on and self._starved(progress):
                # starved for a while, not just between two have-messages
                if self._starved_since is None:
                    self._starved_since = now
                if now - self._starved_since >= self.config.web_seed_starved_s:
                    effects.append(self._restore_web_seeds(now))
            if not self._starved(progress):
                self._starved_since = None
        effects += self._check_leave(now)
        return effects

    def handle_swarm_counts(self, counts: SwarmCounts, *, now: float) -> list[Effect]:
        """The tracker's seeds/leechers for this swarm."""
        if self.phase is PeerPhase.LEFT:
            return []
        if self._suspect(counts):
            self._counts_suspect_at = now
        self.counts = counts
        self._counts_at = now
        self._draw = self._rng.random()
        return self._check_leave(now)

    def handle_web_seed_failed(self, *, now: float) -> list[Effect]:
        """libtorrent disabled a web seed (a non-2xx answer or an error): retry later."""
        if self._web_retry_at is None and self.phase is PeerPhase.DOWNLOADING:
            self._web_retry_at = now + self.config.web_seed_retry_s
        return []

    def handle_download_finished(self, *, now: float) -> list[Effect]:
        """libtorrent holds every piece (each checked against the torrent's SHA-1)."""
        if self.phase is not PeerPhase.DOWNLOADING:
            return []
        self.phase = PeerPhase.VERIFYING
        return [SaveResumeData()]

    def handle_verified(self, *, now: float) -> list[Effect]:
        """Our manifest's SHA-256 of every piece and of the whole file matched: seed."""
        if self.phase is not PeerPhase.VERIFYING:
            raise LocalProtocolError(f"verified while {self.phase.value}")
        self.phase = PeerPhase.SEEDING
        self.seeding_since = now
        self._next_counts_at = now + self.config.counts_interval_s
        # Fresh counts only: ones asked for before this peer was a seed may be stale.
        return [AskSwarmCounts(), *self._check_leave(now)]

    def handle_user_stop(self, *, now: float) -> list[Effect]:
        """The user (or the program) stops the peer."""
        if self.phase is PeerPhase.LEFT:
            return []
        return [self._leave(LeaveRule.USER)]

    # --- timers -------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `handle_timer` must next run; None once the peer has left."""
        if self.phase is PeerPhase.LEFT:
            return None
        cfg = self.config
        deadlines = [self._next_status_at, self._next_counts_at]
        if self.phase is PeerPhase.DOWNLOADING:
            if not self._stall_reported:
                deadlines.append(self.last_progress_at + cfg.stall_after_s)
            if not self.web_seeds_on:
                deadlines.append(self.last_progress_at + self._stall_guard_s())
            if self._web_retry_at is not None:
                deadlines.append(self._web_retry_at)
        if self._resume_dirty:
            deadlines.append(self._last_resume_save + cfg.resume_save_interval_s)
        if self.phase is PeerPhase.SEEDING and cfg.max_seed_time_s is not None:
            assert self.seeding_since is not None
            deadlines.append(self.seeding_since + cfg.max_seed_time_s)
        return min(deadlines)

    def handle_timer(self, *, now: float) -> list[Effect]:
        """Run every timer that is due."""
        if self.phase is PeerPhase.LEFT:
            return []
        cfg = self.config
        effects: list[Effect] = []
        if now >= self._next_status_at:
            self._next_status_at = max(self._next_status_at + cfg.status_interval_s, now)
            effects.append(PollStatus())
        if now >= self._next_counts_at:
            self._next_counts_at = max(self._next_counts_at + cfg.counts_interval_s, now)
            effects.append(AskSwarmCounts())
        if self.phase is PeerPhase.DOWNLOADING:
            idle_s = now - self.last_progress_at
            if not self._stall_reported and idle_s >= cfg.stall_after_s:
                self._stall_reported = True
                self.stalls += 1
                effects.append(Stalled(idle_s, self._last_pieces))
            restore = not self.web_seeds_on and idle_s >= self._stall_guard_s()
            retry = self._web_retry_at is not None and now >= self._web_retry_at
            if retry:
                self._web_retry_at = None
            if restore:
                effects.append(self._restore_web_seeds(now))
            elif retry and self.web_seeds_on:
                effects.append(RestoreWebSeeds())
        if self._resume_dirty and now >= self._last_resume_save + cfg.resume_save_interval_s:
            self._resume_dirty = False
            self._last_resume_save = now
            effects.append(SaveResumeData())
        effects += self._check_leave(now)
        return effects

    # --- internals ----------------------------------------------------------

    def _swarm_size(self, progress: Progress) -> int:
        counted = self.counts.seeds + self.counts.leechers if self.counts else 0
        return max(counted, progress.connected_peers + 1, 1)

    def _may_drop_web_seeds(self, progress: Progress, now: float) -> bool:
        cfg = self.config
        if not (cfg.drop_web_seeds and self.web_seeds_on and now >= self._web_hold_until):
            return False
        if self.fetches_owed:  # the web seeds were only for a starved moment
            return not self._starved(progress)
        if progress.connected_peers <= 0 or progress.pieces_total <= 0:
            return False
        if progress.tradable_pieces == 0:
            return False  # nothing to trade: the origins are the only source now
        if progress.owed_pieces > 0:
            return False  # pieces the policy gave this peer that only the origins hold
        fraction = min(1.0, cfg.web_seed_share_factor / self._swarm_size(progress))
        # Bytes from the web seeds, not pieces held: pieces from peers are not this
        # peer's contribution of origin data to the swarm.
        return progress.web_seed_bytes >= progress.wanted_bytes * fraction

    def _stall_guard_s(self) -> float:
        cfg = self.config
        if self.progress is not None and self.progress.coming_pieces > 0:
            return cfg.web_seed_ring_stall_s  # other peers bring them (the ring said)
        return cfg.web_seed_stall_s

    def _restore_web_seeds(self, now: float) -> RestoreWebSeeds:
        self._starved_since = None
        self.web_seeds_on = True
        self.web_seed_restores += 1
        # (back while waiting on the ring's other peers: they stay as long as the guard
        # waited, not dropped at the next poll because the ring still says "coming")
        ring = self.progress is not None and self.progress.coming_pieces > 0
        hold = self.config.web_seed_ring_stall_s if ring else self.config.web_seed_hold_s
        self._web_hold_until = now + hold
        return RestoreWebSeeds()

    def _starved(self, progress: Progress) -> bool:
        if progress.done_bytes >= progress.wanted_bytes:
            return False
        if self.fetches_owed:  # owed pieces are on their way from the origins
            return progress.tradable_pieces == 0 and progress.owed_pieces == 0
        return progress.tradable_pieces == 0 or progress.owed_pieces > 0

    def _suspect(self, counts: SwarmCounts) -> bool:
        """Counts that fell suddenly, or that do not count this seed (module doc)."""
        if self.phase is PeerPhase.SEEDING and counts.seeds <= 0:
            return True
        before = self.counts
        if before is None:
            return False
        # a fall from counts that said "needed" to counts that say "not needed"; a
        # swarm whose spare seeds leave (the rule held before) is not one
        spl, floor = self.config.not_needed_seeds_per_leecher, self.config.not_needed_min_seeds
        turned = not not_needed(before, spl, floor) and not_needed(counts, spl, floor)
        fell = 2 * (counts.seeds + counts.leechers) < before.seeds + before.leechers
        return turned and fell

    def _check_leave(self, now: float) -> list[Effect]:
        if self.phase is not PeerPhase.SEEDING or self.progress is None:
            return []
        assert self.seeding_since is not None
        fresh = self.counts if self._counts_at >= self.seeding_since else None
        if now - self._counts_suspect_at < self.config.not_needed_settle_s:
            fresh = None  # a sudden fall: not a reason to leave yet
        rule = fair_to_leave(
            self.config,
            uploaded_bytes=self.progress.uploaded_bytes,
            downloaded_bytes=self.progress.downloaded_bytes,
            counts=fresh,
            seeding_for_s=now - self.seeding_since,
            draw=self._draw,
            busy=seed_in_use(self.config, self.progress),
        )
        if rule is not None and rule.fair and self._last_holder(fresh):
            # the last holder of a piece others still need: may leave, not yet (the
            # seeding bound still holds)
            bound = self.config.max_seed_time_s
            if bound is None or now - self.seeding_since < bound:
                return []
            rule = LeaveRule.MAX_SEED_TIME
        return [] if rule is None else [self._leave(rule)]

    def _last_holder(self, counts: SwarmCounts | None) -> bool:
        # Pieces no connected peer holds while one of them downloads, and no other seed
        # in the swarm (a seed holds every piece; libtorrent closes seed-to-seed
        # connections, so the bitfields alone would hold every seed back). Counts not
        # fresh yet: assume none.
        assert self.progress is not None
        if self.progress.sole_pieces <= 0:
            return False
        return counts is None or counts.seeds <= 1

    def _leave(self, rule: LeaveRule) -> Leave:
        self.phase = PeerPhase.LEFT
        p = self.progress
        ratio = share_ratio(p.uploaded_bytes, p.downloaded_bytes) if p else None
        self.left = Leave(rule, ratio)
        return self.left
