"""The adapter tells the layering up to when it has read (issue 28, session 21): the
kernel's arrival stamp of the oldest datagram still waiting in the channel sockets
(`net.oldest_waiting_arrival`, peeked with MSG_PEEK), on the monotonic clock
(`ChannelSockets.read_up_to`). The core's rules on what it is told:
test_layering_late_evidence.py; the loop reading on while a join blocks:
test_layering_slow_join.py."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time

from pressrun.multicast.net import (
    SO_TIMESTAMPNS,
    enable_arrival_times,
    oldest_waiting_arrival,
    receiver_socket,
)

from .conftest import random_groups


def _sender() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    return sock


def _read_stamped(sock: socket.socket) -> tuple[bytes, float]:
    """Read one datagram with its kernel arrival stamp (SO_TIMESTAMPNS)."""
    data, ancdata, _, _ = sock.recvmsg(2048, 256)
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanoseconds = struct.unpack("@qq", raw[:16])
            return data, int(seconds) + int(nanoseconds) / 1e9
    raise AssertionError("the stamped socket gave a datagram without its stamp")


def _stamps_on_arrival(stamped: socket.socket, out: socket.socket, group: str, port: int) -> None:
    """Wait until the kernel stamps datagrams as they arrive. Linux turns its receive
    stamps on for the whole host by deferred work after the first socket asks
    (`net_enable_timestamp`); until that work has run (late on a loaded host), a
    datagram is stamped when it is first read or peeked, not when it came."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        out.sendto(b"w", (group, port))
        time.sleep(0.05)
        before_peek = time.time()
        data, stamp = _read_stamped(stamped)
        assert data == b"w"
        if stamp < before_peek:
            return
    raise AssertionError("the kernel never stamped a datagram on arrival within 10 s")


def test_the_oldest_waiting_datagram_s_arrival_is_peeked_not_read() -> None:
    (group, port), _ = random_groups(random.Random())
    stamped = receiver_socket(group, port, "127.0.0.1")
    plain = receiver_socket(group, port, "127.0.0.1")
    enable_arrival_times(stamped)
    out = _sender()
    try:
        assert oldest_waiting_arrival(stamped) is None  # nothing waits
        _stamps_on_arrival(stamped, out, group, port)
        with contextlib.suppress(BlockingIOError):  # the warm-up came to both
            while True:
                assert plain.recv(2048) == b"w"
        first = time.time()  # the kernel stamps in Unix time
        out.sendto(b"a" * 1400, (group, port))
        time.sleep(0.2)
        out.sendto(b"b" * 1400, (group, port))
        time.sleep(0.02)
        arrived = oldest_waiting_arrival(stamped)
        assert arrived is not None and first <= arrived <= time.time()
        assert oldest_waiting_arrival(stamped) == arrived  # peeked: still there
        # the stamp peeked is the oldest datagram's own: the one read next
        assert _read_stamped(stamped) == (b"a" * 1400, arrived)
        then = oldest_waiting_arrival(stamped)
        assert then is not None and arrived <= then <= time.time()
        assert _read_stamped(stamped) == (b"b" * 1400, then)
        assert oldest_waiting_arrival(stamped) is None
        # a socket that does not stamp its datagrams says nothing
        assert oldest_waiting_arrival(plain) is None
        assert plain.recv(2048) == b"a" * 1400
    finally:
        for sock in (stamped, plain, out):
            sock.close()
