"""The adapter tells the layering up to when it has read (issue 28, session 21): the
kernel's arrival stamp of the oldest datagram still waiting in the channel sockets
(`net.oldest_waiting_arrival`, peeked with MSG_PEEK), on the monotonic clock
(`ChannelSockets.read_up_to`); and it reads on while a join blocks (the joins and
leaves run in a thread of their own). The core's rules on what it is told:
test_layering_late_evidence.py."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.multicast.config import CarouselConfig, LayeringConfig
from pressrun.multicast.net import (
    enable_arrival_times,
    oldest_waiting_arrival,
    receiver_socket,
)

from .conftest import Shelf, random_groups, receive_issue


def _sender() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    return sock


def test_the_oldest_waiting_datagram_s_arrival_is_peeked_not_read() -> None:
    (group, port), _ = random_groups(random.Random())
    stamped = receiver_socket(group, port, "127.0.0.1")
    plain = receiver_socket(group, port, "127.0.0.1")
    enable_arrival_times(stamped)
    out = _sender()
    try:
        assert oldest_waiting_arrival(stamped) is None  # nothing waits
        first = time.time()  # the kernel stamps in Unix time
        out.sendto(b"a" * 1400, (group, port))
        time.sleep(0.2)
        second = time.time()
        out.sendto(b"b" * 1400, (group, port))
        time.sleep(0.02)
        arrived = oldest_waiting_arrival(stamped)
        assert arrived is not None and first <= arrived < second
        assert oldest_waiting_arrival(stamped) == arrived  # peeked: still there
        assert stamped.recv(2048) == b"a" * 1400
        then = oldest_waiting_arrival(stamped)
        assert then is not None and second <= then <= time.time()
        stamped.recv(2048)
        assert oldest_waiting_arrival(stamped) is None
        # a socket that does not stamp its datagrams says nothing
        assert oldest_waiting_arrival(plain) is None
        assert plain.recv(2048) == b"a" * 1400
    finally:
        for sock in (stamped, plain, out):
            sock.close()


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
    from pressrun.multicast.channels import ChannelSockets
    from pressrun.multicast.layering import LayerCore

    shelf.publish("read-up-to", 2_000_000)
    sender = await senders(shelf, CarouselConfig(channels=3, rate_bps=3e6))
    await sender.start_carousel("read-up-to", sender.config.carousel)
    calls: list[tuple[int, float, float]] = []  # (channel, called, returned)
    join = ChannelSockets.open_channel

    def slow_join(self: Any, index: int) -> Any:
        called = time.perf_counter()
        if index == 1:
            time.sleep(1.0)
        sock = join(self, index)
        calls.append((index, called, time.perf_counter()))
        return sock

    told: list[tuple[float, float | None]] = []  # (applied, read_up_to)
    applied = LayerCore.handle_applied

    def record(self: LayerCore, *, now: float, read_up_to: float | None = None) -> None:
        told.append((now, read_up_to))
        applied(self, now=now, read_up_to=read_up_to)

    monkeypatch.setattr(ChannelSockets, "open_channel", slow_join)
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
