"""A join that blocks: the layering's settling is timed from when the change took
effect, not from the decision (issue 28; flash-crowd-50 at bdd9429, 28 Nov 15:33).

In that run 10 of 35 carousel receivers held a channel above their link past a
measuring window. Their logs show why: the decisions to join came at about 64.9 s
and the joins returned 2.9 s later (``IP_ADD_MEMBERSHIP`` takes the kernel's network
configuration lock, shared by every namespace, while the peak's containers were being
set up). Settling timed from the decision had passed by then, so the window began as
the channel's first packets arrived, while the link's queue was still filling: the
probe measured under the leave threshold, was kept a window (or another channel was
joined on it) and left only at the next.

Pure: the core driven with an explicit ``now`` behind a simulated shaped link; two
tests go through `receive_carousel` with a real sender on 127.0.0.1, the second
showing the loop reads on while a join blocks (the joins and leaves run in a thread
of their own since session 21: the kernel's lock held them 9-13 s on 29 Nov)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.emulate.fleet import kept_above
from pressrun.multicast.config import CarouselConfig, LayeringConfig
from pressrun.multicast.core import LocalProtocolError
from pressrun.multicast.layering import LayerCore

from .conftest import Shelf, receive_issue, shaped_link_trace


@pytest.mark.parametrize("stall_s", [0.0, 0.4, 2.9])
def test_a_join_that_blocks_is_left_by_the_first_window_after_it_settled(
    stall_s: float,
) -> None:
    """Behind a link that carries one channel and a quarter, with a queue that hides
    a second channel's excess for its first 0.25 s, every probe of a second channel
    is left by the first window after it settled, however long the join took to
    return: no window ends with the probe kept (the report's check,
    `fleet.kept_above`), and it lasts settle_s + window_s from the join's return.
    Before the fix (settling timed from the decision) a join that took 2.9 s was
    judged on the window that began as its packets arrived, measured 19% loss,
    and was kept to the next window."""
    config = LayeringConfig(window_s=0.5, settle_s=0.3)
    layers = LayerCore(config, (100_000.0,) * 3)
    log, windows = shaped_link_trace(
        layers, carries_pps=125.0, queue_packets=19.0, until=40.0, stall_s=stall_s
    )
    above = [(t, next_t) for (t, n, _), (next_t, _, _) in itertools.pairwise(log) if n > 1]
    assert len(above) >= 3, log  # probed, backed off, probed again
    assert kept_above([(n, w) for _, n, w in log], windows, 1) == 0, log
    for joined, left in above:
        # from the join's return to the leave's start: settling and one window
        assert left - stall_s - joined == pytest.approx(config.settle_s + config.window_s), log
    assert max(layers.losses) > config.leave_above_loss


def test_applied_restarts_settling_and_forgets_what_was_counted() -> None:
    """`handle_applied` after a join: the settling ends settle_s after it, and the
    packets counted between the decision and it (the old channels' while the join
    blocked) are not in any window."""
    layers = LayerCore(LayeringConfig(window_s=0.5, settle_s=0.3), (100.0,) * 3)
    layers.start(now=0.0)
    layers.handle_applied(now=0.0)  # a start on one channel: no settling
    layers.handle_packets(0, 50)
    assert [type(e).__name__ for e in layers.handle_timer(now=0.5)] == ["JoinChannel"]
    layers.handle_packets(0, 10)  # counted while the join blocked
    layers.handle_applied(now=3.7)
    assert layers.next_deadline() == pytest.approx(4.0)
    assert layers.handle_timer(now=3.9) == []  # still settling
    assert layers.handle_timer(now=4.0) == []  # settled: the window starts
    assert layers.next_deadline() == pytest.approx(4.5)
    with pytest.raises(LocalProtocolError):
        LayerCore(LayeringConfig(), (100.0,)).handle_applied(now=0.0)


async def test_receive_carousel_settles_from_the_join_s_return(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the adapter, with a real carousel on 127.0.0.1 (no loss: the receiver
    joins on): the second channel's join blocks 1 s. The next change comes no sooner
    than settle_s + window_s after that join returned, and the log times the join
    at its return. Before the fix the window began as the join returned (its
    settling had passed during the block) and the next join came 0.5 s after it."""
    shelf.publish("slow-join", 2_000_000)
    sender = await senders(shelf, CarouselConfig(channels=3, rate_bps=3e6))
    await sender.start_carousel("slow-join", sender.config.carousel)
    joins = _second_join_blocks_1_s(monkeypatch)
    config = LayeringConfig(window_s=0.5, settle_s=0.3)
    result = await receive_issue(
        shelf, sender.config.control_group, "slow-join", tmp_path / "rx", layering=config
    )
    assert result.completed, result.reason
    first = joins[0][1]  # channel 0's join: the receive's joined_at, within a few ms
    slow = [j for j in joins if j[0] == 1]
    assert slow, (joins, result.channel_log)
    returned = slow[0][2] - first
    entries = [t for t, _ in result.channel_log]
    at = next(i for i, (_, n) in enumerate(result.channel_log) if n == 2)
    assert entries[at] == pytest.approx(returned, abs=0.05), (result.channel_log, returned)
    assert at + 1 < len(entries), result.channel_log  # joined the third channel
    gap = entries[at + 1] - returned
    assert gap >= config.settle_s + config.window_s - 0.02, (result.channel_log, returned)
    assert result.change_apply_max_s >= 1.0


