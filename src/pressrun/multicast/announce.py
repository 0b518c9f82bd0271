"""The multicast sender's control channel: every ``announce_interval_s`` an
`Announcement` of every running carousel, signed with the publisher's Ed25519 key, goes
to the control group with a sequence number and an expiry ``announcement_ttl_s`` later,
in as many datagrams (parts of one round) as keep each under ``ANNOUNCEMENT_PART_BYTES``
(`Announcer`)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from pressrun.multicast.codec import ANNOUNCEMENT_PART_BYTES, split_announcement
from pressrun.multicast.control import sign_announcement
from pressrun.multicast.core import AnnouncementClock
from pressrun.multicast.events import Announcement
from pressrun.multicast.metrics import SenderMetrics
from pressrun.multicast.send import SendThread

if TYPE_CHECKING:
    from pressrun.multicast.sender import SenderServiceConfig

log = logging.getLogger("pressrun.multicast.sender")


class Announcer:
    """Makes and sends the sender's signed announcements (`run`: the loop)."""

    def __init__(
        self,
        config: SenderServiceConfig,
        *,
        sock: socket.socket,
        thread: SendThread,
        metrics: SenderMetrics,
        publisher_key: str,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.sock = sock
        self.thread = thread
        self.metrics = metrics
        self.publisher_key = publisher_key
        self.clock = clock
        self._changed = asyncio.Event()

    def carousels_changed(self) -> None:
        """A carousel started or stopped: the next round goes out now
        (`AnnouncementClock.handle_changed`)."""
        self._changed.set()

    def announcement(self, seq: int) -> Announcement:
        """The announcement of every running carousel, numbered ``seq`` (one round,
        before `split_announcement` cuts it into datagrams)."""
        now = self.clock()
        return Announcement(
            publisher_key=self.publisher_key,
            seq=seq,
            issued_at=now,
            expires_at=now + self.config.announcement_ttl_s,
            carousels=tuple(
                replace(
                    c.plan,
                    sent_packets=tuple(c.schedule.sent(i) for i in range(len(c.plan.channels))),
                )
                for c in sorted(self.thread.running(), key=lambda c: c.plan.issue_id)
            ),
        )

    def announcement_datagrams(self, seq: int) -> list[bytes]:
        """One round of announcements: the signed datagrams, numbered from ``seq``."""
        parts = split_announcement(self.announcement(seq), ANNOUNCEMENT_PART_BYTES)
        return [sign_announcement(part, self.config.signing_key) for part in parts]

    async def run(self) -> None:
        """Forever: one round of announcements every ``announce_interval_s``."""
        loop = asyncio.get_running_loop()
        clock = AnnouncementClock(self.config.announce_interval_s, loop.time())
        # sequence numbers start at the Unix time in ms: a restarted sender continues
        # above what receivers saw from it, so its announcements are not "replayed"
        clock.seq = int(self.clock() * 1000)
        while True:
            wait = clock.next_deadline() - loop.time()
            if wait > 0 and not self._changed.is_set():
                # (asyncio.wait, not wait_for: 3.11's wait_for loses a cancel that
                # comes as the event is set, and the sender's close then waits forever)
                changed = loop.create_task(self._changed.wait())
                try:
                    await asyncio.wait({changed}, timeout=wait)
                finally:
                    changed.cancel()
            if self._changed.is_set():
                self._changed.clear()
                clock.handle_changed(now=loop.time())
            seq = clock.handle_timer(now=loop.time())
            if seq is None:
                continue
            try:
                datagrams = self.announcement_datagrams(seq)
            except Exception:  # every carousel's announcements depend on this loop
                log.exception("announcement %d could not be made; the next one is due", seq)
                continue
            # a round of n parts takes n sequence numbers
            clock.seq = seq + len(datagrams) - 1
            for datagram in datagrams:
                try:
                    self.sock.sendto(datagram, self.config.control_group)
                    self.metrics.announcements.inc()
                except OSError as err:
                    self.metrics.send_errors.inc()
                    log.warning("announcement %d not sent: %s", seq, err)
