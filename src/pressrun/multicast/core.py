"""The multicast decisions, pure: channel plan, carousel schedule and pacing, the
receiver's channel joining, and which announcements a receiver accepts.

**Channel plan** (`channel_cycles`). The sender encodes one pass of an issue with the
crate ``flute`` (the binding returns each packet's source block number and encoding
symbol id). With RaptorQ (RFC 6330), a packet with ESI e goes on channel
``e mod N``: the N channels carry disjoint encoding symbols of every block, and the
repair symbols are sized (`CarouselConfig.repair_symbols_per_block`) so that each
channel alone carries K x (1 + overhead) symbols of a block of K source symbols. A
receiver needs about K symbols of each block whatever their ESIs, so k channels
deliver about k times faster (paper 004, section III.B: "the same data on several
logical tunnels"). With no FEC (RFC 6726 Compact No-Code) every channel carries the
whole pass, channel c starting c/N of the way in, so a receiver of k channels still
gets the pieces it lacks sooner, and a standard FLUTE receiver can take any one of
them. Every channel repeats the FDT at its start and every ``fdt_every_packets``
packets, so a receiver joining at any moment learns the object (RFC 6726 section 3.4:
the FDT is sent often enough for late joiners).

**Carousel schedule and pacing** (`CarouselSchedule`). Each channel sends its cycle
over and over (the TOI never changes, no Close-Object: a receiver that joins at any
moment completes after about one cycle). Packets leave at the channel's rate: packet
n of a channel is due at ``start + n / packets_per_s``. When the adapter wakes late,
it gets what is due but never more than ``max_burst`` packets at once; beyond that
the schedule slips (the rate is a ceiling, never a catch-up burst that would overflow
the receivers' socket buffers).

**Receiver-driven layering** (`LayerCore`, after McCanne, Jacobson and Vetterli,
"Receiver-driven Layered Multicast", SIGCOMM 1996). The sender does no congestion
control; each receiver owes it to the network. It starts on ``start_channels``
channels and measures the loss *on the path* over windows of ``window_s``. After every
change of the channels held (the start, a join, a leave) the window restarts once the
change has settled (``settle_s``: the join has taken effect, the packets queued before
it have drained); the settling measures nothing. It is timed from when the adapter
says the change took effect (`LayerCore.handle_applied`, after the join or leave
returned), not from the decision: a join that blocked for seconds would otherwise
be judged on its first packets, before the link's queue filled. So a join probe is
judged on a window of its own packets only, and a probe the link cannot carry is left
``settle_s + window_s`` after the join returned (0.8 s by default), not on a window
of a fixed clock that happens to start after settling (up to a window later). After a
leave the settling also waits out the network's leave latency (``leave_latency_s``,
2 s: an IGMP querier forwards a group left until its last-member queries have gone
unanswered), in which the channel left still takes its share of the link. The
settling and the windows are in *arrival* time: the adapter says, with each timer
call, up to when it has read what arrived (``read_up_to``: the arrival of the oldest
packet still waiting in its sockets), and a settling or window ends only once the
receiver has read to its end. A receiver reading behind its channels (short of CPU,
or back from a join that blocked while the old channels' packets queued) so judges
each window on the packets that arrived in it, not on older ones read late; it joins
nothing while it reads more than a window behind, and a probe whose window is still
unread a window after it was due is left (tried again after the current wait): the
receiver is never above its link for longer because its evidence came late. Over a
window:

- from the channel's sequence numbers (an LCT header extension the sender numbers
  per channel, `handle_sequence`): expected is how far the numbers moved on, lost is
  the gaps less the packets the receiver's own socket dropped (the kernel's
  ``SO_RXQ_OVFL`` count): a receiver starved of CPU overflows its own queue, which
  is not the network's congestion. A sender that falls behind its schedule sends
  fewer numbers, not gaps, so a slow sender is never counted as loss.
- without sequence numbers (an older sender, or no packet at all in the window):
  ``1 - received / expected`` with expected the rate the channel was actually sent
  at, from the packets-sent counters in the announcements, capped by the announced
  rate.

Path loss above the leave threshold leaves the last channels joined and doubles the
wait before each is tried again (RLM's join timer backoff). The threshold falls with
the channels held (`LayerCore.leave_threshold`): with k channels of one rate, one
channel more than the link carries loses 1 / (k + 1) of the packets, 20% at k = 4, so
a fixed 25% let a 20 Mbit/s reader keep 5 channels of 5 Mbit/s for good (flash-crowd-50
with 10 channels, 28 Nov 17:14: 4 of 10 dsl-20 readers ended on 5 or 6). A loss above
1 / (2k) says the link carries less than k - 1/2 channels, so the last one goes; the
link carried about k (1 - loss) channels, so that many are kept (rounded, at least
one) and the others left at once, not one per window. The threshold is never above
``leave_above_loss`` nor under 2 x ``join_below_loss`` (a random loss that stops
joins does not also make the receiver leave). Path loss below ``join_below_loss`` adds
the next channel, but never while the own socket overflowed in the window (more
channels would only overflow it more), and never on a window in which the sender sent
under `SENT_SHARE_FOR_JOIN` (90%) of its announced rate on the channels held: a slow
sender is not congestion (no leave), but a link that carried a slow sender's channels
has not shown it carries one more at full rate. For the same reason a join whose
first window after settling had the sender under that share is left again (tried
after the current wait, not a doubled one): a window cannot confirm a probe at a rate
the sender did not send.

**Announcements** (`AnnouncementGate`). A receiver accepts an announcement only when
its Ed25519 signature is good (checked by `pressrun.multicast.control`), its key is a
trusted publisher's, it has not expired and was not issued in the future, both judged
with the same allowance for the skew between the sender's clock and the receiver's
(``max_skew_s``, 30 s: a receiver a few seconds fast or slow accepts every fresh
announcement; a replay is refused by its sequence number in any case), and its
sequence number is above the last one accepted from that key.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.events import (
    Announcement,
    AnnouncementVerdict,
    JoinChannel,
    LayerEffect,
    LeaveChannel,
    SendBatch,
)


class LocalProtocolError(Exception):
    """A caller misused a multicast core (a bug in the adapter, not a peer's fault)."""


def channel_cycles(
    *,
    fec: str,
    sbns: Sequence[int],
    esis: Sequence[int],
    channels: int,
    fdt_packets: int,
    fdt_every_packets: int,
) -> list[tuple[int, ...]]:
    """Each channel's cycle: indices into ``FDT packets + object packets`` (the FDT
    packets are ``0..fdt_packets-1``, object packet i is ``fdt_packets + i``), in send
    order, the FDT at the start and after every ``fdt_every_packets`` object packets.

    ``sbns`` and ``esis`` are the object packets' source block numbers and encoding
    symbol ids in the pass's order. With RaptorQ each channel's packets are spread
    evenly over the blocks (the i-th of a block's n packets on the channel goes at
    about i/n of the cycle): a receiver joining at any moment then completes every
    block at about the same time, and no symbol arrives for a block already decoded
    while another still lacks symbols (with blocks one after another, a late joiner
    would waste up to the cycle overhead).
    """
    if len(sbns) != len(esis):
        raise LocalProtocolError("one SBN per ESI")
    if channels < 1:
        raise LocalProtocolError("a carousel needs at least one channel")
    if fdt_packets < 1:
        raise LocalProtocolError("a pass has at least one FDT packet")
    n = len(esis)
    per_channel: list[list[int]]
    if fec == "raptorq":
        by_block: list[dict[int, list[int]]] = [{} for _ in range(channels)]
        for i, (sbn, esi) in enumerate(zip(sbns, esis, strict=True)):
            by_block[esi % channels].setdefault(sbn, []).append(fdt_packets + i)
        per_channel = []
        for blocks in by_block:
            ranked = [
                ((rank + 0.5) / len(packets), sbn, packet)
                for sbn, packets in blocks.items()
                for rank, packet in enumerate(packets)
            ]
            per_channel.append([packet for _, _, packet in sorted(ranked)])
    elif fec == "none":
        per_channel = []
        for c in range(channels):
            shift = c * n // channels
            per_channel.append([fdt_packets + (shift + i) % n for i in range(n)])
    else:
        raise LocalProtocolError(f"unknown fec {fec!r}")
    fdt = list(range(fdt_packets))
    cycles: list[tuple[int, ...]] = []
    for packets in per_channel:
        cycle: list[int] = []
        for start in range(0, max(1, len(packets)), fdt_every_packets):
            cycle += fdt
            cycle += packets[start : start + fdt_every_packets]
        cycles.append(tuple(cycle))
    return cycles


@dataclass(slots=True)
class _ChannelPacing:
    cycle: tuple[int, ...]
    packets_per_s: float
    start: float
    sent: int = 0  # packets sent since start (not reset at a cycle's end)
    slipped: int = 0  # packets the schedule gave up rather than burst


class CarouselSchedule:
    """Which packet goes out on which channel, and when (see the module docstring)."""

    def __init__(
        self,
        cycles: Sequence[tuple[int, ...]],
        packets_per_s: Sequence[float],
        *,
        now: float,
        max_burst: int = 64,
    ) -> None:
        if len(cycles) != len(packets_per_s) or not cycles:
            raise LocalProtocolError("one rate per channel, and at least one channel")
        if any(not c for c in cycles):
            raise LocalProtocolError("a channel's cycle is empty")
        if any(not (r > 0 and math.isfinite(r)) for r in packets_per_s):
            raise LocalProtocolError("packet rates must be positive")
        if max_burst < 1:
            raise LocalProtocolError("max_burst must be at least 1")
        self.max_burst = max_burst
        self._channels = [
            _ChannelPacing(tuple(c), float(r), now)
            for c, r in zip(cycles, packets_per_s, strict=True)
        ]

    def cycle_length(self, channel: int) -> int:
        """Packets in channel ``channel``'s cycle (FDT repeats included)."""
        return len(self._channels[channel].cycle)

    def cycle_s(self, channel: int) -> float:
        """How long channel ``channel`` takes to send its whole cycle."""
        ch = self._channels[channel]
        return len(ch.cycle) / ch.packets_per_s

    def next_deadline(self) -> float:
        """When the next packet of any channel is due."""
        return min(ch.start + ch.sent / ch.packets_per_s for ch in self._channels)

    def handle_timer(self, *, now: float) -> list[SendBatch]:
        """The packets due by ``now`` on each channel (at most ``max_burst`` each)."""
        batches: list[SendBatch] = []
        for index, ch in enumerate(self._channels):
            due = math.floor((now - ch.start) * ch.packets_per_s) + 1
            count = due - ch.sent
            if count <= 0:
                continue
            if count > self.max_burst:
                # late: send a burst's worth and move the schedule on, never catch up
                ch.slipped += count - self.max_burst
                count = self.max_burst
                ch.start = now - (ch.sent + count - 1) / ch.packets_per_s
            length = len(ch.cycle)
            first = ch.sent % length
            if first + count <= length:
                packets = ch.cycle[first : first + count]
            else:
                packets = tuple(ch.cycle[(first + k) % length] for k in range(count))
            ch.sent += count
            batches.append(SendBatch(index, packets))
        return batches

    def sent(self, channel: int) -> int:
        """Packets channel ``channel`` has sent."""
        return self._channels[channel].sent

    def cycles_done(self, channel: int) -> float:
        """Cycles channel ``channel`` has sent (fractional)."""
        ch = self._channels[channel]
        return ch.sent / len(ch.cycle)

    def slipped(self, channel: int) -> int:
        """Packets channel ``channel`` did not send because the sender woke late."""
        return self._channels[channel].slipped


@dataclass(slots=True)
class _Joined:
    index: int
    received: int = 0
    # from the channel's sequence numbers since the window began
    seq_received: int = 0
    seq_expected: int = 0
    socket_drops: int = 0


#: a join needs a window in which the channels held came at this share of their
#: announced rate at least (the sequence numbers moved on that far, or the sent
#: counters say so): a sender short of CPU sends less, the link then carries channels
#: it cannot at full rate, and a receiver that joined on that was above its link when
#: the sender caught up (flash-crowd-50, 28 Nov 17:14: the sender at 26-46 of its
#: 50 Mbit/s over 82-101 s, and the joins to 3-4 channels on lossy-10, 6-7 on dsl-20,
#: 3 on mobile-6 came in those seconds)
SENT_SHARE_FOR_JOIN = 0.9


@dataclass(slots=True)
class LayerCore:
    """A receiver's channel joining (receiver-driven layering; module docstring).

    ``packets_per_s`` is each channel's announced packet rate, in plan order; channels
    are joined in that order and left last-joined first.
    """

    config: LayeringConfig
    packets_per_s: tuple[float, ...]
    joined: list[_Joined] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    _window_start: float | None = None
    #: when the last change of the channels held has settled (the window starts then)
    _settling_until: float | None = None
    #: how long the last change takes to settle: ``settle_s``, after a leave plus
    #: the network's leave latency
    _settle_for: float = 0.0
    _backoff_s: dict[int, float] = field(default_factory=dict)
    _retry_at: dict[int, float] = field(default_factory=dict)
    most_joined: int = 0
    #: the rate each channel was actually sent at, from the announcements' counters
    sent_rates: dict[int, float] = field(default_factory=dict)
    _last_sent: tuple[float, tuple[int, ...]] | None = None
    #: packets the receiver's own sockets dropped (SO_RXQ_OVFL), over the whole run
    socket_drops: int = 0
    #: windows in which a join was held back because the own socket overflowed
    overflow_windows: int = 0
    #: windows in which a join was held back because the sender sent under
    #: `SENT_SHARE_FOR_JOIN` of its announced rate on the channels held
    slow_sender_windows: int = 0
    #: windows in which not one packet arrived on any channel held: nothing judged
    empty_windows: int = 0
    #: joins left because their first window had the sender under its rate
    unconfirmed_probes: int = 0
    #: the channel last joined while its first window after settling is to come
    _probe: int | None = None
    #: measuring windows ended since the start (settlings not counted): a channel
    #: joined and left with one window ended in between was judged on that one window
    windows_ended: int = 0
    #: when the probe's window was due to end had the receiver read as packets came
    #: (the join's return + settling + one window)
    _probe_due: float | None = None
    #: joins left because their window's packets were still unread a window after it
    #: was due (a receiver reading behind its channels)
    late_probes: int = 0
    #: windows in which a join was held back because the receiver read more than a
    #: window behind its channels
    behind_windows: int = 0
    #: how far behind its channels the receiver read at a window's end, at most (s)
    behind_max_s: float = 0.0

    @property
    def limit(self) -> int:
        """How many channels this receiver may join at most."""
        cap = self.config.max_channels or len(self.packets_per_s)
        return min(cap, len(self.packets_per_s))

    def start(self, *, now: float) -> list[LayerEffect]:
        """Join the first ``start_channels`` channels."""
        if self._window_start is not None:
            raise LocalProtocolError("LayerCore.start called twice")
        self._window_start = now
        effects: list[LayerEffect] = []
        for index in range(min(self.config.start_channels, self.limit)):
            self.joined.append(_Joined(index))
            effects.append(JoinChannel(index))
        self.most_joined = len(self.joined)
        self._changed(now)
        return effects

    def _changed(self, now: float, *, left: bool = False) -> None:
        """The channels held changed at ``now``: the next window starts once that has
        settled (at once when ``settle_s`` is 0). After a leave (``left``) it also
        waits out the network's leave latency: the channel left still comes down the
        link meanwhile and takes its share of it, so a window then would judge the
        channels kept on a load they do not make (flash-crowd-50 at 297117b, 28 Nov
        18:12: 9 of 10 dsl-20 readers lost their 4th channel, which the link carries,
        in the window after each 5th-channel probe's leave)."""
        self._settle_for = self.config.settle_s
        if left:
            self._settle_for += self.config.leave_latency_s
        if self._settle_for > 0:
            self._settling_until = now + self._settle_for
        self._window_start = now

    def handle_applied(self, *, now: float, read_up_to: float | None = None) -> None:
        """The effects of the last `start` or `handle_timer` (the joins and leaves)
        took effect at ``now``: the settling, and the window after it, start from
        then, and nothing counted before counts. Call it only after effects.
        ``read_up_to`` as in `handle_timer`: a receiver that was not reading while the
        change blocked has the old channels' packets of that time still to read, and
        with no settling (``settle_s`` 0) the window waits until they are. A join
        is a system call that may block: in flash-crowd-50 at bdd9429 (28 Nov) 9 of
        the 10 receivers kept above their link past a window had a join return
        1.5-3.0 s after its decision, and none of the other 25 (IP_ADD_MEMBERSHIP
        takes the kernel's network configuration lock, which every namespace shares
        and docker's network changes hold: the likely cause, not shown). Settling
        timed from the decision had then passed before the channel was joined, and
        the probe was judged on its first half second of packets, while the link's
        queue filled, and kept."""
        if self._window_start is None:
            raise LocalProtocolError("LayerCore.start first")
        if self._settling_until is not None or (read_up_to is not None and read_up_to < now):
            self._settling_until = now + self._settle_for
        self._window_start = max(self._window_start, now)
        if self._probe_due is not None:
            self._probe_due = now + self._settle_for + self.config.window_s
        self._reset_counts()

    def handle_sent(self, sent_packets: Sequence[int], *, now: float) -> None:
        """An announcement's per-channel packets-sent counters, received at ``now``:
        the loss is then measured against what was sent, not the announced rate (a
        sender that falls behind its schedule is not congestion)."""
        counts = tuple(sent_packets)
        last = self._last_sent
        self._last_sent = (now, counts)
        if last is None or len(last[1]) != len(counts) or now - last[0] < 0.05:
            return
        elapsed = now - last[0]
        for index, (before, after) in enumerate(zip(last[1], counts, strict=True)):
            if after >= before:
                self.sent_rates[index] = (after - before) / elapsed

    def _rate(self, index: int) -> float:
        return min(self.packets_per_s[index], self.sent_rates.get(index, math.inf))

    def handle_packets(self, index: int, count: int) -> None:
        """Count ``count`` packets received on channel ``index``."""
        for ch in self.joined:
            if ch.index == index:
                ch.received += count
                return

    def handle_sequence(
        self, index: int, *, received: int, expected: int, socket_drops: int = 0
    ) -> None:
        """Channel ``index``'s counts since the last call: ``received`` packets that
        carried a sequence number, ``expected`` how far the numbers moved on (both
        from the binding), and ``socket_drops`` the packets the channel's own socket
        dropped meanwhile (the growth of its SO_RXQ_OVFL count)."""
        if received < 0 or expected < 0 or socket_drops < 0:
            raise LocalProtocolError("counts are never negative")
        self.socket_drops += socket_drops
        for ch in self.joined:
            if ch.index == index:
                ch.seq_received += received
                ch.seq_expected += expected
                ch.socket_drops += socket_drops
                return

    def leave_threshold(self, held: int) -> float:
        """The path loss above which a receiver holding ``held`` channels leaves
        (module docstring): 1 / (2 held), at most ``leave_above_loss`` and at least
        2 x ``join_below_loss``."""
        floor = min(self.config.leave_above_loss, 2 * self.config.join_below_loss)
        return min(self.config.leave_above_loss, max(floor, 1.0 / (2 * max(1, held))))

    def next_deadline(self) -> float | None:
        """The end of the current settling (the window starts then) or of the current
        measuring window, in arrival time: `handle_timer` acts once the receiver has
        read what arrived by then."""
        if self._window_start is None:
            return None
        if self._settling_until is not None:
            return self._settling_until
        return self._window_start + self.config.window_s

    def _reset_counts(self) -> None:
        for ch in self.joined:
            ch.received = ch.seq_received = ch.seq_expected = ch.socket_drops = 0

    def handle_timer(self, *, now: float, read_up_to: float | None = None) -> list[LayerEffect]:
        """At the settling's end: start the window (nothing is judged). At a window's
        end: measure the path loss, join or leave a channel. Called early (before
        `next_deadline`) it does nothing.

        ``read_up_to``: every packet that arrived on the channels held before it has
        been read and counted (the arrival of the oldest packet still waiting in the
        receiver's sockets; None: nothing waits, as ``now``). The settling and the
        windows are in arrival time: a window counts the packets that arrived in it,
        so a receiver reading behind its channels (short of CPU, or back from a join
        that blocked while the packets queued) judges a window only once it has read
        to its end; before, the packets that arrived before a join were counted in
        the join's window, and the probe was kept. While it waits, a probe whose
        window is a window overdue is left: a receiver never stays above its link
        because its evidence comes late."""
        if self._window_start is None:
            raise LocalProtocolError("LayerCore.start first")
        deadline = self.next_deadline()
        assert deadline is not None
        if now < deadline:
            return []
        read = now if read_up_to is None else min(now, read_up_to)
        if read < deadline:
            return self._evidence_late(now)
        if self._settling_until is not None:
            # settled: what arrived meanwhile is the change's transient, not counted
            self._settling_until = None
            self._window_start = read
            self._reset_counts()
            return []
        start, self._window_start = self._window_start, read
        self.windows_ended += 1
        behind = now - read
        self.behind_max_s = max(self.behind_max_s, behind)
        now = read  # the window judged is the one that arrived
        expected = 0.0
        lost = 0.0
        overflowed = False
        for ch in self.joined:
            overflowed = overflowed or ch.socket_drops > 0
            if ch.seq_expected > 0:
                # the sequence numbers: gaps the own socket does not explain
                expected += ch.seq_expected
                gaps = max(0, ch.seq_expected - ch.seq_received)
                lost += max(0, gaps - ch.socket_drops)
            else:
                rate_expected = (now - start) * self._rate(ch.index)
                expected += rate_expected
                lost += max(0.0, rate_expected - ch.received - ch.socket_drops)
        arrived = sum(ch.received + ch.seq_received + ch.socket_drops for ch in self.joined)
        self._reset_counts()
        if expected < 1.0:
            return []
        # what the held channels would have sent at their announced rates
        nominal = (now - start) * sum(self.packets_per_s[ch.index] for ch in self.joined)
        slow = arrived == 0 or expected < SENT_SHARE_FOR_JOIN * nominal
        probe, self._probe, self._probe_due = self._probe, None, None
        if probe is not None and slow and len(self.joined) > 1 and self.joined[-1].index == probe:
            # the join's own window could not show the link carries it at full rate
            # (the sender was short): undone, tried again after the current wait, not
            # a doubled one (no loss was seen); kept, it would be above the link when
            # the sender caught up (flash-crowd-50, 28 Nov 17:41: every stretch above
            # a link past a window came at 78-96 s, the sender at 34-48 of 50 Mbit/s)
            self.joined.pop()
            self._retry_at[probe] = now + self._backoff_s.get(probe, 2 * self.config.window_s)
            self.unconfirmed_probes += 1
            self._changed(now, left=True)
            loss = min(1.0, max(0.0, lost / expected))
            return [LeaveChannel(probe, loss, why="the sender under its rate in its window")]
        if arrived == 0:
            # not one packet on any channel: a sender that paused (or a receive loop
            # that read nothing), not congestion, which drops a share, not all; judged
            # as loss it left every channel but one at once (flash-crowd-50, 28 Nov
            # 17:44: a fibre reader on 10 channels saw one such window and went to 1)
            self.empty_windows += 1
            return []
        loss = min(1.0, max(0.0, lost / expected))
        self.losses.append(loss)
        held = len(self.joined)
        if loss > self.leave_threshold(held) and held > 1:
            # the link carried about held x (1 - loss) channels: keep that many
            keep = min(held - 1, max(1, round(held * (1.0 - loss))))
            effects: list[LayerEffect] = []
            while len(self.joined) > keep:
                last = self.joined.pop()
                backoff = self._backoff_s.get(last.index, 2 * self.config.window_s) * 2
                self._backoff_s[last.index] = backoff
                self._retry_at[last.index] = now + backoff
                effects.append(LeaveChannel(last.index, loss))
            self._changed(now, left=True)
            return effects
        if loss < self.config.join_below_loss and len(self.joined) < self.limit:
            if overflowed:
                # the own socket cannot keep up: another channel would only add drops
                self.overflow_windows += 1
                return []
            if slow:
                # the sender sent under its announced rate: the link carried what came,
                # which says nothing of whether it carries one channel more at full rate
                self.slow_sender_windows += 1
                return []
            if behind > self.config.window_s:
                # reading more than a window behind: a probe's window would be read
                # later than it is due, and left for that (`_evidence_late`)
                self.behind_windows += 1
                return []
            index = len(self.joined)
            if now >= self._retry_at.get(index, 0.0):
                self.joined.append(_Joined(index))
                self.most_joined = max(self.most_joined, len(self.joined))
                self._probe = index
                self._changed(now)
                self._probe_due = now + self._settle_for + self.config.window_s
                return [JoinChannel(index)]
        return []

    def _evidence_late(self, now: float) -> list[LayerEffect]:
        """`handle_timer` at ``now`` while what arrived by the deadline is still unread:
        nothing is judged, but a probe whose window was due a window ago or more is
        left (tried again after the current wait, not a doubled one: no loss was
        seen). Judged that late, it would have held the link above what it carries
        for as long as the receiver read behind (flash-crowd-50 at 21f36b4, 29 Nov
        02:17: six receivers whose joins returned 2.9 s after the decision read the
        old channels' packets of those seconds in the probe's window)."""
        probe, due = self._probe, self._probe_due
        if probe is None or due is None or now < due + self.config.window_s:
            return []
        if len(self.joined) < 2 or self.joined[-1].index != probe:
            return []
        self.joined.pop()
        self._probe = self._probe_due = None
        self._retry_at[probe] = now + self._backoff_s.get(probe, 2 * self.config.window_s)
        self.late_probes += 1
        self._changed(now, left=True)
        return [LeaveChannel(probe, 0.0, why="its window read late")]


class AnnouncementGate:
    """Which announcements a receiver accepts (module docstring): trusted key,
    not expired and not from the future (both within ``max_skew_s`` of the receiver's
    clock, which may be fast or slow), sequence number above the last accepted."""

    def __init__(self, trusted_keys: Collection[str], *, max_skew_s: float = 30.0) -> None:
        self.trusted_keys = frozenset(k.lower() for k in trusted_keys)
        self.max_skew_s = max_skew_s
        self._last_seq: dict[str, int] = {}
        self.counts: dict[AnnouncementVerdict, int] = {}

    def handle(
        self, announcement: Announcement | None, *, signature_ok: bool, now_unix: float
    ) -> AnnouncementVerdict:
        """Judge one announcement (None: it did not parse); counts every verdict."""
        verdict = self._judge(announcement, signature_ok, now_unix)
        self.counts[verdict] = self.counts.get(verdict, 0) + 1
        if verdict is AnnouncementVerdict.ACCEPTED and announcement is not None:
            self._last_seq[announcement.publisher_key.lower()] = announcement.seq
        return verdict

    def _judge(
        self, ann: Announcement | None, signature_ok: bool, now_unix: float
    ) -> AnnouncementVerdict:
        if ann is None:
            return AnnouncementVerdict.MALFORMED
        if not signature_ok:
            return AnnouncementVerdict.UNSIGNED
        key = ann.publisher_key.lower()
        if key not in self.trusted_keys:
            return AnnouncementVerdict.UNTRUSTED
        # the hosts' clocks differ: the allowance is the same both ways, or a receiver
        # a few seconds fast would find every announcement expired on arrival
        if ann.expires_at + self.max_skew_s <= now_unix:
            return AnnouncementVerdict.STALE
        if ann.issued_at > now_unix + self.max_skew_s:
            return AnnouncementVerdict.FUTURE
        last = self._last_seq.get(key)
        if last is not None and ann.seq <= last:
            return AnnouncementVerdict.REPLAYED
        return AnnouncementVerdict.ACCEPTED


class CarouselPresence:
    """Whether a sender's announcements still name one issue's carousel. A round of
    announcements may come in several parts (`Announcement.parts`): the carousel is
    gone only when every part of one round was accepted and none named it; a lost part
    decides nothing. One round is kept at a time (at most ``parts`` numbers)."""

    def __init__(self, issue_id: str) -> None:
        self.issue_id = issue_id
        self._round: int | None = None
        self._seen: set[int] = set()
        self._named = False

    def handle(self, ann: Announcement) -> bool | None:
        """An accepted announcement: True if it names the carousel, False when a
        whole round went by without it, None while that is not known."""
        if ann.round_seq != self._round:
            if self._round is not None and ann.round_seq < self._round:
                return None  # a late part of an older round
            self._round, self._seen, self._named = ann.round_seq, set(), False
        self._seen.add(ann.part)
        if ann.plan_for(self.issue_id) is not None:
            self._named = True
            return True
        if not self._named and len(self._seen) >= ann.parts:
            return False
        return None


@dataclass(slots=True)
class AnnouncementClock:
    """When the sender announces, and each announcement's sequence number."""

    interval_s: float
    next_at: float
    seq: int = 0

    def next_deadline(self) -> float:
        """When the next announcement is due."""
        return self.next_at

    def handle_timer(self, *, now: float) -> int | None:
        """The next sequence number when an announcement is due, else None."""
        if now < self.next_at:
            return None
        self.seq += 1
        self.next_at += self.interval_s
        if self.next_at <= now:  # woke late: no burst of announcements
            self.next_at = now + self.interval_s
        return self.seq
