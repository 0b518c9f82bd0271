"""The balancer's ``multicast`` directive carries the carousel's plan as the sender
gave it (its answer to the start, then its list each round), without packet
counters, and the client's decoder reads it back; a plan the client cannot read
leaves the rest of the directive usable (the reader waits for the announcement)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import aiohttp

from pressrun.balancer.carousels import CarouselClient, keep_carousels
from pressrun.balancer.codec import encode_directive
from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import DeliveryMode, Directive, MulticastInfo
from pressrun.clients.codec import decode_directive
from pressrun.multicast.codec import carousel_to_dict
from pressrun.multicast.events import CarouselPlan, ChannelSpec

from .test_carousels import INFO, TOKEN, crowd, sender_at, until
from .test_multicast_demand import CFG

__all__ = ["sender_at"]  # the fixture, used here

PLAN = CarouselPlan(
    issue_id="w",
    manifest_sha256="ab" * 32,
    size_bytes=1_000_000,
    toi=1,
    fec="raptorq",
    symbol_bytes=1280,
    source_symbols=782,
    cycle_s=2.5,
    channels=(
        ChannelSpec("239.255.9.2", 5500, 77, 5e6, 488.28125),
        ChannelSpec("239.255.9.3", 5501, 78, 5e6, 488.28125),
    ),
)


def _directive(multicast: MulticastInfo) -> bytes:
    directive = Directive(
        "w", DeliveryMode.MULTICAST, (), None, (DeliveryMode.ORIGIN,), 30.0, "x", multicast
    )
    return json.dumps(encode_directive(directive)).encode()


def test_the_directive_carries_the_plan_and_the_client_reads_it_back() -> None:
    doc = json.loads(_directive(dataclasses.replace(INFO, plan=PLAN)))
    assert "sent_packets" not in doc["multicast"]["plan"]  # no counters: they age
    got = decode_directive(_directive(dataclasses.replace(INFO, plan=PLAN))).multicast
    assert got is not None and got.plan == PLAN and got.plan_error is None
    bare = decode_directive(_directive(INFO)).multicast
    assert bare is not None and bare.plan is None and bare.plan_error is None
    assert "plan" not in json.loads(_directive(INFO))["multicast"]


def test_a_malformed_plan_leaves_the_directive_usable() -> None:
    doc = json.loads(_directive(dataclasses.replace(INFO, plan=PLAN)))
    for bad in ({"issue_id": "w"}, [1], {**carousel_to_dict(PLAN), "channels": []}):
        doc["multicast"]["plan"] = bad
        got = decode_directive(json.dumps(doc).encode())
        assert got.mode == "multicast" and got.multicast is not None
        assert got.multicast.plan is None
        assert got.multicast.plan_error is not None
        assert "multicast.plan is malformed" in got.multicast.plan_error


async def test_the_balancer_answers_with_the_plan_the_sender_runs(sender_at: Any) -> None:
    sender = await sender_at()
    carousels: dict[str, MulticastInfo] = {}
    policy = DemandPolicy(CFG, {}, carousels)
    crowd(policy, 4.0, 40.0)
    async with aiohttp.ClientSession() as http:
        client = CarouselClient(http, sender.url, TOKEN)
        loop = asyncio.ensure_future(
            keep_carousels(policy, carousels, client, INFO, interval_s=0.1, now=lambda: 40.0)
        )
        try:
            assert await until(lambda: "w" in carousels)
            running = sender.thread.get("w")
            assert running is not None
            want = dataclasses.replace(running.plan, sent_packets=())
            assert carousels["w"].plan == want
            assert carousels["w"].control_group == INFO.control_group
            told = decode_directive(_directive(carousels["w"])).multicast
            assert told is not None and told.plan == want
            # the list of later rounds keeps it (the start's answer gave it first)
            await asyncio.sleep(0.3)
            assert carousels["w"].plan == want
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
