"""Readers behind an AMT relay in the emulation (issue 34): the scenario's
``[amt_readers]``, the compose override that adds the relay and names it (checked by
``docker-compose config`` merging it over docker-compose.yml, and pressrun's own parser
reading the merged commands), the readers' names for the island, and the report's
carousel bytes by path. The real run is ``pressrun emulate --scenario
flash-crowd-amt`` (docs/emulation.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pressrun.balancer.demand import DemandConfig, DemandPolicy
from pressrun.balancer.events import DeliveryMode, SwarmInfo
from pressrun.cli import build_parser
from pressrun.emulate.amt import (
    RELAY_SERVICE,
    SSM_ENV,
    compose_override,
    forwarding_paths,
    host_entries,
    island_addresses,
    multicast_path,
    write_override,
)
from pressrun.emulate.fleet import by_kind, kinds_line
from pressrun.emulate.scenario import AMT, BROWSER, DESKTOP, load_scenario, parse_scenario
from pressrun.sim.scenario import ScenarioError

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """
name = "t"
issue_mb = 2
[[links]]
name = "dsl"
rate = "20mbit"
[[links]]
name = "mobile"
rate = "6mbit"
profile = "mobile"
[[arrivals]]
kind = "burst"
count = 4
at_s = 0
spread_s = 4
[browser_readers]
[[browser_readers.arrivals]]
kind = "burst"
count = 2
at_s = 1
spread_s = 1
[amt_readers]
link = "dsl"
[[amt_readers.arrivals]]
kind = "burst"
count = 3
at_s = 10
spread_s = 2
"""


def test_amt_readers_come_after_the_other_fleets_on_their_link() -> None:
    scenario = parse_scenario(SCENARIO)
    plans = scenario.clients()
    assert [p.kind for p in plans] == [DESKTOP] * 4 + [BROWSER] * 2 + [AMT] * 3
    assert [p.number for p in plans] == list(range(1, 10))
    behind = [p for p in plans if p.kind == AMT]
    assert {p.link.name for p in behind} == {"dsl"}
    assert all(10 <= p.at_s <= 12 for p in behind)
    # the desktop fleet is the same without them
    without = parse_scenario(SCENARIO.split("[amt_readers]")[0]).clients()
    assert [p for p in plans if p.kind != AMT] == without


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('link = "dsl"', 'link = "fibre"'), "no [[links]] named 'fibre'"),
        (('link = "dsl"', "colour = 1"), "unknown key(s) colour"),
        (("[[amt_readers.arrivals]]", "[[amt_readers.other]]"), "unknown key(s) other"),
        (
            ("[[links]]", '[env]\nPRESSRUN_MULTICAST_CONTROL_GROUP = "239.1.1.1:5400"\n[[links]]'),
            "must be in 232.0.0.0/8",
        ),
    ],
)
def test_amt_reader_mistakes_are_named(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(SCENARIO.replace(*change, 1))


def test_the_builtin_amt_scenario_has_readers_behind_the_relay() -> None:
    scenario = load_scenario("flash-crowd-amt")
    assert scenario.amt is not None
    kinds = [p.kind for p in scenario.clients()]
    assert kinds.count(AMT) == 5


def test_fixed_addresses_at_the_top_of_the_island() -> None:
    assert island_addresses("198.18.33.0/24") == ("198.18.33.251", "198.18.33.250")
    with pytest.raises(ValueError, match="/24"):
        island_addresses("198.18.33.0/25")


def _default(text: str) -> str:
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", text)


def test_the_override_names_the_relay_and_the_source_in_every_directive() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    override = compose_override(doc, "198.18.33.0/24")["services"]
    sender = override["multicast"]["command"]
    assert sender[sender.index("--interface") + 1] == "198.18.33.251"
    for name in ("balancer", "balancer-2"):
        command = [_default(str(part)) for part in override[name]["command"]]
        assert command[: len(doc["services"][name]["command"])] == [
            _default(str(p)) for p in doc["services"][name]["command"]
        ]
        args = build_parser().parse_args(command[1:])
        assert args.multicast_source == "198.18.33.251"
        assert args.amt_relay == ["198.18.33.250:2268"]
    relay = override[RELAY_SERVICE]
    args = build_parser().parse_args(relay["command"][1:])
    assert callable(args.func)
    assert relay["networks"] == {"default": {"ipv4_address": "198.18.33.250"}}
    assert relay["image"] == doc["services"]["multicast"]["image"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="needs docker-compose")
def test_compose_merges_the_override_over_the_file(tmp_path: Path) -> None:
    override = write_override(ROOT / "docker-compose.yml", "198.18.33.0/24", tmp_path / "o.yml")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PRESSRUN_")}
    env = {**clean, **SSM_ENV, "PRESSRUN_SUBNET": "198.18.33.0/24"}
    done = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "-f", str(override), "config"],
        env=env, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    merged: dict[str, Any] = yaml.safe_load(done.stdout)["services"]
    assert merged["multicast"]["networks"]["default"]["ipv4_address"] == "198.18.33.251"
    balancer = merged["balancer"]["command"]
    assert balancer[balancer.index("--amt-relay") + 1] == "198.18.33.250:2268"
    group = balancer[balancer.index("--multicast-control-group") + 1]
    assert group == SSM_ENV["PRESSRUN_MULTICAST_CONTROL_GROUP"]
    # the relay joins on its own address, where the sender's datagrams reach it
    relay = merged[RELAY_SERVICE]
    assert relay["command"][relay["command"].index("--interface") + 1] == "198.18.33.250"
    assert relay["depends_on"]["multicast"]["condition"] == "service_healthy"
    # every other service as the file has it
    assert merged["origin-a"]["command"][0] == "pressrun"


def test_readers_behind_the_relay_know_the_island_by_name() -> None:
    args = host_entries({"balancer": "198.18.33.7", "origin-a": "198.18.33.3", "other": "x"})
    assert args == ["--add-host", "balancer:198.18.33.7", "--add-host", "origin-a:198.18.33.3"]
    assert forwarding_paths(["br-abc"]) == [Path("/proc/sys/net/ipv4/conf/br-abc/forwarding")]


def _row(kind: str, multicast: int, note: str | None, peers: int = 0) -> dict[str, Any]:
    return {"kind": kind, "mode": "multicast", "verified": True, "bytes_from_origins": 1_000_000,
            "bytes_from_peers": peers, "bytes_from_multicast": multicast,
            "multicast_note": note, "download_s": 20.0}  # fmt: skip


def test_carousel_bytes_split_by_native_and_through_the_relay() -> None:
    relay_note = "4 channel(s), 12.0 s, 4 at the end, 0 own socket drops, through the AMT relay "
    relay_note += "198.18.33.250:2268, efficiency 0.97; channels over time 0.0:1"
    native_note = "4 channel(s), 11.0 s, 4 at the end, 0 own socket drops; channels over time 0:1"
    rows = [
        _row(AMT, 49_000_000, relay_note),
        _row(AMT, 20_000_000, None, peers=29_000_000),  # a carousel that did not finish
        _row(DESKTOP, 49_000_000, native_note),
        _row(DESKTOP, 0, None, peers=49_000_000),
    ]
    assert [multicast_path(r) for r in rows] == ["relay", "unattributed", "native", None]
    kinds = by_kind(rows)
    assert kinds[AMT]["bytes_from_multicast_relay"] == 49_000_000
    assert kinds[AMT]["bytes_from_multicast_unattributed"] == 20_000_000
    assert kinds[AMT]["bytes_from_multicast_native"] == 0
    assert kinds[DESKTOP]["bytes_from_multicast_native"] == 49_000_000
    assert kinds[DESKTOP]["bytes_from_multicast_relay"] == 0
    line = kinds_line("emulation", kinds)
    assert (
        "amt 2/2 verified, download median 20 s, 29 MB from peers, 2 MB from origins (94% from "
        "peers), 69 MB by multicast (natively 0, through the AMT relay 49, unfinished 20)" in line
    )
    assert "desktop 2/2 verified" in line and "(natively 49, through the AMT relay 0)" in line


def _multicast_span(scenario_name: str, until_s: float) -> tuple[float | None, float | None]:
    """When the balancer's demand policy, with the scenario's thresholds, first enters
    multicast and when it leaves it (None: never), each planned client asking once at
    its arrival from an address of its own, reviewed every second (the scenario's
    poll interval). One request per client is the least the real clients send (they
    ask again in their window and count again after it), so a run's demand is at
    least this: a carousel this replay reaches is reached in the run, no later."""
    scenario = load_scenario(scenario_name)
    env = scenario.env
    policy = DemandPolicy(
        DemandConfig(
            enter_downloaders=float(env["PRESSRUN_SWARM_ENTER_DOWNLOADERS"]),
            leave_downloaders=float(env["PRESSRUN_SWARM_LEAVE_DOWNLOADERS"]),
            min_dwell_s=float(env["PRESSRUN_SWARM_MIN_DWELL_S"]),
            multicast_enter_downloaders=float(env["PRESSRUN_MULTICAST_ENTER_DOWNLOADERS"]),
            multicast_leave_downloaders=float(env["PRESSRUN_MULTICAST_LEAVE_DOWNLOADERS"]),
        ),
        {"issue": SwarmInfo("http://o/t.torrent", "http://t/announce", "00" * 20)},
    )
    asks = sorted((p.at_s, f"10.0.{p.number // 256}.{p.number % 256}") for p in scenario.clients())
    entered: float | None = None
    left: float | None = None
    t = 0.0
    while t <= until_s:
        while asks and asks[0][0] <= t:
            at_s, address = asks.pop(0)
            policy.decide("issue", now=at_s, address=address)
        policy.review(now=t)
        mode = policy.estimate("issue", now=t).mode
        if mode is DeliveryMode.MULTICAST and entered is None:
            entered = t
        if mode is not DeliveryMode.MULTICAST and entered is not None and left is None:
            left = t
        t += 1.0
    return entered, left


def test_the_amt_readers_arrive_while_the_carousel_runs() -> None:
    # runs A, B and 11:41 (docs/results/2026-11-28-emulation-amt.md): without
    # flash-crowd-50's phones the swarm came only with the peak, its dwell outlasted the
    # peak's demand, and the carousel came late (101 s, 110 s) or never: no AMT reader
    # was ever sent to it
    scenario = load_scenario("flash-crowd-amt")
    behind = [p.at_s for p in scenario.clients() if p.kind == AMT]
    entered, left = _multicast_span("flash-crowd-amt", max(behind) + 60)
    assert entered is not None, "the scenario's crowd never reaches the carousel"
    # the sender's start and the readers' first directive: 10 s of room
    assert entered + 10 <= min(behind), (entered, min(behind))
    assert left is None, f"the carousel stops at {left} s, before the readers are done"


def test_get_joins_a_source_specific_control_group_by_the_source_it_is_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the run gives every client of a run with AMT readers the sender's address
    # (emulate/run.py): a 232/8 control group without it is refused at once, not
    # found out by each swarm client as a failed swarm (the 11:41 and 11:49 runs)
    ssm = [
        "get",
        "weekly",
        "--library",
        str(tmp_path),
        "--multicast-control-group",
        "232.1.70.1:5400",
    ]
    args = build_parser().parse_args([*ssm, "--multicast-control-source", "198.18.33.251"])
    assert args.multicast_control_source == "198.18.33.251"
    refused = build_parser().parse_args([*ssm, "--balancer", "http://127.0.0.1:9"])
    assert refused.func(refused) == 2
    assert "--multicast-control-source" in capsys.readouterr().err
