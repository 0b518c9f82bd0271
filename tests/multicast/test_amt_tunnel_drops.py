"""The AMT gateway's socket counts its own drops (issue 34, CI's 0.943 efficiency).

Through a relay every channel's datagrams queue on the gateway's one UDP socket, so a
reader starved of CPU overflows that socket, not its channel sockets. Those losses
must show as own socket drops (SO_RXQ_OVFL on the tunnel socket, reported on the base
channel once, however many channels the tunnel carries), and the socket's buffer must
be as large as a channel socket's. Real sockets on 127.0.0.1, the real binding."""

from __future__ import annotations

import socket
from pathlib import Path

import pressrun_flute

from pressrun.multicast import amt
from pressrun.multicast.gateway import AmtGateway
from pressrun.multicast.net import RECEIVE_BUFFER_BYTES, big_receive_buffer

SOURCE = ("10.35.1.1", 40000)
GROUPS = (("232.9.9.1", 5001), ("232.9.9.2", 5002))


def _data(group: tuple[str, int], n: int) -> bytes:
    """AMT Multicast Data carrying one datagram of ``group`` (not ALC: the binding
    counts it as received and rejects it)."""
    return amt.encode(amt.MulticastData(amt.udp_datagram(SOURCE, group, bytes([n % 256]) * 1200)))


def _send(gateway: AmtGateway, first: int, sent: int) -> None:
    """Send datagrams ``first`` .. ``sent`` - 1 to the gateway, alternating the two
    channels, faster than anyone reads."""
    port = gateway.sock.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as relay:
        for n in range(first, sent):
            relay.sendto(_data(GROUPS[n % 2], n), ("127.0.0.1", port))


def test_the_tunnel_sockets_overflow_counts_as_own_drops_once(tmp_path: Path) -> None:
    gateway = AmtGateway([("127.0.0.1", 9)], bind=("127.0.0.1", 0))
    try:
        rx = pressrun_flute.Receiver(tmp_path)
        rx.set_tunnel_channels([(group, port, i) for i, (group, port) in enumerate(GROUPS)])
        # a queue of a few datagrams: most of the 400 are dropped by the kernel; the
        # kernel stamps each datagram with the drop count when it queues it, so the
        # drops show on the ones sent after the queue was read (one a round here, to
        # an empty queue: none of these is dropped)
        gateway.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sent = 400
        _send(gateway, 0, sent)
        received = drops = 0
        by_channel: dict[int, int] = {}
        for round_ in range(4):
            if round_ > 0:
                _send(gateway, sent, sent + 1)
                sent += 1
            per_channel, _, _, _, _ = rx.receive([], 0.1, tunnel_fd=gateway.fileno())
            for index, count, dropped in per_channel:
                received += count
                drops += dropped
                by_channel[index] = by_channel.get(index, 0) + dropped
        # every datagram sent was either read or dropped by the full queue, and each
        # drop is counted once (on the base channel), not once per channel carried
        assert received > 0 and drops > 0, (received, drops)
        assert received + drops == sent, (received, drops, by_channel)
        assert by_channel.get(1, 0) == 0, by_channel
    finally:
        gateway.close()


def test_the_tunnel_socket_has_a_channel_sockets_buffer() -> None:
    gateway = AmtGateway([("127.0.0.1", 9)], bind=("127.0.0.1", 0))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as channel:
            big_receive_buffer(channel, RECEIVE_BUFFER_BYTES)  # as receiver_socket does
            want = channel.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert gateway.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= want
    finally:
        gateway.close()
