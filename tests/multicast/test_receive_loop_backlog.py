"""The binding's receive loop returns by its timeout even when its socket never drains
(issue 28, session 18).

It read a socket batch after batch while each batch came full (64 datagrams), and
looked at the clock only between rounds: a receiver whose thread reads slower than its
channels arrive (a host short of CPU) never saw a batch under 64 and stayed in the loop
until the object completed. Python, and with it the layering, got no turn meanwhile: in
flash-crowd-50 at 49b8d26 (28 Nov 19:30, /work/runs/fc50-s18a) a dsl-20 reader joined a
5th and 6th channel and then ended no measuring window for its last 15 s (it ended on 6
channels of a link that carries 4), and a fibre-50 reader ended no window for its last
10 s. Real UDP on 127.0.0.1: a backlog of datagrams far larger than a batch, read with a
timeout of a millisecond."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("pressrun_flute")
import pressrun_flute

BACKLOG = 20_000


def test_a_socket_that_never_drains_does_not_hold_the_loop_past_its_timeout(
    tmp_path: Path,
) -> None:
    """20,000 datagrams queued (not ALC: each is counted and rejected, the cheapest
    work a datagram gets): with a 1 ms timeout the call returns having read a few
    batches, not the whole queue; the next calls read on. On the code before, the first
    call read all 20,000."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        # SO_RCVBUFFORCE (root) past rmem_max, else as much as the host allows
        try:
            rx.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        except PermissionError:
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        for n in range(BACKLOG):
            tx.sendto(n.to_bytes(4, "big") * 4, rx.getsockname())
        receiver = pressrun_flute.Receiver(tmp_path)
        started = time.perf_counter()
        per_channel, _, _, _, ended = receiver.receive([(0, rx.fileno())], 0.001, batch_wait_s=0.0)
        took = time.perf_counter() - started
        queued = BACKLOG - receiver.rejected  # what the first call left
        first = per_channel[0][1]
        assert not ended
        if first == BACKLOG:
            pytest.fail(f"the first call read the whole backlog ({first}) in {took:.3f} s")
        assert first < BACKLOG // 2, (first, took)
        assert queued > 0
        read = first
        for _ in range(1000):  # the rest comes with the next calls
            per_channel, *_ = receiver.receive([(0, rx.fileno())], 0.001, batch_wait_s=0.0)
            read += per_channel[0][1]
            if read >= BACKLOG:
                break
        assert read == BACKLOG
    finally:
        rx.close()
        tx.close()
