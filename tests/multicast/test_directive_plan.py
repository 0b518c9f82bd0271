"""A reader told ``multicast`` joins the carousel from the plan its directive carries
(`DirectiveMulticast.plan`), not at the carousel's next announcement: in
flash-crowd-50-desktops at 5820c3b and f1ea13d the readers told ``multicast`` joined a
median 0.44 s after their directive, waiting for one. The plan is not signed: the
first signed announcement confirms it or refuses it (the announced channels are
joined then), a plan of another manifest is refused before any join, a stale plan of
a stopped carousel ends the receive at the first round without it, and the reader
ends with a verified copy in every case. ``pressrun get`` end to end: an origin, the
balancer answering ``multicast`` with the plan, the sender on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import MulticastInfo
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.events import CarouselPlan
from pressrun.origin import OriginConfig, start_origin

from .conftest import (
    ISSUE,
    PEAK_AT_ONCE,
    Published,
    fetch_through_balancer,
    multicast_client,
    random_groups,
)

SIZE = 1_000_000 + 77
#: a carousel deadline short enough that a reader left waiting for an announcement
#: falls back within the test (the code before: 5 s, then every byte from the origin)
CLIENT = multicast_client(deadline_s=5.0)


async def _fetch(pub: Published, group: str, plan: CarouselPlan | None) -> Any:
    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    info = MulticastInfo(group, "127.0.0.1", plan=plan)
    policy = DemandPolicy(PEAK_AT_ONCE, {}, {ISSUE: info})
    return await fetch_through_balancer(ISSUE, origin, policy, CLIENT, publisher=pub)


async def _carousel(pub: Published, sender_factory: Any) -> tuple[Any, CarouselPlan]:
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    plan = await sender.start_carousel(ISSUE, sender.config.carousel)
    return sender, dataclasses.replace(plan, sent_packets=())


def _all_from_the_carousel(result: Any, pub: Published) -> None:
    assert hashlib.sha256(result.path.read_bytes()).digest() == hashlib.sha256(pub.data).digest()
    assert result.mode == "multicast"
    assert result.bytes_from_multicast == SIZE
    assert sum(result.bytes_by_origin.values()) == 0


async def test_the_directive_plan_is_joined_with_no_announcement_heard(
    published: Callable[[int], Published], sender_factory: Any
) -> None:
    """The directive names a control group nobody announces on: from its plan the
    reader joins the channels and takes the whole file from the carousel. Before, it
    waited for an announcement until its deadline and took the file from the origin."""
    pub = published(SIZE)
    sender, plan = await _carousel(pub, sender_factory)
    silent, _ = random_groups(random.Random())
    assert silent != sender.config.control_group
    result = await _fetch(pub, "{}:{}".format(*silent), plan)
    _all_from_the_carousel(result, pub)
    assert result.multicast_note is not None
    assert "the directive's plan unconfirmed" in result.multicast_note


async def test_the_directive_plan_is_confirmed_by_the_signed_announcement(
    published: Callable[[int], Published], sender_factory: Any
) -> None:
    pub = published(SIZE)
    sender, plan = await _carousel(pub, sender_factory)
    result = await _fetch(pub, "{}:{}".format(*sender.config.control_group), plan)
    _all_from_the_carousel(result, pub)
    assert "the directive's plan confirmed" in result.multicast_note
    # the reader's timeline: the receive's start after its first directive request
    started = r"started \d+\.\d\d s after the first directive request"
    assert re.search(started, result.multicast_note)


async def test_a_forged_plan_is_refused_and_the_reader_gets_the_announced_carousel(
    published: Callable[[int], Published],
    sender_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The directive's plan names channels nobody sends on (a forged or stale plan
    with the right manifest): the first signed announcement refuses it with a clear
    warning, the announced channels are joined, and the copy is the publisher's."""
    pub = published(SIZE)
    sender, plan = await _carousel(pub, sender_factory)
    _, elsewhere = random_groups(random.Random())
    forged = dataclasses.replace(
        plan,
        channels=tuple(dataclasses.replace(ch, group=elsewhere) for ch in plan.channels),
    )
    with caplog.at_level(logging.WARNING, logger="pressrun.multicast.receiver"):
        result = await _fetch(pub, "{}:{}".format(*sender.config.control_group), forged)
    _all_from_the_carousel(result, pub)
    assert "the directive's plan refused: channels differ" in result.multicast_note
    assert any(
        "not the one the signed announcement names" in r.getMessage() for r in caplog.records
    )


async def test_a_plan_of_another_manifest_is_refused_before_any_join(
    published: Callable[[int], Published],
    sender_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pub = published(SIZE)
    sender, plan = await _carousel(pub, sender_factory)
    other = dataclasses.replace(plan, manifest_sha256="00" * 32)
    with caplog.at_level(logging.WARNING, logger="pressrun.clients"):
        result = await _fetch(pub, "{}:{}".format(*sender.config.control_group), other)
    _all_from_the_carousel(result, pub)  # from the announcement, as without a plan
    assert "the directive's plan" not in result.multicast_note
    assert any(
        "names another manifest" in r.getMessage() and "refused" in r.getMessage()
        for r in caplog.records
    )


async def test_a_stale_plan_of_a_stopped_carousel_falls_back_to_the_origin(
    published: Callable[[int], Published], sender_factory: Any
) -> None:
    """The carousel stopped after the balancer took its plan: the sender's next round
    of announcements does not name it, the receive ends there, and the origin brings
    the file (verified)."""
    pub = published(SIZE)
    sender, plan = await _carousel(pub, sender_factory)
    assert sender.stop_carousel(ISSUE)
    result = await _fetch(pub, "{}:{}".format(*sender.config.control_group), plan)
    assert result.path.read_bytes() == pub.data
    assert result.bytes_from_multicast == 0
    assert sum(result.bytes_by_origin.values()) == SIZE
    assert result.multicast_note is not None
    assert "the sender stopped the carousel" in result.multicast_note
