"""The adapter tells the layering up to when it has read (issue 28, session 21): the
kernel's arrival stamp of the oldest datagram still waiting in the channel sockets
(`net.oldest_waiting_arrival`, peeked with MSG_PEEK), on the monotonic clock
(`ChannelSockets.read_up_to`). The core's rules on what it is told:
test_layering_late_evidence.py; the loop reading on while a join blocks:
test_layering_slow_join.py."""

from __future__ import annotations

import random
import socket
import time

from pressrun.multicast.net import (
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
