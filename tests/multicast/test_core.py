"""The multicast cores driven synchronously with an explicit ``now``."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.multicast.config import CarouselConfig, LayeringConfig
from pressrun.multicast.core import (
    AnnouncementClock,
    AnnouncementGate,
    CarouselSchedule,
    LocalProtocolError,
    channel_cycles,
)
from pressrun.multicast.events import (
    Announcement,
    AnnouncementVerdict,
    JoinChannel,
    LeaveChannel,
)
from pressrun.multicast.layering import LayerCore


def _pass(blocks: int, k: int, repair: int) -> tuple[list[int], list[int]]:
    """SBNs and ESIs of a pass as the crate's sender orders it (4 blocks interleaved)."""
    sbns: list[int] = []
    esis: list[int] = []
    for first in range(0, blocks, 4):
        window = range(first, min(blocks, first + 4))
        for esi in range(k + repair):
            for sbn in window:
                sbns.append(sbn)
                esis.append(esi)
    return sbns, esis


def test_raptorq_channels_carry_disjoint_symbols_spread_over_blocks() -> None:
    sbns, esis = _pass(6, 100, 170)
    cycles = channel_cycles(
        fec="raptorq", sbns=sbns, esis=esis, channels=2, fdt_packets=2, fdt_every_packets=50
    )
    data = [set(c) - {0, 1} for c in cycles]
    assert data[0].isdisjoint(data[1])
    assert data[0] | data[1] == set(range(2, 2 + len(esis)))
    for cycle in cycles:
        # the FDT at the start and after every 50 object packets
        assert cycle[:2] == (0, 1)
        fdt_at = [i for i, p in enumerate(cycle) if p == 0]
        assert all(b - a == 52 for a, b in itertools.pairwise(fdt_at))
        # every block progresses at the same pace: any 10% of the cycle holds about
        # 10% of each block's packets on this channel
        objects = [p - 2 for p in cycle if p >= 2]
        tenth = objects[: len(objects) // 10]
        per_block = Counter(sbns[p] for p in tenth)
        assert set(per_block) == set(range(6))
        assert max(per_block.values()) - min(per_block.values()) <= 1
        # a channel alone carries K x (1 + overhead) symbols of each block
        assert Counter(sbns[p] for p in objects) == dict.fromkeys(range(6), 135)


def test_no_code_channels_are_phase_shifted_copies() -> None:
    esis = list(range(9))
    cycles = channel_cycles(
        fec="none", sbns=[0] * 9, esis=esis, channels=3, fdt_packets=1, fdt_every_packets=100
    )
    assert cycles[0] == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert cycles[1] == (0, 4, 5, 6, 7, 8, 9, 1, 2, 3)
    assert cycles[2] == (0, 7, 8, 9, 1, 2, 3, 4, 5, 6)


def test_channel_cycles_misuse() -> None:
    with pytest.raises(LocalProtocolError):
        channel_cycles(fec="rs", sbns=[0], esis=[0], channels=1, fdt_packets=1, fdt_every_packets=9)
    with pytest.raises(LocalProtocolError):
        channel_cycles(
            fec="none", sbns=[0], esis=[0], channels=0, fdt_packets=1, fdt_every_packets=9
        )


def test_repair_sizing_gives_each_channel_its_share() -> None:
    config = CarouselConfig(
        channels=3, cycle_overhead=0.25, symbol_bytes=1000, max_source_block_symbols=1024
    )
    size = 2_500_000  # 2500 symbols: 3 blocks of 834 at most 1024
    repair = config.repair_symbols_per_block(size)
    assert repair == -(-834 * 3 * 1.25 // 1) - 834
    assert CarouselConfig(fec="none").repair_symbols_per_block(size) == 0


def test_schedule_paces_each_channel_and_wraps_the_cycle() -> None:
    schedule = CarouselSchedule([(7, 8, 9), (1, 2)], [100.0, 10.0], now=0.0)
    assert schedule.next_deadline() == 0.0
    first = schedule.handle_timer(now=0.0)
    assert [(b.channel, b.packets) for b in first] == [(0, (7,)), (1, (1,))]
    assert schedule.next_deadline() == pytest.approx(0.01)
    later = schedule.handle_timer(now=0.05)  # 5 more on channel 0, none on channel 1
    assert [(b.channel, b.packets) for b in later] == [(0, (8, 9, 7, 8, 9))]
    assert schedule.sent(0) == 6 and schedule.cycles_done(0) == 2.0
    assert schedule.cycle_s(0) == pytest.approx(0.03)


def test_schedule_never_bursts_past_max_burst() -> None:
    schedule = CarouselSchedule([tuple(range(100))], [1000.0], now=0.0, max_burst=10)
    schedule.handle_timer(now=0.0)
    batches = schedule.handle_timer(now=1.0)  # 1000 due: woke very late
    assert len(batches[0].packets) == 10
    assert schedule.slipped(0) == 990
    # and the pace goes on from there, not with a catch-up burst
    assert sum(len(b.packets) for b in schedule.handle_timer(now=1.0055)) == 5


@given(
    rate=st.floats(min_value=10, max_value=1e5),
    steps=st.lists(st.floats(min_value=0, max_value=0.01), min_size=1, max_size=200),
)
@settings(max_examples=100, deadline=None)
def test_schedule_rate_is_a_ceiling(rate: float, steps: list[float]) -> None:
    """Whatever the wake-ups, a channel never sends more than rate x elapsed + 1."""
    schedule = CarouselSchedule([(0, 1, 2)], [rate], now=0.0, max_burst=50)
    now = 0.0
    for step in steps:
        now += step
        schedule.handle_timer(now=now)
        assert schedule.sent(0) <= rate * now + 1 + 1e-6


def _layers(**kw: float | int | None) -> LayerCore:
    config = LayeringConfig(window_s=1.0, settle_s=0.0, **kw)  # type: ignore[arg-type]
    return LayerCore(config, (100.0, 100.0, 100.0))


def test_layering_adds_channels_while_loss_is_low() -> None:
    layers = _layers()
    assert layers.start(now=0.0) == [JoinChannel(0)]
    layers.handle_packets(0, 99)
    assert layers.handle_timer(now=1.0) == [JoinChannel(1)]
    layers.handle_packets(0, 100)
    layers.handle_packets(1, 100)
    assert layers.handle_timer(now=2.0) == [JoinChannel(2)]
    for ch in range(3):
        layers.handle_packets(ch, 100)
    assert layers.handle_timer(now=3.0) == []  # every channel joined
    assert layers.most_joined == 3


def test_layering_leaves_when_loss_climbs_and_backs_off() -> None:
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_packets(0, 100)
    assert layers.handle_timer(now=1.0) == [JoinChannel(1)]
    layers.handle_packets(0, 60)
    layers.handle_packets(1, 60)  # 40% loss once two channels are joined
    effects = layers.handle_timer(now=2.0)
    assert len(effects) == 1 and isinstance(effects[0], LeaveChannel)
    assert effects[0].index == 1 and effects[0].loss == pytest.approx(0.4)
    layers.handle_packets(0, 100)
    assert layers.handle_timer(now=3.0) == []  # backing off before trying again
    layers.handle_packets(0, 100)
    assert layers.handle_timer(now=4.0) == []
    layers.handle_packets(0, 250)
    # the channel waits twice what a failed probe costs the link (window 1 s + leave
    # latency 2 s) from its leave: 8 s
    assert layers.handle_timer(now=6.5) == []
    layers.handle_packets(0, 200)
    assert layers.handle_timer(now=8.5) == [JoinChannel(1)]


def test_layering_keeps_channels_at_moderate_loss() -> None:
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_packets(0, 90)  # 10% random loss: no join, no leave
    assert layers.handle_timer(now=1.0) == []
    assert layers.losses == [pytest.approx(0.1)]


def test_layering_respects_max_and_start_channels() -> None:
    layers = _layers(max_channels=2, start_channels=2)
    assert layers.start(now=0.0) == [JoinChannel(0), JoinChannel(1)]
    layers.handle_packets(0, 100)
    layers.handle_packets(1, 100)
    assert layers.handle_timer(now=1.0) == []
    with pytest.raises(LocalProtocolError):
        layers.start(now=2.0)


def _ann(
    seq: int, *, key: str = "ab" * 32, issued: float = 1000.0, ttl: float = 5.0
) -> Announcement:
    return Announcement(key, seq, issued, issued + ttl, ())


def test_gate_accepts_fresh_signed_trusted_in_order() -> None:
    gate = AnnouncementGate({"ab" * 32})
    assert gate.handle(_ann(1), signature_ok=True, now_unix=1001.0) is AnnouncementVerdict.ACCEPTED
    assert gate.handle(_ann(2), signature_ok=True, now_unix=1001.5) is AnnouncementVerdict.ACCEPTED


@pytest.mark.parametrize(
    ("ann", "signature_ok", "verdict"),
    [
        (None, False, AnnouncementVerdict.MALFORMED),
        (_ann(9), False, AnnouncementVerdict.UNSIGNED),
        (_ann(9, key="cd" * 32), True, AnnouncementVerdict.UNTRUSTED),
        (_ann(9, issued=900.0), True, AnnouncementVerdict.STALE),
        (_ann(9, issued=1100.0), True, AnnouncementVerdict.FUTURE),
        (_ann(5), True, AnnouncementVerdict.REPLAYED),
        (_ann(4), True, AnnouncementVerdict.REPLAYED),
    ],
)
def test_gate_rejects(
    ann: Announcement | None, signature_ok: bool, verdict: AnnouncementVerdict
) -> None:
    gate = AnnouncementGate({"ab" * 32})
    assert gate.handle(_ann(5), signature_ok=True, now_unix=1000.0) is AnnouncementVerdict.ACCEPTED
    assert gate.handle(ann, signature_ok=signature_ok, now_unix=1001.0) is verdict
    assert gate.counts[verdict] == 1


@pytest.mark.parametrize("receiver_ahead_s", [-29.0, -6.0, 0.0, 6.0, 29.0])
def test_gate_allows_the_same_skew_both_ways(receiver_ahead_s: float) -> None:
    """A receiver whose clock is a few seconds fast (or slow) takes every fresh
    announcement: issued at 1000.0 by the sender's clock, 5 s to live, read 0.1 s later."""
    gate = AnnouncementGate({"ab" * 32}, max_skew_s=30.0)
    now = 1000.1 + receiver_ahead_s
    assert gate.handle(_ann(1), signature_ok=True, now_unix=now) is AnnouncementVerdict.ACCEPTED


@pytest.mark.parametrize(
    ("receiver_ahead_s", "verdict"),
    [(36.0, AnnouncementVerdict.STALE), (-31.0, AnnouncementVerdict.FUTURE)],
)
def test_gate_refuses_beyond_the_skew_allowance(
    receiver_ahead_s: float, verdict: AnnouncementVerdict
) -> None:
    gate = AnnouncementGate({"ab" * 32}, max_skew_s=30.0)
    now = 1000.1 + receiver_ahead_s
    assert gate.handle(_ann(1), signature_ok=True, now_unix=now) is verdict


def test_a_carousel_is_gone_only_after_a_whole_round_without_it() -> None:
    from dataclasses import replace

    from pressrun.multicast.core import CarouselPresence
    from pressrun.multicast.events import CarouselPlan

    plan = CarouselPlan("w", "ab" * 32, 10, 1, "raptorq", 1400, 1, 1.0, ())
    presence = CarouselPresence("w")

    def part(seq: int, k: int, n: int, named: bool) -> Announcement:
        return replace(_ann(seq), part=k, parts=n, carousels=(plan,) if named else ())

    # a round of three: the carousel is in part 2 only; parts 0 and 1 decide nothing
    assert presence.handle(part(10, 0, 3, False)) is None
    assert presence.handle(part(11, 1, 3, False)) is None
    assert presence.handle(part(12, 2, 3, True)) is True
    # the next round loses part 2: still nothing decided
    assert presence.handle(part(13, 0, 3, False)) is None
    assert presence.handle(part(14, 1, 3, False)) is None
    # a whole round without it: gone
    assert presence.handle(part(16, 0, 3, False)) is None
    assert presence.handle(part(17, 1, 3, False)) is None
    assert presence.handle(part(18, 2, 3, False)) is False
    # a late part of an older round is ignored; one-part rounds decide at once
    assert presence.handle(part(15, 2, 3, True)) is None
    assert presence.handle(part(19, 0, 1, False)) is False


def test_announcement_clock() -> None:
    clock = AnnouncementClock(0.5, 10.0)
    assert clock.handle_timer(now=9.9) is None
    assert clock.handle_timer(now=10.0) == 1
    assert clock.next_deadline() == 10.5
    assert clock.handle_timer(now=20.0) == 2  # woke late: one announcement, not 20
    assert clock.next_deadline() == 20.5


def test_layering_simulated_receiver_settles_where_the_link_carries_it() -> None:
    """A stepped simulation: a link that carries 250 packets/s, channels of 200: the
    receiver tries a second channel, loses 37%, leaves it, backs off, tries again;
    the same seed gives the same trace."""

    def run(seed: int) -> tuple[list[str], int]:
        rng = random.Random(seed)
        layers = LayerCore(LayeringConfig(window_s=0.5, settle_s=0.0), (200.0,) * 4)
        trace = [repr(layers.start(now=0.0))]
        for step in range(1, 60):
            now = step * 0.5
            share = min(1.0, 250.0 / (200.0 * len(layers.joined)))
            for ch in layers.joined:
                layers.handle_packets(ch.index, sum(rng.random() < share for _ in range(100)))
            trace.append(repr(layers.handle_timer(now=now)))
        return trace, len(layers.joined)

    trace, _ = run(3)
    assert trace == run(3)[0]
    text = "".join(trace)
    assert text.count("JoinChannel(index=1)") >= 2  # tried again after backing off
    assert "LeaveChannel(index=1" in text
    assert "JoinChannel(index=2)" not in text
    # backoff doubles: the retries grow further apart
    joins = [i for i, t in enumerate(trace) if "JoinChannel(index=1)" in t]
    gaps = [b - a for a, b in itertools.pairwise(joins)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]


def test_layering_counts_loss_against_what_was_sent() -> None:
    """A sender that falls behind (sends 50 packets/s of its announced 100) is not
    congestion: with its counters the receiver sees no loss and leaves nothing; it
    joins only once a window shows the channels at their announced rate (a link that
    carried half a channel has not shown it carries two at full rate)."""
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_sent((0, 0, 0), now=0.0)
    layers.handle_sent((50, 50, 50), now=1.0)
    layers.handle_packets(0, 50)
    assert layers.handle_timer(now=1.0) == []
    assert layers.losses == [0.0] and layers.slow_sender_windows == 1
    assert layers.sent_rates == {0: 50.0, 1: 50.0, 2: 50.0}
    layers.handle_sent((150, 150, 150), now=2.0)  # back at its rate
    layers.handle_packets(0, 100)
    assert layers.handle_timer(now=2.0) == [JoinChannel(1)]
    # without counters the same packets would be 50% loss
    blind = _layers()
    blind.start(now=0.0)
    blind.handle_packets(0, 50)
    assert blind.handle_timer(now=1.0) == []
    assert blind.losses == [pytest.approx(0.5)]


def test_layering_leaves_on_path_loss_from_sequence_gaps() -> None:
    """Loss is judged from each channel's sequence numbers: gaps the own socket does
    not explain are the path's, and past leave_above_loss the last channel goes."""
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_packets(0, 100)
    layers.handle_sequence(0, received=100, expected=100)
    assert layers.handle_timer(now=1.0) == [JoinChannel(1)]
    for ch in (0, 1):  # the link carries 120 of 200: 40% lost on the path
        layers.handle_packets(ch, 60)
        layers.handle_sequence(ch, received=60, expected=100)
    effects = layers.handle_timer(now=2.0)
    assert effects == [LeaveChannel(1, pytest.approx(0.4))]


def test_layering_own_socket_drops_are_not_path_loss_and_hold_joins() -> None:
    """A receiver starved of CPU: its socket overflows (SO_RXQ_OVFL counts the
    drops), the sequence gaps are all its own. It does not leave (no path loss) and
    it never joins while the socket overflows; once the drops stop it joins again."""
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_packets(0, 100)
    layers.handle_sequence(0, received=100, expected=100)
    assert layers.handle_timer(now=1.0) == [JoinChannel(1)]
    for step in (2.0, 3.0, 4.0):
        for ch in (0, 1):
            layers.handle_packets(ch, 50)
            layers.handle_sequence(ch, received=50, expected=100, socket_drops=50)
        assert layers.handle_timer(now=step) == []  # neither leave nor join
    assert layers.losses[-3:] == [0.0, 0.0, 0.0]
    assert layers.overflow_windows == 3 and layers.socket_drops == 300
    for ch in (0, 1):
        layers.handle_packets(ch, 100)
        layers.handle_sequence(ch, received=100, expected=100)
    assert layers.handle_timer(now=5.0) == [JoinChannel(2)]


def test_layering_overflow_holds_joins_without_sequence_numbers_too() -> None:
    """An older sender (no sequence numbers): the socket's drops still count as the
    receiver's own, not the path's, and still hold joins back."""
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_packets(0, 70)
    layers.handle_sequence(0, received=0, expected=0, socket_drops=30)
    assert layers.handle_timer(now=1.0) == []
    assert layers.losses == [0.0] and layers.overflow_windows == 1


def test_layering_slow_sender_is_not_congestion_by_sequence_numbers() -> None:
    """The sender sends 40 of its announced 100 packets/s and no announcement
    counters reach the receiver: the sequence numbers moved on by 40, all arrived,
    so there is no loss and nothing is left; nor joined, until the numbers move at
    the announced rate again (flash-crowd-50, 28 Nov 17:14: receivers that joined
    while the sender ran at 26-46 of its 50 Mbit/s were above their links when it
    caught up)."""
    layers = _layers()
    layers.start(now=0.0)
    layers.handle_packets(0, 40)
    layers.handle_sequence(0, received=40, expected=40)
    assert layers.handle_timer(now=1.0) == []
    assert layers.losses == [0.0] and layers.slow_sender_windows == 1
    layers.handle_packets(0, 95)
    layers.handle_sequence(0, received=95, expected=95)  # 95%: at its rate
    assert layers.handle_timer(now=2.0) == [JoinChannel(1)]


def test_layering_sequence_counts_misuse() -> None:
    layers = _layers()
    layers.start(now=0.0)
    with pytest.raises(LocalProtocolError):
        layers.handle_sequence(0, received=-1, expected=0)


def _probe_trace(
    layers: LayerCore, carries_pps: float, queue_packets: float, until: float
) -> list[tuple[float, int]]:
    """Drive ``layers`` as the receiver's adapter does (a timer call at each
    `next_deadline`, packets counted between calls) behind a link that carries
    ``carries_pps`` packets/s of the channels' 100 each through a queue of
    ``queue_packets`` (a shaped link's buffer: what exceeds the link first fills the
    queue, then is dropped, shared by the channels). Returns (time, channels held)."""
    log = [(0.0, len(layers.start(now=0.0)))]
    now, queue, step = 0.0, 0.0, 0.01
    while now < until:
        deadline = layers.next_deadline()
        assert deadline is not None and deadline > now
        while now < deadline - 1e-9:
            dt = min(step, deadline - now)
            offered = 100.0 * dt * len(layers.joined)
            queue += offered - carries_pps * dt
            dropped = max(0.0, queue - queue_packets)
            queue = min(max(queue, 0.0), queue_packets)
            for ch in layers.joined:
                sent = 100.0 * dt
                arrived = sent - dropped / len(layers.joined)
                layers.handle_packets(ch.index, round(arrived * 1000))
                layers.handle_sequence(
                    ch.index, received=round(arrived * 1000), expected=round(sent * 1000)
                )
            now += dt
        now = deadline
        if layers.handle_timer(now=now):
            log.append((now, len(layers.joined)))
    return log


def test_layering_judges_a_probe_on_a_fresh_window_after_it_settled() -> None:
    """A join probe the link cannot carry is left one measuring window after it
    settled (settle_s + window_s after the join), not on the first window of a fixed
    clock that happens to start after settling (up to a window later): the window
    restarts when the new channel has settled, so the verdict is on its packets
    alone."""
    config = LayeringConfig(window_s=0.5, settle_s=0.3)
    # packets counted in thousandths so that rounding loses nothing
    layers = LayerCore(config, (100_000.0,) * 3)
    # the link carries 1 channel and a quarter; its queue holds 0.25 s of the excess
    # of a second channel, which hides the probe's loss for the first 0.25 s
    log = _probe_trace(layers, carries_pps=125.0, queue_packets=19.0, until=30.0)
    above = [(t, next_t) for (t, n), (next_t, _) in itertools.pairwise(log) if n > 1]
    assert len(above) >= 3  # probed, backed off, probed again
    for joined, left in above:
        assert left - joined == pytest.approx(config.settle_s + config.window_s)
    # the first join: a start on one channel has no settling, one window
    assert log[1][0] == pytest.approx(config.window_s)


def test_layering_window_restarts_at_settling_after_a_join() -> None:
    """After a join at t the next timer is the settling's end (t + settle_s), which
    measures nothing and starts the window; the verdict comes at t + settle_s +
    window_s, counting only what arrived after settling. (A start on one channel has
    no settling: its window is the first.)"""
    layers = LayerCore(LayeringConfig(window_s=0.5, settle_s=0.3), (100.0,) * 3)
    layers.start(now=0.0)
    assert layers.next_deadline() == pytest.approx(0.5)
    layers.handle_packets(0, 50)
    assert layers.handle_timer(now=0.5) == [JoinChannel(1)]
    assert layers.next_deadline() == pytest.approx(0.8)
    for ch in (0, 1):  # packets queued before the join took effect: not counted
        layers.handle_packets(ch, 40)
    assert layers.handle_timer(now=0.8) == []
    assert layers.losses == [0.0]
    assert layers.next_deadline() == pytest.approx(1.3)
    layers.handle_packets(0, 50)
    layers.handle_packets(1, 20)  # 30 of 100 lost
    assert layers.handle_timer(now=1.3) == [LeaveChannel(1, pytest.approx(0.3))]
    assert layers.losses == [0.0, pytest.approx(0.3)]
    # after the leave the remaining channel settles again before it is judged, once
    # the network's leave latency (2 s: the channel left comes down the link until
    # then) has passed too
    assert layers.next_deadline() == pytest.approx(1.3 + 2.0 + 0.3)
