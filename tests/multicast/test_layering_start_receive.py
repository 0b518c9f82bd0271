"""The layering's start in `receive_carousel` (issue 28, session 23): the start takes
effect at its first packet's arrival (the kernel's stamp), and a receiver told what its
link has carried (``link_bps``) starts on that many channels' worth. The core's rules:
test_layering_start.py. A real carousel on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.multicast.config import CarouselConfig, LayeringConfig

from .conftest import Shelf, receive_issue

LAYERING = LayeringConfig(window_s=0.5, settle_s=0.3)


async def test_the_start_is_timed_from_its_first_packet(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    """One channel at the start: the result says when its first packet arrived, and
    the first join comes a whole window after it (judged on that window alone)."""
    data = shelf.publish("first-packet", 1_500_000)
    sender = await senders(shelf, CarouselConfig(channels=4, rate_bps=2e6))
    await sender.start_carousel("first-packet", sender.config.carousel)
    result = await receive_issue(
        shelf, sender.config.control_group, "first-packet", tmp_path / "rx", layering=LAYERING
    )
    assert result.completed, result.reason
    assert result.path.read_bytes() == data
    assert result.first_packet_s is not None
    assert 0.0 <= result.first_packet_s < 1.0, result.first_packet_s
    assert result.channel_log[0] == (0.0, 1)
    first_join, windows = result.channel_log[1][0], result.channel_log_windows[1]
    assert first_join >= result.first_packet_s + LAYERING.window_s, result.channel_log
    assert windows == 1, (result.channel_log, result.channel_log_windows)


async def test_a_receiver_told_its_links_rate_starts_on_that_many_channels(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    """A link shown to carry 4.5 Mbit/s of a plan of 2 Mbit/s channels: the receive
    starts on 2 channels (4 Mbit/s, whole channels only), settles from the first
    packet, and goes on climbing; the issue decodes bit-exact. Without ``link_bps``
    it starts on one (above)."""
    data = shelf.publish("link-rate", 1_500_000)
    sender = await senders(shelf, CarouselConfig(channels=4, rate_bps=2e6))
    await sender.start_carousel("link-rate", sender.config.carousel)
    result = await receive_issue(
        shelf,
        sender.config.control_group,
        "link-rate",
        tmp_path / "rx",
        layering=LAYERING,
        link_bps=4.5e6,
    )
    assert result.completed, result.reason
    assert result.path.read_bytes() == data
    assert result.channel_log[0] == (0.0, 2)
    assert result.first_packet_s is not None
    if len(result.channel_log) > 1:  # the climb's next step, if the object lasted
        assert result.channel_log[1][0] >= (
            result.first_packet_s + LAYERING.settle_s + LAYERING.window_s
        ), result.channel_log
    with pytest.raises(ValueError, match="link_bps"):
        await receive_issue(
            shelf, sender.config.control_group, "link-rate", tmp_path / "rx2", link_bps=-1.0
        )
