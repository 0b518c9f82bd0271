"""A carousel that starts is announced at once, not at the announcer's next tick: a
swarm client's watch learns of it by its announcements (in flash-crowd-50-desktops at
a23629d the first came 0.3 s after the carousel started, the interval's phase, and
the leavers joined 1.3-1.9 s after it). A real sender on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.control import check_datagram
from pressrun.multicast.core import AnnouncementClock, AnnouncementGate
from pressrun.multicast.events import AnnouncementVerdict
from pressrun.multicast.net import leave_and_close, receiver_socket
from pressrun.multicast.receiver import MAX_DATAGRAM, wall_clock

from .conftest import Shelf


def test_a_change_makes_the_next_announcement_due_now() -> None:
    clock = AnnouncementClock(0.5, 10.0)
    assert clock.handle_timer(now=10.0) == 1
    assert clock.handle_timer(now=10.2) is None
    clock.handle_changed(now=10.2)
    assert clock.next_deadline() == 10.2
    assert clock.handle_timer(now=10.2) == 2
    # the cadence goes on from the change
    assert clock.next_deadline() == 10.7
    # a change never puts the next announcement later
    clock.handle_changed(now=11.0)
    assert clock.next_deadline() == 10.7


async def test_a_carousel_is_announced_when_it_starts(
    shelf: Shelf, senders: Callable[..., Any]
) -> None:
    """Announcements every 60 s: the carousel started after the first is named in an
    announcement that comes well before the second is due."""
    shelf.publish("soon", 100_000)
    sender = await senders(
        shelf,
        CarouselConfig(channels=1, rate_bps=1e6),
        announce_interval_s=60.0,
        announcement_ttl_s=120.0,
    )
    group = sender.config.control_group
    sock = receiver_socket(group[0], group[1], "127.0.0.1")
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    gate = AnnouncementGate({shelf.public_hex})
    try:
        await asyncio.sleep(0.3)  # the announcement at the sender's start (no carousel)
        while True:
            try:
                sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                break
        await sender.start_carousel("soon", sender.config.carousel)

        async def named() -> None:
            while True:
                data = await loop.sock_recv(sock, MAX_DATAGRAM)
                ann, verdict, _ = check_datagram(data, gate, now_unix=wall_clock())
                accepted = ann if verdict is AnnouncementVerdict.ACCEPTED else None
                if accepted is not None and accepted.plan_for("soon") is not None:
                    return

        # (the tick after the start's is 60 s away)
        await asyncio.wait_for(named(), 20.0)
    finally:
        leave_and_close(sock, group[0], "127.0.0.1", None)
