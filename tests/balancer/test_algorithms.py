"""Every scoring algorithm against cases worked out by hand from the papers' pseudocode.

Algorithm 2 and Algorithm 1: Figures 2 and 1 of 000_9aae53f3113e9bd8.txt. Weighted
dispatch: Eq. (4)-(5) of 003_fb4a16d3be88866e.txt. rr/wrr/lc/wlc: LVS / nginx.
Capacities are chosen so the arithmetic stays in round numbers: 1 MB/s = 1,000,000
bytes/s makes "x * 1000 / availBandwidth" equal to x / 1000.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.helpers import MB, algorithm, pick, specs, status
from pressrun.balancer.algorithms import (
    ScoredAlgorithm,
    ScoringAlgorithm,
    algorithm_names,
    make_algorithm,
)
from pressrun.balancer.algorithms.alg1 import Alg1, Alg1Weights, update_weights
from pressrun.balancer.algorithms.alg2 import (
    MAX_ESTIMATE_BYTES_PER_S,
    MIN_ESTIMATE_BYTES_PER_S,
    Alg2,
    bandwidth_points,
    clamp_estimate,
)
from pressrun.balancer.algorithms.weighted import WeightedDispatch, dispatch_weight
from pressrun.balancer.events import OriginStatus

KIB = 1024
MIB = 1024 * 1024


def alg2(names: tuple[str, ...] = ("a", "b", "c")) -> Alg2:
    alg = algorithm("alg2", names)
    assert isinstance(alg, Alg2)
    return alg


# --- Algorithm 2 (Figure 2) ------------------------------------------------------


def test_alg2_score_of_a_status() -> None:
    alg = alg2()
    alg.handle_status(status("a", cpu=0.25, ram=0.40, out=250_000, cap=MB), now=0.0)
    # line 2: cpuRate*1000 + ramRate*1000 = (1-0.25)*1000 + (1-0.40)*1000 = 750 + 600
    # line 6: bwScore = 1000 - 250,000*1000/1,000,000 = 1000 - 250 = 750; bwInfl = 0
    # total 750 + 600 + 750 = 2100
    assert alg.score("a", "i") == pytest.approx(2100.0)
    assert alg.rank("i", now=0.0) == [("a", pytest.approx(2100.0))]


def test_alg2_cache_bonus_is_200_for_the_cached_issue_only() -> None:
    alg = alg2()
    alg.handle_status(
        status("a", cpu=0.25, ram=0.40, out=250_000, issues=("i", "j"), cached=("i",)), now=0.0
    )
    # line 4: +200 when the asset is cached: 2100 + 200 = 2300 for i, 2100 for j
    assert alg.score("a", "i") == pytest.approx(2300.0)
    assert alg.score("a", "j") == pytest.approx(2100.0)


def test_alg2_cache_bonus_offsets_a_20_percent_disadvantage() -> None:
    # Section 4: "only a 20% disadvantage in any of the resources will offset the
    # advantage of using an existing cache". a: cached, 20% more CPU; b: not cached.
    alg = alg2(("a", "b"))
    alg.handle_status(status("a", cpu=0.30, cached=("i",)), now=0.0)  # 700+1000+1000+200
    alg.handle_status(status("b", cpu=0.10), now=0.0)  # 900+1000+1000
    assert alg.score("a", "i") == pytest.approx(2900.0)
    assert alg.score("b", "i") == pytest.approx(2900.0)


def test_alg2_bandwidth_score_floored_at_zero_during_overload() -> None:
    alg = alg2()
    alg.handle_status(status("a", cpu=0.25, ram=0.40, out=1_500_000, cap=MB), now=0.0)
    # line 6: bwScore = 1000 - 1,500,000*1000/1,000,000 = -500; line 8: -> 0
    # score = 750 + 600 + 0 = 1350 (not 850)
    assert alg.score("a", "i") == pytest.approx(1350.0)
    alg.handle_pick("a", "i", now=0.0)
    # lines 9-10: bwInfl = 65,536*1000/1e6 = 65.5 > bwScore 0 -> bwInfl = bwScore = 0:
    # the inflation never takes the bandwidth part below 0
    assert alg.score("a", "i") == pytest.approx(1350.0)
    assert bandwidth_points(1_500_000, MB, 0.0) == 0.0
    assert bandwidth_points(250_000, MB, 900_000) == 0.0  # 750 - min(900, 750)


def test_alg2_inflation_after_a_pick_and_the_bandwidth_score_it_yields() -> None:
    alg = alg2(("a",))
    alg.handle_status(status("a", cpu=0.25, ram=0.40, out=250_000, mean=200_000), now=0.0)
    assert alg.inflation.get("a", 0.0) == 0.0
    assert pick(alg) == "a"
    # after the pick: toAdd = currentAverageBandwidth = 200,000 (inside the clamps);
    # bandwidthInflation = 0 + 200,000
    assert alg.inflation["a"] == pytest.approx(200_000)
    # bwInfl = 200,000*1000/1,000,000 = 200; bw part = 750 - 200 = 550
    # score = 750 + 600 + 550 = 1900
    assert alg.score("a", "i") == pytest.approx(1900.0)
    assert alg.rank("i", now=0.0) == [("a", pytest.approx(1900.0))]
    pick(alg)
    # 400,000 inflation -> bwInfl 400 -> 750 - 400 = 350 -> 1700
    assert alg.score("a", "i") == pytest.approx(1700.0)
    pick(alg)
    pick(alg)
    # 800,000 -> bwInfl 800 > bwScore 750 -> bwInfl = 750 -> bw part 0 -> 1350
    assert alg.score("a", "i") == pytest.approx(1350.0)


def test_alg2_inflation_decays_by_0_9_per_refresh() -> None:
    alg = alg2(("a",))
    s = status("a", cpu=0.25, ram=0.40, out=250_000, mean=200_000)
    alg.handle_status(s, now=0.0)
    pick(alg)  # inflation 200,000 -> score 1900 (above)
    alg.handle_status(s, now=1.0)
    # "Every data refresh: bandwidthInflation *= 0.9": 200,000 * 0.9 = 180,000
    # bwInfl = 180 -> 750 - 180 = 570 -> 750 + 600 + 570 = 1920
    assert alg.inflation["a"] == pytest.approx(180_000)
    assert alg.score("a", "i") == pytest.approx(1920.0)
    alg.handle_status(s, now=2.0)
    # 180,000 * 0.9 = 162,000 -> bwInfl 162 -> 588 -> 1938
    assert alg.inflation["a"] == pytest.approx(162_000)
    assert alg.score("a", "i") == pytest.approx(1938.0)


def test_alg2_decay_only_touches_the_refreshed_origin() -> None:
    alg = alg2(("a", "b"))
    alg.handle_status(status("a"), now=0.0)
    alg.handle_status(status("b", cpu=0.5), now=0.0)
    pick(alg)  # a (3000 vs 2500): inflation a = 65,536
    alg.handle_status(status("b", cpu=0.5), now=1.0)
    assert alg.inflation["a"] == pytest.approx(65_536)


# 10 MiB/s capacity: bwInfl = inflation * 1000 / 10,485,760, so 1 MiB/s -> 100 points.
CAP_10MIB = 10 * MIB


@pytest.mark.parametrize(
    ("mean", "added", "score"),
    [
        # 10,000 B/s < 64 KiB/s: line 3 raises it to 65,536; 65,536*1000/10 MiB = 6.25
        # score = 1000 + 1000 + (1000 - 6.25) = 2993.75
        (10_000.0, 64 * KIB, 2993.75),
        # 5,000,000 B/s > 1 MiB/s: line 4 lowers it to 1,048,576 -> 100 points -> 2900
        (5_000_000.0, MIB, 2900.0),
        # 524,288 B/s (4 Mbit/s) is inside the clamps: 50 points -> 2950
        (512 * KIB, 512 * KIB, 2950.0),
    ],
)
def test_alg2_estimate_clamps(mean: float, added: float, score: float) -> None:
    alg = alg2(("a",))
    alg.handle_status(status("a", cap=CAP_10MIB, mean=mean), now=0.0)
    pick(alg)
    assert alg.inflation["a"] == pytest.approx(added)
    assert alg.score("a", "i") == pytest.approx(score)


def test_alg2_clamp_constants_are_the_papers() -> None:
    # "minimum of 0.5 mbps": 64*1024 B/s; "maximum of 8 mbps": 1024*1024 B/s
    assert MIN_ESTIMATE_BYTES_PER_S == 65_536
    assert MAX_ESTIMATE_BYTES_PER_S == 1_048_576
    assert clamp_estimate(None) == 65_536
    assert clamp_estimate(1.0) == 65_536
    assert clamp_estimate(1e12) == 1_048_576


def test_alg2_default_estimate_without_bandwidth_data() -> None:
    alg = alg2(("a",))
    # just (re)booted: no mean at all, nor for the asset
    alg.handle_status(status("a", cap=CAP_10MIB), now=0.0)
    pick(alg)
    # "If neither is available ... 0.5 megabit per second is assumed": 65,536 B/s
    assert alg.inflation["a"] == pytest.approx(65_536)
    assert alg.score("a", "i") == pytest.approx(2993.75)


def test_alg2_asset_mean_is_preferred_over_the_host_mean() -> None:
    alg = alg2(("a",))
    alg.handle_status(
        status("a", issues=("i", "j"), mean=800_000, by_issue={"i": 300_000}, cap=CAP_10MIB),
        now=0.0,
    )
    pick(alg, "i")
    # the asset's own mean, 300,000, not the host's 800,000
    assert alg.inflation["a"] == pytest.approx(300_000)
    pick(alg, "j")
    # j has no mean of its own: the host's 800,000 -> 300,000 + 800,000
    assert alg.inflation["a"] == pytest.approx(1_100_000)


def test_alg2_inflation_spreads_a_burst_between_polls() -> None:
    # No status arrives during the burst; only the inflation moves the argmax.
    # a: 1000+1000+1000 = 3000; b: cpu 10% -> 900+1000+1000 = 2900. Each pick on a
    # costs 65,536*1000/1e6 = 65.536 points: after 2 picks a has 2868.9 < 2900.
    alg = alg2(("a", "b"))
    alg.handle_status(status("a"), now=0.0)
    alg.handle_status(status("b", cpu=0.10), now=0.0)
    assert [pick(alg) for _ in range(3)] == ["a", "a", "b"]


# --- Algorithm 1 (Figure 1) ------------------------------------------------------


def test_alg1_weights_over_two_refreshes() -> None:
    alg = algorithm("alg1", ("a",))
    assert isinstance(alg, Alg1)
    # refresh 0: used (cpu, ram, bw) = (.5, .5, 500,000/1e6 = .5), tot 1.5: no previous
    alg.handle_status(status("a", cpu=0.5, ram=0.5, out=500_000), now=0.0)
    w = alg.weights["a"]
    assert (w.cpu, w.ram, w.bw) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    # refresh 1: (.3, .5, .4), tot 1.2; totPrev - totCurr = 0.3
    #   cpu = 0.9/3 + 0.1 * (0.5-0.3)/0.3 = 0.3 + 0.0666.. = 0.3666..
    #   ram = 0.9/3 + 0.1 * 0/0.3         = 0.3
    #   bw  = 0.9/3 + 0.1 * (0.5-0.4)/0.3 = 0.3 + 0.0333.. = 0.3333..
    alg.handle_status(status("a", cpu=0.3, ram=0.5, out=400_000), now=1.0)
    assert (w.cpu, w.ram, w.bw) == pytest.approx((0.3 + 0.2 / 3, 0.3, 0.3 + 0.1 / 3))
    # refresh 2: (.1, .6, .3), tot 1.0; delta 0.2
    #   cpu = 0.9 * 0.3666.. + 0.1 * 0.2/0.2  = 0.33 + 0.1  = 0.43
    #   ram = 0.9 * 0.3      + 0.1 * -0.1/0.2 = 0.27 - 0.05 = 0.22
    #   bw  = 0.9 * 0.3333.. + 0.1 * 0.1/0.2  = 0.30 + 0.05 = 0.35
    alg.handle_status(status("a", cpu=0.1, ram=0.6, out=300_000), now=2.0)
    assert (w.cpu, w.ram, w.bw) == pytest.approx((0.43, 0.22, 0.35))
    assert w.cpu + w.ram + w.bw == pytest.approx(1.0)
    # score = cpuRate*cpuModif + ramRate*ramModif + bwRate*bwModif, rates = share left
    #       = 0.9*0.43 + 0.4*0.22 + 0.7*0.35 = 0.387 + 0.088 + 0.245 = 0.72
    assert alg.score("a", "i") == pytest.approx(0.72)


def test_alg1_renormalises_the_weights_to_one() -> None:
    # With a2 = 0.2 the update sums to 1.1 (lines 6-10 of Figure 1 divide it out):
    # (.5,.5,.5) -> (.3,.5,.4): cpu = 0.3 + 0.2*(0.2/0.3) = 0.4333.., ram = 0.3,
    # bw = 0.3 + 0.2*(0.1/0.3) = 0.3666..; sum 1.1 -> /1.1
    w = Alg1Weights()
    update_weights(w, (0.5, 0.5, 0.5), a1=0.9, a2=0.2)
    update_weights(w, (0.3, 0.5, 0.4), a1=0.9, a2=0.2)
    assert (w.cpu, w.ram, w.bw) == pytest.approx(
        ((0.3 + 0.4 / 3) / 1.1, 0.3 / 1.1, (0.3 + 0.2 / 3) / 1.1)
    )
    assert w.cpu + w.ram + w.bw == pytest.approx(1.0)


def test_alg1_negative_weight_is_clamped_then_renormalised() -> None:
    # (.5,.5,.5) -> (.1,.9,.45): tot 1.5 -> 1.45, delta 0.05
    #   cpu = 0.3 + 0.1 * 0.4/0.05  = 1.1
    #   ram = 0.3 + 0.1 * -0.4/0.05 = -0.5 -> 0 (our choice; see alg1's docstring)
    #   bw  = 0.3 + 0.1 * 0.05/0.05 = 0.4;  sum 1.5 -> (0.7333.., 0, 0.2666..)
    w = Alg1Weights()
    update_weights(w, (0.5, 0.5, 0.5))
    update_weights(w, (0.1, 0.9, 0.45))
    assert (w.cpu, w.ram, w.bw) == pytest.approx((1.1 / 1.5, 0.0, 0.4 / 1.5))


def test_alg1_unchanged_total_keeps_the_weights() -> None:
    # "if (numbersChanged)": totPrev == totCurr would divide by zero; weights stay
    w = Alg1Weights()
    update_weights(w, (0.5, 0.2, 0.3))
    update_weights(w, (0.2, 0.5, 0.3))
    assert (w.cpu, w.ram, w.bw) == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_alg1_score_never_exceeds_1_by_rounding() -> None:
    # Found by search: after these three refreshes the renormalised weights sum to
    # 1 + 2.2e-16, and an idle origin (all rates left 1) would score above 1.
    alg = algorithm("alg1", ("a",))
    for cpu, ram, bw in [(0.82, 0.1, 0.15), (0.7, 0.05, 0.57), (0.0, 0.0, 0.0)]:
        alg.handle_status(status("a", cpu=cpu, ram=ram, out=bw * MB), now=0.0)
    assert alg.score("a", "i") == 1.0


def test_alg1_herds_between_refreshes() -> None:
    # No inflation: the argmax does not move until a status does (the paper's finding)
    alg = algorithm("alg1", ("a", "b"))
    alg.handle_status(status("a", cpu=0.1), now=0.0)
    alg.handle_status(status("b", cpu=0.2), now=0.0)
    assert [pick(alg) for _ in range(5)] == ["a"] * 5


# --- rr, wrr, lc, wlc ----------------------------------------------------------------


def test_rr_order_skips_origins_without_the_issue_and_the_excluded() -> None:
    alg = algorithm("rr", ("a", "b", "c", "d"))
    for name in "abc":
        alg.handle_status(status(name), now=0.0)
    alg.handle_status(status("d", issues=("other",)), now=0.0)
    assert [pick(alg) for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]
    # next in turn is b; excluding b gives c then a
    assert [n for n, _ in alg.rank("i", exclude={"b"}, now=0.0)] == ["c", "a"]


def test_wrr_5_1_1_over_7_picks_is_proportional_and_interleaved() -> None:
    # nginx smooth WRR by hand (credit += weight for all, winner pays the total 7):
    #   pick 1: a 5  b 1  c 1 -> a; credits a -2 b 1 c 1
    #   pick 2: a 3  b 2  c 2 -> a; credits a -4 b 2 c 2
    #   pick 3: a 1  b 3  c 3 -> b (tie, name); credits a 1 b -4 c 3
    #   pick 4: a 6  b -3 c 4 -> a; credits a -1 b -3 c 4
    #   pick 5: a 4  b -2 c 5 -> c; credits a 4 b -2 c -2
    #   pick 6: a 9  b -1 c -1 -> a; credits a 2 b -1 c -1
    #   pick 7: a 7  b 0  c 0 -> a; credits all 0 again
    alg = algorithm("wrr", ("a", "b", "c"), weights=(5, 1, 1))
    for name in "abc":
        alg.handle_status(status(name), now=0.0)
    seq = [pick(alg) for _ in range(7)]
    assert seq == ["a", "a", "b", "a", "c", "a", "a"]
    assert Counter(seq) == {"a": 5, "b": 1, "c": 1}
    # the cycle repeats
    assert [pick(alg) for _ in range(7)] == seq


def test_lc_counts_picks_since_the_last_status() -> None:
    alg = algorithm("lc")
    alg.handle_status(status("a", active=3), now=0.0)
    alg.handle_status(status("b", active=1), now=0.0)
    alg.handle_status(status("c", active=2), now=0.0)
    # connections: a 3, b 1, c 2 -> b (2); b 2 = c 2 -> b by name (3); c 2 -> c (3);
    # all 3 -> a
    assert [pick(alg) for _ in range(4)] == ["b", "b", "c", "a"]
    # b's status arrives with 1 active: the picks it counted are now in the status
    alg.handle_status(status("b", active=1), now=1.0)
    assert alg.score("b", "i") == -1.0
    assert pick(alg) == "b"


def test_wlc_divides_connections_by_weight() -> None:
    alg = algorithm("wlc", ("a", "b", "z"), weights=(4, 1, 0))
    alg.handle_status(status("a", active=4), now=0.0)
    alg.handle_status(status("b", active=0), now=0.0)
    alg.handle_status(status("z", active=0), now=0.0)
    # (active + picks) / weight: a 4/4 = 1, b 0/1 = 0 -> b; b 1 = a 1 -> a (name);
    # a 5/4 = 1.25 > b 1 -> b; b 2 > a 1.25 -> a (6/4 = 1.5); a 1.5 < b 2 -> a
    assert [pick(alg) for _ in range(5)] == ["b", "a", "b", "a", "a"]
    # weight 0: never eligible
    assert "z" not in [n for n, _ in alg.rank("i", k=3, now=0.0)]


# --- weighted dispatch (003, Eq. 4-5) ------------------------------------------------


def test_weighted_eq5_weights_with_w_max_and_w_min() -> None:
    # W_i = max(W_max * M_i / Best(M), W_min), W_max = 10, W_min = 1
    assert dispatch_weight(1_000_000, 1_000_000, 10, 1) == 10.0  # the best path
    assert dispatch_weight(500_000, 1_000_000, 10, 1) == 5.0  # half of the best
    assert dispatch_weight(10_000, 1_000_000, 10, 1) == 1.0  # 0.1 -> floored at W_min
    assert dispatch_weight(0.0, 0.0, 10, 1) == 1.0  # nothing measured


def test_weighted_eq4_dispatch_is_proportional_to_the_weights() -> None:
    alg = algorithm("weighted")
    assert isinstance(alg, WeightedDispatch)
    # available bandwidth = capacity - outbound (Eq. 6 at the last mile):
    # a 1,000,000 (best, W 10), b 500,000 (W 5), c 10,000 (W 1)
    alg.handle_status(status("a", out=0), now=0.0)
    alg.handle_status(status("b", out=500_000), now=0.0)
    alg.handle_status(status("c", out=990_000), now=0.0)
    assert [alg.weight(alg.statuses[n]) for n in "abc"] == [10.0, 5.0, 1.0]
    # Eq. (4) argmin SD_i / W_i (ties to the first name): the first three picks find
    # every SD at 0 -> a, b, c; after 16 = sum(W) picks every ratio is 1 again:
    # SD = W, i.e. a 10, b 5, c 1.
    seq = [pick(alg) for _ in range(16)]
    assert seq[:3] == ["a", "b", "c"]
    assert Counter(seq) == {"a": 10, "b": 5, "c": 1}
    assert alg.score("a", "i") == pytest.approx(-10 / 10)
    # a new status starts a new measuring period for that origin: SD_a = 0
    alg.handle_status(status("a", out=0), now=1.0)
    assert alg.dispatched["a"] == 0
    assert pick(alg) == "a"


# --- Hypothesis properties -------------------------------------------------------

NAMES = ("a", "b", "c", "d", "e")
ISSUES = ("i", "j")

fractions = st.floats(0.0, 1.0)
rates = st.floats(0.0, 5e9, allow_nan=False)


@st.composite
def statuses(draw: st.DrawFn, name: str | None = None) -> OriginStatus:
    """Any status the codec would accept (fractions 0..1, bytes/s >= 0, capacity > 0)."""
    issues = draw(st.frozensets(st.sampled_from(ISSUES)))
    return OriginStatus(
        name=name if name is not None else draw(st.sampled_from(NAMES)),
        cpu_fraction=draw(fractions),
        ram_fraction=draw(fractions),
        out_bytes_per_s=draw(rates),
        capacity_bytes_per_s=draw(st.floats(1.0, 5e9)),
        active_transfers=draw(st.integers(0, 3)),
        issues=issues,
        cached_issues=draw(st.frozensets(st.sampled_from(ISSUES))),
        mean_transfer_bytes_per_s=draw(st.none() | rates),
        mean_transfer_bytes_per_s_by_issue=draw(
            st.dictionaries(st.sampled_from(ISSUES), rates, max_size=2)
        ),
    )


# A few fixed statuses, so that sequences often repeat one: an origin re-scored back to
# an old score, or taken down and back with the same status, is where a lazy heap can
# hold two live copies of one origin.
CATALOGUE = [
    OriginStatus(n, 0.1 * k, 0.2, 1e5 * k, 1e6, k, frozenset(ISSUES), frozenset({"i"}))
    for n in NAMES
    for k in (0, 1)
]

# An op: ("status", status) | ("pick", issue) | ("down", name) | ("rank", issue, exclude, k)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("status"), statuses()),
        st.tuples(st.just("status"), st.sampled_from(CATALOGUE)),
        st.tuples(st.just("pick"), st.sampled_from(ISSUES)),
        st.tuples(st.just("down"), st.sampled_from(NAMES)),
        st.tuples(
            st.just("rank"),
            st.sampled_from(ISSUES),
            st.frozensets(st.sampled_from(NAMES)),
            st.integers(1, 6),
        ),
    ),
    max_size=60,
)


def run_ops(alg: ScoringAlgorithm, sequence: list[tuple[object, ...]], check: object) -> None:
    """Apply `sequence` to `alg` at increasing `now`; call check(alg, op) after each."""
    for step, op in enumerate(sequence):
        now = float(step)
        kind = op[0]
        if kind == "status":
            s = op[1]
            assert isinstance(s, OriginStatus)
            alg.handle_status(s, now=now)
        elif kind == "pick":
            issue = op[1]
            assert isinstance(issue, str)
            ranked = alg.rank(issue, k=3, now=now)
            if ranked:
                alg.handle_pick(ranked[0][0], issue, now=now)
        elif kind == "down":
            name = op[1]
            assert isinstance(name, str)
            alg.handle_origin_down(name, now=now)
        if callable(check):
            check(alg, op)


def weighted_algorithm(name: str) -> ScoringAlgorithm:
    return make_algorithm(name, specs(NAMES, (5, 1, 2, 3, 1)), random.Random(1))


@settings(max_examples=150, deadline=None)
@given(sequence=ops)
def test_alg2_scores_stay_within_0_and_3200(sequence: list[tuple[object, ...]]) -> None:
    def check(alg: ScoringAlgorithm, op: object) -> None:
        for name in alg.statuses:
            for issue in ISSUES:
                score = alg.score(name, issue)
                assert score is not None and 0.0 <= score <= 3200.0

    run_ops(weighted_algorithm("alg2"), sequence, check)


@settings(max_examples=150, deadline=None)
@given(sequence=ops)
def test_alg1_scores_stay_within_0_and_1(sequence: list[tuple[object, ...]]) -> None:
    def check(alg: ScoringAlgorithm, op: object) -> None:
        assert isinstance(alg, Alg1)
        for name in alg.statuses:
            w = alg.weights[name]
            assert min(w.cpu, w.ram, w.bw) >= 0.0
            assert w.cpu + w.ram + w.bw == pytest.approx(1.0)
            score = alg.score(name, "i")
            # weights sum to 1 up to rounding: allow one part in 1e12 above 1
            assert score is not None and 0.0 <= score <= 1.0

    run_ops(weighted_algorithm("alg1"), sequence, check)


@st.composite
def better_and_worse(draw: st.DrawFn) -> tuple[OriginStatus, OriginStatus]:
    """(better, worse): less CPU, less RAM, less outbound (by a margin that survives
    rounding), same capacity, the same means, cached if the worse one is."""
    cap = draw(st.floats(1e3, 5e9))
    cpu = draw(st.floats(0.0, 0.99))
    ram = draw(st.floats(0.0, 0.99))
    out = draw(st.floats(0.0, 2 * cap))
    worse_cached = draw(st.frozensets(st.sampled_from(ISSUES)))
    mean = draw(st.none() | rates)
    by_issue = draw(st.dictionaries(st.sampled_from(ISSUES), rates, max_size=2))
    worse = OriginStatus(
        "b", cpu, ram, out, cap, 0, frozenset(ISSUES), worse_cached, mean, by_issue
    )
    better = OriginStatus(
        "a",
        cpu - draw(st.floats(0.01, 1.0)) * cpu if cpu >= 0.01 else 0.0,
        draw(st.floats(0.0, ram)),
        draw(st.floats(0.0, out)),
        cap,
        0,
        frozenset(ISSUES),
        worse_cached | draw(st.frozensets(st.sampled_from(ISSUES))),
        mean,
        by_issue,
    )
    return better, worse


@settings(max_examples=200, deadline=None)
@given(pair=better_and_worse(), picks=st.lists(st.sampled_from(ISSUES), max_size=12))
def test_alg2_a_strictly_better_server_never_scores_or_ranks_lower(
    pair: tuple[OriginStatus, OriginStatus], picks: list[str]
) -> None:
    better, worse = pair
    alg = alg2(("a", "b"))
    alg.handle_status(better, now=0.0)
    alg.handle_status(worse, now=0.0)
    # the same inflation history: every pick is made on both (same means -> same toAdd)
    for issue in picks:
        alg.handle_pick("a", issue, now=0.0)
        alg.handle_pick("b", issue, now=0.0)
    assert alg.inflation.get("a", 0.0) == alg.inflation.get("b", 0.0)
    for issue in ISSUES:
        score_a, score_b = alg.score("a", issue), alg.score("b", issue)
        assert score_a is not None and score_b is not None
        assert score_a >= score_b
        ranked = [n for n, _ in alg.rank(issue, k=2, now=0.0)]
        if score_a > score_b:
            assert ranked == ["a", "b"]
        else:  # a tie goes to the first name, which is a's
            assert ranked[0] == "a"


@pytest.mark.parametrize("name", algorithm_names())
@settings(max_examples=60, deadline=None)
@given(sequence=ops)
def test_ranking_returns_distinct_eligible_origins_never_an_excluded_one(
    name: str, sequence: list[tuple[object, ...]]
) -> None:
    def check(alg: ScoringAlgorithm, op: tuple[object, ...]) -> None:
        if op[0] != "rank":
            return
        _, issue, exclude, k = op
        assert isinstance(issue, str) and isinstance(exclude, frozenset) and isinstance(k, int)
        ranked = [n for n, _ in alg.rank(issue, exclude=exclude, k=k, now=0.0)]
        if isinstance(alg, ScoredAlgorithm):  # may skip holders (e.g. mist's FULL rule)
            eligible = {n for n, s in alg.statuses.items() if alg.eligible(n, s, issue)}
        else:
            eligible = {n for n, s in alg.statuses.items() if issue in s.issues}
        eligible -= exclude
        assert len(ranked) == len(set(ranked))
        assert set(ranked) <= eligible
        assert len(ranked) == min(k, len(eligible))

    run_ops(weighted_algorithm(name), sequence, check)


SCORED = [n for n in algorithm_names() if issubclass(type(weighted_algorithm(n)), ScoredAlgorithm)]


@pytest.mark.parametrize("name", SCORED)
@settings(max_examples=60, deadline=None)
@given(sequence=ops)
def test_lazy_heap_ranking_equals_a_brute_force_sort(
    name: str, sequence: list[tuple[object, ...]]
) -> None:
    def check(alg: ScoringAlgorithm, op: tuple[object, ...]) -> None:
        # Only at "rank" ops: ranking drops stale heap entries, so checking after every
        # op would clean up the very states a bug needs (e.g. two live copies).
        if op[0] != "rank":
            return
        assert isinstance(alg, ScoredAlgorithm)
        for issue in ISSUES:
            for exclude in (frozenset(), frozenset({"a", "c"})):
                brute = sorted(
                    (
                        (-alg.compute_score(n, s, issue), n)
                        for n, s in alg.statuses.items()
                        if n not in exclude and alg.eligible(n, s, issue)
                    ),
                )
                expected = [(n, -neg) for neg, n in brute[:3]]
                assert alg.rank(issue, exclude=exclude, k=3, now=0.0) == expected

    run_ops(weighted_algorithm(name), sequence, check)


def test_an_origin_rescored_back_to_an_old_score_is_ranked_once() -> None:
    # Regression (lazy heap): a at 0 connections is indexed, picked (-1), refreshed
    # back to 0 before any ranking dropped its first entry: two live (0, a) entries.
    alg = algorithm("lc", ("a", "b"))
    alg.handle_status(status("a", active=0), now=0.0)
    alg.handle_status(status("b", active=1), now=0.0)
    assert [n for n, _ in alg.rank("i", now=0.0)] == ["a", "b"]
    alg.handle_pick("a", "i", now=0.0)
    alg.handle_status(status("a", active=0), now=1.0)
    assert [n for n, _ in alg.rank("i", now=1.0)] == ["a", "b"]
    # the same after a down/up with an unchanged status
    alg.handle_origin_down("a", now=2.0)
    alg.handle_status(status("a", active=0), now=3.0)
    assert [n for n, _ in alg.rank("i", now=3.0)] == ["a", "b"]


def test_the_registry_knows_every_algorithm_of_the_issue() -> None:
    assert {"alg1", "alg2", "rr", "wrr", "lc", "wlc", "weighted"} <= set(algorithm_names())
    with pytest.raises(KeyError, match="choose one of"):
        make_algorithm("nope", specs(("a",)), random.Random(0))
