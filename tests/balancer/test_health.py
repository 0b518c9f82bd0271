"""Origin health as HAProxy checks it (issue 30): rise, fall and slow start.

The pure core is driven with a stepped ``now``; then a real balancer polls real HTTP
origins on 127.0.0.1: one that fails every other poll, one that comes back and ramps.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from balancer.fake_origin import FakeOrigin, start_fake_origin
from balancer.helpers import specs, status
from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore, OriginState
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    OriginCameBack,
    OriginSpec,
    OriginWentDown,
    PollFailed,
    StatusReceived,
)
from pressrun.balancer.health import HealthChecks, HealthConfig

CONFIG = BalancerConfig(poll_interval_s=1.0, stale_after_s=3.5, directive_origins=2)
ISSUE = "weekly-2026-47"


def make_core(health: HealthConfig, names: tuple[str, ...] = ("a", "b")) -> BalancerCore:
    origins = specs(names)
    alg = make_algorithm("rr", origins, random.Random(0))
    return BalancerCore(CONFIG, origins, alg, now=0.0, health=health)


def good(core: BalancerCore, name: str, now: float) -> list[object]:
    core.handle_timer(now=now)
    return list(core.handle_status_received(StatusReceived(status(name)), now=now))


def bad(core: BalancerCore, name: str, now: float) -> list[object]:
    core.handle_timer(now=now)
    return list(core.handle_poll_failed(PollFailed(name, "refused"), now=now))


def picks(core: BalancerCore, n: int, now: float) -> list[str]:
    out = []
    for _ in range(n):
        d = core.handle_directive_requested(DirectiveRequested("i"), now=now)
        assert isinstance(d, Directive)
        out.append(d.origins[0].name)
    return out


def test_config_checks() -> None:
    assert HealthConfig() == HealthConfig(rise=2, fall=3, slowstart_s=10.0)
    for bad_cfg in ({"rise": 0}, {"fall": 0}, {"slowstart_s": -1.0}):
        with pytest.raises(ValueError):
            HealthConfig(**bad_cfg)  # type: ignore[arg-type]


def test_first_status_puts_an_origin_in_at_once_without_slow_start() -> None:
    core = make_core(HealthConfig(rise=3, fall=3, slowstart_s=10.0))
    good(core, "a", 0.0)
    good(core, "b", 0.0)
    assert core.origin_states() == {"a": OriginState.UP, "b": OriginState.UP}
    assert core.health.ramping() == {}
    assert sorted(picks(core, 10, 0.0)).count("b") == 5


def test_fall_failed_polls_in_a_row_take_an_origin_out() -> None:
    core = make_core(HealthConfig(rise=2, fall=3, slowstart_s=0.0))
    good(core, "a", 0.0)
    good(core, "b", 0.0)
    assert bad(core, "b", 1.0) == []
    assert bad(core, "b", 2.0) == []
    assert core.origins["b"].state is OriginState.UP
    assert set(picks(core, 4, 2.0)) == {"a", "b"}  # still in rotation meanwhile
    effects = bad(core, "b", 3.0)
    assert [type(e) for e in effects] == [OriginWentDown]
    assert core.origins["b"].state is OriginState.DOWN
    assert set(picks(core, 4, 3.0)) == {"a"}


def test_a_good_poll_resets_the_failures() -> None:
    core = make_core(HealthConfig(rise=2, fall=3, slowstart_s=0.0))
    good(core, "a", 0.0)
    good(core, "b", 0.0)
    now = 0.0
    for _ in range(20):  # fails every other poll: never three in a row
        now += 1.0
        assert bad(core, "b", now) == []
        now += 1.0
        core.handle_status_received(StatusReceived(status("b")), now=now)
        good(core, "a", now)
        assert core.origins["b"].state is OriginState.UP


def test_rise_good_polls_in_a_row_bring_it_back() -> None:
    core = make_core(HealthConfig(rise=2, fall=1, slowstart_s=0.0))
    good(core, "a", 0.0)
    good(core, "b", 0.0)
    bad(core, "b", 1.0)
    assert core.origins["b"].state is OriginState.DOWN
    assert good(core, "b", 2.0) == []
    assert core.origins["b"].state is OriginState.DOWN
    bad(core, "b", 3.0)  # the run of good polls starts again
    assert good(core, "b", 4.0) == []
    assert [type(e) for e in good(core, "b", 5.0)] == [OriginCameBack]
    assert core.origins["b"].state is OriginState.UP


def test_slow_start_share_grows_linearly_over_slowstart() -> None:
    core = make_core(HealthConfig(rise=1, fall=1, slowstart_s=10.0))
    good(core, "a", 0.0)
    good(core, "b", 0.0)
    bad(core, "b", 1.0)
    good(core, "b", 2.0)  # back at t=2: ramps until t=12
    assert core.health.ramping() == {"b": 2.0}
    shares = []
    for second in range(12):
        now = 2.0 + second
        good(core, "a", now)
        good(core, "b", now)
        got = picks(core, 200, now)
        shares.append(got.count("b") / len(got))
    # rr gives b half; during the ramp it gets half of (t - 2) / 10 of it
    for second, share in enumerate(shares[:10]):
        expected = 0.5 * second / 10.0
        assert abs(share - expected) <= 0.02, (second, share, expected)
    assert shares[10] == pytest.approx(0.5, abs=0.01)
    assert core.health.ramping() == {}


def test_slow_start_never_refuses_when_the_ramping_origin_is_the_only_one() -> None:
    core = make_core(HealthConfig(rise=1, fall=1, slowstart_s=10.0), names=("a",))
    good(core, "a", 0.0)
    bad(core, "a", 1.0)
    good(core, "a", 2.0)
    assert picks(core, 5, 2.0) == ["a"] * 5


def test_stale_status_ends_a_slow_start() -> None:
    checks = HealthChecks(HealthConfig(rise=1, fall=1, slowstart_s=5.0), specs(["a"]))
    checks.poll_failed("a", "up")
    assert checks.status_ok("a", "down", now=1.0)
    assert checks.share("a", now=3.5) == pytest.approx(0.5)
    checks.went_down("a")
    assert checks.share("a", now=3.5) == 1.0


# --- real origins over HTTP -----------------------------------------------------

INTERVAL_S = 0.1


class FlappingOrigin(FakeOrigin):
    """A fake origin whose /stats can fail every other poll, or always."""

    mode: str = "good"  # "good", "flap", "down"
    polls: int = 0

    async def _stats(self, request: web.Request) -> web.Response:
        self.polls += 1
        failing = self.mode == "down" or (self.mode == "flap" and self.polls % 2 == 0)
        return web.Response(
            status=503 if failing else 200,
            body=json.dumps(self.stats),
            content_type="application/json",
        )


async def start_flapping(name: str) -> FlappingOrigin:
    plain = await start_fake_origin(name, [ISSUE], {ISSUE: f"{ISSUE}.pdf"})
    port = plain.port
    await plain.stop()
    origin = FlappingOrigin(name, plain.stats, dict(plain.file_names))
    await origin.start(port)
    return origin


@pytest.fixture
async def two() -> AsyncIterator[tuple[FakeOrigin, FlappingOrigin]]:
    a = await start_fake_origin("origin-a", [ISSUE], {ISSUE: f"{ISSUE}.pdf"})
    b = await start_flapping("origin-b")
    yield a, b
    await a.stop()
    await b.stop()


async def watch_state(running: object, name: str, seconds: float) -> list[str]:
    """The origin's state as seen by the running balancer, every 10 ms."""
    seen: list[str] = []
    core = running.core  # type: ignore[attr-defined]
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        state = core.origins[name].state.value
        if not seen or seen[-1] != state:
            seen.append(state)
        await asyncio.sleep(0.01)
    return seen


