"""UDP multicast sockets for the sender and the receivers (IPv4).

The interface is named by its address (``--interface 127.0.0.1``): the sender sends
through it (``IP_MULTICAST_IF``, loopback on so receivers on the same host hear it,
TTL 2 by the sender's default: a relay or router one hop away gets the groups), a
receiver joins its groups on it
(``IP_ADD_MEMBERSHIP``), or, for a source-specific group (232/8, RFC 4607), the
(source, group) channel (``IP_ADD_SOURCE_MEMBERSHIP``: packets from another source
are not delivered, and an AMT relay or SSM router forwards by (S, G)). Multicast on
the loopback interface works in the initial
network namespace and, after ``ip link set lo multicast on``, in a namespace of its
own (FIELD-NOTES.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct

from pressrun.multicast.config import is_ssm

#: receive buffer asked for each channel socket; the kernel caps it at rmem_max
RECEIVE_BUFFER_BYTES = 8 * 1024 * 1024


def parse_group(text: str) -> tuple[str, int]:
    """``"239.255.1.2:5000"`` -> ``("239.255.1.2", 5000)``; ValueError when the
    address is not IPv4 multicast or the port not 1..65535."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"{text!r} is not GROUP:PORT (e.g. 239.255.70.1:5400)")
    try:
        address = ipaddress.IPv4Address(host)
    except ipaddress.AddressValueError:
        raise ValueError(f"{host!r} is not an IPv4 address") from None
    if not address.is_multicast:
        raise ValueError(f"{host} is not a multicast address (224.0.0.0/4)")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 1..65535")
    return str(address), port


def free_udp_port() -> int:
    """A UDP port no socket on this host holds right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
        return port


def sender_socket(interface: str, *, ttl: int = 1) -> socket.socket:
    """A UDP socket that sends multicast through ``interface`` (an IPv4 address)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RECEIVE_BUFFER_BYTES)
    except OSError:
        sock.close()
        raise
    return sock


def _membership(group: str, interface: str) -> bytes:
    return struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(interface))


#: Linux's IP_ADD/DROP_SOURCE_MEMBERSHIP (Python's socket module has them on Linux)
IP_ADD_SOURCE_MEMBERSHIP = getattr(socket, "IP_ADD_SOURCE_MEMBERSHIP", 39)
IP_DROP_SOURCE_MEMBERSHIP = getattr(socket, "IP_DROP_SOURCE_MEMBERSHIP", 40)


def source_membership(group: str, interface: str, source: str) -> bytes:
    """struct ip_mreq_source as Linux lays it out: group, interface, source."""
    return struct.pack(
        "4s4s4s", socket.inet_aton(group), socket.inet_aton(interface), socket.inet_aton(source)
    )


def _join(sock: socket.socket, group: str, interface: str, source: str | None) -> None:
    if is_ssm(group):
        if source is None:
            raise ValueError(f"{group} is a source-specific group: join it with its source")
        membership = source_membership(group, interface, source)
        sock.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, membership)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, _membership(group, interface))


def big_receive_buffer(sock: socket.socket, size: int = RECEIVE_BUFFER_BYTES) -> None:
    """Ask for ``size`` bytes of receive buffer (RECEIVE_BUFFER_BYTES): a receiver
    that loses the CPU for a moment then finds its packets queued rather than
    dropped. As root, SO_RCVBUFFORCE passes the net.core.rmem_max cap (208 KiB by
    default); otherwise the kernel caps SO_RCVBUF there."""
    force = getattr(socket, "SO_RCVBUFFORCE", None)
    if force is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
            return
        except PermissionError:
            pass
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


#: Linux's SO_TIMESTAMPNS (and its control message SCM_TIMESTAMPNS), not exported by
#: Python's socket module: the kernel stamps each datagram with its arrival time
SO_TIMESTAMPNS = 35


def enable_arrival_times(sock: socket.socket) -> bool:
    """Ask the kernel to stamp each datagram with its arrival time (the binding's
    receive loop reads it); False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


#: room for the control messages a peeked datagram carries (its arrival stamp, a
#: struct timespec, and the socket's drop count)
_PEEK_CONTROL_BYTES = socket.CMSG_SPACE(16) + socket.CMSG_SPACE(4)


def oldest_waiting_arrival(sock: socket.socket) -> float | None:
    """The arrival (the kernel's stamp, Unix seconds) of the oldest datagram waiting
    in ``sock``'s receive queue, peeked, not read; None when none waits or the socket
    does not stamp them (`enable_arrival_times`). Everything that arrived before it
    has been read."""
    try:
        _, ancdata, _, _ = sock.recvmsg(
            1, _PEEK_CONTROL_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT
        )
    except (BlockingIOError, InterruptedError):
        return None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("@qq", data[:16])
            return int(seconds) + int(nanoseconds) / 1e9
    return None


#: Linux's SO_RXQ_OVFL: each datagram then comes with the count of datagrams the
#: socket dropped so far because its receive queue was full (the kernel's sk_drops)
SO_RXQ_OVFL = 40


def enable_drop_counts(sock: socket.socket) -> bool:
    """Ask the kernel to give each datagram the socket's drop count (SO_RXQ_OVFL; the
    binding's receive loop reads it, and the kernel adds it only once the count is
    above 0); False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    except OSError:
        return False
    return True


def receiver_socket(
    group: str,
    port: int,
    interface: str,
    *,
    receive_buffer_bytes: int = RECEIVE_BUFFER_BYTES,
    source: str | None = None,
) -> socket.socket:
    """A non-blocking UDP socket bound to ``group:port`` and joined to the group on
    ``interface`` (several receivers on one host may bind the same group and port),
    with ``receive_buffer_bytes`` of receive buffer. A source-specific group (232/8)
    is joined as the (``source``, group) channel; ValueError without a source."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        big_receive_buffer(sock, receive_buffer_bytes)
        sock.bind((group, port))
        _join(sock, group, interface, source)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def leave_and_close(
    sock: socket.socket, group: str, interface: str, source: str | None = None
) -> None:
    """Leave the group (``IP_DROP_MEMBERSHIP``, or ``IP_DROP_SOURCE_MEMBERSHIP`` for a
    source-specific one joined with ``source``) and close the socket."""
    with contextlib.suppress(OSError):  # closing drops the membership anyway
        if is_ssm(group) and source is not None:
            sock.setsockopt(
                socket.IPPROTO_IP,
                IP_DROP_SOURCE_MEMBERSHIP,
                source_membership(group, interface, source),
            )
        else:
            sock.setsockopt(
                socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP, _membership(group, interface)
            )
    sock.close()
