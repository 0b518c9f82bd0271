"""The peer core with a stepped clock: fair exit, stall detector, web-seed use; the
uploader-policy registry. Hypothesis for the exit rule's invariants."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.peer.config import PeerConfig, desktop_profile, mobile_profile, profile_config
from pressrun.peer.core import (
    LocalProtocolError,
    PeerCore,
    fair_to_leave,
    not_needed,
    not_needed_share,
)
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
from pressrun.peer.uploader import (
    LibtorrentPicker,
    PiecePlan,
    SwarmView,
    UploaderPolicy,
    make_uploader_policy,
    register_uploader_policy,
    uploader_policy_names,
)

MB = 1_000_000


def progress(
    *,
    done: int = 0,
    up: int = 0,
    down: int = 0,
    pieces: int = 0,
    total: int = 100,
    peers: int = 3,
    web: int = 0,
    tradable: int | None = 10,
) -> Progress:
    return Progress(done, total * MB, pieces, total, up, down, peers, web, tradable)


def of(effects: list[Effect], kind: type) -> list[Effect]:
    return [e for e in effects if isinstance(e, kind)]


def seeding_core(
    config: PeerConfig, *, down: int = 100 * MB, up: int = 0, rng: random.Random | None = None
) -> PeerCore:
    core = PeerCore(config, now=0.0, rng=rng)
    core.handle_progress(progress(done=100 * MB, down=down, up=up, pieces=100), now=1.0)
    core.handle_download_finished(now=1.0)
    core.handle_verified(now=2.0)
    return core


# --- the rule itself ----------------------------------------------------------


def test_ratio_rule_is_the_papers_fairness() -> None:
    cfg = desktop_profile()
    kw = {"counts": None, "seeding_for_s": 0.0}
    assert fair_to_leave(cfg, uploaded_bytes=99, downloaded_bytes=100, **kw) is None  # type: ignore[arg-type]
    assert fair_to_leave(cfg, uploaded_bytes=100, downloaded_bytes=100, **kw) is LeaveRule.RATIO  # type: ignore[arg-type]
    half = desktop_profile(share_ratio=0.5)
    assert fair_to_leave(half, uploaded_bytes=50, downloaded_bytes=100, **kw) is LeaveRule.RATIO  # type: ignore[arg-type]


def test_not_needed_matches_the_trackers_needs_seeds() -> None:
    # tracker: needs_seeds = leechers > 0 and seeds <= leechers
    for seeds in range(6):
        for leechers in range(6):
            needs = leechers > 0 and seeds <= leechers
            assert not_needed(SwarmCounts(seeds, leechers), 1.0) is (not needs)
    assert not not_needed(SwarmCounts(10, 0), 0.0)  # 0 disables the rule


def test_seeds_on_the_same_counts_do_not_all_leave() -> None:
    # 15 seeds, 5 leechers, 2 seeds a leecher: the rule can spare 5 of the 15
    counts = SwarmCounts(seeds=15, leechers=5)
    assert not_needed_share(counts, 2.0) == pytest.approx(5 / 15)
    assert not_needed_share(SwarmCounts(seeds=3, leechers=0), 2.0) == 1.0
    assert not_needed_share(SwarmCounts(seeds=10, leechers=5), 2.0) == 0.0
    rng = random.Random(4)
    left = []
    for _ in range(200):
        cores = [
            seeding_core(desktop_profile(), down=100 * MB, rng=random.Random(rng.random()))
            for _ in range(15)
        ]
        left.append(sum(bool(of(c.handle_swarm_counts(counts, now=3.5), Leave)) for c in cores))
    assert statistics.mean(left) == pytest.approx(5, abs=0.5)
    # a seed that stayed draws again on the next counts
    core = seeding_core(desktop_profile(), down=100 * MB, rng=random.Random(1))
    t = 3.5
    while not of(core.handle_swarm_counts(counts, now=t), Leave):
        t += 1.0
    assert core.left is not None and core.left.rule is LeaveRule.NOT_NEEDED


def test_rules_in_order_and_the_max_seed_time() -> None:
    cfg = desktop_profile(max_seed_time_s=60.0)
    counts = SwarmCounts(seeds=5, leechers=1)
    assert (
        fair_to_leave(cfg, uploaded_bytes=10, downloaded_bytes=5, counts=counts, seeding_for_s=99)
        is LeaveRule.RATIO
    )
    assert (
        fair_to_leave(cfg, uploaded_bytes=1, downloaded_bytes=5, counts=counts, seeding_for_s=99)
        is LeaveRule.NOT_NEEDED
    )
    busy = SwarmCounts(seeds=1, leechers=5)
    assert (
        fair_to_leave(cfg, uploaded_bytes=1, downloaded_bytes=5, counts=busy, seeding_for_s=59.9)
        is None
    )
    assert (
        fair_to_leave(cfg, uploaded_bytes=1, downloaded_bytes=5, counts=busy, seeding_for_s=60)
        is LeaveRule.MAX_SEED_TIME
    )


def test_mobile_profiles() -> None:
    mobile = mobile_profile()
    assert mobile.upload_limit_bps > 0 and mobile.seeds
    metered = profile_config("mobile", metered=True)
    assert not metered.seeds
    busy = SwarmCounts(seeds=1, leechers=5)
    assert (
        fair_to_leave(metered, uploaded_bytes=0, downloaded_bytes=5, counts=busy, seeding_for_s=0)
        is LeaveRule.METERED
    )
    # a metered peer whose ratio already holds says so
    assert (
        fair_to_leave(metered, uploaded_bytes=5, downloaded_bytes=5, counts=busy, seeding_for_s=0)
        is LeaveRule.RATIO
    )
    assert LeaveRule.METERED.tracker_value == "user" and not LeaveRule.METERED.fair
    assert LeaveRule.RATIO.fair and LeaveRule.NOT_NEEDED.fair


@settings(max_examples=300, deadline=None)
@given(
    up=st.integers(0, 10**9),
    down=st.integers(0, 10**9),
    ratio=st.floats(0.0, 3.0),
    seeds=st.integers(0, 50),
    leechers=st.integers(0, 50),
    have_counts=st.booleans(),
    seeding_for=st.floats(0.0, 10_000.0),
    max_seed=st.one_of(st.none(), st.floats(0.0, 10_000.0)),
    metered=st.booleans(),
    draw=st.floats(0.0, 1.0, exclude_max=True),
)
def test_every_departure_names_a_rule_that_holds(
    up: int,
    down: int,
    ratio: float,
    seeds: int,
    leechers: int,
    have_counts: bool,
    seeding_for: float,
    max_seed: float | None,
    metered: bool,
    draw: float,
) -> None:
    cfg = desktop_profile(share_ratio=ratio, max_seed_time_s=max_seed, metered=metered)
    counts = SwarmCounts(seeds, leechers) if have_counts else None
    rule = fair_to_leave(
        cfg,
        uploaded_bytes=up,
        downloaded_bytes=down,
        counts=counts,
        seeding_for_s=seeding_for,
        draw=draw,
    )
    ratio_holds = up >= ratio * down
    per_leecher = cfg.not_needed_seeds_per_leecher
    not_needed_now = counts is not None and (leechers == 0 or seeds - 1 >= per_leecher * leechers)
    # the share is positive exactly where the rule holds; this peer is among the spared
    assert (counts is not None and not_needed_share(counts, per_leecher) > 0) is not_needed_now
    nobody = counts is not None and draw < not_needed_share(counts, per_leecher)
    timed_out = max_seed is not None and seeding_for >= max_seed
    if rule is LeaveRule.RATIO:
        assert ratio_holds
    elif rule is LeaveRule.NOT_NEEDED:
        assert nobody and not ratio_holds
    elif rule is LeaveRule.MAX_SEED_TIME:
        assert timed_out and not ratio_holds and not nobody
    elif rule is LeaveRule.METERED:
        assert metered and not (ratio_holds or nobody or timed_out)
    else:
        # staying: no rule holds, and the peer does seed
        assert rule is None
        assert not (ratio_holds or nobody or timed_out or metered)


# --- the core with a stepped clock ----------------------------------------------


def test_seeding_peer_leaves_once_it_has_uploaded_what_it_downloaded() -> None:
    core = seeding_core(desktop_profile(), down=100 * MB, up=10 * MB)
    assert core.phase is PeerPhase.SEEDING
    t = 2.0
    for up in range(20, 100, 20):
        t += 0.5
        assert not of(core.handle_progress(progress(done=100 * MB, up=up * MB, down=100 * MB,
                                                     pieces=100), now=t), Leave)  # fmt: skip
    effects = core.handle_progress(
        progress(done=100 * MB, up=100 * MB, down=100 * MB, pieces=100), now=t + 1
    )
    (leave,) = of(effects, Leave)
    assert leave == Leave(LeaveRule.RATIO, 1.0)
    assert core.phase is PeerPhase.LEFT and core.next_deadline() is None
    assert core.handle_timer(now=t + 100) == []


def test_the_last_holder_of_a_piece_stays_until_it_has_a_second_holder() -> None:
    # ratio reached, but no connected peer holds 2 pieces a connected leecher lacks
    core = seeding_core(desktop_profile(max_seed_time_s=60.0), down=100 * MB)
    assert core.phase is PeerPhase.SEEDING

    def poll(sole: int, t: float) -> list[Effect]:
        p = progress(done=100 * MB, up=100 * MB, down=100 * MB, pieces=100)
        return core.handle_progress(replace(p, sole_pieces=sole), now=t)

    assert not of(poll(2, 3.0), Leave)  # counts unknown: no other seed assumed
    assert not of(core.handle_swarm_counts(SwarmCounts(seeds=1, leechers=5), now=3.5), Leave)
    assert not of(poll(1, 4.0), Leave)
    (leave,) = of(poll(0, 4.5), Leave)  # the piece has a second holder now
    assert leave.rule is LeaveRule.RATIO
    # another seed in the swarm holds every piece: no need to stay
    other = seeding_core(desktop_profile(), down=100 * MB)
    p = replace(progress(done=100 * MB, up=100 * MB, down=100 * MB, pieces=100), sole_pieces=3)
    assert not of(other.handle_progress(p, now=3.0), Leave)
    (leave,) = of(other.handle_swarm_counts(SwarmCounts(seeds=2, leechers=5), now=3.5), Leave)
    assert leave.rule is LeaveRule.RATIO
    # "may leave", not "must": the maximum seeding time and the user still end it
    held = seeding_core(desktop_profile(max_seed_time_s=10.0), down=100 * MB)
    p = replace(progress(done=100 * MB, up=100 * MB, down=100 * MB, pieces=100), sole_pieces=3)
    assert not of(held.handle_progress(p, now=3.0), Leave)
    (leave,) = of(held.handle_timer(now=12.5), Leave)
    assert leave.rule is LeaveRule.MAX_SEED_TIME


def test_a_seed_in_use_does_not_leave_by_not_needed() -> None:
    # Issue 29: the counts say the swarm can spare seeds (20 seeds, 1 leecher: 18 of 20
    # may go), but this one uploads 0.9 of its 1 MB/s: the leechers use it. It stays
    # while it does, and leaves once its upload falls under half of its capacity. On
    # the loopback bench every peer left by not_needed within a second of the first
    # copies while the last ones still downloaded at rates their links could take.
    def poll(core: PeerCore, rate: int, t: float) -> list[Effect]:
        p = progress(done=100 * MB, up=10 * MB, down=100 * MB, pieces=100)
        return core.handle_progress(replace(p, upload_bps=rate, upload_capacity_bps=MB), now=t)

    spare = SwarmCounts(seeds=20, leechers=1)
    core = seeding_core(desktop_profile(), down=100 * MB, up=10 * MB, rng=random.Random(1))
    assert not of(poll(core, 900_000, 3.0), Leave)
    assert not of(core.handle_swarm_counts(spare, now=3.5), Leave)  # (draw 0.13 < 0.9)
    assert not of(poll(core, 600_000, 4.0), Leave)
    (leave,) = of(poll(core, 400_000, 4.5), Leave)
    assert leave.rule is LeaveRule.NOT_NEEDED
    # the check off: the same counts let the busy seed go at once
    off = seeding_core(
        desktop_profile(not_needed_busy_share=0), down=100 * MB, up=10 * MB, rng=random.Random(1)
    )
    assert not of(poll(off, 900_000, 3.0), Leave)
    (leave,) = of(off.handle_swarm_counts(spare, now=3.5), Leave)
    assert leave.rule is LeaveRule.NOT_NEEDED
    # a capacity not known yet (no limit, nothing uploaded) is not "in use"
    unknown = seeding_core(desktop_profile(), down=100 * MB, up=10 * MB, rng=random.Random(1))
    p = progress(done=100 * MB, up=10 * MB, down=100 * MB, pieces=100)
    assert not of(unknown.handle_progress(replace(p, upload_bps=900_000), now=3.0), Leave)
    (leave,) = of(unknown.handle_swarm_counts(spare, now=3.5), Leave)
    assert leave.rule is LeaveRule.NOT_NEEDED
    with pytest.raises(ValueError, match="busy_share"):
        desktop_profile(not_needed_busy_share=1.5)


def test_counts_from_before_seeding_are_not_trusted() -> None:
    core = PeerCore(desktop_profile(), now=0.0)
    core.handle_progress(progress(done=50 * MB, down=50 * MB, pieces=50), now=1.0)
    core.handle_swarm_counts(SwarmCounts(seeds=10, leechers=0), now=1.5)  # stale by then
    core.handle_progress(progress(done=100 * MB, down=100 * MB, pieces=100), now=2.0)
    core.handle_download_finished(now=2.0)
    effects = core.handle_verified(now=3.0)
    assert of(effects, AskSwarmCounts) and not of(effects, Leave)
    (leave,) = of(core.handle_swarm_counts(SwarmCounts(seeds=10, leechers=0), now=3.5), Leave)
    assert leave.rule is LeaveRule.NOT_NEEDED and leave.ratio == 0.0


def test_max_seed_time_through_the_timer() -> None:
    core = seeding_core(desktop_profile(max_seed_time_s=100.0))
    core.handle_swarm_counts(SwarmCounts(seeds=1, leechers=9), now=3.0)
    assert core.next_deadline() is not None
    t = 3.0
    rules = []
    while core.phase is not PeerPhase.LEFT:
        deadline = core.next_deadline()
        assert deadline is not None
        t = max(t, deadline)  # a deadline already past runs now
        rules += [e.rule for e in of(core.handle_timer(now=t), Leave)]  # type: ignore[attr-defined]
    assert rules == [LeaveRule.MAX_SEED_TIME] and t == pytest.approx(102.0)


def test_metered_mobile_never_seeds() -> None:
    core = PeerCore(mobile_profile(metered=True), now=0.0)
    core.handle_progress(progress(done=100 * MB, down=100 * MB, up=5 * MB, pieces=100), now=1)
    core.handle_download_finished(now=1.0)
    (leave,) = of(core.handle_verified(now=1.5), Leave)
    assert leave.rule is LeaveRule.METERED


def test_verify_before_finish_is_a_local_error() -> None:
    core = PeerCore(desktop_profile(), now=0.0)
    with pytest.raises(LocalProtocolError):
        core.handle_verified(now=1.0)


def test_user_stop() -> None:
    core = PeerCore(desktop_profile(), now=0.0)
    (leave,) = core.handle_user_stop(now=1.0)
    assert leave == Leave(LeaveRule.USER, None)
    assert core.handle_user_stop(now=2.0) == []


def test_stall_is_reported_once_and_again_only_after_progress() -> None:
    core = PeerCore(desktop_profile(stall_after_s=5.0, drop_web_seeds=False), now=0.0)
    core.handle_progress(progress(done=1 * MB, down=1 * MB, pieces=1), now=1.0)
    stalls: list[tuple[float, Effect]] = []
    t = 1.0
    while t < 20.0:
        deadline = core.next_deadline()
        assert deadline is not None
        t = deadline
        stalls += [(t, e) for e in of(core.handle_timer(now=t), Stalled)]
    assert [s for _, s in stalls] == [Stalled(5.0, 1)] and stalls[0][0] == 6.0
    core.handle_progress(progress(done=2 * MB, down=2 * MB, pieces=2), now=20.0)
    assert not of(core.handle_timer(now=24.9), Stalled)
    assert of(core.handle_timer(now=25.0), Stalled)
    assert core.stalls == 2


def test_partial_payload_counts_as_progress() -> None:
    core = PeerCore(desktop_profile(stall_after_s=5.0), now=0.0)
    for i in range(1, 20):  # bytes keep coming, no piece completes
        core.handle_progress(progress(done=0, down=i * 1000, pieces=0), now=float(i))
        assert not of(core.handle_timer(now=float(i)), Stalled)


def test_web_seeds_dropped_at_the_share_and_restored_when_starved() -> None:
    cfg = desktop_profile(web_seed_hold_s=4.0, web_seed_share_factor=1.0)
    core = PeerCore(cfg, now=0.0)
    core.handle_swarm_counts(SwarmCounts(seeds=0, leechers=10), now=0.5)
    # share = 100 MB / 10 peers = 10 MB from the web seeds
    assert not of(core.handle_progress(progress(down=9 * MB, web=9 * MB), now=1.0), DropWebSeeds)
    # nothing to trade yet: keep the origins
    effects = core.handle_progress(progress(down=11 * MB, web=11 * MB, tradable=0), now=1.5)
    assert not of(effects, DropWebSeeds)
    effects = core.handle_progress(progress(down=12 * MB, web=11 * MB, tradable=5), now=2.0)
    assert of(effects, DropWebSeeds) and not core.web_seeds_on
    # starved: no connected peer holds a piece it lacks -> origins back at once
    effects = core.handle_progress(progress(down=13 * MB, web=11 * MB, tradable=0), now=3.0)
    assert not of(effects, RestoreWebSeeds)  # starved for a moment only
    effects = core.handle_progress(progress(down=13 * MB, web=11 * MB, tradable=0), now=3.5)
    assert not of(effects, RestoreWebSeeds)
    effects = core.handle_progress(progress(down=13 * MB, web=11 * MB, tradable=0), now=4.0)
    assert of(effects, RestoreWebSeeds) and core.web_seeds_on
    # held for web_seed_hold_s before the next drop
    assert not of(core.handle_progress(progress(down=14 * MB, web=12 * MB), now=7.9), DropWebSeeds)
    assert of(core.handle_progress(progress(down=15 * MB, web=12 * MB), now=8.0), DropWebSeeds)
    # the stall guard: no payload for web_seed_stall_s puts them back
    t = 8.0
    restored = False
    while not restored:
        deadline = core.next_deadline()
        assert deadline is not None
        t = deadline
        restored = bool(of(core.handle_timer(now=t), RestoreWebSeeds))
    assert t == pytest.approx(8.0 + cfg.web_seed_stall_s)
    assert (core.web_seed_drops, core.web_seed_restores) == (2, 2)


def test_a_disabled_web_seed_is_put_back_after_a_delay() -> None:
    core = PeerCore(desktop_profile(web_seed_retry_s=1.0), now=0.0)
    core.handle_web_seed_failed(now=0.2)
    core.handle_web_seed_failed(now=0.3)  # one retry pending at a time
    assert not of(core.handle_timer(now=1.1), RestoreWebSeeds)
    assert len(of(core.handle_timer(now=1.2), RestoreWebSeeds)) == 1
    assert not of(core.handle_timer(now=5.0), RestoreWebSeeds)


def test_status_polls_and_resume_saves_are_timed() -> None:
    cfg = desktop_profile(status_interval_s=0.5, resume_save_interval_s=2.0)
    core = PeerCore(cfg, now=0.0)
    assert of(core.handle_timer(now=0.0), PollStatus)
    assert not of(core.handle_timer(now=0.2), PollStatus)
    assert of(core.handle_timer(now=0.5), PollStatus)
    core.handle_progress(progress(done=MB, down=MB, pieces=1), now=0.6)  # dirty
    assert not of(core.handle_timer(now=1.9), SaveResumeData)
    assert of(core.handle_timer(now=2.0), SaveResumeData)
    assert not of(core.handle_timer(now=4.5), SaveResumeData)  # nothing new
    assert of(core.handle_download_finished(now=5.0), SaveResumeData)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        PeerConfig(share_ratio=-1)
    with pytest.raises(ValueError):
        PeerConfig(stall_after_s=0)
    with pytest.raises(ValueError):
        profile_config("tablet")


# --- the uploader-choice hook -----------------------------------------------------


def test_the_libtorrent_policy_leaves_libtorrent_alone() -> None:
    assert make_uploader_policy().name == "chord"  # the default (`stripes` without a ring)
    policy = make_uploader_policy("libtorrent")
    assert isinstance(policy, LibtorrentPicker) and policy.name == "libtorrent"
    view = SwarmView(peer_id="00" * 20, info_hash="ab" * 20, have=(False,) * 4, connected_peers=2)
    assert policy.plan(view, now=0.0) is None
    with pytest.raises(ValueError, match="unknown uploader policy"):
        make_uploader_policy("no-such-policy")  # ("chord" is registered now)


def test_a_policy_registers_and_plans_never_use_priority_zero() -> None:
    class Evens(UploaderPolicy):
        name = "test-evens"

        def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
            return PiecePlan(tuple(7 if i % 2 == 0 else 1 for i in range(len(view.have))))

    register_uploader_policy("test-evens", Evens)
    assert "test-evens" in uploader_policy_names()
    with pytest.raises(ValueError, match="already registered"):
        register_uploader_policy("test-evens", Evens)
    view = SwarmView(peer_id="00" * 20, info_hash="ab" * 20, have=(False,) * 4, connected_peers=2)
    plan = make_uploader_policy("test-evens").plan(view, now=0.0)
    assert plan is not None and plan.piece_priorities == (7, 1, 7, 1)
    with pytest.raises(ValueError, match=r"must be 0\.\.7"):
        PiecePlan((1, 8, 7))
    # pieces on hold (0) only while another missing piece stays wanted
    have = [False, True, False, False, False]
    assert PiecePlan.checked([0, 1, 7, 1, 1], have).piece_priorities == (0, 1, 7, 1, 1)
    assert PiecePlan.checked([0, 7, 7, 0, 1], have).piece_priorities == (1, 7, 7, 1, 1)


def test_a_sudden_fall_of_the_counts_does_not_make_the_seeds_leave() -> None:
    """Issue 24: a tracker that lost its peers (a step of its clock, a restart) answers
    0 / 0 until they announce again; a seed must not read that as "nobody needs me".
    The fall holds not_needed back for not_needed_settle_s; counts that still say so
    after it let the seed go."""
    config = desktop_profile(max_seed_time_s=None)
    core = seeding_core(config, rng=random.Random(3))
    assert not of(core.handle_swarm_counts(SwarmCounts(seeds=3, leechers=7), now=3.0), Leave)
    assert not of(core.handle_swarm_counts(SwarmCounts(seeds=0, leechers=0), now=5.0), Leave)
    # the peers announce again one by one: (1, 0) is a fall still settling
    assert not of(core.handle_swarm_counts(SwarmCounts(seeds=1, leechers=0), now=7.0), Leave)
    assert not of(core.handle_swarm_counts(SwarmCounts(seeds=3, leechers=7), now=30.0), Leave)
    # counts that never count this seed are never a reason
    for t in (70.0, 140.0, 210.0):
        assert not of(core.handle_swarm_counts(SwarmCounts(seeds=0, leechers=0), now=t), Leave)
    # a swarm that really emptied: the counts still say so after the settling time
    assert not of(core.handle_swarm_counts(SwarmCounts(seeds=2, leechers=0), now=240.0), Leave)
    (leave,) = of(core.handle_swarm_counts(SwarmCounts(seeds=2, leechers=0), now=271.0), Leave)
    assert leave.rule is LeaveRule.NOT_NEEDED


def test_counts_that_shrink_as_seeds_leave_are_not_a_fall() -> None:
    """The normal end of a swarm: seeds leave a few at a time, no settling."""
    core = seeding_core(desktop_profile(max_seed_time_s=None), rng=random.Random(1))
    core.handle_swarm_counts(SwarmCounts(seeds=8, leechers=4), now=3.0)  # needed
    assert core.phase is PeerPhase.SEEDING
    (leave,) = of(core.handle_swarm_counts(SwarmCounts(seeds=6, leechers=0), now=5.0), Leave)
    assert leave.rule is LeaveRule.NOT_NEEDED
