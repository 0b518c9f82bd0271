"""The multicast decisions, pure: channel plan, carousel schedule and pacing, and
which announcements a receiver accepts (the receiver's channel joining:
`pressrun.multicast.layering`).

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

**Receiver-driven layering** (`LayerCore`) is in `pressrun.multicast.layering`.

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
from dataclasses import dataclass

from pressrun.multicast.events import Announcement, AnnouncementVerdict, SendBatch


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

    def handle_changed(self, *, now: float) -> None:
        """The carousels on the air changed (one started or stopped): the next
        announcement is due now, not at the next interval. A swarm client's watch
        hears of a carousel by its announcements: in flash-crowd-50-desktops at
        a23629d the first came 0.3 s after the carousel started, the interval's phase."""
        self.next_at = min(self.next_at, now)

    def handle_timer(self, *, now: float) -> int | None:
        """The next sequence number when an announcement is due, else None."""
        if now < self.next_at:
            return None
        self.seq += 1
        self.next_at += self.interval_s
        if self.next_at <= now:  # woke late: no burst of announcements
            self.next_at = now + self.interval_s
        return self.seq
