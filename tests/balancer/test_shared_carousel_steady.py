"""The carousel of a crowd that stays above the multicast threshold is started once
and never stopped, on one balancer or two sharing demand through a real Redis, when
every origin misses its polls for a moment at the peak (as in the emulated flash
crowd, where all three went out of rotation for 7 s under load 97 and balancer-2
stopped the carousel 3 s after starting it, "not wanted"), and when the balancer
holding the carousel lease is killed.

Real ``pressrun serve balancer`` processes, real origins (stopped and started again on
their ports), a real redis-server; the multicast sender is the control-API stand-in of
test_shared_demand, which counts the orders it gets."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from balancer import test_shared_demand
from balancer.test_service import REAL_NAMES, start_real_origin
from balancer.test_shared_demand import (
    INTERVAL_S,
    ISSUE,
    PACE_S,
    FakeSender,
    start_balancer_process,
    wait_ready,
)
from pressrun.balancer.demand import DemandConfig, DemandPolicy
from pressrun.balancer.shared import DEFAULT_PREFIX
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish
from pressrun.origin import RunningOrigin

#: a throwaway redis-server (the fixture of test_shared_demand)
redis_url = test_shared_demand.redis_url


class Origins:
    """Two real origins that can be stopped and started again on their ports."""

    def __init__(self, content: Path) -> None:
        self.content = content
        self.running: list[RunningOrigin] = []

    async def start(self, ports: list[int] | None = None) -> None:
        self.running = [
            await start_real_origin(self.content, name, port)
            for name, port in zip(REAL_NAMES[:2], ports or [0, 0], strict=True)
        ]

    async def stop(self) -> list[int]:
        ports = [o.port for o in self.running]
        for origin in self.running:
            await origin.stop()
        self.running = []
        return ports


@pytest.fixture
async def origins(tmp_path: Path) -> AsyncIterator[Origins]:
    source = tmp_path / f"{ISSUE}.pdf"
    source.write_bytes(os.urandom(200_000))
    key, _ = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    publish(source, issue_id=ISSUE, title="Weekly 47", key_path=key, content_dir=content)
    both = Origins(content)
    await both.start()
    yield both
    await both.stop()


async def ask(http: aiohttp.ClientSession, urls: list[str]) -> str | None:
    """One client: the first balancer that answers (the next on a refused
    connection); its mode, or None when refused (no origin in rotation)."""
    for url in urls:
        try:
            async with http.get(f"{url}/v1/issues/{ISSUE}/directive") as resp:
                if resp.status != 200:
                    return None
                mode: str = (await resp.json())["mode"]
                return mode
        except aiohttp.ClientConnectionError:
            continue
    raise AssertionError("no balancer answered")


async def clients(http: aiohttp.ClientSession, urls: list[str], n: int, k0: int) -> list[str]:
    """``n`` new clients, one every PACE_S, alternating which balancer they ask first."""
    modes: list[str] = []
    for k in range(k0, k0 + n):
        started = time.monotonic()
        mode = await ask(http, urls[k % len(urls) :] + urls[: k % len(urls)])
        if mode is not None:
            modes.append(mode)
        await asyncio.sleep(max(0.0, PACE_S - (time.monotonic() - started)))
    return modes


async def leader_pid(url: str) -> int:
    """The pid of the balancer holding the carousel lease (its name is host-pid-tail)."""
    r = aioredis.from_url(url)
    try:
        name = await r.get(f"{DEFAULT_PREFIX}carousel-leader")
    finally:
        await r.aclose()
    assert name is not None, "nobody holds the carousel lease"
    return int(name.decode().rsplit("-", 2)[1])


@pytest.mark.parametrize("count", [1, 2])
async def test_the_carousel_stays_up_while_the_crowd_stays_above_the_threshold(
    origins: Origins,
    redis_url: str,
    count: int,
) -> None:
    """The crowd crosses the multicast threshold (60 downloaders: about 20 clients at
    3 each), then keeps arriving; every origin stops for 1.5 s (out of rotation on
    every balancer, its directives refused) and comes back; with two balancers, the
    lease holder is then SIGKILLed. Demand never falls near the leave threshold (20):
    the sender must see one start and no stop."""
    sender = FakeSender()
    await sender.start()
    procs = [
        start_balancer_process(origins.running, sender, redis_url if count == 2 else None)
        for _ in range(count)
    ]
    urls = [url for _, url in procs]
    try:
        async with aiohttp.ClientSession() as http:
            for url in urls:
                await wait_ready(http, url, 2)
            await asyncio.sleep(2 * INTERVAL_S)  # the exchange has run (a lease taken)
            for url in urls:  # warm-up: each has read the manifest
                await ask(http, [url])
            await asyncio.sleep(0.5)
            rise = await clients(http, urls, 30, 0)
            assert "multicast" in rise, rise
            assert sender.starts == [ISSUE]
            # every origin misses its polls at the peak, then answers again
            ports = await origins.stop()
            await clients(http, urls, 30, 30)  # 1.5 s: refused, still counted nowhere
            await origins.start(ports)
            for url in urls:
                await wait_ready(http, url, 2)
            after_outage = await clients(http, urls, 10, 60)
            assert sender.stops == [], "the carousel was stopped at the peak (outage)"
            assert after_outage[-4:] == ["multicast"] * 4, after_outage
            if count == 2:
                holder = await leader_pid(redis_url)
                killed = next(i for i, (p, _) in enumerate(procs) if p.pid == holder)
                procs[killed][0].kill()  # SIGKILL: the lease runs out after 3 exchanges
                procs[killed][0].wait(timeout=10)
                after_kill = await clients(http, urls, 30, 70)
                assert await leader_pid(redis_url) == procs[1 - killed][0].pid
                assert after_kill[-4:] == ["multicast"] * 4, after_kill
            await asyncio.sleep(3 * INTERVAL_S)  # a late order would show
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        assert sender.runner is not None
        await sender.runner.cleanup()
    print("orders the sender got: starts", sender.starts, "stops", sender.stops)
    assert sender.starts == [ISSUE], "the carousel was started more than once"
    assert sender.stops == [], "the carousel was stopped while the crowd stayed"


# --- pure: the demand of an issue no origin holds for a moment --------------------

MC_CFG = DemandConfig(
    tau_s=10.0,
    typical_download_s=30.0,
    enter_downloaders=30.0,
    leave_downloaders=5.0,
    min_dwell_s=20.0,
    multicast_enter_downloaders=60.0,
    multicast_leave_downloaders=20.0,
    client_window_s=0.0,
)


def test_an_issue_out_of_rotation_keeps_its_mode_until_its_demand_fades() -> None:
    policy = DemandPolicy(MC_CFG, {})
    for k in range(25):  # 75 downloaders: multicast
        policy.decide("i", now=k * 0.05)
    assert policy.carousels_wanted() == {"i"}
    policy.forget_issue("i")  # every origin missed its polls (the core)
    policy.review(now=2.0)
    assert policy.carousels_wanted() == {"i"}  # the crowd has not gone
    policy.decide("i", now=5.0)  # the origins are back: the same state counts on
    assert policy.mode_changes("i") == 1
    # out of rotation again, and nobody asks: forgotten once the demand has faded
    policy.forget_issue("i")
    policy.review(now=60.0)  # D about 0.2: back to origin, but not faded yet
    assert policy.carousels_wanted() == frozenset() and "i" in policy._issues
    policy.review(now=200.0)
    assert "i" not in policy._issues and not policy._unheld


def test_a_faded_issue_no_origin_holds_is_forgotten_by_requests_for_others() -> None:
    policy = DemandPolicy(MC_CFG, {})
    policy.decide("gone", now=0.0)
    policy.forget_issue("gone")
    policy.decide("other", now=0.5)
    assert "gone" in policy._issues  # 3 downloaders: not faded
    policy.decide("other", now=200.0)  # 3 x e^-20: faded; no review() without a sender
    assert "gone" not in policy._issues and not policy._unheld


async def test_a_balancer_that_joins_late_keeps_the_carousel_when_it_takes_the_lease(
    origins: Origins,
    redis_url: str,
) -> None:
    """A crowd on balancer A moves the issue to multicast (A holds the lease and starts
    the carousel), then stops arriving. B starts while the total demand is between the
    leave (20) and enter (60) thresholds: it never saw the total cross 60. A is
    SIGKILLed; B takes the lease with the demand still above 20: the carousel runs on
    (B answers multicast) and is never stopped."""
    sender = FakeSender()
    await sender.start()
    procs = [start_balancer_process(origins.running, sender, redis_url)]
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, procs[0][1], 2)
            await asyncio.sleep(2 * INTERVAL_S)
            await ask(http, [procs[0][1]])
            await asyncio.sleep(0.5)
            rise = await clients(http, [procs[0][1]], 26, 0)  # about 75 downloaders
            assert rise[-3:] == ["multicast"] * 3, rise
            crowd_ended = time.monotonic()
            await asyncio.sleep(3.0)  # the total falls under 60 (75 x e^-0.3 = 56)
            procs.append(start_balancer_process(origins.running, sender, redis_url))
            await wait_ready(http, procs[1][1], 2)
            await asyncio.sleep(3 * INTERVAL_S)  # B has heard A's demand
            assert await leader_pid(redis_url) == procs[0][0].pid
            procs[0][0].kill()
            procs[0][0].wait(timeout=10)
            await asyncio.sleep(6 * INTERVAL_S)  # the lease runs out, B takes it
            assert await leader_pid(redis_url) == procs[1][0].pid
            mode = await ask(http, [procs[1][1]])
            quiet_s = time.monotonic() - crowd_ended
            # 75 x e^(-quiet/10) is still above the leave threshold (20)
            assert quiet_s < 10.0, f"too slow a host: the crowd ended {quiet_s:.1f} s ago"
            await asyncio.sleep(3 * INTERVAL_S)  # a late order would show
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        assert sender.runner is not None
        await sender.runner.cleanup()
    print(f"B took the lease {quiet_s:.1f} s after the crowd: {sender.starts=} {sender.stops=}")
    assert sender.starts == [ISSUE]
    assert sender.stops == [], "the new holder stopped a carousel its demand still wants"
    assert mode == "multicast"


def test_a_running_carousel_is_adopted_above_the_leave_threshold_only() -> None:
    late = DemandPolicy(MC_CFG, {})
    # heard only from the others: 40 downloaders, between leave (20) and enter (60)
    late.set_remote_rates({"i": 40 / 30, "j": 10 / 30}, now=0.0)
    late.review(now=0.0)
    assert late.carousels_wanted() == frozenset()
    late.adopt_carousels({"i", "j", "unknown"}, now=0.0)
    assert late.carousels_wanted() == {"i"}  # j (10) is below the leave threshold
    assert "unknown" not in late._issues  # nothing created for a name from the sender
    no_multicast = DemandPolicy(CFG_NO_MC, {})
    no_multicast.set_remote_rates({"i": 40 / 30}, now=0.0)
    no_multicast.adopt_carousels({"i"}, now=0.0)
    assert no_multicast.carousels_wanted() == frozenset()


CFG_NO_MC = DemandConfig(enter_downloaders=30.0, leave_downloaders=5.0, client_window_s=0.0)
