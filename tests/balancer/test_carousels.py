"""The balancer keeps the multicast sender's carousels what demand wants: the pure
reconciler with an explicit ``now``, and the loop against a real sender on 127.0.0.1
(real UDP multicast), restarted under it."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pressrun.balancer.carousels import (
    CarouselClient,
    CarouselOrders,
    CarouselReconciler,
    keep_carousels,
)
from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import MulticastInfo

from .test_multicast_demand import CFG

pytest.importorskip("pressrun_flute", reason="the FLUTE binding is built by `make setup`")

TOKEN = "test-token-0123456789"
INFO = MulticastInfo("239.255.70.1:5400", "127.0.0.1")


def test_the_reconciler_orders_the_difference() -> None:
    r = CarouselReconciler(retry_s=1.0)
    assert r.orders({"a", "b"}, {"b", "c"}, now=0.0) == CarouselOrders(("a",), ("c",))
    assert r.orders(set(), set(), now=0.0) == CarouselOrders((), ())


def test_a_failed_order_waits_twice_as_long_each_time_up_to_the_cap() -> None:
    r = CarouselReconciler(retry_s=1.0, max_retry_s=4.0)
    waits = []
    now = 0.0
    for _ in range(5):
        assert r.orders({"a"}, set(), now=now).start == ("a",)
        waits.append(r.handle_failed("a", now=now))
        assert r.orders({"a"}, set(), now=now + waits[-1] - 0.01).start == ()
        now += waits[-1]
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    # a stop that failed (a lost DELETE) is ordered again the same way
    assert r.orders(set(), {"a"}, now=now).stop == ("a",)
    r.handle_done("a")
    assert r.orders(set(), {"a"}, now=now).stop == ("a",)
    r.handle_failed("a", now=now)
    # an issue neither wanted nor running is forgotten
    r.orders(set(), set(), now=now)
    assert r._backoff == {}


def crowd(p: DemandPolicy, rate_per_s: float, seconds: float) -> None:
    t = 0.0
    while t < seconds:
        p.decide("w", now=t)
        t += 1.0 / rate_per_s


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def sender_at(tmp_path: Path) -> AsyncIterator[Callable[[], Any]]:
    """Start (again) a real multicast sender on one fixed API port, with issue ``w``."""
    from pressrun.content.keys import generate_keypair, load_signing_key
    from pressrun.content.publish import publish
    from pressrun.multicast.config import CarouselConfig
    from pressrun.multicast.net import free_udp_port
    from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

    secret, _ = generate_keypair(tmp_path / "publisher.key")
    source = tmp_path / "w.pdf"
    source.write_bytes(random.Random(1).randbytes(20_000))
    content = tmp_path / "content"
    publish(source, issue_id="w", title="w", key_path=secret, content_dir=content)
    a, b = random.randrange(1, 255), random.randrange(1, 200)
    config = SenderServiceConfig(
        content_dir=content,
        control_group=(f"239.255.{a}.{b}", free_udp_port()),
        signing_key=load_signing_key(secret),
        token=TOKEN,
        port=free_tcp_port(),
        carousel=CarouselConfig(channels=1, rate_bps=200e3),
        group_base=f"239.255.{a}.{b + 1}",
        prepare_issues=0,
    )
    started: list[MulticastSender] = []

    async def start() -> MulticastSender:
        sender = MulticastSender(config)
        started.append(sender)
        await sender.start()
        return sender

    yield start
    for sender in started:
        await sender.close()


async def until(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    for _ in range(int(seconds / 0.05)):
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


async def test_a_restarted_sender_is_asked_again(sender_at: Any) -> None:
    """Before: the balancer remembered the carousel as running and never asked the
    restarted sender, so readers sent to multicast waited and fell back all peak."""
    sender = await sender_at()
    carousels: dict[str, MulticastInfo] = {}
    policy = DemandPolicy(CFG, {}, carousels)
    crowd(policy, 4.0, 40.0)
    assert policy.carousels_wanted() == {"w"}
    async with aiohttp.ClientSession() as http:
        client = CarouselClient(http, sender.url, TOKEN)
        loop = asyncio.ensure_future(
            keep_carousels(policy, carousels, client, INFO, interval_s=0.1, now=lambda: 40.0)
        )
        try:
            assert await until(lambda: sender.thread.get("w") is not None and "w" in carousels)
            await sender.close()
            # while the sender is down nothing is answered multicast
            assert await until(lambda: "w" not in carousels)
            again = await sender_at()
            assert await until(lambda: again.thread.get("w") is not None), "not asked again"
            assert await until(lambda: "w" in carousels)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)


async def test_a_restarted_balancer_stops_the_orphan_carousel(sender_at: Any) -> None:
    """Before: a balancer that restarted (or lost a DELETE) left the carousel running
    for ever at full rate."""
    sender = await sender_at()
    carousels: dict[str, MulticastInfo] = {}
    policy = DemandPolicy(CFG, {}, carousels)
    crowd(policy, 4.0, 40.0)
    async with aiohttp.ClientSession() as http:
        client = CarouselClient(http, sender.url, TOKEN)
        first = asyncio.ensure_future(
            keep_carousels(policy, carousels, client, INFO, interval_s=0.1, now=lambda: 40.0)
        )
        assert await until(lambda: sender.thread.get("w") is not None)
        first.cancel()  # the balancer dies; its carousel runs on
        await asyncio.gather(first, return_exceptions=True)
        fresh: dict[str, MulticastInfo] = {}
        restarted = DemandPolicy(CFG, {}, fresh)  # knows no demand
        second = asyncio.ensure_future(
            keep_carousels(restarted, fresh, client, INFO, interval_s=0.1, now=lambda: 41.0)
        )
        try:
            assert await until(lambda: sender.thread.get("w") is None), "the orphan runs on"
            assert fresh == {}
        finally:
            second.cancel()
            await asyncio.gather(second, return_exceptions=True)


async def test_the_loop_survives_an_error_in_a_round(sender_at: Any) -> None:
    sender = await sender_at()
    carousels: dict[str, MulticastInfo] = {}

    class Flaky(DemandPolicy):
        reviews = 0

        def review(self, *, now: float) -> None:
            Flaky.reviews += 1
            if Flaky.reviews == 1:
                raise RuntimeError("a bug in one round")
            super().review(now=now)

    policy = Flaky(CFG, {}, carousels)
    crowd(policy, 4.0, 40.0)
    async with aiohttp.ClientSession() as http:
        client = CarouselClient(http, sender.url, TOKEN)
        loop = asyncio.ensure_future(
            keep_carousels(policy, carousels, client, INFO, interval_s=0.1, now=lambda: 40.0)
        )
        try:
            assert await until(lambda: sender.thread.get("w") is not None)
            assert Flaky.reviews >= 2 and not loop.done()
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
