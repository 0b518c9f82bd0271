"""The peer's configuration and its two profiles (desktop, mobile), with documented defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

#: the seeds the programs' ``not_needed`` never spares (`profile_config`): what the rule
#: keeps for one leecher (``not_needed_seeds_per_leecher`` 2.0), kept for the next reader
SEED_FLOOR = 2


class ProfileName(Enum):
    """The client profiles of ARCHITECTURE.md."""

    DESKTOP = "desktop"
    MOBILE = "mobile"


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """How one peer downloads, seeds and leaves (docs/swarm.md).

    profile: desktop or mobile (see `desktop_profile` / `mobile_profile`).
    share_ratio: the fair-exit rule of 004 (III.A): after finishing, seed until
        uploaded >= share_ratio x downloaded. 1.0 is the paper's "as much as it has
        downloaded".
    not_needed_seeds_per_leecher: the "nobody needs me any more" rule: a finished peer
        may leave when the tracker counts no leechers, or when the other seeds
        (seeds - 1) number at least this many per leecher. 1.0 would match the
        tracker's ``needs_seeds`` (``leechers > 0 and seeds <= leechers``); 2.0 keeps
        seeds a little longer for the last leechers (at N = 20 on the loopback bench
        1.45x the fluid bound in 3 of 3 runs against 1.49-1.81x with 1.0,
        docs/swarm.md). 0 disables the rule.
    not_needed_min_seeds: the seeds ``not_needed`` never spares: a seed leaves by it only
        if at least this many others stay (the counts' seeds - 1), whatever the
        leechers. 0 here and in the bare profiles, for a closed swarm (a bench, a
        loopback test: nobody comes after its peers, and a floor would keep its last
        seeds for the whole seeding bound); `profile_config`, which the programs run
        (`pressrun get`, `pressrun seed`, the prefetch), sets `SEED_FLOOR` (2): the
        readers of an issue arrive over its first hour in waves, and a swarm whose
        seeds all left in a lull sends the next wave to the origins (docs/swarm.md,
        "Seeds for the next readers"). With 2.0 seeds per leecher a floor of 2 only
        binds once nobody downloads. ``ratio``, ``max_seed_time`` and ``metered``
        are untouched, so the floor's seeds still leave by them.
    not_needed_busy_share: a seed whose payload upload over the last two seconds is at
        least this share of its upload capacity (its limit, else the fastest it
        uploaded) is in use: whatever the counts say, it does not leave by
        ``not_needed`` while it is (the seeds per leecher a swarm can use depend on
        its links: a leecher's downlink takes as many seeds as it is faster than
        their uplinks). Default 0.5; 0 turns the check off. ``ratio`` and
        ``max_seed_time`` are untouched.
    not_needed_settle_s: counts that fell suddenly (their seeds + leechers under half of
        the last counts' as they turned from "needed" to "not needed", or no seed at all
        while this peer seeds: the tracker does not count it) do not let a seed leave
        by ``not_needed`` until this long after the fall, and only if the counts then
        still say so. A tracker that lost its peers (a step of its clock, a restart,
        a failover) answers 0 seeds / 0 leechers until they announce again, within one
        announce interval (30 s); every seed would read "nobody needs me" at once
        (issue 24). Default 60 s, two intervals.
    max_seed_time_s: a finished peer leaves after seeding this long, whatever its ratio
        (None: no bound).
    seed_after_download: False for a peer that never seeds (mobile on a metered link):
        it leaves as soon as its copy is verified, by the ratio rule if it already
        holds, else by `metered`.
    metered: the link is metered (mobile data): implies seed_after_download=False.
    upload_limit_bps / download_limit_bps: libtorrent's session rate limits in bytes/s
        (0: unlimited); they apply to loopback and LAN peers too (the peer moves every
        address into libtorrent's global peer class).
    stall_after_s: no download progress for this long reports `Stalled` (the client
        falls back to origin sections, keeping the pieces it has).
    status_interval_s: how often the torrent's status is polled (progress, ratio).
    counts_interval_s: how often a seeding peer asks the tracker for its counts (scrape).
    drop_web_seeds: remove the origins' web seeds once this peer holds its share of
        the pieces (pieces / swarm size x web_seed_share_factor), so the origins send
        about one copy in all and the peers the rest (FIELD-NOTES.md, libtorrent).
    web_seed_share_factor: how many shares a peer takes from the web seeds first. 2.0:
        measured on the loopback bench (docs/swarm.md), 1.0 starves the swarm of
        pieces (origin idle, 2.6x the bound at N = 10), 3.0 sends more copies.
    web_seed_stall_s: with web seeds dropped, no progress for this long puts them back
        (the stall guard); they stay back for web_seed_hold_s before another drop.
    web_seed_hold_s: see web_seed_stall_s.
    web_seed_ring_stall_s: the stall guard while the Chord ring has said the pieces
        this peer lacks are coming from other peers (the first seconds of a flash
        crowd, while a few bringers fetch the first pieces: web seeds back for every
        waiting peer would share the origins' egress among all of them).
    web_seed_starved_s: with web seeds dropped, no connected peer holding a piece this
        peer lacks for this long puts them back (at once would react to the moment
        between a piece finishing somewhere and its HAVE message arriving).
    web_seed_retry_s: a web seed that libtorrent disabled (one non-2xx answer disables
        it for the session) is put back after this delay.
    resume_save_interval_s: at most one resume-data save per interval while pieces
        arrive (and one at exit).
    seed_until_stopped: no rule lets the peer go; it seeds until stopped
        (`LeaveRule.USER`): `pressrun seed --until-stopped`, the desktop seeding in the
        background.
    ratio_basis_bytes: the ratio rule counts at least this many bytes as downloaded.
        `pressrun seed` sets the file's size, so a copy that came from the origins is
        paid back to the swarm (otherwise 0 downloaded would let it leave at once).
    stun_server: the STUN server (``host:port``) libtorrent's WebRTC peers (browser
        readers, through the tracker's WebSocket) learn their public address from;
        empty: none (LAN, loopback, tests). ``--stun`` / ``PRESSRUN_STUN``.
    """

    profile: ProfileName = ProfileName.DESKTOP
    share_ratio: float = 1.0
    not_needed_seeds_per_leecher: float = 2.0
    not_needed_min_seeds: int = 0
    not_needed_busy_share: float = 0.5
    not_needed_settle_s: float = 60.0
    max_seed_time_s: float | None = 1800.0
    seed_after_download: bool = True
    metered: bool = False
    upload_limit_bps: int = 0
    download_limit_bps: int = 0
    stall_after_s: float = 20.0
    status_interval_s: float = 0.5
    counts_interval_s: float = 2.0
    drop_web_seeds: bool = True
    web_seed_share_factor: float = 2.0
    web_seed_stall_s: float = 2.0
    web_seed_ring_stall_s: float = 6.0
    web_seed_hold_s: float = 1.0
    web_seed_starved_s: float = 1.0
    web_seed_retry_s: float = 1.0
    resume_save_interval_s: float = 2.0
    seed_until_stopped: bool = False
    ratio_basis_bytes: int = 0
    stun_server: str = ""

    def __post_init__(self) -> None:
        if not (self.share_ratio >= 0 and math.isfinite(self.share_ratio)):
            raise ValueError("share_ratio must be a finite number >= 0")
        if not (self.not_needed_seeds_per_leecher >= 0):
            raise ValueError("not_needed_seeds_per_leecher must be >= 0")
        if isinstance(self.not_needed_min_seeds, bool) or not (
            isinstance(self.not_needed_min_seeds, int) and self.not_needed_min_seeds >= 0
        ):
            raise ValueError("not_needed_min_seeds must be a whole number >= 0")
        if not (0 <= self.not_needed_busy_share <= 1):
            raise ValueError("not_needed_busy_share must be between 0 and 1")
        if not (self.not_needed_settle_s >= 0):
            raise ValueError("not_needed_settle_s must be >= 0")
        if self.max_seed_time_s is not None and not self.max_seed_time_s >= 0:
            raise ValueError("max_seed_time_s must be >= 0 (or None)")
        if self.upload_limit_bps < 0 or self.download_limit_bps < 0:
            raise ValueError("rate limits must be >= 0 (0: unlimited)")
        for name in (
            "stall_after_s",
            "status_interval_s",
            "counts_interval_s",
            "web_seed_stall_s",
            "web_seed_ring_stall_s",
            "web_seed_retry_s",
            "resume_save_interval_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.web_seed_hold_s < 0 or not self.web_seed_share_factor > 0:
            raise ValueError("web_seed_hold_s must be >= 0 and web_seed_share_factor > 0")

    @property
    def seeds(self) -> bool:
        """True if this peer seeds after downloading at all."""
        return self.seed_after_download and not self.metered


def desktop_profile(**overrides: object) -> PeerConfig:
    """Desktop: no rate limits by default, seeds to ratio 1.0, at most 30 minutes,
    or until nobody needs it; `pressrun seed` keeps seeding in the background."""
    return replace(PeerConfig(profile=ProfileName.DESKTOP), **overrides)  # type: ignore[arg-type]


def mobile_profile(*, metered: bool = False, **overrides: object) -> PeerConfig:
    """Mobile: uploads capped at 256 KiB/s, seeds only to meet the ratio (or until
    nobody needs it), at most 5 minutes; on a metered link never seeds."""
    base = PeerConfig(
        profile=ProfileName.MOBILE,
        metered=metered,
        upload_limit_bps=256 * 1024,
        max_seed_time_s=300.0,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def profile_config(name: str, *, metered: bool = False, **overrides: object) -> PeerConfig:
    """The config of a profile by name (`desktop` or `mobile`) as the programs run it
    (`pressrun get`, `pressrun seed`, the prefetch): the profile, with `SEED_FLOOR`
    seeds that ``not_needed`` never spares (`PeerConfig.not_needed_min_seeds`; the bare
    profiles keep none, for closed swarms)."""
    profile = ProfileName(name)
    overrides = {"not_needed_min_seeds": SEED_FLOOR, **overrides}
    if profile is ProfileName.MOBILE:
        return mobile_profile(metered=metered, **overrides)
    return desktop_profile(metered=metered, **overrides)
