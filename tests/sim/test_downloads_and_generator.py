"""Issue 10: the download workload, per-issue headroom, the generator and the tournament."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from balancer.fake_origin import start_fake_origin
from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import OriginSpec, OriginStatus
from pressrun.cli import main
from pressrun.sim.generate import generate_scenario, generate_scenarios, run_entry
from pressrun.sim.metrics import capacity_bound, summarize
from pressrun.sim.model import AssetSpec, Client, Server, ServerSpec
from pressrun.sim.run import run_scenario
from pressrun.sim.scenario import ScenarioError, parse_scenario

DOCS = Path(__file__).resolve().parents[2] / "docs"

# --- the download model ---------------------------------------------------------------


def test_downloads_share_a_link_max_min_fairly_up_to_their_access_rates() -> None:
    spec = ServerSpec("s", cores=64, link_bytes_per_s=10e6, cache_miss_cpu_factor=1.0)
    server = Server(spec, random.Random(1))
    issue = AssetSpec("i", download_bytes=40e6, deadline_s=60.0)
    slow = Client(0, issue, 0.0, access_bytes_per_s=2e6)
    fast = Client(1, issue, 0.0, access_bytes_per_s=100e6)
    server.add(slow, 0.0)
    server.add(fast, 0.0)
    assert slow.flow is not None and fast.flow is not None
    assert slow.flow.rate == pytest.approx(2e6)  # its own link holds it back
    assert fast.flow.rate == pytest.approx(8e6)  # the rest of the server's link
    assert server.out_bytes_per_s() == pytest.approx(10e6)
    delay, first = server.next_download_end() or (0.0, None)
    assert first is fast and delay == pytest.approx(5.0)  # 40 MB at 8 MB/s


def test_a_stream_and_downloads_on_one_link() -> None:
    spec = ServerSpec("s", cores=64, link_bytes_per_s=1e6, cache_miss_cpu_factor=1.0)
    server = Server(spec, random.Random(1))
    stream = Client(0, AssetSpec("v", bitrate_bytes_per_s=100e3), 0.0)
    download = Client(1, AssetSpec("i", download_bytes=1e6), 0.0, access_bytes_per_s=10e6)
    server.add(stream, 0.0)
    server.add(download, 0.0)
    assert stream.flow is not None and download.flow is not None
    assert stream.flow.rate == pytest.approx(100e3)  # under the fair level: all it needs
    assert download.flow.rate == pytest.approx(900e3)
    assert server.phi < 1.0  # the download takes less than its access link


DOWNLOADS = """
name = "downloads"
duration_s = 200
[clients]
access_bytes_per_s = [1e6, 4e6]
access_weights = [1, 1]
[[servers]]
name = "only"
link_bytes_per_s = 20e6
cores = 64
[[assets]]
name = "issue"
size_bytes = 40e6
deadline_s = 30
[[arrivals]]
kind = "burst"
count = 4
at_s = 1.0
"""


def test_a_download_succeeds_when_it_ends_within_its_deadline() -> None:
    result = run_scenario(parse_scenario(DOWNLOADS), "headroom", 3)
    s = summarize(result)
    for c in result.clients:
        took = (c.ended_at or 0.0) - c.requested_at
        # 40 MB over a 1 MB/s access link takes 40 s > 30 s; over 4 MB/s 10 s.
        if c.access_bytes_per_s == 1e6:
            assert c.state.value == "failed" and took == pytest.approx(40.0, abs=0.5)
        else:
            assert c.state.value == "done" and took == pytest.approx(10.0, abs=0.5)
    assert s["capacity"]["bound_clients"] == s["successful"]  # slow links cannot succeed


def test_download_fields_are_checked() -> None:
    with pytest.raises(ScenarioError, match="size_bytes: must be > 0"):
        parse_scenario(DOWNLOADS.replace("size_bytes = 40e6", "size_bytes = 0"))
    with pytest.raises(ScenarioError, match="one weight per access_bytes_per_s"):
        parse_scenario(DOWNLOADS.replace("access_weights = [1, 1]", "access_weights = [1]"))


# --- headroom per issue -----------------------------------------------------------------


def _streaming(name: str, by_issue: dict[str, float], counts: dict[str, int]) -> OriginStatus:
    n = sum(counts.values())
    out = sum(by_issue[i] * k for i, k in counts.items())
    return OriginStatus(
        name, 0.1, 0.1, out, 125e6, n, frozenset({"low", "high"}), frozenset(),
        out / n, by_issue, counts,
    )  # fmt: skip


@pytest.mark.parametrize("told_needs", [False, True])
def test_headroom_judges_each_issue_by_its_own_rate(told_needs: bool) -> None:
    # Issue 10's collapse: "low" streams at 64 kB/s on one origin, "high" at 2.5 MB/s on
    # another. A single rate per origin (the highest seen) calls the first under-served.
    alg = make_algorithm(
        "headroom", [OriginSpec("a", ""), OriginSpec("b", "")], random.Random(1),
        {"need_bytes_per_s": 0.0},
    )  # fmt: skip
    if told_needs:
        alg.set_issue_need("low", 64e3, paced=True)
        alg.set_issue_need("high", 2.5e6, paced=True)
    for t in (0.0, 1.0, 2.0):
        alg.handle_status(_streaming("a", {"low": 64e3}, {"low": 100}), now=t)
        alg.handle_status(_streaming("b", {"high": 2.5e6}, {"high": 10}), now=t)
    assert not alg.models["a"].under_served  # type: ignore[attr-defined]
    assert alg.models["a"].learned_bytes_per_s is None  # type: ignore[attr-defined]
    assert alg.free_slots("a", alg.statuses["a"], "low") > 100  # type: ignore[attr-defined]
    # ... and a real shortfall is still seen: "low" at half its rate.
    alg.handle_status(_streaming("a", {"low": 32e3}, {"low": 100}), now=3.0)
    assert alg.models["a"].under_served  # type: ignore[attr-defined]


def _paced(told: float, needs: dict[str, float]) -> Any:
    alg = make_algorithm("headroom", [OriginSpec("a", "")], random.Random(1))
    for issue, need in needs.items():
        alg.set_issue_need(issue, need, paced=True)
    idle = OriginStatus("a", 0.05, 0.05, 0.0, told, 0, frozenset(needs), frozenset())
    alg.handle_status(idle, now=0.0)
    return alg


def _load(
    told: float, out: float, by_issue: dict[str, float], counts: dict[str, int], cpu: float = 0.1
) -> OriginStatus:
    n = sum(counts.values())
    return OriginStatus(
        "a", cpu, 0.1, out, told, n, frozenset({"low", "high"}), frozenset(),
        out / n, by_issue, counts,
    )  # fmt: skip


def test_headroom_admits_a_small_stream_where_max_min_sharing_still_serves_it() -> None:
    # 10 MB/s told and real, four 2.5 MB/s streams fill it: full for another 2.5 MB/s
    # stream, but a 64 kB/s one gets its rate under max-min sharing (only the big ones
    # are squeezed, by 64 kB/s): (9.5 MB/s - 4 x 64 kB/s) / 64 kB/s slots.
    alg = _paced(10e6, {"low": 64e3, "high": 2.5e6})
    alg.handle_status(_load(10e6, 10e6, {"high": 2.5e6}, {"high": 4}), now=1.0)
    assert alg.free_slots("a", alg.statuses["a"], "high") < 1.0
    assert alg.rank("high", now=1.0) == []
    assert alg.free_slots("a", alg.statuses["a"], "low") >= 1.0
    assert [name for name, _ in alg.rank("low", now=1.0)] == ["a"]


def test_headroom_starving_big_streams_still_takes_small_ones() -> None:
    # The link gives 1 MB/s to each stream: the 2.5 MB/s ones starve, the 64 kB/s ones
    # get their rate. No more big ones there; small ones still fit.
    alg = _paced(10e6, {"low": 64e3, "high": 2.5e6})
    counts = {"high": 9, "low": 10}
    alg.handle_status(_load(10e6, 9.64e6, {"high": 1e6, "low": 64e3}, counts), now=1.0)
    assert alg.models["a"].level == 1e6
    assert alg.rank("high", now=1.0) == []
    assert [name for name, _ in alg.rank("low", now=1.0)] == ["a"]


def test_headroom_counts_a_download_beside_streams_at_their_bitrate() -> None:
    # 10 MB/s: two 2.5 MB/s streams and ten downloads needing 0.1 MB/s each (5 MB/s
    # committed). Elastic downloads take the max-min level, not their need: each counts
    # 2.5 MB/s beside the streams, so the link is at 12 x 2.5 MB/s already, and neither
    # another stream nor another download may go there (issue 10, gen-7-005). Without
    # the streams the same downloads leave room for 85 more.
    alg = _paced(10e6, {"high": 2.5e6})
    alg.set_issue_need("low", 0.1e6)  # a download (elastic)
    mixed = _load(10e6, 10e6, {"high": 0.5e6, "low": 0.5e6}, {"high": 2, "low": 10})
    alg.handle_status(mixed, now=1.0)
    assert alg.free_slots("a", alg.statuses["a"], "high") < 1.0
    assert alg.free_slots("a", alg.statuses["a"], "low") < 1.0
    assert alg.rank("low", now=1.0) == []
    alone = _load(10e6, 10e6, {"low": 1e6}, {"low": 10})
    alg.handle_status(alone, now=2.0)
    assert alg.free_slots("a", alg.statuses["a"], "low") == pytest.approx(85.0)
    # one stream picked there since the status: the downloads count at its bitrate
    alg.handle_pick("a", "high", now=2.5)
    assert alg.free_slots("a", alg.statuses["a"], "low") < 1.0
    assert alg.free_slots("a", alg.statuses["a"], "high") < 1.0  # 12 x 2.5 > 9.5


def test_headroom_counts_a_download_at_its_need_where_the_downloads_lead() -> None:
    # 312.5 MB/s: one 1.25 MB/s stream beside 250 downloads needing 0.5 MB/s (125 MB/s).
    # Counted at the stream's bitrate the downloads fill the link (251 x 1.25 > 0.95 x
    # 312.5); but the stream needs under half of what the downloads need, so a download
    # counts its need: (296.9 - 1.25 - 125) / 0.5 more (issue 10, gen-13-064: 1246
    # served of a bound of 1485, 1488 so).
    alg = _paced(312.5e6, {"high": 1.25e6})
    alg.set_issue_need("low", 0.5e6)  # a download (elastic)
    mixed = _load(312.5e6, 312.5e6, {"high": 1.25e6, "low": 1.33e6}, {"high": 1, "low": 250})
    alg.handle_status(mixed, now=1.0)
    free = (0.95 * 312.5e6 - 1.25e6 - 250 * 0.5e6) / 0.5e6
    assert alg.free_slots("a", alg.statuses["a"], "low") == pytest.approx(free)
    # ... and where the streams lead (here: `level_share` 0.01, 1.25 >= 1.175 MB/s), the
    # downloads count at the stream's bitrate
    led = make_algorithm("headroom", [OriginSpec("a", "")], random.Random(1), {"level_share": 0.01})
    led.set_issue_need("high", 1.25e6, paced=True)
    led.set_issue_need("low", 0.5e6)
    led.handle_status(
        OriginStatus("a", 0.05, 0.05, 0.0, 312.5e6, 0, frozenset(), frozenset()), now=0.0
    )
    led.handle_status(mixed, now=1.0)
    assert led.free_slots("a", led.statuses["a"], "low") < 1.0


def test_headroom_does_not_probe_a_link_saturated_by_downloads_upwards() -> None:
    # Told 100 MB/s, really 50: downloads needing 0.5 MB/s each fill it. Once it is seen
    # short, the learned 50 MB/s stays while it sends exactly that, whatever it holds.
    alg = make_algorithm("headroom", [OriginSpec("a", "")], random.Random(1))
    alg.set_issue_need("low", 0.5e6)
    idle = OriginStatus("a", 0.05, 0.05, 0.0, 100e6, 0, frozenset({"low"}), frozenset())
    alg.handle_status(idle, now=0.0)
    full = OriginStatus(
        "a", 0.2, 0.1, 50e6, 100e6, 110, frozenset({"low"}), frozenset(), 50e6 / 110,
        {"low": 50e6 / 110}, {"low": 110},
    )  # fmt: skip
    alg.handle_status(full, now=1.0)  # 55 MB/s needed, 50 sent, each below its need
    assert alg.models["a"].learned_bytes_per_s == 50e6
    for t in range(2, 12):  # 96 left: 48 MB/s needed, the link still at 50 MB/s
        steady = OriginStatus(
            "a", 0.2, 0.1, 50e6, 100e6, 96, frozenset({"low"}), frozenset(), 50e6 / 96,
            {"low": 50e6 / 96}, {"low": 96},
        )  # fmt: skip
        alg.handle_status(steady, now=float(t))
    assert alg.models["a"].learned_bytes_per_s == 50e6
    assert alg.rank("low", now=12.0) == []  # 47.5 MB/s room, 48 committed


def test_headroom_never_shuts_out_an_origin_on_misleading_readings() -> None:
    # The soak test's origins on a loaded machine: the whole machine's CPU at 100 % with
    # no transfer, and small downloads read slowly by the clients (0.4 MB/s each against
    # the default 1 MB/s need). The forecast says full; the origin still takes
    # probe_transfers (10), and not one more.
    alg = make_algorithm("headroom", [OriginSpec("o", "")], random.Random(1))
    for t, n in ((0.0, 0), (1.0, 3), (2.0, 0), (3.0, 3)):
        status = OriginStatus(
            "o", 1.0, 0.1, 0.4e6 * n, 125e6, n, frozenset({"i"}), frozenset(),
            0.4e6 if n else None, {"i": 0.4e6} if n else {},
        )  # fmt: skip
        alg.handle_status(status, now=t)
    assert alg.models["o"].learned_bytes_per_s is not None  # learned at what they took
    for k in range(7):
        assert [name for name, _ in alg.rank("i", now=3.5)] == ["o"], k
        alg.handle_pick("o", "i", now=3.5)
    assert alg.rank("i", now=3.5) == []  # 3 + 7 = probe_transfers


async def test_the_service_refuses_quickly_with_retry_after_when_every_origin_is_full() -> None:
    # a 10 MB/s origin with 10 downloads holds no 1 MB/s more.
    busy = dict(
        out_bytes_per_s=10e6,
        capacity_bytes_per_s=10e6,
        active_transfers=10,
        mean_transfer_bytes_per_s=1e6,
        mean_transfer_bytes_per_s_by_issue={"i": 1e6},
    )
    origin = await start_fake_origin("o", ["i"], {}, **busy)
    running = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("o", origin.url),),
            balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=0.7, algorithm="headroom"),
        )
    )
    try:
        await running.wait_until_up(1, timeout_s=5.0)
        assert running.core.algorithm.name == "headroom"
        async with aiohttp.ClientSession() as http:
            start = time.perf_counter()
            async with http.get(f"{running.url}/v1/issues/i/directive") as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "2"
                assert "full" in (await resp.json())["error"]
            assert time.perf_counter() - start < 1.0
            origin.stats.update(active_transfers=2, out_bytes_per_s=2e6)
            await asyncio.sleep(0.5)
            async with http.get(f"{running.url}/v1/issues/i/directive") as resp:
                assert resp.status == 200  # room again: admitted
    finally:
        await running.stop()
        await origin.stop()


# --- the generator ----------------------------------------------------------------------


def test_generated_scenarios_cover_the_issue_ranges_and_are_reproducible() -> None:
    scenarios = generate_scenarios(60, 2026)
    assert generate_scenario(2026, 7) == scenarios[7]  # scenario k whatever N
    servers = [len(s.servers) for s in scenarios]
    assets = [len(s.assets) for s in scenarios]
    assert min(servers) >= 3 and max(servers) <= 50 and max(servers) >= 30
    assert min(assets) >= 1 and max(assets) <= 200 and max(assets) >= 100
    links = {sv.link_bytes_per_s for s in scenarios for sv in s.servers}
    assert min(links) == 12.5e6 and max(links) == 5e9  # 100 Mbit/s .. 40 Gbit/s
    flat = [sv for s in scenarios for sv in s.servers]
    assert any(sv.told_bytes_per_s is not None for sv in flat)  # misconfigured
    assert any(sv.cpu_idle >= 0.2 for sv in flat)  # busy
    assert sum(1 for s in scenarios if s.failures) >= 10  # failing and returning
    kinds = {a.is_download for s in scenarios for a in s.assets}
    assert kinds == {True, False}
    patterns = {spec["kind"] for s in scenarios for spec in s.arrival_specs}
    assert patterns == {"rate", "waves", "burst"}  # flash crowds are decaying rates
    assert any("flash" in s.description for s in scenarios)
    assert any(float(s.description.split(" at ")[1].split("x")[0]) > 1.0 for s in scenarios)


def test_the_bound_is_at_least_what_served_and_counts_slow_links_out() -> None:
    scenario = parse_scenario(DOWNLOADS)
    result = run_scenario(scenario, "alg2", 3)
    bound = capacity_bound(scenario, result)
    assert bound["bound_clients"] == sum(1 for c in result.clients if c.access_bytes_per_s > 1e6)


def _tournament_record() -> dict[str, Any]:
    path = DOCS / "tournament-2026.json"
    return dict(json.loads(path.read_text(encoding="utf-8")))


@pytest.mark.slow
def test_twenty_tournament_scenarios_default_reaches_the_bound_and_beats_alg2() -> None:
    # 20 of the tournament's 200 scenarios (docs/tournament.md): 18 spread over them and
    # the two the default once lost to alg2 (gen-2026-016, gen-2026-021). The other
    # algorithms' counts are the recorded ones (the same code and seeds give the same
    # numbers: the default's recorded count is checked too).
    default = BalancerConfig().algorithm
    record = _tournament_record()
    names = sorted(record["scenarios"])
    assert len(names) == 200
    picked = sorted(set(names[::11][:18]) | {"gen-2026-016", "gen-2026-021"})
    assert len(picked) == 20
    near_best = 0
    below_alg2: list[str] = []
    for name in picked:
        row = record["scenarios"][name]
        index = int(name.rsplit("-", 1)[1])
        ours = run_entry(generate_scenario(record["seed"], index), default, 1)
        assert ours.successful == row["served"][default], name
        assert ours.successful >= 0.9 * ours.bound, (name, ours)
        if ours.successful < row["served"]["alg2"]:
            below_alg2.append(name)
        near_best += ours.successful >= 0.98 * max(row["served"].values())
    assert near_best >= 19  # 95 %
    assert below_alg2 == []


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "index"), [(7, 33), (13, 64), (17, 99)])
def test_the_fifth_round_misses_reach_the_bound_and_beat_alg2(seed: int, index: int) -> None:
    # docs/tournament.md, the fifth round: gen-7-033 (a misconfigured origin believed at
    # its told link took the clients a failed origin dropped: 280 of a bound of 344,
    # alg2 301) and gen-13-064 (one stream beside 235 downloads held them at its
    # bitrate: 1246 of 1485, alg2 1297), both below 0.9 of the bound before; the sixth:
    # gen-17-099 (a 5 GB/s origin learned at what its 10-50 Mbit/s clients took: 674 of
    # 732, alg2 719).
    default = BalancerConfig().algorithm
    record = json.loads((DOCS / f"tournament-{seed}.json").read_text(encoding="utf-8"))
    row = record["scenarios"][f"gen-{seed}-{index:03d}"]
    ours = run_entry(generate_scenario(seed, index), default, 1)
    assert ours.successful == row["served"][default]
    assert ours.bound == row["bound"]
    assert ours.successful >= 0.9 * ours.bound
    assert ours.successful >= row["served"]["alg2"]


@pytest.mark.slow
def test_a_client_that_cannot_finish_in_time_leaves_the_room_to_one_that_can() -> None:
    # docs/tournament.md, the sixth round: gen-13-039, the 5 GB/s origin of three fails
    # with 163 clients on it and 291 more to come; the survivors cannot carry everyone.
    # Refusing, while refusing already, the clients that cannot finish at the rate they
    # would get: 656 to 684, within 2 % of the best other (p2c 689). Issue 33's crowd
    # rules (the demand over the deadline says overload after the failure): 699; with
    # reserved starts (the survivors' queue, clients told when to come back): 727; with
    # starts ahead of the queue where no turn ends in time (issue 33, the earlier seeds): 731;
    # with turns taken by downloads 3x smaller than a waiting one: 750.
    default = BalancerConfig().algorithm
    record = json.loads((DOCS / "tournament-13.json").read_text(encoding="utf-8"))
    row = record["scenarios"]["gen-13-039"]
    ours = run_entry(generate_scenario(13, 39), default, 1)
    assert ours.successful == row["served"][default] == 750
    assert ours.successful >= 0.98 * max(row["served"].values())
    assert ours.successful > row["served"]["alg2"]


@pytest.mark.slow
def test_seed_7_mixed_burst_default_keeps_the_streams_level() -> None:
    # docs/tournament.md, seed 7: a burst of 1500 downloads and 2.5 MB/s streams at 1.19x
    # capacity. Counting the downloads at their own small need let 614 of them starve
    # 160 streams on one origin (977 served of a bound of 1247); at the streams' bitrate,
    # the default reaches the bound and more (the bound admits in arrival order).
    default = BalancerConfig().algorithm
    record = json.loads((DOCS / "tournament-7.json").read_text(encoding="utf-8"))
    row = record["scenarios"]["gen-7-005"]
    ours = run_entry(generate_scenario(7, 5), default, 1)
    assert ours.successful == row["served"][default]
    assert ours.bound == row["bound"] == 1247
    assert ours.successful >= ours.bound
    assert ours.successful > max(n for alg, n in row["served"].items() if alg != default)


@pytest.mark.slow
def test_seed_7_clients_that_tell_what_they_lack_fit_after_a_failure() -> None:
    # docs/tournament.md, "What a client tells": gen-7-033 (the biggest of 3 servers fails
    # 32 s into a burst of 483 downloads) and gen-7-056 (two misconfigured 125 MB/s
    # origins). The recorded counts, and what the same clients get when they tell the
    # balancer nothing (`tells_balancer = false`): the third round's 236; 632 for 056
    # since the sixth round (628 before: the full-link test now sees its misconfigured
    # origins, which carry streams too, without the clients' help).
    default = BalancerConfig().algorithm
    record = json.loads((DOCS / "tournament-7.json").read_text(encoding="utf-8"))
    for index, silent in ((33, 236), (56, 632)):
        scenario = generate_scenario(7, index)
        row = record["scenarios"][scenario.name]
        ours = run_entry(scenario, default, 1)
        assert ours.successful == row["served"][default]
        quiet = dataclasses.replace(
            scenario, clients=dataclasses.replace(scenario.clients, tells_balancer=False)
        )
        assert run_entry(quiet, default, 1).successful == silent
        assert ours.successful > silent if index == 33 else ours.successful == silent
    assert record["scenarios"]["gen-7-056"]["served"][default] == 632  # the bound, = alg2


def test_cli_tournament_in_slices_merges_into_one_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sim", "balancer", "--generate", "4", "--seed", "19", "--algorithm", "rr"]
    assert main([*base, "--scenarios", "0:1", "--out", str(tmp_path)]) == 0
    assert main([*base, "--scenarios", "3:4", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "tournament-19.json").read_text(encoding="utf-8"))
    assert sorted(record["scenarios"]) == ["gen-19-000", "gen-19-003"]
    assert set(record["scenarios"]["gen-19-003"]["served"]) == {"rr"}
    capsys.readouterr()
    assert main(["sim", "balancer", "--report", str(tmp_path / "tournament-19.json")]) == 0
    table = capsys.readouterr().out
    assert "2 generated scenarios, seed 19" in table and "rr" in table
    # bad slices and records are refused with a clear message, nothing written
    for bad in ("2:2", "0:5", "x:1", "3"):
        assert main([*base, "--scenarios", bad]) == 2
        assert "--scenarios wants A:B" in capsys.readouterr().err
    other = ["sim", "balancer", "--generate", "1", "--seed", "20", "--algorithm", "rr"]
    (tmp_path / "tournament-20.json").write_text('{"seed": 19, "scenarios": {}}')
    assert main([*other, "--out", str(tmp_path)]) == 2
    assert "another seed" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert main(["sim", "balancer", "--report", str(tmp_path / "junk.json")]) == 2
    assert "not a tournament record" in capsys.readouterr().err


def test_cli_generate_runs_a_small_tournament(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "balancer", "--generate", "1", "--seed", "19", "--algorithm", "headroom,rr"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "within 2%" in captured.out and "headroom" in captured.out
    assert "[2/2]" in captured.err  # progress
    assert main(["sim", "balancer", "--generate", "1", "--algorithm", "nope"]) == 2
