"""A channel left keeps coming down the link for the network's leave latency, and the
layering does not take that for its remaining channels' loss (issue 28, session 18).

An IGMP querier (RFC 2236 / RFC 3376; the emulation's Linux bridge with
``mcast_querier 1``) answers a leave with a group-specific query and forwards the group
until its last-member query time has passed: 2 queries 1 s apart, about 2 s. In
flash-crowd-50 at 297117b (28 Nov 18:12, /work/runs/fc50-s17c) 9 of 10 dsl-20 readers
ended on 3 channels where their link carries 4 (3.88 with the headers): every leave of a
5th-channel probe was followed 0.9-1.8 s later by a leave of the 4th at 13-18% loss
(clients 15, 23), the window after the settling still seeing the probe's packets. Now
the window after a leave starts only once the leave latency (``leave_latency_s``, 2 s)
and the settling have passed. Pure: the core behind a simulated shaped link."""

from __future__ import annotations

import itertools

import pytest

from pressrun.emulate.fleet import kept_above
from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.layering import LayerCore

from .conftest import shaped_link_trace

#: an IGMP querier's last-member query time with the defaults (2 queries, 1 s apart)
IGMP_LEAVE_LATENCY_S = 2.0


@pytest.mark.parametrize("carries", [2, 4, 6])
def test_a_probe_left_does_not_take_a_channel_the_link_carries_with_it(carries: int) -> None:
    """Ten channels of 100 packets/s behind a link of 0.97 x k of them (k channels of
    5 Mbit/s payload on a k x 5 Mbit/s link: the headers are 3% more), each channel
    left still on the link for 2 s: once the receiver holds k it never holds fewer
    (every probe of a (k+1)-th is left alone), and no window ends above the link. On
    the code before, the window after each probe's leave saw the probe's packets and
    the k-th channel went too (k - 1 held, for the doubled wait)."""
    config = LayeringConfig(window_s=0.5, settle_s=0.3)
    assert config.leave_latency_s == IGMP_LEAVE_LATENCY_S
    layers = LayerCore(config, (100_000.0,) * 10)
    log, windows = shaped_link_trace(
        layers,
        carries_pps=97.0 * carries,
        queue_packets=19.0,
        until=90.0,
        leave_latency_s=IGMP_LEAVE_LATENCY_S,
    )
    held = [n for _, n, _ in log]
    # the first climb at most doubles the channels a join, until a window shows loss
    reached = next(i + 1 for i, (a, b) in enumerate(itertools.pairwise(held)) if b < a)
    assert held[reached] == carries, log
    assert max(held[reached:]) == carries + 1, log  # it probed
    assert min(held[reached:]) == carries, log
    assert kept_above([(n, w) for _, n, w in log], windows, carries) == 0, log


def test_a_link_that_carries_fewer_is_still_left_at_once() -> None:
    """Six channels held where the link carries three: the leave takes the three it
    does not carry in one window, and with the leave latency waited out, the receiver
    settles on three (it is not held above its link for longer by the wait: the
    channels go at the first window)."""
    config = LayeringConfig(window_s=0.5, settle_s=0.3, start_channels=6)
    layers = LayerCore(config, (100_000.0,) * 10)
    log, windows = shaped_link_trace(
        layers,
        carries_pps=300.0,
        queue_packets=19.0,
        until=30.0,
        leave_latency_s=IGMP_LEAVE_LATENCY_S,
    )
    assert log[1][1] == 3, log  # the first change: straight to 3
    assert log[1][0] <= config.settle_s + config.window_s + 1e-6, log
    assert min(n for _, n, _ in log[1:]) == 3, log
    assert kept_above([(n, w) for _, n, w in log], windows, 3) == 0, log


def test_a_join_waits_out_the_leave_latency_too() -> None:
    """After a leave nothing is judged until the leave latency and the settling have
    passed: the next window starts 2.3 s after the leave returned, so the next
    decision is 2.8 s after it, not 0.8 s."""
    config = LayeringConfig(window_s=0.5, settle_s=0.3, start_channels=2)
    layers = LayerCore(config, (100.0,) * 4)
    layers.start(now=0.0)
    layers.handle_applied(now=0.0)
    assert layers.handle_timer(now=0.3) == []  # settled
    for ch in (0, 1):
        layers.handle_sequence(ch, received=25, expected=50)
        layers.handle_packets(ch, 25)
    effects = layers.handle_timer(now=0.8)  # 50% loss: one leave
    assert len(effects) == 1
    layers.handle_applied(now=0.9)
    assert layers.next_deadline() == pytest.approx(0.9 + 2.0 + 0.3)
