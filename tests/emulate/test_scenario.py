"""Emulation scenario files: the built-ins load, mistakes are named."""

from __future__ import annotations

import pytest

from pressrun.emulate.scenario import builtin_names, load_scenario, parse_scenario
from pressrun.sim.scenario import ScenarioError

MINIMAL = """
name = "t"
issue_mb = 2
[[links]]
name = "fast"
rate = "50mbit"
share = 3
[[links]]
name = "mobile"
rate = "4mbit"
loss_pct = 1
profile = "mobile"
share = 1
[[arrivals]]
kind = "trickle"
rate_per_s = 2
end_s = 10
[[arrivals]]
kind = "waves"
count = 5
every_s = 20
waves = 2
start_s = 10
"""


def test_builtins_load() -> None:
    names = builtin_names()
    assert "small" in names
    for name in names:
        scenario = load_scenario(name)
        assert scenario.clients()


def test_clients_follow_the_arrival_tables_and_draw_links_by_share() -> None:
    scenario = parse_scenario(MINIMAL)
    clients = scenario.clients()
    assert len(clients) == 20 + 10  # a trickle of 2/s for 10 s, then 2 waves of 5
    assert [c.number for c in clients] == list(range(1, 31))
    assert [c.at_s for c in clients] == sorted(c.at_s for c in clients)
    assert {c.link.name for c in clients} == {"fast", "mobile"}
    mobile = next(c.link for c in clients if c.link.name == "mobile")
    assert mobile.env() == {
        "PRESSRUN_LINK_UP_RATE": "4mbit",
        "PRESSRUN_LINK_DOWN_RATE": "4mbit",
        "PRESSRUN_LINK_LOSS_PCT": "1",
    }
    # the same seed gives the same fleet
    assert parse_scenario(MINIMAL).clients() == clients


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[[faults]]\nat_s = 1\naction = "explode"\nservice = "origin-c"', "faults\\[0\\].action"),
        ('[[faults]]\nat_s = 1\naction = "kill"\nservice = "origin-z"', "faults\\[0\\].service"),
        ('[env]\nOTHER = "x"', "env.OTHER"),
        ('[[links]]\nrate = "1mbit"\ncolour = "red"', "unknown key"),
        ('[[links]]\nrate = "fast"', "not a rate"),
    ],
)
def test_mistakes_are_named(extra: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(MINIMAL + "\n" + extra)


def test_no_arrivals_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="arrivals"):
        parse_scenario('name = "t"')
    with pytest.raises(ScenarioError, match="no built-in emulation scenario"):
        load_scenario("no-such-scenario")


def test_env_settings_over_a_scenarios_own() -> None:
    from pressrun.emulate.cli import with_env

    scenario = load_scenario("flash-crowd")
    changed = with_env(scenario, ["PRESSRUN_UPLOADER_POLICY=stripes", "PRESSRUN_X=a=b"])
    assert changed.env["PRESSRUN_UPLOADER_POLICY"] == "stripes"
    assert changed.env["PRESSRUN_X"] == "a=b"  # the value keeps its own '='
    assert changed.env["PRESSRUN_MULTICAST_CHANNELS"] == scenario.env["PRESSRUN_MULTICAST_CHANNELS"]
    assert changed.clients() == scenario.clients()
    with pytest.raises(ScenarioError, match="PRESSRUN_NAME=VALUE"):
        with_env(scenario, ["UPLOADER=stripes"])