async def test_the_loop_reads_on_while_a_join_blocks(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real carousel on 127.0.0.1: the second channel's join blocks 1 s (as the
    kernel's network lock held them 2.9-13 s on the emulation's host). The receive
    loop reads the first channel on meanwhile, so when the join returns the adapter
    tells the core (`handle_applied`'s ``read_up_to``) that it has read about to
    then. Before, the join blocked the reading thread: that second's packets waited
    in the socket (overflowing it when the block was long) and were read after the
    change, in the probe's settling and window."""
    shelf.publish("read-up-to", 2_000_000)
    sender = await senders(shelf, CarouselConfig(channels=3, rate_bps=3e6))
    await sender.start_carousel("read-up-to", sender.config.carousel)
    calls = _second_join_blocks_1_s(monkeypatch)
    told: list[tuple[float, float | None]] = []  # (applied, read_up_to)
    applied = LayerCore.handle_applied

    def record(self: LayerCore, *, now: float, read_up_to: float | None = None) -> None:
        told.append((now, read_up_to))
        applied(self, now=now, read_up_to=read_up_to)

    monkeypatch.setattr(LayerCore, "handle_applied", record)
    result = await receive_issue(
        shelf,
        sender.config.control_group,
        "read-up-to",
        tmp_path / "rx",
        layering=LayeringConfig(window_s=0.5, settle_s=0.3),
    )
    assert result.completed, result.reason
    _, called, returned = next(c for c in calls if c[0] == 1)
    at, read_up_to = next(t for t in told if t[0] >= returned)
    assert at - returned < 0.05
    # nothing unread, or only what arrived in the loop's last batch wait: not the
    # second the join blocked
    assert read_up_to is None or read_up_to >= returned - 0.1, (told, called, returned)
    assert returned - called >= 1.0 and result.socket_drops == 0


def _second_join_blocks_1_s(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float, float]]:
    """Make channel 1's join block 1 s; the joins made, as (channel, called, returned)."""
    from pressrun.multicast.channels import ChannelSockets

    joins: list[tuple[int, float, float]] = []
    join = ChannelSockets.open_channel

    def slow_join(self: Any, index: int) -> Any:
        called = time.perf_counter()
        if index == 1:
            time.sleep(1.0)
        sock = join(self, index)
        joins.append((index, called, time.perf_counter()))
        return sock

    monkeypatch.setattr(ChannelSockets, "open_channel", slow_join)
    return joins
