"""A multicast receiver's channel joining, pure: receiver-driven layering.

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
one) and the others left at once, not one per window. With channels of unequal rates
(the announcement gives each channel's) the same rules are in rate: the threshold is
the share of the rate held that half the last channel is, and the channels kept are
those whose cumulative rate is nearest the rate the link carried (interpolated within
a channel, rounded). The threshold is never above
``leave_above_loss`` nor under 2 x ``join_below_loss`` (a random loss that stops
joins does not also make the receiver leave). Path loss below ``join_below_loss`` adds
the next channel (during the first climb, more: below), but never while the own
socket overflowed in the window (more
channels would only overflow it more), and never on a window in which the sender sent
under `SENT_SHARE_FOR_JOIN` (90%) of its announced rate on the channels held: a slow
sender is not congestion (no leave), but a link that carried a slow sender's channels
has not shown it carries one more at full rate. For the same reason a join whose
first window after settling had the sender under that share is left again (tried
after the current wait, not a doubled one): a window cannot confirm a probe at a rate
the sender did not send.

**The first climb doubles** (``LayeringConfig.climb_doubling``). Until the first window
with path loss at or above ``join_below_loss``, or the first join undone because its
evidence was read late, a join adds the next channels whose rate together is at most
the rate held: the rate held doubles a step (1, 2, 4, 8, 10 of ten equal channels), as
TCP's slow start does a window, and the join is judged, left or undone as one probe.
The first loss ends it: the channels the loss says the link did not carry go at once
(above), and from then on a join adds one channel (RLM). One channel a step, a
fibre-50 reader of 10 x 5 Mbit/s held its 10 channels 9.0 s into a 15.1 s receive
(flash-crowd-50-desktops at 369aaf6, 29 Nov 06:28); the price is one overshoot of at
most the rate held, for one window after settling, on a link that carries less than
twice what the receiver held. A step undone because the sender sent under its rate in
its window does not end the climb when that window showed no path loss (nothing of the
link): the step is tried again, doubling, after the current wait. Ending it there cost
every fibre-50 reader of flash-crowd-50-desktops at 6cc57a5 (29 Nov 10:08, the host
saturated as 22 readers started together, the sender at 45 of its 50 Mbit/s for a
second) its doubling: they held their 10 channels 11.4 s after the first join at the
median, against 3.05-3.44 s in the three runs on record without such a window. A
window with path loss above the leave threshold is judged by the loss whatever the
sender's rate (the sequence gaps are packets lost after the sender): a lossy-10 reader
of the run at 32718c0 (29 Nov 12:03) whose step to 4 lost 51% in a slow sender's
window had it undone, and doubled to 4 again 2.8 s later. A receiver whose evidence
came late (`_evidence_late`) is short of CPU itself: doubling its channels would
double its packets, so that undo still ends the climb.

**A channel the link was measured not to carry waits.** A leave on path loss measured
the link (it carried about the rate held x (1 - loss)); each channel left is tried
again only after its wait, which doubles at each such leave (RLM's join timer
backoff) and starts at twice what one failed probe costs the link
(`LayerCore.probe_cost_s`: settling, a window and the network's leave latency, 2.8 s
by default; before, a wait started at 2 x ``window_s``, 1 s): a link whose rate has not
changed is held above it by failed probes 2.8 s in the 6.4 s after the first, then in
12 s, in 23 s (before: in 3.6 s, 4.8 s, 8.8 s; the wait runs from the leave's
decision, the leave latency within it). The climb's overshoot was not where a reader's
link lost most: in the four flash-crowd-50-desktops runs on record (29 Nov) a dsl-20
reader held more than its 4 channels for 2.8 s in the overshoot and 8.5 s in its later
probes of a fifth channel, lossy-10 2.8 s and 11.3 s, mobile-6 2.8 s and 14.2 s (its
link carries one channel, each probe of a second lost 36-42%). The doubling itself has
no measure of the link before its first loss: 4 channels on a 20 Mbit/s link lose
nothing in the window that decides the next step (their 3% excess fills the link's
queue for seconds before it drops), so that step goes to 8.

**The start.** A receiver starts on one channel, or, when its link has been seen to
carry more (the adapter's ``link_bps``: a reader that leaves the swarm for the
carousel knows the best rate the swarm's peers and web seeds brought it over a
window), on the channels whose rates together are at most that rate
(`LayerCore.channels_within`; the climb goes on from there, doubling until the first
loss). The start takes effect when its first packet arrives (the adapter calls
`LayerCore.handle_applied` with that packet's arrival stamp), and a start on one
channel has no settling: nothing of the receiver's was queued before it, and the
window can only decide whether to probe a second channel, which settles as every join
does. So the first step takes one window (0.5 s) after the first packet, not settling
and a window after the join returned (0.8 s); and a first packet that comes late (a
join the network carries out late) no longer leaves the first window empty or partial
(a partial one looked like a slow sender, and no join came of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.core import LocalProtocolError
from pressrun.multicast.events import JoinChannel, LayerEffect, LeaveChannel


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
    #: the first channel of the last join (the channels joined with it follow it)
    #: while its first window after settling is to come
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
    #: still in the first climb: no window has shown path loss at or above
    #: ``join_below_loss`` yet, so a join may add several channels (`_step`)
    climbing: bool = True
    #: joins that added more than one channel
    multi_joins: int = 0

    @property
    def limit(self) -> int:
        """How many channels this receiver may join at most."""
        cap = self.config.max_channels or len(self.packets_per_s)
        return min(cap, len(self.packets_per_s))

    def start(self, *, now: float, channels: int | None = None) -> list[LayerEffect]:
        """Join the first ``start_channels`` channels, or the first ``channels`` (at
        least one, at most `limit`): as many as the receiver's link has been seen to
        carry (`channels_within`; the module docstring, "The start").

        A start on one channel has no settling: its first window begins when
        `handle_applied` says the start took effect (the adapter: at its first
        packet's arrival). Nothing of the receiver's was queued before it to drain,
        and with one channel held the window can only decide whether to probe a
        second (that probe settles as every join does)."""
        if self._window_start is not None:
            raise LocalProtocolError("LayerCore.start called twice")
        if channels is not None and channels < 1:
            raise LocalProtocolError("a start joins one channel at least")
        self._window_start = now
        effects: list[LayerEffect] = []
        wanted = self.config.start_channels if channels is None else channels
        for index in range(min(wanted, self.limit)):
            self.joined.append(_Joined(index))
            effects.append(JoinChannel(index))
        self.most_joined = len(self.joined)
        self._changed(now)
        if len(self.joined) == 1:
            self._settle_for = 0.0
            self._settling_until = None
        return effects

    def channels_within(self, rate: float) -> int:
        """How many channels, in plan order, a link seen to carry ``rate`` (packets/s,
        as `packets_per_s`) takes whole: the most whose rates together are at most
        it, one at least, at most `limit`."""
        return channels_within(self.packets_per_s, rate, self.limit)

    @property
    def probe_cost_s(self) -> float:
        """How long one failed probe holds the link above what it carries: its
        settling and window, then the network's leave latency after the leave."""
        c = self.config
        return c.settle_s + c.window_s + c.leave_latency_s

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
        (module docstring): the share of their rate that half the last channel is
        (1 / (2 held) with channels of one rate), at most ``leave_above_loss`` and at
        least 2 x ``join_below_loss``."""
        floor = min(self.config.leave_above_loss, 2 * self.config.join_below_loss)
        held = min(max(1, held), len(self.packets_per_s))
        half_last = self.packets_per_s[held - 1] / (2 * sum(self.packets_per_s[:held]))
        if len(set(self.packets_per_s[:held])) == 1:
            half_last = 1.0 / (2 * held)  # the same, without the sum's rounding
        return min(self.config.leave_above_loss, max(floor, half_last))

    def _channels_carried(self, held: int, loss: float) -> float:
        """How many of the first ``held`` channels (fractional, in plan order) a link
        that lost ``loss`` of their packets carried: held x (1 - loss) with channels
        of one rate; else where the rate it carried falls among their cumulative
        rates."""
        if len(set(self.packets_per_s[:held])) == 1:
            return held * (1.0 - loss)
        carried = (1.0 - loss) * sum(self.packets_per_s[:held])
        whole = 0
        while whole < held and carried >= self.packets_per_s[whole]:
            carried -= self.packets_per_s[whole]
            whole += 1
        return whole + (carried / self.packets_per_s[whole] if whole < held else 0.0)

    def _step(self, now: float) -> list[int]:
        """The channels the next join adds: the next one, and while climbing
        (`climbing`) the ones after it as long as the step's rate stays within the
        rate held (the rate at most doubles), each only once its retry time passed."""
        held = len(self.joined)
        first = held
        if first >= self.limit or now < self._retry_at.get(first, 0.0):
            return []
        doubling = self.climbing and self.config.climb_doubling
        count = step_size(self.packets_per_s, held, self.limit, doubling=doubling)
        step = [first]
        for index in range(first + 1, first + count):
            if now < self._retry_at.get(index, 0.0):
                break
            step.append(index)
        return step

    def _undo_step(
        self, probe: int, now: float, loss: float, why: str, *, ends_climb: bool
    ) -> list[LayerEffect]:
        """Leave the channels of the last join (``probe`` and those joined with it),
        to be tried again after the current wait, not a doubled one: no loss was seen
        that says the link does not carry them. ``ends_climb``: the next tries are one
        channel each (evidence read late: the receiver is short of CPU); a slow
        sender's window leaves the climb as it was (the module docstring)."""
        if ends_climb:
            self.climbing = False
        effects: list[LayerEffect] = []
        while len(self.joined) > max(1, probe):
            index = self.joined.pop().index
            self._retry_at[index] = now + self._backoff_s.get(index, 2 * self.config.window_s)
            effects.append(LeaveChannel(index, loss, why=why))
        self._changed(now, left=True)
        return effects

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
        loss = min(1.0, max(0.0, lost / expected))
        # a window whose path loss is above the leave threshold refutes the probe
        # whatever the sender's rate (gaps are packets lost after the sender): the
        # loss's rule below, not an undo
        refuted = arrived > 0 and loss > self.leave_threshold(len(self.joined))
        if probe is not None and slow and len(self.joined) > max(1, probe) and not refuted:
            # the join's own window could not show the link carries it at full rate
            # (the sender was short): undone, tried again after the current wait, not
            # a doubled one (no loss was seen); kept, it would be above the link when
            # the sender caught up (flash-crowd-50, 28 Nov 17:41: every stretch above
            # a link past a window came at 78-96 s, the sender at 34-48 of 50 Mbit/s).
            # The climb goes on unless the window showed path loss
            self.unconfirmed_probes += 1
            return self._undo_step(
                probe,
                now,
                loss,
                "the sender under its rate in its window",
                ends_climb=loss >= self.config.join_below_loss,
            )
        if arrived == 0:
            # not one packet on any channel: a sender that paused (or a receive loop
            # that read nothing), not congestion, which drops a share, not all; judged
            # as loss it left every channel but one at once (flash-crowd-50, 28 Nov
            # 17:44: a fibre reader on 10 channels saw one such window and went to 1)
            self.empty_windows += 1
            return []
        self.losses.append(loss)
        if loss >= self.config.join_below_loss:
            self.climbing = False  # from here on, one channel a join (RLM)
        held = len(self.joined)
        if loss > self.leave_threshold(held) and held > 1:
            # the link carried about held x (1 - loss) channels: keep that many
            keep = min(held - 1, max(1, round(self._channels_carried(held, loss))))
            effects: list[LayerEffect] = []
            while len(self.joined) > keep:
                last = self.joined.pop()
                # the link was measured not to carry it: its wait starts at twice a
                # failed probe's cost and doubles at each such leave (module docstring)
                backoff = self._backoff_s.get(last.index, self.probe_cost_s) * 2
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
            step = self._step(now)
            if step:
                self.joined.extend(_Joined(index) for index in step)
                self.most_joined = max(self.most_joined, len(self.joined))
                self.multi_joins += len(step) > 1
                self._probe = step[0]
                self._changed(now)
                self._probe_due = now + self._settle_for + self.config.window_s
                return [JoinChannel(index) for index in step]
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
        if len(self.joined) <= max(1, probe):
            return []
        self._probe = self._probe_due = None
        self.late_probes += 1
        return self._undo_step(probe, now, 0.0, "its window read late", ends_climb=True)


def channels_within(rates: Sequence[float], rate: float, limit: int | None = None) -> int:
    """How many channels of ``rates`` (in plan order, any one unit) a link seen to
    carry ``rate`` (the same unit) takes whole: the most whose rates together are at
    most it, one at least, at most ``limit`` (None: all of them)."""
    if not rate >= 0:
        raise LocalProtocolError("a rate is a number, not negative")
    top = len(rates) if limit is None else min(limit, len(rates))
    held, total = 0, 0.0
    while held < top and total + rates[held] <= rate * (1 + 1e-9):
        total += rates[held]
        held += 1
    return max(1, held)


def step_size(rates: Sequence[float], held: int, limit: int, *, doubling: bool) -> int:
    """How many channels the next join adds to the first ``held`` of ``rates``: one;
    while ``doubling``, the next ones as long as their rates together are at most the
    rate held (the rate held at most doubles); never past ``limit``."""
    if held >= limit:
        return 0
    if not doubling:
        return 1
    budget = sum(rates[:held])
    added, count = rates[held], 1
    while held + count < limit and added + rates[held + count] <= budget * (1 + 1e-9):
        added += rates[held + count]
        count += 1
    return count


def climb_s(config: LayeringConfig, rates: Sequence[float], start: int, target: int) -> float:
    """How long the first climb takes, with no loss and no wait, from ``start``
    channels of ``rates`` to ``target`` (at most all of them): a window for the step
    from a one-channel start (it has no settling), settling and a window for every
    other step (`LayerCore`)."""
    target = min(target, len(rates))
    held, seconds = max(1, start), 0.0
    while held < target:
        one = held == 1 and seconds == 0.0 and start <= 1
        seconds += config.window_s if one else config.settle_s + config.window_s
        held += step_size(rates, held, len(rates), doubling=config.climb_doubling)
    return seconds
