"""The multicast sender's send thread: `SendThread` owns every running carousel
(`RunningCarousel`: its plan, one pass of packets, its `CarouselSchedule`), sleeps until
the next packet is due (``time.perf_counter``), takes the due batches and hands each to
the binding's `PacketBuffer.send`, which loops over blocking ``sendto`` with the GIL
released (FIELD-NOTES: a thread keeps up with the line where an asyncio loop loses
packets). It counts what it sent in `SenderMetrics`."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.core import CarouselSchedule
from pressrun.multicast.events import CarouselPlan
from pressrun.multicast.metrics import SenderMetrics
from pressrun.multicast.prepare import PreparedIssue

if TYPE_CHECKING:
    from pressrun_flute import PacketBuffer

log = logging.getLogger("pressrun.multicast.sender")

#: channel sequence numbers (the binding's LCT extension, HET 250) wrap at 2^24
SEQUENCE_MODULO = 1 << 24


@dataclass
class RunningCarousel:
    """A carousel handed to the send thread: its plan, one pass of packets, the
    schedule and where each channel goes."""

    plan: CarouselPlan
    packets: PacketBuffer  # the pass: FDT packets, then the object's
    schedule: CarouselSchedule
    addresses: list[tuple[str, int]]
    started_at: float
    config: CarouselConfig  # what it was started with (a republished issue: again)
    prepared: PreparedIssue


class SendThread(threading.Thread):
    """Owns the running carousels: sleeps until the next packet is due, sends the due
    batches. The asyncio side starts and stops carousels through `start_carousel`
    and `stop_carousel` (a lock guards the table; the schedules are this thread's)."""

    def __init__(self, sock: socket.socket, metrics: SenderMetrics) -> None:
        super().__init__(name="pressrun-multicast-send", daemon=True)
        self.sock = sock
        self.metrics = metrics
        self._lock = threading.Lock()
        self._carousels: dict[str, RunningCarousel] = {}
        #: set on a start or stop, so an idle thread looks again at once (an event, not
        #: a queue: a queue the thread drains only when idle grew by one per order for
        #: as long as any carousel ran)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._slipped: dict[tuple[str, int], int] = {}
        self._children: dict[tuple[str, int], tuple[Counter, Counter, Gauge, Counter]] = {}
        #: issues whose carousel stopped: their metric children go at the thread's next
        #: round (the thread may be counting a batch of the carousel as it stops)
        self._stopped: set[str] = set()

    def start_carousel(self, carousel: RunningCarousel) -> None:
        """Start (or replace) the carousel of ``carousel.plan.issue_id``."""
        with self._lock:
            self._carousels[carousel.plan.issue_id] = carousel
            self.metrics.carousels.set(len(self._carousels))
        self._wake.set()

    def stop_carousel(self, issue_id: str) -> RunningCarousel | None:
        """Stop an issue's carousel; the stopped carousel, or None if none ran."""
        with self._lock:
            carousel = self._carousels.pop(issue_id, None)
            self.metrics.carousels.set(len(self._carousels))
            if carousel is not None:
                self._stopped.add(issue_id)
        self._wake.set()
        return carousel

    def running(self) -> list[RunningCarousel]:
        """The running carousels (a snapshot)."""
        with self._lock:
            return list(self._carousels.values())

    def get(self, issue_id: str) -> RunningCarousel | None:
        """The running carousel of ``issue_id``."""
        with self._lock:
            return self._carousels.get(issue_id)

    def stop(self) -> None:
        """Ask the thread to end (join it afterwards)."""
        self._stopping.set()
        self._wake.set()

    def _forget_stopped(self) -> None:
        """Remove the per-(issue, channel) metric children of the carousels stopped
        since the last round (a carousel running again keeps its counters)."""
        with self._lock:
            stopped = {i for i in self._stopped if i not in self._carousels}
            self._stopped.clear()
        if not stopped:
            return
        for key in [k for k in self._children if k[0] in stopped]:
            del self._children[key]
            self._slipped.pop(key, None)
            labels = (key[0], str(key[1]))
            for metric in (
                self.metrics.packets,
                self.metrics.bytes,
                self.metrics.cycles,
                self.metrics.slipped,
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._round()
            except Exception:  # every carousel's packets depend on this thread
                log.exception("the send thread's round failed; it goes on")
                time.sleep(0.05)

    def _round(self) -> None:
        self._forget_stopped()
        carousels = self.running()
        if not carousels:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            return
        deadline = min(c.schedule.next_deadline() for c in carousels)
        now = time.perf_counter()
        if deadline > now:
            time.sleep(min(deadline - now, 0.05))
            now = time.perf_counter()
        for carousel in carousels:
            self._send_due(carousel, now)

    def _send_due(self, carousel: RunningCarousel, now: float) -> None:
        fd = self.sock.fileno()
        for batch in carousel.schedule.handle_timer(now=now):
            host, port = carousel.addresses[batch.channel]
            # the binding loops over sendto with the GIL released, numbering each
            # channel's packets (an LCT extension) so receivers see the path's loss
            first = carousel.schedule.sent(batch.channel) - len(batch.packets)
            sent, sent_bytes, failures, error = carousel.packets.send(
                fd, batch.packets, host, port, first % SEQUENCE_MODULO
            )
            if failures:
                self.metrics.send_errors.inc(failures)
                log.warning(
                    "sending %s channel %d: %d packets failed (%s)",
                    carousel.plan.issue_id,
                    batch.channel,
                    failures,
                    error,
                )
            self._count(carousel, batch.channel, sent, sent_bytes)

    def _count(self, carousel: RunningCarousel, channel: int, sent: int, sent_bytes: int) -> None:
        issue = carousel.plan.issue_id
        key = (issue, channel)
        children = self._children.get(key)
        if children is None:
            label = str(channel)
            children = self._children[key] = (
                self.metrics.packets.labels(issue, label),
                self.metrics.bytes.labels(issue, label),
                self.metrics.cycles.labels(issue, label),
                self.metrics.slipped.labels(issue, label),
            )
        packets, nbytes, cycles, slipped_counter = children
        packets.inc(sent)
        nbytes.inc(sent_bytes)
        cycles.set(carousel.schedule.cycles_done(channel))
        slipped = carousel.schedule.slipped(channel)
        if slipped > self._slipped.get(key, 0):
            slipped_counter.inc(slipped - self._slipped.get(key, 0))
            self._slipped[key] = slipped
