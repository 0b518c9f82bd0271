"""The first climb doubles the channels held a join until a window shows loss, and the
layering's rules hold for channels of unequal rates (issue 28, session 22).

flash-crowd-50-desktops at 369aaf6 (29 Nov 06:28-06:35, /work/runs/s22-e2): a fibre-50
reader of 10 x 5 Mbit/s joined one channel a window (settle 0.3 s + window 0.5 s) and
held its 10 channels 9.0 s into a 15.1 s receive (8.2 s nominal); a dsl-20 reader held
its 4 from 2.8-2.9 s. Now, until a window shows path loss at or above the join
threshold, a join adds the next channels whose rate together is at most the rate held
(TCP's slow start, in channels): 1, 2, 4, 8, 10. The first loss ends it, and the
channels the loss says the link did not carry go at once (as before), then one channel
a join (RLM). Pure: the core behind a simulated shaped link."""

from __future__ import annotations

import itertools

import pytest

from pressrun.emulate.fleet import kept_above
from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.events import JoinChannel, LeaveChannel
from pressrun.multicast.layering import LayerCore

from .conftest import shaped_link_trace


def _held(log: list[tuple[float, int, int]]) -> list[int]:
    return [n for _, n, _ in log]


def test_a_link_that_carries_all_ten_holds_them_after_four_joins() -> None:
    config = LayeringConfig(window_s=0.5, settle_s=0.3)
    layers = LayerCore(config, (100_000.0,) * 10)
    log, _ = shaped_link_trace(layers, carries_pps=1000.0, queue_packets=19.0, until=10.0)
    assert _held(log) == [1, 2, 4, 8, 10], log
    # a window for the start's step (no settling on one channel), settle + window for
    # the others: all ten 2.9 s after the start, not 6.9 s one at a time
    steps = config.window_s + 3 * (config.settle_s + config.window_s)
    assert log[-1][0] == pytest.approx(steps), log
    assert layers.multi_joins == 3  # 2 -> 4, 4 -> 8, 8 -> 10
    # without the doubling (as before): nine joins
    single_steps = LayeringConfig(window_s=0.5, settle_s=0.3, climb_doubling=False)
    single = LayerCore(single_steps, (100_000.0,) * 10)
    log, _ = shaped_link_trace(single, carries_pps=1000.0, queue_packets=19.0, until=10.0)
    assert _held(log) == list(range(1, 11)), log


@pytest.mark.parametrize("carries", [1, 3, 4, 6, 9])
def test_an_overshoot_is_left_in_one_window_and_then_one_channel_a_probe(carries: int) -> None:
    """A link of 0.97 x k channels (the headers): the climb overshoots once, the
    window after it keeps what the loss says the link carried (k), and every later
    probe is one channel; no window ends above the link."""
    config = LayeringConfig(window_s=0.5, settle_s=0.3)
    layers = LayerCore(config, (100_000.0,) * 10)
    log, windows = shaped_link_trace(
        layers, carries_pps=97.0 * carries, queue_packets=19.0, until=60.0, leave_latency_s=2.0
    )
    held = _held(log)
    fall = next(i + 1 for i, (a, b) in enumerate(itertools.pairwise(held)) if b < a)
    assert held[fall] == carries, log
    assert held[fall - 1] <= 2 * carries, log  # the overshoot at most doubled
    assert max(held[fall:]) == carries + 1, log
    assert held[-1] in (carries, carries + 1), log
    assert not layers.climbing
    assert kept_above([(n, w) for _, n, w in log], windows, carries) == 0, log


def test_a_window_with_random_loss_ends_the_climb() -> None:
    """A lossy link (8% random loss, every channel carried): no join on that window,
    and the joins after it add one channel each."""
    layers = LayerCore(LayeringConfig(window_s=1.0, settle_s=0.0, start_channels=2), (100.0,) * 10)
    layers.start(now=0.0)
    for ch in range(2):
        layers.handle_sequence(ch, received=92, expected=100)
        layers.handle_packets(ch, 92)
    assert layers.handle_timer(now=1.0) == []
    assert not layers.climbing
    for ch in range(2):
        layers.handle_sequence(ch, received=100, expected=100)
        layers.handle_packets(ch, 100)
    assert layers.handle_timer(now=2.0) == [JoinChannel(2)]


def test_a_step_undone_for_a_slow_sender_leaves_all_its_channels_and_climbs_on() -> None:
    """The step's channels go together; the climb goes on (no loss was seen: the
    window showed nothing of the link), so the next join doubles again
    (tests/multicast/test_layering_measured.py)."""
    layers = LayerCore(LayeringConfig(window_s=1.0, settle_s=0.0, start_channels=2), (100.0,) * 10)
    layers.start(now=0.0)
    for ch in range(2):
        layers.handle_sequence(ch, received=100, expected=100)
        layers.handle_packets(ch, 100)
    assert layers.handle_timer(now=1.0) == [JoinChannel(2), JoinChannel(3)]
    for ch in range(4):  # the sender at half its rate in the step's window
        layers.handle_sequence(ch, received=50, expected=50)
        layers.handle_packets(ch, 50)
    effects = layers.handle_timer(now=2.0)
    assert [(e.index, e.why) for e in effects if isinstance(e, LeaveChannel)] == [
        (3, "the sender under its rate in its window"),
        (2, "the sender under its rate in its window"),
    ]
    assert len(layers.joined) == 2 and layers.climbing


def test_channels_of_unequal_rates() -> None:
    """Cumulative layers of unequal rates (channel rates 4, 1, 1, 2, 4): the climb
    adds channels whose rate is at most the rate held; the leave threshold is half
    the last channel's share of the rate held; the channels kept are those whose
    cumulative rate is nearest what the link carried."""
    rates = (400.0, 100.0, 100.0, 200.0, 400.0)
    layers = LayerCore(LayeringConfig(window_s=1.0, settle_s=0.0), rates)
    # held 1 (rate 4): half of 4 of 4 is 50%, capped at 25%; held 4 (rate 8): half
    # of 2 of 8; held 5 (12): half of 4 of 12
    assert [round(layers.leave_threshold(k), 3) for k in (1, 4, 5)] == [0.25, 0.125, 0.167]
    layers.start(now=0.0)
    layers.handle_sequence(0, received=400, expected=400)
    layers.handle_packets(0, 400)
    # rate held 4: channels 1, 2 and 3 add 1 + 1 + 2 = 4
    assert layers.handle_timer(now=1.0) == [JoinChannel(1), JoinChannel(2), JoinChannel(3)]
    # a link that carries 5.2 of the 8 held: 35% loss; cumulative rates 4, 5, 6, 8:
    # 5.2 is a fifth of the way from 2 channels' rate to 3 channels', 2.2 channels,
    # so 2 are kept and channels 3 and 2 go
    for ch, rate in enumerate(rates[:4]):
        sent = int(rate)
        layers.handle_sequence(ch, received=round(sent * 5.2 / 8), expected=sent)
        layers.handle_packets(ch, round(sent * 5.2 / 8))
    effects = layers.handle_timer(now=2.0)
    assert [e.index for e in effects if isinstance(e, LeaveChannel)] == [3, 2]
    assert len(layers.joined) == 2