@pytest.mark.parametrize(
    ("health", "flips"),
    [(HealthConfig(rise=2, fall=3, slowstart_s=0.0), False), (HealthConfig.immediate(), True)],
    ids=["haproxy-defaults", "one-poll-decides"],
)
async def test_an_origin_failing_every_other_poll_is_not_taken_in_and_out(
    two: tuple[FakeOrigin, FlappingOrigin], health: HealthConfig, flips: bool
) -> None:
    a, b = two
    running = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec(a.name, a.url), OriginSpec(b.name, b.url)),
            balancer=BalancerConfig(
                algorithm="rr", poll_interval_s=INTERVAL_S, stale_after_s=5 * INTERVAL_S
            ),
            health=health,
        )
    )
    try:
        await running.wait_until_up(2, timeout_s=5.0)
        b.mode = "flap"
        polls_before = b.polls
        seen = await watch_state(running, b.name, 2.0)
        assert b.polls - polls_before >= 10, "the origin was hardly polled"
        if flips:
            # the same flapping with one poll deciding: out and in on every poll
            assert seen.count("down") >= 4, seen
        else:
            assert seen == ["up"], seen
    finally:
        await running.stop()


async def test_an_origin_that_comes_back_ramps_over_slowstart(
    two: tuple[FakeOrigin, FlappingOrigin],
) -> None:
    a, b = two
    slowstart = 2.0
    running = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec(a.name, a.url), OriginSpec(b.name, b.url)),
            balancer=BalancerConfig(
                algorithm="rr", poll_interval_s=INTERVAL_S, stale_after_s=5 * INTERVAL_S
            ),
            health=HealthConfig(rise=2, fall=2, slowstart_s=slowstart),
        )
    )
    loop = asyncio.get_running_loop()
    try:
        await running.wait_until_up(2, timeout_s=5.0)
        b.mode = "down"
        while running.core.origins[b.name].state is not OriginState.DOWN:
            await asyncio.sleep(0.01)
        b.mode = "good"
        while running.core.origins[b.name].state is not OriginState.UP:
            await asyncio.sleep(0.005)
        back_at = loop.time()
        # new clients, one every 5 ms, for slowstart + 1 s: the share of b per 0.5 s
        bins: dict[int, list[str]] = {}
        async with aiohttp.ClientSession() as http:
            while (t := loop.time() - back_at) < slowstart + 1.0:
                async with http.get(f"{running.url}/v1/issues/{ISSUE}/directive") as resp:
                    doc = await resp.json()
                bins.setdefault(int(t / 0.5), []).append(doc["origins"][0]["name"])
                await asyncio.sleep(0.005)
        shares = [bins[k].count(b.name) / len(bins[k]) for k in sorted(bins)]
        print("share of origin-b per 0.5 s since it came back:", [f"{s:.2f}" for s in shares])
        # rr's full share is 0.5; ramp midpoints 0.125, 0.375, 0.625, 0.875 of it
        assert shares[0] < 0.15
        assert shares[0] < shares[1] < shares[2] < shares[3]
        assert shares[-1] == pytest.approx(0.5, abs=0.05)
        for k, share in enumerate(shares[:4]):
            assert share == pytest.approx(0.5 * (k + 0.5) / 4, abs=0.08), shares
    finally:
        await running.stop()


def test_serve_balancer_health_flags_out_of_range_exit_2() -> None:
    import subprocess
    import sys
    from pathlib import Path

    pressrun = str(Path(sys.executable).with_name("pressrun"))
    for flags, message in (
        (["--rise", "0"], "rise and fall"),
        (["--slowstart-s", "-1"], "slowstart"),
    ):
        done = subprocess.run(
            [pressrun, "serve", "balancer", "--origins", "http://127.0.0.1:9", "--port", "0",
             *flags],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert message in done.stderr


def test_the_cli_defaults_are_haproxys() -> None:
    from pressrun.cli import build_parser

    args = build_parser().parse_args(["serve", "balancer", "--origins", "http://o:1"])
    assert (args.rise, args.fall, args.slowstart_s) == (2, 3, 10.0)
