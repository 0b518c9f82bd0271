"""The channel plan for mixed links (`pressrun.multicast.config.mixed_link_plan`):
channels at most 5/6 of the slowest link, as many as the fastest carries; and
flash-crowd-50's plan is that rule's for its links (issue 28, session 17); the
default plan (CLI and docker-compose.yml) is the rule's for links of 6 to 50 Mbit/s
(session 25). Pure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pressrun.emulate.link import parse_rate_bps
from pressrun.emulate.scenario import load_scenario
from pressrun.multicast.config import MAX_CHANNELS, CarouselConfig, mixed_link_plan


def test_the_slowest_link_carries_one_channel_the_fastest_all() -> None:
    assert mixed_link_plan(6e6, 50e6) == (10, 5e6)
    assert mixed_link_plan(6e6, 20e6) == (4, 5e6)  # the plan of 4 x 5 Mbit/s
    assert mixed_link_plan(6e6, 6e6) == (1, 5e6)
    assert mixed_link_plan(2e6, 1e9) == (MAX_CHANNELS, 1e6)  # capped
    channels, rate = mixed_link_plan(1e6, 1e6)  # under 1 Mbit/s: not rounded
    assert rate == pytest.approx(1e6 * 5 / 6) and channels == 1
    for slowest, fastest in ((6e6, 50e6), (10e6, 100e6), (3e6, 3e6), (0.5e6, 40e6)):
        channels, rate = mixed_link_plan(slowest, fastest)
        assert rate < slowest  # one channel fits the slowest link
        # the fastest link carries them all, and not one more
        assert channels * rate <= fastest
        assert (channels + 1) * rate > fastest or channels == MAX_CHANNELS
        CarouselConfig(channels=channels, rate_bps=rate)  # a valid carousel
    with pytest.raises(ValueError):
        mixed_link_plan(10e6, 5e6)


def test_flash_crowd_50s_plan_is_the_rule_for_its_links() -> None:
    """Its carousel was 4 x 5 Mbit/s: a fibre-50 reader got 20 Mbit/s from it where
    the origins, at 50 clients, gave it about that or more (carousel readers' median
    44.1 s against 42.2 s unicast-only at bdd9429)."""
    scenario = load_scenario("flash-crowd-50")
    downs = [parse_rate_bps(link.down_rate, link.name) for link in scenario.links if link.down_rate]
    assert downs
    channels, rate = mixed_link_plan(min(downs), max(downs))
    assert int(scenario.env["PRESSRUN_MULTICAST_CHANNELS"]) == channels
    assert float(scenario.env["PRESSRUN_MULTICAST_RATE_MBPS"]) * 1e6 == rate


def test_the_default_plan_is_the_rule_for_links_of_6_to_50_mbit() -> None:
    """`CarouselConfig`'s default (the CLI's) serves the emulation's links, 6 to 50
    Mbit/s, at their rates: 10 x 5 Mbit/s (4 x 5 held a 50 Mbit/s reader to 20)."""
    default = CarouselConfig()
    assert (default.channels, default.rate_bps) == mixed_link_plan(6e6, 50e6) == (10, 5e6)


def test_flash_crowd_50_desktops_runs_flash_crowd_50s_plan() -> None:
    """The desktops' crowd is flash-crowd-50 without its phones: the same links, so the
    same plan (its readers are compared with flash-crowd-50's runs)."""
    full, desktops = load_scenario("flash-crowd-50"), load_scenario("flash-crowd-50-desktops")
    for key in ("PRESSRUN_MULTICAST_CHANNELS", "PRESSRUN_MULTICAST_RATE_MBPS"):
        assert desktops.env[key] == full.env[key], key


def test_the_compose_sender_defaults_to_the_cli_plan() -> None:
    """docker-compose.yml's sender, without PRESSRUN_MULTICAST_CHANNELS or _RATE_MBPS,
    runs `CarouselConfig`'s plan (it ran 2 x 40 Mbit/s, the plan that congested every
    link under 40 Mbit/s, after the CLI's default had left it)."""
    compose = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()

    def default_of(name: str) -> str:
        found = re.search(r"\$\{" + name + r":-([0-9.]+)\}", compose)
        assert found is not None, f"docker-compose.yml gives {name} no default"
        return found.group(1)

    default = CarouselConfig()
    assert int(default_of("PRESSRUN_MULTICAST_CHANNELS")) == default.channels
    assert float(default_of("PRESSRUN_MULTICAST_RATE_MBPS")) * 1e6 == default.rate_bps
