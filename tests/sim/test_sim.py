"""Simulator tests: reproducibility, the real balancer core, calibration, scenarios, CLI."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.balancer.algorithms import algorithm_class, make_algorithm
from pressrun.balancer.algorithms.alg1 import Alg1
from pressrun.balancer.algorithms.alg2 import Alg2
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import OriginSpec, OriginStatus
from pressrun.cli import main
from pressrun.sim.engine import EventLoop
from pressrun.sim.metrics import summarize
from pressrun.sim.model import AssetSpec, Client, Server, ServerSpec
from pressrun.sim.run import Simulation, run_scenario
from pressrun.sim.scenario import ScenarioError, builtin_names, load_scenario, parse_scenario

PAPER = {  # Tables 1-5 of 000_9aae53f3113e9bd8.txt: successful clients, (alg2, alg1)
    "trickle": (1500, 1500),
    "waves": (1138, 1012),
    "burst": (847, 191),
    "waves-2": (1500, 1300),
    "burst-2": (1500, 199),
}


def run(scenario: str, algorithm: str, seed: int = 1) -> dict[str, Any]:
    return summarize(run_scenario(load_scenario(scenario), algorithm, seed))


# --- the engine -----------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(times=st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=60))
def test_events_run_in_time_order_and_fifo_at_equal_times(times: list[float]) -> None:
    loop = EventLoop()
    seen: list[tuple[float, int]] = []
    for i, t in enumerate(times):
        loop.at(t, lambda i=i: seen.append((loop.now, i)))
    loop.run(until=1000.0)
    assert len(seen) == len(times)
    expected = sorted(((t, i) for i, t in enumerate(times)), key=lambda x: (x[0], x[1]))
    assert seen == expected


# --- the model --------------------------------------------------------------------


def test_clients_share_a_saturated_link_and_stall_by_the_missing_fraction() -> None:
    spec = ServerSpec("s", cores=64, link_bytes_per_s=1000.0, cache_miss_cpu_factor=1.0)
    server = Server(spec, random.Random(1))
    asset = AssetSpec("a", bitrate_bytes_per_s=100.0)
    clients = [Client(i, asset, 0.0) for i in range(20)]
    for c in clients:
        server.add(c, 0.0)
    assert server.phi == pytest.approx(0.5)  # 2000 B/s wanted, 1000 B/s of link
    assert server.out_bytes_per_s() == pytest.approx(1000.0)
    stall = server.remove(clients[0], 10.0)
    assert stall == pytest.approx(5.0)  # half of every second missing, for 10 s
    assert server.bytes_out == pytest.approx(10_000.0)


def test_cpu_bound_server_delivers_what_its_free_cores_allow() -> None:
    spec = ServerSpec(
        "s", cores=1, cpu_idle=0.5, cpu_per_client_cores=0.1, cache_miss_cpu_factor=1.0
    )
    server = Server(spec, random.Random(1))
    asset = AssetSpec("a", bitrate_bytes_per_s=100.0)
    for i in range(10):  # 1 core of demand, 0.5 free
        server.add(Client(i, asset, 0.0), 0.0)
    assert server.phi == pytest.approx(0.5)
    assert server.cpu_fraction() == pytest.approx(1.0)


def test_status_reports_what_the_agent_of_the_paper_reports() -> None:
    spec = ServerSpec("c", link_bytes_per_s=1000.0, told_bytes_per_s=10_000.0)
    server = Server(spec, random.Random(1))
    asset = AssetSpec("a", bitrate_bytes_per_s=100.0)
    for i in range(20):
        server.add(Client(i, asset, 0.0), 0.0)
    status = server.status(frozenset({"a"}))
    assert isinstance(status, OriginStatus)
    assert status.capacity_bytes_per_s == 10_000.0  # what it was told, not the truth
    assert status.out_bytes_per_s == pytest.approx(1000.0)
    assert status.active_transfers == 20
    assert status.mean_transfer_bytes_per_s == pytest.approx(50.0)
    assert status.mean_transfer_bytes_per_s_by_issue == {"a": pytest.approx(50.0)}


# --- the simulator drives the real balancer core ------------------------------------


def test_simulation_builds_the_service_classes_not_copies() -> None:
    sim = Simulation(load_scenario("burst"), "alg2", 1)
    assert type(sim.core) is BalancerCore
    assert type(sim.algorithm) is Alg2
    assert type(sim.algorithm) is algorithm_class("alg2")
    assert sim.core.algorithm is sim.algorithm
    assert type(Simulation(load_scenario("burst"), "alg1", 1).algorithm) is Alg1


def test_patching_the_balancers_alg2_changes_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = run("burst", "alg2")
    # A copy of the scoring in the simulator would not see these patches.
    monkeypatch.setattr(Alg2, "compute_score", lambda self, name, status, issue: -ord(name[0]))
    patched = run("burst", "alg2")
    assert patched["machines"] != before["machines"]
    # Score by name only, on every path Alg2 scores through: "A" always wins.
    monkeypatch.setattr(Alg2, "base_score", lambda self, name, status: -ord(name[0]))
    only_a = run("burst", "alg2")
    assert only_a["machines"][0]["clients_total"] == 1500


def test_balancer_sees_stale_status_between_polls() -> None:
    sim = Simulation(load_scenario("burst"), "alg1", 1)
    seen: list[tuple[float, int]] = []
    original = sim.core.handle_status_received

    def spy(msg: Any, *, now: float) -> list[Any]:
        if msg.status.name == "A":
            seen.append((now, msg.status.active_transfers))
        return original(msg, now=now)

    sim.core.handle_status_received = spy  # type: ignore[method-assign]
    sim.run()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= 1.0  # one status per poll interval, not per event
    # During the burst (t 10.98 .. 11.98) A's count jumps between two refreshes.
    assert any(b[1] - a[1] > 100 for a, b in itertools.pairwise(seen))


# --- reproducibility --------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "algorithm"), [("burst", "alg2"), ("zipf-50", "p2c")])
def test_same_seed_same_numbers(scenario: str, algorithm: str) -> None:
    assert run(scenario, algorithm, 7) == run(scenario, algorithm, 7)


def test_another_seed_draws_other_numbers() -> None:
    a, b = run("zipf-50", "p2c", 1), run("zipf-50", "p2c", 2)
    assert a["machines"] != b["machines"]


# --- calibration against the paper ----------------------------------------------------


@pytest.mark.parametrize("scenario", list(PAPER))
def test_alg2_and_alg1_reproduce_the_papers_successful_clients(scenario: str) -> None:
    for algorithm, expected in zip(("alg2", "alg1"), PAPER[scenario], strict=True):
        s = run(scenario, algorithm)
        assert abs(s["successful"] - expected) <= 0.15 * expected, (algorithm, s["successful"])
        c_crashes = s["machines"][2]["crashes"]
        if scenario.startswith("burst") and algorithm == "alg1":
            assert c_crashes >= 1  # section 8 and 10: C crashes under Algorithm 1
        else:
            assert c_crashes == 0  # never under Algorithm 2 (and not outside the bursts)


@pytest.mark.parametrize("scenario", list(PAPER))
def test_headroom_serves_every_client_of_the_five_tests(scenario: str) -> None:
    s = run(scenario, "headroom")
    assert s["successful"] == s["clients"] == 1500
    assert s["machines"][-1]["crashes"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["mixed-20", "zipf-50", "failure"])
def test_headroom_is_not_worse_than_alg2_outside_the_paper(scenario: str) -> None:
    ours, theirs = run(scenario, "headroom"), run(scenario, "alg2")
    assert ours["successful"] >= theirs["successful"]


OVERLOAD = """
name = "overload"
duration_s = 200
[[servers]]
name = "only"
link_bytes_per_s = 12.5e6
cores = 64
[[assets]]
name = "a"
bitrate_bytes_per_s = 100000
[[arrivals]]
kind = "burst"
count = 300
at_s = 5.0
spread_s = 1.0
"""


def test_capacity_bound_is_computed_and_headroom_reaches_it() -> None:
    scenario = parse_scenario(OVERLOAD)
    theirs = summarize(run_scenario(scenario, "alg2", 1))
    assert theirs["capacity"]["all_servable"] is False
    assert theirs["capacity"]["bound_clients"] == 125
    assert theirs["successful"] == 0  # everyone on one saturated link: all stall
    ours = summarize(run_scenario(scenario, "headroom", 1, algorithm_params={"u_bw": 1.0}))
    assert ours["successful"] == 125
    default = summarize(run_scenario(scenario, "headroom", 1))
    assert default["successful"] == 118  # u_bw = 0.95 keeps a 5 % margin


# --- algorithms added for the simulator ------------------------------------------------


def _status(name: str, out: float, cap: float, mean: float | None = None) -> OriginStatus:
    return OriginStatus(name, 0.1, 0.1, out, cap, 1, frozenset({"i"}), frozenset(), mean, {})


def test_mist_answers_full_when_bandwidth_plus_inflation_reaches_every_limit() -> None:
    origins = [OriginSpec("a", ""), OriginSpec("b", "")]
    alg = make_algorithm("mist", origins, random.Random(1))
    alg.handle_status(_status("a", 990_000.0, 1_000_000.0), now=0.0)
    alg.handle_status(_status("b", 0.0, 1_000_000.0), now=0.0)
    assert alg.rank("i", now=0.0)[0][0] == "b"
    # 64 KiB/s of inflation per pick: "a" is over its limit after 1 pick, "b" after 16.
    picks = []
    while ranked := alg.rank("i", now=0.0):
        picks.append(ranked[0][0])
        alg.handle_pick(ranked[0][0], "i", now=0.0)
        assert len(picks) <= 17
    assert sorted(picks) == ["a"] + ["b"] * 16
    assert alg.rank("i", now=0.0) == []  # FULL


def test_p2c_draws_from_the_rng_it_is_given() -> None:
    origins = [OriginSpec(n, "") for n in "abcd"]

    def picks(seed: int) -> list[str]:
        alg = make_algorithm("p2c", origins, random.Random(seed))
        for n in "abcd":
            alg.handle_status(_status(n, 0.0, 1e6), now=0.0)
        out = []
        for _ in range(40):
            name = alg.rank("i", now=0.0)[0][0]
            alg.handle_pick(name, "i", now=0.0)
            out.append(name)
        return out

    assert picks(3) == picks(3)
    assert sorted(set(picks(3))) == ["a", "b", "c", "d"]


def test_headroom_learns_a_misconfigured_capacity_from_under_service() -> None:
    alg = make_algorithm(
        "headroom", [OriginSpec("c", "")], random.Random(1), {"need_bytes_per_s": 0.0}
    )
    alg.handle_status(_status("c", 0.0, 125e6), now=0.0)
    by_issue = {"i": 100_000.0}
    healthy = OriginStatus(
        "c", 0.1, 0.1, 5e6, 125e6, 50, frozenset({"i"}), frozenset(), 1e5, by_issue
    )
    alg.handle_status(healthy, now=1.0)
    assert alg.rank("i", now=1.0)  # told 125 MB/s, delivering fine
    starving = OriginStatus(
        "c", 0.3, 0.2, 12.5e6, 125e6, 250, frozenset({"i"}), frozenset(), 5e4, {"i": 5e4}
    )
    alg.handle_status(starving, now=2.0)
    assert alg.rank("i", now=2.0) == []  # it delivers 12.5 MB/s, not 125: full


# --- scenarios ----------------------------------------------------------------------


def test_builtin_scenarios_all_load() -> None:
    names = builtin_names()
    assert {"trickle", "waves", "burst", "waves-2", "burst-2"} <= set(names)
    for name in names:
        assert load_scenario(name).servers


MINIMAL = """
name = "t"
duration_s = 100
[[servers]]
name = "s"
[[assets]]
name = "a"
[[arrivals]]
kind = "rate"
rate_per_s = 1
end_s = 10
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = 'x'\nduration_s = [", "not valid TOML"),
        (MINIMAL.replace("duration_s = 100", ""), "missing required field 'duration_s'"),
        (MINIMAL + "\nbogus = 1\n", "unknown field(s) bogus"),
        (MINIMAL.replace('kind = "rate"', 'kind = "tide"'), "must be one of"),
        (MINIMAL.replace("rate_per_s = 1", "rate_per_s = -1"), "must be > 0"),
        (MINIMAL.replace('name = "s"', 'name = "s"\nassets = ["nope"]'), "unknown asset(s) nope"),
        (MINIMAL.replace('name = "s"', 'name = "s"\ncores = "many"'), "must be a number"),
        (MINIMAL + '\n[[failures]]\nserver = "zz"\ndown_at_s = 1\n', "unknown server 'zz'"),
        (
            MINIMAL + '\n[[failures]]\nserver = "s"\ndown_at_s = 5\nup_at_s = 2\n',
            "must be after down_at_s",
        ),
        (MINIMAL.replace('[[assets]]\nname = "a"', ""), "[[assets]]"),
        (MINIMAL + '\n[popularity]\nlaw = "pareto"\n', "popularity.law"),
    ],
)
def test_scenario_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, source="t.toml")
    assert message in str(err.value)
    assert str(err.value).startswith("t.toml")


