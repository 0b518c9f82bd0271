"""`pressrun sim swarm`: the block-level model at a small N, the bound, scenario files, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pressrun.cli import main
from pressrun.peer.config import SEED_FLOOR
from pressrun.sim.swarm_leave import departures
from pressrun.sim.swarm_model import _Swarm, run_swarm
from pressrun.sim.swarm_report import compare
from pressrun.sim.swarm_scenario import (
    Subscribers,
    SwarmScenario,
    SwarmScenarioError,
    draw_subscribers,
    fluid_bound_s,
    load_swarm_scenario,
)

SMALL = """
name = "small"
[swarm]
subscribers = 300
file_mb = 20
piece_kib = 1024
origin_upload_mbps = 10
[[swarm.classes]]
share = 0.5
upload_mbps = 1
download_mbps = 10
[[swarm.classes]]
share = 0.5
upload_mbps = 2
download_mbps = 20
"""


def small(tmp_path: Path, text: str = SMALL) -> SwarmScenario:
    path = tmp_path / "small.toml"
    path.write_text(text)
    return load_swarm_scenario(str(path))


def test_every_choice_delivers_everything_and_never_beats_the_bound(tmp_path: Path) -> None:
    sc = small(tmp_path)
    cmp = compare(sc, seed=2)
    rows = {r["choice"]: r for r in cmp.rows()}
    assert set(rows) == {"ring", "random", "rarest"}
    for run in cmp.runs:
        assert np.isfinite(run.done_at_s).all()  # everyone finished
        assert run.last_done_s >= cmp.bound_s  # nobody beats the bound
        # every byte came from somewhere: the origin sent at least one copy, and the
        # subscribers the rest
        assert run.origin_pieces >= sc.num_pieces
        # a model that keeps uploaders busy (pipelining, a super-seeding origin) stays
        # near the bound at this size: 1.12x to 1.2x measured (docs/chord.md)
        assert run.last_done_s <= 1.3 * cmp.bound_s, (run.choice, run.last_done_s, cmp.bound_s)
    # same seed, same run
    again = run_swarm(sc, "ring", seed=2)
    assert np.array_equal(again.done_at_s, cmp.runs[0].done_at_s)


def test_download_bound_is_met_exactly(tmp_path: Path) -> None:
    # Download is the bottleneck (1 Mbit/s down, a 100 Mbit/s origin): one block a step
    # each, so everyone is done after exactly F/d, whatever the resolution.
    text = SMALL.replace("subscribers = 300", "subscribers = 4").replace(
        "origin_upload_mbps = 10", "origin_upload_mbps = 100"
    )
    text = text.replace("download_mbps = 10", "download_mbps = 1").replace(
        "upload_mbps = 2\ndownload_mbps = 20", "upload_mbps = 1\ndownload_mbps = 1"
    )
    sc = small(tmp_path, text)
    for blocks in (4, 16):
        for choice in ("ring", "random", "rarest"):
            run = run_swarm(sc, choice, blocks_per_piece=blocks)
            assert run.last_done_s == pytest.approx(sc.file_bytes * 8 / 1e6)
            assert run.done_at_s.min() == run.last_done_s
    # arrivals over 30 s: each one done F/d after it arrives, never sooner, at most a
    # step later (a subscriber takes part from the first step after it arrives)
    late = small(
        tmp_path,
        text.replace("origin_upload_mbps = 100", "origin_upload_mbps = 100\narrival_window_s = 30"),
    )
    bound = fluid_bound_s(late, draw_subscribers(late, np.random.default_rng(1)))
    for choice in ("ring", "random", "rarest"):
        run = run_swarm(late, choice, seed=1)
        assert bound <= run.last_done_s <= bound + run.step_s


def test_decaying_arrivals(tmp_path: Path) -> None:
    # a crowd that thins out: exponential with a mean of a quarter of the window, cut at it
    text = SMALL.replace("subscribers = 300", "subscribers = 20000")
    text = text.replace("origin_upload_mbps = 10", "origin_upload_mbps = 10\narrival_window_s = 80")
    uniform = draw_subscribers(small(tmp_path, text), np.random.default_rng(1)).arrive_s
    sc = small(
        tmp_path,
        text.replace("arrival_window_s = 80", 'arrival_window_s = 80\narrival_shape = "decay"'),
    )
    decay = draw_subscribers(sc, np.random.default_rng(1)).arrive_s
    assert decay.min() >= 0 and decay.max() <= 80
    # truncated at 4 means: mean = 20 * (1 - 5 e^-4) / (1 - e^-4)
    assert decay.mean() == pytest.approx(20 * (1 - 5 * np.exp(-4)) / (1 - np.exp(-4)), rel=0.03)
    assert np.median(decay) < np.median(uniform) / 2
    # a crowd that builds up: density 2t/w^2, mean 2w/3, median w/sqrt(2)
    rising = draw_subscribers(
        small(
            tmp_path,
            text.replace(
                "arrival_window_s = 80", 'arrival_window_s = 80\narrival_shape = "rising"'
            ),
        ),
        np.random.default_rng(1),
    ).arrive_s
    assert rising.min() >= 0 and rising.max() <= 80
    assert rising.mean() == pytest.approx(80 * 2 / 3, rel=0.02)
    assert np.median(rising) == pytest.approx(80 / np.sqrt(2), rel=0.02)


def test_finer_blocks_give_the_same_answer(tmp_path: Path) -> None:
    # the resolution is not what the result depends on: 8 and 32 blocks a piece agree
    sc = small(tmp_path)
    coarse = run_swarm(sc, "ring", seed=3, blocks_per_piece=8).last_done_s
    fine = run_swarm(sc, "ring", seed=3, blocks_per_piece=32).last_done_s
    assert abs(coarse - fine) <= 0.05 * fine, (coarse, fine)


def test_bound_with_arrivals() -> None:
    # two subscribers of 1 Mbit/s up arriving at 0 and 10 s, an origin of 10 Mbit/s:
    # the upload available by T is 10T + T + (T - 10) Mbit, which must reach 2F
    sc = SwarmScenario("two", 2, 10.48576, 1024, 10.0, 10.0, ())
    f = sc.file_bytes * 8 / 1e6  # 83.88608 Mbit
    subs = Subscribers(np.array([1e6, 1e6]), np.array([1e9, 1e9]), np.array([0.0, 10.0]))
    assert fluid_bound_s(sc, subs) == pytest.approx((2 * f + 10) / 12, rel=1e-9)
    # everyone at t = 0: Kumar and Ross's max(F/u_s, F/d_min, N*F/(u_s + sum u_i))
    flash = Subscribers(np.array([1e6, 3e6]), np.array([2e6, 1e9]), np.zeros(2))
    assert fluid_bound_s(sc, flash) == pytest.approx(max(f / 10, f / 2, 2 * f / 14))


def test_bad_scenarios_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(SwarmScenarioError, match="built-in"):
        load_swarm_scenario("no-such")
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.replace("share = 0.5\nupload_mbps = 2", "share = 0.6\nupload_mbps = 2"))
    with pytest.raises(SwarmScenarioError, match="add up"):
        load_swarm_scenario(str(bad))
    bad.write_text("[swarm]\nsubscribers = 10\n")
    with pytest.raises(SwarmScenarioError, match="classes"):
        load_swarm_scenario(str(bad))
    bad.write_text(
        SMALL.replace("origin_upload_mbps = 10", 'origin_upload_mbps = 10\narrival_shape = "wave"')
    )
    with pytest.raises(
        SwarmScenarioError, match="arrival_shape must be one of uniform, decay, rising"
    ):
        load_swarm_scenario(str(bad))
    for name, subscribers in (("flash-50k", 50000), ("window-20k", 20000), ("mix-20k", 20000)):
        assert load_swarm_scenario(name).subscribers == subscribers


def test_cli_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.toml"
    path.write_text(SMALL.replace("subscribers = 300", "subscribers = 40"))
    args = ["sim", "swarm", "--scenario", str(path), "--leave", "last-holder", "--json"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["leave"] == "last-holder"
    assert [c["choice"] for c in summary["choices"]] == ["ring", "random", "rarest"]
    assert all(0.0 <= c["upload_idle_share"] < 1.0 for c in summary["choices"])
    for choice in summary["choices"]:  # everyone left, the last ones at the end, but
        # the floor's SEED_FLOOR (2) seeds: with nobody downloading, not_needed keeps them
        assert choice["left_by_ratio"] + choice["left_by_not_needed"] == 40 - SEED_FLOOR
        assert choice["last_holder_stayed_s"] >= 0
    for choice in summary["choices"]:
        classes = choice["classes"]  # per class of access link, in the scenario's order
        assert [(c["share"], c["upload_mbps"]) for c in classes] == [(0.5, 1.0), (0.5, 2.0)]
        for c in classes:
            assert c["median_done_s"] <= c["last_done_s"] <= choice["last_done_s"]
            assert c["leave_median_s"] <= choice["last_done_s"]
            assert 0.0 < c["upload_use"] <= 1.0
            assert len(c["upload_use_by_span"]) == 10
            assert all(0.0 <= u <= 1.0 for u in c["upload_use_by_span"])
    assert (tmp_path / "swarm-small-seed1-leave-last-holder.png").stat().st_size > 1000
    assert main(["sim", "swarm", "--scenario", str(path), "--choices", "nope"]) == 2
    assert main(["sim", "swarm", "--scenario", str(path), "--blocks-per-piece", "0"]) == 2


def test_ring_serves_unused_upload_first_then_the_most_behind(tmp_path: Path) -> None:
    # The ring's supernodes serve first the askers whose upload went most unused by
    # their last report (a piece there adds upload), then the most behind
    # (docs/chord.md, "sim swarm").
    sc = small(tmp_path, SMALL.replace("subscribers = 300", "subscribers = 8"))
    sw = _Swarm(sc, "ring", 1, 16)
    everyone = np.arange(8)
    fast = sw.up_rate[:8] > sw.up_rate[:8].min()
    # newcomers: all their upload is unused, so the most upload first
    order = sw._asker_order(everyone)
    assert fast[order[:4]].all() and not fast[order[4:]].any()
    prio = sw._request_priority(everyone)
    assert (prio[fast] < prio[~fast]).all()
    # every upload in use: the most behind first (what it misses over its download rate)
    sw.unused_reported[:] = 0.0
    sw.downloaded[:] = np.arange(8) * 30
    order = sw._asker_order(everyone)
    behind = (sw.p * sw.b - sw.downloaded) / sw.down_rate
    assert (np.diff(behind[order]) <= 0).all()
    assert (sw._request_priority(everyone) == 255).all()
    # ... but one whose upload idles comes first, however far along it is
    sw.unused_reported[7] = 0.5
    assert sw._asker_order(everyone)[0] == 7
    assert sw._request_priority(everyone).argmin() == 7
    # the other choices give no request a rank
    assert (_Swarm(sc, "random", 1, 16)._request_priority(everyone) == 0).all()


def test_ring_knows_unused_upload_as_of_each_report(tmp_path: Path) -> None:
    sc = small(tmp_path, SMALL.replace("subscribers = 300", "subscribers = 4"))
    sw = _Swarm(sc, "ring", 1, 16)
    r = sw.report_steps
    assert r == round(2.0 / sw.run.step_s)  # a report every 2 s, each at its phase
    sw.report_phase[:] = 0
    arrived = np.array([True, True, True, False])
    for t in range(1, r):  # nothing due: the ring still sees the newcomer's value
        sw._report(t, arrived, np.array([1, 0, 2, 0]))
    assert list(sw.unused_reported) == list(sw.up_rate[:4])
    sw._report(r, arrived, np.array([1, 0, 5, 0]))
    # the mean over the steps since the last report; not arrived: unchanged
    assert list(sw.unused_reported[:3]) == pytest.approx([1.0, 0.0, (2 * (r - 1) + 5) / r])
    assert sw.unused_reported[3] == sw.up_rate[3]


def test_ring_gives_requests_to_the_holders_that_pay_back_soonest(tmp_path: Path) -> None:
    sc = small(tmp_path, SMALL.replace("subscribers = 300", "subscribers = 4"))
    sw = _Swarm(sc, "ring", 1, 16)
    sw.up_rate[:4] = [1.0, 1.0, 4.0, 4.0]
    sw.downloaded[:] = [40, 10, 60, 0]
    sw.uploaded[:] = [0, 0, 0, 5]  # 3 owes nothing
    left = np.array([1, 1, 4, 4])
    # payback: 40/1, 10/1, 60/4 steps; then the one that owes nothing
    assert list(sw._holder_order(left)) == [1, 2, 0, 3]


def test_leave_rules() -> None:
    # four subscribers: 0 and 1 finished (0 uploaded what it downloaded), 2 and 3 still
    # downloading; two pieces, piece 1 held by the seeds only
    rng = np.random.default_rng(1)
    have_t = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=bool)
    seeds = np.array([True, True, False, False])
    kw = {
        "seeds": seeds,
        "leechers": ~seeds,
        "uploaded": np.array([10, 3, 0, 0]),
        "downloaded": np.array([10, 10, 5, 5]),
        "have_t": have_t,
        "rng": rng,
    }
    assert departures("never", **kw).leaving.size == 0
    # fair: 0 by the ratio rule; 1 stays (one seed left, two leechers: needed)
    fair = departures("fair", **kw)
    assert list(fair.by_ratio) == [0] and fair.by_not_needed.size == 0
    # not_needed: with one leecher, seeds - 1 >= 2 * leechers lets 1 go once 0 has not
    one = departures("fair", **{**kw, "leechers": np.array([False, False, True, False])})
    assert list(one.by_ratio) == [0] and one.by_not_needed.size == 0
    many = np.ones(8, dtype=bool)
    crowd = departures(
        "fair",
        seeds=many,
        leechers=np.zeros(8, dtype=bool),
        uploaded=np.zeros(8, dtype=np.int64),
        downloaded=np.ones(8, dtype=np.int64),
        have_t=np.ones((2, 8), dtype=bool),
        rng=rng,
    )
    # nobody downloads: every seed but the floor (the programs' SEED_FLOOR, 2) is spare
    assert crowd.by_not_needed.size == 8 - SEED_FLOOR
    # a seed in use is needed (the client's not_needed_busy_share): 10 seeds, 1
    # leecher, 8 may go by the counts; the 4 busy ones are not among them
    ten = np.arange(11) < 10
    busy = np.arange(11) < 4
    spare = departures(
        "fair",
        seeds=ten,
        leechers=~ten,
        uploaded=np.zeros(11, dtype=np.int64),
        downloaded=np.ones(11, dtype=np.int64),
        have_t=np.ones((2, 11), dtype=bool),
        rng=rng,
        busy=busy,
    )
    assert spare.by_not_needed.size == 6 and not set(spare.by_not_needed) & {0, 1, 2, 3}
    # last-holder: 1 is not leaving; make both seeds go by ratio: piece 1 would be lost
    both = {**kw, "uploaded": np.array([10, 10, 0, 0]), "downloaded": np.array([10, 10, 5, 5])}
    assert set(departures("fair", **both).leaving) == {0, 1}
    kept = departures("last-holder", **both)
    assert kept.leaving.size == 1 and kept.held.size == 1
    assert set(kept.leaving) | set(kept.held) == {0, 1}
    # ... but not once a leecher holds piece 1 too
    shared = have_t.copy()
    shared[1, 2] = True
    assert departures("last-holder", **{**both, "have_t": shared}).leaving.size == 2


def test_leaving_subscribers_upload_no_more(tmp_path: Path) -> None:
    sc = small(tmp_path, SMALL.replace("subscribers = 300", "subscribers = 40"))
    stay = run_swarm(sc, "ring", seed=1, blocks_per_piece=4)
    for rule in ("fair", "last-holder"):
        run = run_swarm(sc, "ring", seed=1, blocks_per_piece=4, leave=rule)
        assert np.isfinite(run.done_at_s).all()
        # the last ones at the end, but the floor's seeds
        assert run.left_by_ratio + run.left_by_not_needed == 40 - SEED_FLOOR
        assert (run.left_at_s >= run.done_at_s).all()  # only seeds leave
        assert run.last_done_s >= stay.last_done_s  # leaving takes upload away
    assert not np.isfinite(stay.left_at_s).any()


def test_ring_passes_critical_first_and_leavers_ahead_last(tmp_path: Path) -> None:
    # The ring serves, from every piece's holders, first the askers whose own download
    # rate would finish them no sooner than the swarm's upload finishes everyone, last
    # those that will have uploaded the file's size when done (they leave at once by
    # the ratio rule) and are ahead of the median asker (docs/chord.md, "sim swarm").
    sc = small(tmp_path, SMALL.replace("subscribers = 300", "subscribers = 8"))
    sw = _Swarm(sc, "ring", 1, 16)
    everyone, present = np.arange(8), np.ones(8, dtype=bool)
    total = sw.p * sw.b
    slow = np.flatnonzero(sw.down_rate == sw.down_rate.min())
    fast = np.flatnonzero(sw.down_rate > sw.down_rate.min())
    sw.unused_reported[:] = 0.0
    sw.downloaded[:] = total - 20
    assert (sw._passes(everyone, present) == 0).all()  # one pass: nobody stands out
    # a slow newcomer: 320 blocks at its 10 a step against the swarm's 460 at its 22
    sw.downloaded[slow[0]] = 0
    assert sw.p * sw.b == 320 and sw.up_rate[:8].sum() + sw.up_rate[8] == 22
    # a fast subscriber that has uploaded the file and is ahead; another that has but
    # is behind the median asker
    sw.uploaded[fast[0]] = total
    sw.uploaded[fast[1]] = total
    sw.downloaded[fast[1]] = 100
    passes = sw._passes(everyone, present)
    assert passes[slow[0]] == 0 and passes[fast[0]] == 2
    rest = np.setdiff1d(everyone, [slow[0], fast[0]])
    assert (passes[rest] == 1).all()
    # its unused upload counts against what it will have uploaded by then
    # (20 blocks missing at 20 a step: one step, in which it uploads 2)
    sw.uploaded[fast[0]] = total - 2
    assert sw._passes(everyone, present)[fast[0]] == 2
    sw.unused_reported[fast[0]] = sw.up_rate[fast[0]]
    assert sw._passes(everyone, present)[fast[0]] == 1
    # without a critical asker the passes are numbered from 0
    sw.unused_reported[fast[0]] = 0.0
    sw.downloaded[slow[0]] = total - 20
    assert set(sw._passes(everyone, present)[everyone]) == {0, 1}
    # the other choices make one pass
    assert (_Swarm(sc, "random", 1, 16)._passes(everyone, present) == 0).all()
