"""Seeds for the next readers (issue 28): the floor of seeds `not_needed` never spares.

flash-crowd-50-desktops at f1ea13d: the first wave's three seeds each left by
not_needed on their own next counts (no leecher between the waves: every seed was
spare), 10 s before the second wave, which then took 130 MB from the web seeds. As the
programs run the peer (`profile_config`), the rule keeps `SEED_FLOOR` (2) seeds; the
ratio rule, the seeding bound and metered links still end them."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field, replace

import pytest

from pressrun.peer.config import (
    SEED_FLOOR,
    PeerConfig,
    desktop_profile,
    mobile_profile,
    profile_config,
)
from pressrun.peer.core import PeerCore, not_needed, not_needed_share
from pressrun.peer.events import (
    AskSwarmCounts,
    Effect,
    Leave,
    LeaveRule,
    PeerPhase,
    Progress,
    SwarmCounts,
)

MB = 1_000_000
#: the first wave of flash-crowd-50-desktops (f1ea13d): (arrival, copy verified) in
#: seconds; the second wave's first reader arrives at 35 s
FIRST_WAVE = ((0.0, 21.3), (7.5, 16.5), (15.0, 23.7))
SECOND_WAVE_S = 35.0


def done(up: int = 5 * MB) -> Progress:
    """A finished copy of 50 MB that uploaded ``up`` (under the ratio)."""
    return Progress(50 * MB, 50 * MB, 50, 50, up, 50 * MB, 2, 0, 0)


@dataclass
class Reader:
    core: PeerCore
    arrive_s: float
    verified_s: float
    left: list[tuple[float, LeaveRule]] = field(default_factory=list)


def run_wave(
    config: PeerConfig, wave: tuple[tuple[float, float], ...], until_s: float, seed: int
) -> list[Reader]:
    """The readers of ``wave`` against a tracker that counts them at once (a leaving
    seed's ``stopped`` reaches it before the next scrape): each asks for counts when its
    core says so, every 0.1 s step, one reader after the other."""
    readers = [
        Reader(PeerCore(config, now=a, rng=random.Random(seed * 100 + i)), a, v)
        for i, (a, v) in enumerate(wave)
    ]

    def counts(now: float) -> SwarmCounts:
        here = [r for r in readers if r.arrive_s <= now and r.core.phase is not PeerPhase.LEFT]
        seeds = sum(r.core.phase is PeerPhase.SEEDING for r in here)
        return SwarmCounts(seeds=seeds, leechers=len(here) - seeds)

    def apply(r: Reader, effects: list[Effect], now: float) -> None:
        for e in effects:
            if isinstance(e, Leave):
                r.left.append((now, e.rule))
            elif isinstance(e, AskSwarmCounts) and r.core.phase is PeerPhase.SEEDING:
                apply(r, r.core.handle_swarm_counts(counts(now), now=now), now)

    for step in range(round(until_s * 10) + 1):
        now = step / 10
        for r in readers:
            if now < r.arrive_s or r.core.phase is PeerPhase.LEFT:
                continue
            if r.core.phase is PeerPhase.DOWNLOADING and now >= r.verified_s:
                r.core.handle_progress(done(), now=now)
                r.core.handle_download_finished(now=now)
                apply(r, r.core.handle_verified(now=now), now)
            else:
                apply(r, r.core.handle_progress(done(), now=now), now)
                apply(r, r.core.handle_timer(now=now), now)
    return readers


@pytest.mark.parametrize("seed", range(12))
def test_the_first_wave_keeps_seeds_for_the_next_readers(seed: int) -> None:
    # as flash-crowd-50-desktops runs `pressrun get` (--max-seed-s 60)
    config = profile_config("desktop", max_seed_time_s=60.0)
    readers = run_wave(config, FIRST_WAVE, SECOND_WAVE_S - 0.1, seed)
    seeding = [r for r in readers if r.core.phase is PeerPhase.SEEDING]
    assert len(seeding) >= SEED_FLOOR  # (3 in one run of 12: every draw stayed)
    assert {rule for r in readers for _, rule in r.left} <= {LeaveRule.NOT_NEEDED}
    # the rule before (a closed swarm's, `desktop_profile`): every seed was spare, and
    # at most one stayed (only while the fall of its counts, (2, 1) to (1, 0), settles)
    before = run_wave(replace(config, not_needed_min_seeds=0), FIRST_WAVE, 34.9, seed)
    assert sum(r.core.phase is PeerPhase.SEEDING for r in before) <= 1
    # the seeding bound still ends the floor's seeds
    readers = run_wave(config, FIRST_WAVE, 90.0, seed)
    for r in readers:
        ((at, rule),) = r.left
        if rule is LeaveRule.MAX_SEED_TIME:
            assert at == pytest.approx(r.verified_s + 60.0, abs=0.11)
    rules = [rule for r in readers for _, rule in r.left]
    assert rules.count(LeaveRule.MAX_SEED_TIME) >= SEED_FLOOR
    assert rules.count(LeaveRule.NOT_NEEDED) <= len(FIRST_WAVE) - SEED_FLOOR


def test_the_floor_binds_only_once_nobody_downloads() -> None:
    # 2.0 seeds per leecher: one leecher keeps two seeds anyway
    for seeds in range(0, 41):
        for leechers in range(1, 21):
            counts = SwarmCounts(seeds, leechers)
            assert not_needed(counts, 2.0, SEED_FLOOR) is not_needed(counts, 2.0)
            assert not_needed_share(counts, 2.0, SEED_FLOOR) == not_needed_share(counts, 2.0)
        idle = SwarmCounts(seeds, 0)
        assert not_needed(idle, 2.0)  # before: nobody downloads, nobody is needed
        assert not_needed(idle, 2.0, SEED_FLOOR) is (seeds > SEED_FLOOR)
        share = not_needed_share(idle, 2.0, SEED_FLOOR)
        assert share == (pytest.approx((seeds - SEED_FLOOR) / seeds) if seeds > 2 else 0.0)
    assert not not_needed(SwarmCounts(10, 0), 0.0, SEED_FLOOR)  # 0 still turns it off


def test_seeds_reading_one_set_of_counts_spare_the_floor_on_average() -> None:
    # every seed reads (n, 0) at once and draws alone: on average n - 2 go; with 2 or
    # fewer, none ever does
    rng = random.Random(7)
    config = profile_config("desktop")
    for n in (1, 2, 3, 6, 12):
        left = []
        for _ in range(300):
            cores = [PeerCore(config, now=0.0, rng=random.Random(rng.random())) for _ in range(n)]
            gone = 0
            for core in cores:
                core.handle_progress(done(), now=1.0)
                core.handle_download_finished(now=1.0)
                core.handle_verified(now=2.0)
                gone += bool(
                    [e for e in core.handle_swarm_counts(SwarmCounts(n, 0), now=2.5)
                     if isinstance(e, Leave)]
                )  # fmt: skip
            left.append(gone)
        if n <= SEED_FLOOR:
            assert max(left) == 0
        else:
            assert statistics.mean(left) == pytest.approx(n - SEED_FLOOR, abs=0.3)


def seed_core(config: PeerConfig) -> PeerCore:
    core = PeerCore(config, now=0.0, rng=random.Random(1))
    core.handle_progress(done(), now=1.0)
    core.handle_download_finished(now=1.0)
    core.handle_verified(now=2.0)
    return core


def test_the_floor_seeds_still_leave_by_ratio_the_bound_and_metered() -> None:
    lone = SwarmCounts(seeds=1, leechers=0)
    # ratio: a floor seed that paid the swarm back goes (the paper's rule)
    core = seed_core(profile_config("desktop"))
    assert not [e for e in core.handle_swarm_counts(lone, now=3.0) if isinstance(e, Leave)]
    (leave,) = [e for e in core.handle_progress(done(up=50 * MB), now=4.0) if isinstance(e, Leave)]
    assert leave.rule is LeaveRule.RATIO
    # the seeding bound: a mobile seed kept by the floor leaves at its 300 s
    mobile = seed_core(profile_config("mobile"))
    assert mobile.config.max_seed_time_s == 300.0
    assert not mobile.handle_swarm_counts(SwarmCounts(seeds=2, leechers=0), now=3.0)[1:]
    assert mobile.phase is PeerPhase.SEEDING
    (leave,) = [e for e in mobile.handle_timer(now=302.0) if isinstance(e, Leave)]
    assert leave.rule is LeaveRule.MAX_SEED_TIME
    # metered: never seeds, even as the only copy in the swarm
    metered = PeerCore(profile_config("mobile", metered=True), now=0.0)
    metered.handle_progress(done(), now=1.0)
    metered.handle_download_finished(now=1.0)
    (leave,) = [e for e in metered.handle_verified(now=2.0) if isinstance(e, Leave)]
    assert leave.rule is LeaveRule.METERED


def test_the_programs_keep_the_floor_the_bare_profiles_do_not() -> None:
    assert SEED_FLOOR == 2
    assert profile_config("desktop").not_needed_min_seeds == SEED_FLOOR
    assert profile_config("mobile").not_needed_min_seeds == SEED_FLOOR
    assert profile_config("desktop", not_needed_min_seeds=0).not_needed_min_seeds == 0
    # a closed swarm (benches, loopback tests): nobody comes after its peers
    assert desktop_profile().not_needed_min_seeds == 0
    assert mobile_profile().not_needed_min_seeds == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="not_needed_min_seeds"):
            desktop_profile(not_needed_min_seeds=bad)