def test_unknown_builtin_lists_the_choices() -> None:
    with pytest.raises(ScenarioError, match=r"built-in scenarios: .*burst"):
        load_scenario("no-such-scenario")


def test_common_log_format_replay(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(
        '10.0.0.1 - - [12/Nov/2007:10:00:00 +0000] "GET /issues/a HTTP/1.1" 200 512\n'
        '10.0.0.2 - - [12/Nov/2007:10:00:02 +0000] "GET /issues/b HTTP/1.1" 200 512\n'
        '10.0.0.3 - - [12/Nov/2007:10:00:04 +0000] "GET /other HTTP/1.1" 200 512\n',
        encoding="utf-8",
    )
    text = MINIMAL.replace(
        '[[arrivals]]\nkind = "rate"\nrate_per_s = 1\nend_s = 10',
        '[[arrivals]]\nkind = "log"\npath = "access.log"\ntime_scale = 0.5\nstart_s = 1',
    ).replace('[[assets]]\nname = "a"', '[[assets]]\nname = "a"\n[[assets]]\nname = "b"')
    path = tmp_path / "replay.toml"
    path.write_text(text, encoding="utf-8")
    scenario = load_scenario(str(path))
    arrivals = scenario.arrivals(random.Random(1))
    assert [a.at_s for a in arrivals] == [1.0, 2.0, 3.0]
    assert [a.asset for a in arrivals][:2] == ["a", "b"]
    s = summarize(run_scenario(scenario, "alg2", 1))
    assert s["clients"] == 3 and s["successful"] == 3
    bad = tmp_path / "bad.log"
    bad.write_text("not a log line\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="not a Common Log Format line"):
        parse_scenario(text.replace("access.log", str(bad)))


# --- the command --------------------------------------------------------------------


def test_cli_prints_the_table_and_writes_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "sim",
                "balancer",
                "--scenario",
                "burst",
                "--algorithm",
                "alg2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Avg CPU" in out and "SLB penalty" in out and "EBU" in out
    data = json.loads((tmp_path / "burst-seed1.json").read_text(encoding="utf-8"))
    assert data[0]["algorithm"] == "alg2"
    png = tmp_path / "burst-alg2-seed1.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_all_algorithms_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "balancer", "--scenario", "burst-2", "--algorithm", "all", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d["algorithm"] for d in data} >= {"alg1", "alg2", "mist", "p2c", "headroom"}


def test_cli_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "balancer", "--scenario", "nope", "--algorithm", "alg2"]) == 2
    assert "no built-in scenario 'nope'" in capsys.readouterr().err
    assert main(["sim", "balancer", "--scenario", "burst", "--algorithm", "nope"]) == 2
    assert "unknown algorithm 'nope'" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.floats(min_value=1e3, max_value=1e6)), min_size=1, max_size=40
    )
)
def test_fluid_share_never_exceeds_link_or_cores(ops: list[tuple[bool, float]]) -> None:
    spec = ServerSpec("s", cores=2, cpu_per_client_cores=0.1, link_bytes_per_s=2e6)
    server = Server(spec, random.Random(1))
    active: list[Client] = []
    now = 0.0
    for i, (add, rate) in enumerate(ops):
        now += 1.0
        if add or not active:
            c = Client(i, AssetSpec(f"a{i}", bitrate_bytes_per_s=rate), now)
            server.add(c, now)
            active.append(c)
        else:
            assert server.remove(active.pop(0), now) >= 0.0
        assert 0.0 < server.phi <= 1.0
        assert server.out_bytes_per_s() <= spec.link_bytes_per_s * (1 + 1e-9)
        assert server.cpu_fraction() <= 1.0
        wanted = sum(c.asset.bitrate_bytes_per_s for c in active)
        assert server.out_bytes_per_s() <= wanted * (1 + 1e-9)
        assert sum(f.members for f in server.flows.values()) == len(active)
    assert all(f.stall_u >= 0.0 for f in server.flows.values())


