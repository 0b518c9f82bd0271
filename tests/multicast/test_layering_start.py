"""The layering's start (issue 28, session 23): the first window from the first
packet, and a start on the channels the receiver's link has been seen to carry.

In flash-crowd-50-desktops a reader's first step (its first join to its second) took
0.9-3.0 s (369aaf6, 29 Nov 06:28) and 1.7-3.7 s (d143269, 07:13) against 0.82 s on
loopback: the start settled 0.3 s after its join returned, then judged a window of
0.5 s. Now a start on one channel has no settling (nothing of the receiver's was
queued before it) and takes effect at its first packet's arrival, so the first step
is one window after that packet; a reader that leaves the swarm for the carousel
starts on the channels whose rates together are at most the best rate the swarm
brought it. Pure: the core alone, and behind the simulated shaped link."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pressrun.emulate.fleet import kept_above
from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.core import LocalProtocolError
from pressrun.multicast.events import JoinChannel
from pressrun.multicast.layering import LayerCore

from .conftest import shaped_link_trace

CONFIG = LayeringConfig(window_s=0.5, settle_s=0.3)


def test_a_start_on_one_channel_judges_a_window_from_its_first_packet() -> None:
    """The join returned at 0; the network forwarded the group from 1.0 s (the
    adapter says so with the first packet's arrival stamp). The first window is
    [1.0, 1.5], judged on its own packets, and the second channel is joined at 1.5.
    Before, the start settled until 0.3 s after the join returned, a window of no
    packet then one that began before the first and looked like a slow sender held
    the join back: the second channel came at 1.8 s at the earliest."""
    layers = LayerCore(CONFIG, (100.0,) * 4)
    assert layers.start(now=0.0) == [JoinChannel(0)]
    layers.handle_applied(now=1.0)  # the first packet's arrival
    assert layers.next_deadline() == pytest.approx(1.5)
    layers.handle_sequence(0, received=50, expected=50)
    layers.handle_packets(0, 50)
    assert layers.handle_timer(now=1.5) == [JoinChannel(1)]
    assert layers.windows_ended == 1 and layers.empty_windows == 0
    assert layers.slow_sender_windows == 0 and layers.losses == [0.0]
    # the join settles as every join does
    assert layers.next_deadline() == pytest.approx(1.8)


def test_the_first_window_waits_for_its_packets_to_be_read() -> None:
    """Arrival time holds for the start too: a loop that has read only to 1.2 s
    when the first window (from 1.0 s) is due judges nothing until it has read to
    1.5 s."""
    layers = LayerCore(CONFIG, (100.0,) * 4)
    layers.start(now=0.0)
    layers.handle_applied(now=1.0)
    assert layers.handle_timer(now=1.6, read_up_to=1.2) == []
    assert layers.windows_ended == 0
    layers.handle_sequence(0, received=60, expected=60)
    assert layers.handle_timer(now=1.7, read_up_to=1.62) == [JoinChannel(1)]


def test_channels_within_a_rate() -> None:
    layers = LayerCore(CONFIG, (100.0,) * 10)
    assert layers.channels_within(0.0) == 1  # one channel whatever the link
    assert layers.channels_within(99.0) == 1
    assert layers.channels_within(380.0) == 3  # whole channels only
    assert layers.channels_within(400.0) == 4
    assert layers.channels_within(1e9) == 10  # at most the plan
    capped = LayerCore(LayeringConfig(max_channels=6), (100.0,) * 10)
    assert capped.channels_within(1e9) == 6
    unequal = LayerCore(CONFIG, (400.0, 100.0, 100.0, 200.0))
    assert unequal.channels_within(550.0) == 2  # 400 + 100; with the next, 600
    with pytest.raises(LocalProtocolError):
        layers.channels_within(-1.0)


def test_a_start_from_the_links_rate_settles_and_climbs_on() -> None:
    """Three channels from the start (a link that has shown 3.8 channels' worth): the
    start settles (several channels: what the link queues of them is judged only once
    it has filled), then the climb doubles from there."""
    layers = LayerCore(CONFIG, (100.0,) * 10)
    start = layers.channels_within(380.0)
    assert layers.start(now=0.0, channels=start) == [JoinChannel(i) for i in range(3)]
    layers.handle_applied(now=0.05)
    assert layers.next_deadline() == pytest.approx(0.35)
    assert layers.handle_timer(now=0.35) == []
    for ch in range(3):
        layers.handle_sequence(ch, received=50, expected=50)
        layers.handle_packets(ch, 50)
    assert layers.handle_timer(now=0.85) == [JoinChannel(i) for i in range(3, 6)]
    with pytest.raises(LocalProtocolError):
        LayerCore(CONFIG, (100.0,) * 4).start(now=0.0, channels=0)


@pytest.mark.parametrize("carries", [3, 4, 9])
def test_a_start_from_the_links_rate_is_never_above_the_link(carries: int) -> None:
    """Behind a link of 0.97 x ``carries`` channels (the headers, as in
    test_layering_climb.py) that has shown 0.96 of that to the swarm (TCP's payload):
    the receiver starts on the whole channels below it, ends on what the link
    carries, and no window of the layering ends with it above the link (the report's
    check)."""
    shown = 0.96 * 0.97 * carries * 100_000.0
    start = LayerCore(CONFIG, (100_000.0,) * 10).channels_within(shown)
    assert start == carries - 1
    # `shaped_link_trace` starts the core itself, on ``start_channels``
    layers = LayerCore(replace(CONFIG, start_channels=start), (100_000.0,) * 10)
    log, windows = shaped_link_trace(
        layers, carries_pps=97.0 * carries, queue_packets=19.0, until=30.0, leave_latency_s=2.0
    )
    held = [n for _, n, _ in log]
    assert held[0] == carries - 1, log
    assert held[-1] in (carries, carries + 1), log  # at the end a probe may be out
    assert kept_above([(n, w) for _, n, w in log], windows, carries) == 0, log
