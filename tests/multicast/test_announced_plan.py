"""A receiver given the plan its caller already accepted from an announcement (a swarm
client's watch of the control channel, `pressrun.clients.carousel_watch`) joins the
carousel's channels at once (`receive_carousel(announced=...)`), not at the next
announcement: a leaver of flash-crowd-50-desktops at a23629d waited up to an
announcement interval (0.5 s) for one more after it had chosen the carousel on one.
A real carousel on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.multicast.config import CarouselConfig, LayeringConfig

from .conftest import Shelf, random_groups, receive_issue


async def test_an_announced_plan_is_received_with_no_announcement_heard(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    """The receiver listens on a control group nobody announces on: given the plan, it
    joins the channels and decodes the issue; without it, it hears nothing and ends."""
    data = shelf.publish("told", 600_000)
    sender = await senders(shelf, CarouselConfig(channels=1, rate_bps=10e6))
    plan = await sender.start_carousel("told", sender.config.carousel)
    silent, _ = random_groups(random.Random())
    assert silent != sender.config.control_group
    result = await receive_issue(
        shelf,
        silent,
        "told",
        tmp_path / "rx",
        layering=LayeringConfig(max_channels=1),
        announced=plan,
    )
    assert result.completed, result.reason
    assert result.path.read_bytes() == data
    assert result.verdicts.get("accepted", 0) == 0  # no announcement was heard
    unheard = await receive_issue(
        shelf, silent, "told", tmp_path / "rx2", deadline_s=1.0, announcement_wait_s=0.5
    )
    assert not unheard.completed and unheard.plan is None


async def test_a_plan_of_another_issue_or_version_is_refused(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    shelf.publish("told", 100_000)
    sender = await senders(shelf, CarouselConfig(channels=1, rate_bps=10e6))
    plan = await sender.start_carousel("told", sender.config.carousel)
    for wrong in (
        dataclasses.replace(plan, issue_id="other"),
        dataclasses.replace(plan, manifest_sha256="00" * 32),
    ):
        with pytest.raises(ValueError, match="not this issue's"):
            await receive_issue(
                shelf, sender.config.control_group, "told", tmp_path / "rx", announced=wrong
            )
