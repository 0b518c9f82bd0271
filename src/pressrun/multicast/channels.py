"""A carousel receiver's channel sockets, and its joins and leaves off the receive
thread.

`ChannelSockets` holds the sockets of the channels joined (the binding's receive loop
reads them), or, through an AMT gateway, the channels joined through the relay. A join
or leave is a system call (``IP_ADD_MEMBERSHIP``, ``IP_DROP_MEMBERSHIP``) that takes
the kernel's network configuration lock, which every namespace shares: on the
emulation's host it returned 2.9-3.2 s after the decision in flash-crowd-50 at
21f36b4 and 9-13 s in the runs of 29 Nov 04:00-04:25 (docker's network changes hold
it). Made in the receive thread, it stopped the reading for that long: the channels'
packets queued in their sockets, overflowed them (2,300-9,000 own drops a receiver,
efficiencies down to 0.14) and were read late. So natively the changes run in a
thread of their own (`change`, one at a time, in order) while the receive loop reads
on; a channel left is no longer read from the decision, a channel joined is read
from when its join returned (`changing`). Through a relay the changes are messages
to it, made at once.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from pressrun.multicast.events import CarouselPlan, JoinChannel, LayerEffect
from pressrun.multicast.net import (
    RECEIVE_BUFFER_BYTES,
    enable_arrival_times,
    enable_drop_counts,
    leave_and_close,
    oldest_waiting_arrival,
    receiver_socket,
)

if TYPE_CHECKING:
    from pressrun_flute import Receiver as FluteReceiver

    from pressrun.multicast.gateway import AmtGateway

log = logging.getLogger("pressrun.multicast.receiver")


def wall_clock() -> float:
    """Unix time: the kernel stamps datagrams with it."""
    return time.time()  # noqa: TID251 (the kernel's arrival stamps are Unix time)


class ChannelSockets:
    """The sockets of the joined channels, or, through an AMT ``gateway``, the
    channels joined through the relay (the binding maps their (group, port) to the
    channel); the module docstring."""

    def __init__(
        self,
        plan: CarouselPlan,
        interface: str,
        receive_buffer_bytes: int = RECEIVE_BUFFER_BYTES,
        gateway: tuple[AmtGateway, FluteReceiver] | None = None,
    ):
        self.plan = plan
        self.interface = interface
        self.receive_buffer_bytes = receive_buffer_bytes
        self.sockets: dict[int, socket.socket] = {}
        self.gateway = gateway
        self.tunnelled: set[int] = set()
        self._changer: ThreadPoolExecutor | None = None
        #: joins (their socket) and leaves (None) started by `change`, not yet seen
        #: done, each with when it returned (``time.perf_counter``)
        self._pending: list[tuple[int, Future[tuple[socket.socket | None, float]]]] = []
        #: when the last changes `changing` saw done returned (the last of them)
        self.applied_at: float | None = None

    @property
    def count(self) -> int:
        return len(self.sockets) + len(self.tunnelled)

    def _tunnel(self, index: int, join: bool) -> None:
        assert self.gateway is not None and self.plan.source is not None
        gateway, flute = self.gateway
        ch = self.plan.channels[index]
        if join:
            self.tunnelled.add(index)
            gateway.join(self.plan.source, ch.group)
        else:
            self.tunnelled.discard(index)
            gateway.leave(self.plan.source, ch.group)
        chans = self.plan.channels
        flute.set_tunnel_channels([(chans[i].group, chans[i].port, i) for i in self.tunnelled])
        log.info("%s channel %d (%s:%d) through the relay", "joined" if join else "left", index,
                 ch.group, ch.port)  # fmt: skip

    def open_channel(self, index: int) -> socket.socket:
        """Join channel ``index`` natively: its socket, joined, arrival-stamped and
        counting its drops (blocking; touches no state of this object)."""
        ch = self.plan.channels[index]
        sock = receiver_socket(
            ch.group,
            ch.port,
            self.interface,
            receive_buffer_bytes=self.receive_buffer_bytes,
            source=self.plan.source,
        )
        enable_arrival_times(sock)
        enable_drop_counts(sock)  # the binding reads SO_RXQ_OVFL with each datagram
        log.info("joined channel %d (%s:%d)", index, ch.group, ch.port)
        return sock

    def _opened(self, index: int) -> tuple[socket.socket | None, float]:
        sock = self.open_channel(index)
        return sock, time.perf_counter()

    def _closed(self, index: int, sock: socket.socket) -> tuple[socket.socket | None, float]:
        self._close_channel(index, sock)
        return None, time.perf_counter()

    def _close_channel(self, index: int, sock: socket.socket) -> None:
        ch = self.plan.channels[index]
        leave_and_close(sock, ch.group, self.interface, self.plan.source)

    def join(self, index: int) -> None:
        """Join channel ``index`` in this thread (the start's joins)."""
        if self.gateway is not None:
            self._tunnel(index, True)
            return
        self.sockets[index] = self.open_channel(index)

    def leave(self, index: int) -> None:
        """Leave channel ``index`` in this thread."""
        if self.gateway is not None:
            if index in self.tunnelled:
                self._tunnel(index, False)
            return
        sock = self.sockets.pop(index, None)
        if sock is not None:
            self._close_channel(index, sock)

    def change(self, effects: Sequence[LayerEffect]) -> None:
        """Start the layering's joins and leaves: natively in the changer thread (the
        receive loop reads on; `changing` says when they returned), through a relay at
        once. A channel left is not read from now on."""
        if self.gateway is not None:
            for effect in effects:
                (self.join if isinstance(effect, JoinChannel) else self.leave)(effect.index)
            return
        if self._changer is None:
            self._changer = ThreadPoolExecutor(1, thread_name_prefix="pressrun-channel-change")
        for effect in effects:
            if isinstance(effect, JoinChannel):
                opening = self._changer.submit(self._opened, effect.index)
                self._pending.append((effect.index, opening))
                continue
            sock = self.sockets.pop(effect.index, None)
            if sock is not None:
                leaving = self._changer.submit(self._closed, effect.index, sock)
                self._pending.append((effect.index, leaving))

    @property
    def changing(self) -> bool:
        """Whether the joins and leaves `change` started have not all returned. Once
        they have, the channels joined are read from then on, and `applied_at` says
        when the last returned (a join that failed raises its error here). Through a
        relay nothing is under way after `change`."""
        if not self._pending:
            return False
        if not all(future.done() for _, future in self._pending):
            return True
        pending, self._pending = self._pending, []
        for index, future in pending:
            sock, returned = future.result()
            self.applied_at = max(self.applied_at or returned, returned)
            if sock is not None:
                self.sockets[index] = sock
        return False

    def read_up_to(self) -> float | None:
        """Up to when (``time.perf_counter``) every datagram that arrived on the
        joined channels has been read: the kernel's arrival stamp of the oldest one
        still waiting in their sockets (`LayerCore.handle_timer`'s ``read_up_to``);
        None when none waits, or through a relay (whose socket is not stamped)."""
        oldest: float | None = None
        for sock in self.sockets.values():
            arrived = oldest_waiting_arrival(sock)
            if arrived is not None and (oldest is None or arrived < oldest):
                oldest = arrived
        if oldest is None:
            return None
        # the stamp is the wall clock's: as the same instant on the monotonic clock
        return time.perf_counter() - max(0.0, wall_clock() - oldest)

    def close(self) -> None:
        """Leave every channel. A join or leave still under way is not waited for:
        the changer thread closes what it opens once it returns."""
        if self._changer is not None:
            for index, future in self._pending:
                future.add_done_callback(functools.partial(_close_when_opened, self, index))
            self._pending = []
            self._changer.shutdown(wait=False)
        for index in list(self.sockets) + sorted(self.tunnelled):
            self.leave(index)


def _close_when_opened(
    channels: ChannelSockets, index: int, future: Future[tuple[socket.socket | None, float]]
) -> None:
    """A join still under way at the end returned: close what it opened."""
    if future.cancelled() or future.exception() is not None:
        return
    sock, _ = future.result()
    if sock is not None:
        channels._close_channel(index, sock)