def test_count_expands_and_zipf_weights_fall_as_one_over_rank() -> None:
    text = MINIMAL.replace('[[assets]]\nname = "a"', '[[assets]]\nname = "a"\ncount = 4')
    text = text.replace('[[servers]]\nname = "s"', '[[servers]]\nname = "s"\ncount = 3')
    text += '\n[popularity]\nlaw = "zipf"\ns = 1.0\n'
    scenario = parse_scenario(text)
    assert [s.name for s in scenario.servers] == ["s-1", "s-2", "s-3"]
    assert [a.name for a in scenario.assets] == ["a-1", "a-2", "a-3", "a-4"]
    assert [a.popularity for a in scenario.assets] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])


def test_headroom_with_a_fixed_need_treats_elastic_downloads_as_served() -> None:
    # Downloads run as fast as the link allows: 10 transfers share 10 MB/s. Inferring the
    # need from the fastest transfer seen (1 transfer, 10 MB/s) would call this origin
    # under-served; a fixed need of 0.5 MB/s per transfer says it has room for ~9 more.
    def origin(n: int) -> OriginStatus:
        return OriginStatus(
            "o", 0.1, 0.1, 10e6, 10e6, n, frozenset({"i"}), frozenset(), 10e6 / n, {"i": 10e6 / n}
        )

    inferred = make_algorithm(
        "headroom", [OriginSpec("o", "")], random.Random(1), {"need_bytes_per_s": 0.0}
    )
    fixed = make_algorithm(
        "headroom", [OriginSpec("o", "")], random.Random(1), {"need_bytes_per_s": 0.5e6}
    )
    for alg in (inferred, fixed):
        alg.handle_status(_status("o", 0.0, 10e6), now=0.0)
        alg.handle_status(origin(1), now=1.0)
        alg.handle_status(origin(10), now=2.0)
    assert inferred.rank("i", now=2.0) == []
    assert fixed.rank("i", now=2.0)


def test_a_failed_server_leaves_the_rotation_until_it_answers_again() -> None:
    sim = Simulation(load_scenario("failure"), "alg2", 1)
    failed_polls: list[float] = []
    original = sim.core.handle_poll_failed

    def spy(msg: Any, *, now: float) -> list[Any]:
        effects = original(msg, now=now)
        failed_polls.append(now)
        assert sim.core.origin_states()[msg.name].value == "down"
        return effects

    sim.core.handle_poll_failed = spy  # type: ignore[method-assign]
    result = sim.run()
    # A is down from 400 s to 700 s: its polls fail in that window only.
    assert failed_polls and 400.0 <= min(failed_polls) <= 402.0
    assert max(failed_polls) <= 701.0
    assert sim.core.origin_states()["A"].value == "up"
    assert result.crashes["A"] == 1
