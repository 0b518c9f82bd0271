"""The body of a content answer: the sendfile(2) transfer loop and its waits.

`TransferMixin` is the part of `pressrun.origin.aio.OriginService` that sends the
bytes of a range once the headers are decided: chunks paced by the egress bucket when
there is a cap, taken a turn of ``cap_turn_bytes`` at a time so answers of up to a turn
finish in the order asked (a small object does not wait behind the bulk transfers'
debt), sized
by the client's pace (`next_chunk_bytes`) when there is none; our own sendfile(2) loop
on a plain socket (`TransferMixin._sendfile_direct`, waiting for room only on EAGAIN),
``loop.sendfile`` under TLS. A chunk the client has not taken within ``send_timeout_s``
ends the transfer with a reset (``stalled``); a client that leaves ends it quietly
(``client gone``); a file truncated under us closes the connection short. One log line
per transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from typing import Any

from aiohttp import web

from pressrun.origin.config import OriginConfig
from pressrun.origin.core import (
    TokenBucket,
    TrafficMeter,
    is_small_object,
    next_chunk_bytes,
    turn_write_release,
)
from pressrun.origin.metrics import OriginMetrics
from pressrun.origin.shared import SharedBucket

log = logging.getLogger("pressrun.origin")

#: transfer outcomes logged at DEBUG (the others at INFO)
_QUIET_OUTCOMES = frozenset({"complete", "client gone"})

#: the socket families TCP_CORK applies to
_TCP_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6})

#: the read-and-write copy's block under TLS
_COPY_BYTES = 256 * 1024

#: SO_LINGER on, 0 s: close() resets the connection and drops the unsent bytes
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class _FileShrank(Exception):
    """The file ended before the bytes the answer promised."""


class TransferMixin:
    """The transfers of `pressrun.origin.aio.OriginService` (which sets these attributes)."""

    config: OriginConfig
    metrics: OriginMetrics
    meter: TrafficMeter
    bucket: TokenBucket | SharedBucket | None
    transfers_cut: int
    _loop: asyncio.AbstractEventLoop
    _dirty: bool
    #: the connections are TCP (TCP_CORK applies); None: not yet asked
    _tcp: bool | None = None
    #: the sent-bytes counter's child by issue
    _sent_counters: dict[str, Any]

    async def _transfer(
        self,
        request: web.BaseRequest,
        response: web.StreamResponse,
        issue: str,
        name: str,
        in_fd: int,
        offset: int,
        count: int,
        size: int,
    ) -> None:
        """Send `count` bytes from `offset` of the file open as `in_fd` (shared with
        other transfers: read at explicit offsets only), counted as they go; log one
        line at the end."""
        loop = self._loop
        started = loop.time()
        tid = self.meter.transfer_started(issue, now=started)
        self._dirty = True
        if log.isEnabledFor(logging.DEBUG):  # request.remote is a lookup: only when logged
            log.debug(
                "transfer start issue=%s file=%s range=%d-%d/%d client=%s",
                issue,
                name,
                offset,
                offset + count - 1,
                size,
                request.remote,
            )
        outcome = "complete"
        sock: Any = None
        corked = False
        try:
            transport = request.transport
            if transport is None:
                raise ConnectionResetError("connection lost before the body")
            sock = transport.get_extra_info("socket")
            if self.config.send_buffer_bytes is not None and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.send_buffer_bytes)
            # our own sendfile(2) loop on a plain socket; asyncio's under TLS
            out_fd = -1
            if sock is not None and transport.get_extra_info("sslcontext") is None:
                out_fd = sock.fileno()
                tcp = self._tcp
                if tcp is None:
                    # every connection comes from this process's listening sockets:
                    # asked once (the socket's family property is not free)
                    tcp = self._tcp = sock.family in _TCP_FAMILIES
                if tcp:
                    # nginx's tcp_nopush: hold the headers until the body's first bytes
                    # join them, so they leave in one segment instead of a small one of
                    # their own (asyncio sets TCP_NODELAY); uncorked after the first chunk
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                    corked = True
            await response.prepare(request)
            position, end = offset, offset + count
            bucket = self.bucket
            cfg = self.config
            max_chunk = cfg.sendfile_chunk_bytes if bucket is None else cfg.cap_chunk_bytes
            chunk = max_chunk
            counter = self._sent_counters.get(issue)
            if counter is None:  # the labelled child looked up once per issue
                counter = self._sent_counters[issue] = self.metrics.bytes_sent.labels(issue)
            # A small object (a manifest, a cover) takes its bytes from the bucket but
            # does not wait behind the bulk transfers' debt: they pay it back (issue 33).
            small = is_small_object(name, size)
            # Under a cap the bytes are taken a turn at a time (cap_turn_bytes, one
            # take), its paced writes going as the turn pays for them: forty piece
            # fetches at once complete one after another, not all at the end (issue 29)
            turn_end = position
            turn_released_at = 0.0
            while position < end:
                n = min(chunk, end - position)
                if bucket is not None:
                    now = loop.time()
                    if position >= turn_end:
                        turn_end = min(end, position + cfg.cap_turn_bytes)
                        turn_released_at = now + bucket.take(turn_end - position, now=now)
                    n = min(n, turn_end - position)
                    release = turn_write_release(
                        turn_released_at, turn_end - position - n, bucket.rate_bytes_per_s
                    )
                    if release > now and not small:
                        # waiting for the cap is the origin's pacing, not a stall
                        self.meter.transfer_paced(tid, now=release)
                        await asyncio.sleep(release - now)
                if transport.is_closing():
                    raise ConnectionResetError("client closed the connection")
                began = loop.time()
                # a client that takes nothing of a chunk for send_timeout_s stopped
                # reading: TimeoutError
                if out_fd >= 0 and transport.get_write_buffer_size() == 0:
                    sent = await self._sendfile_direct(
                        transport, out_fd, in_fd, position, n, began + cfg.send_timeout_s
                    )
                else:
                    sent = await self._sendfile_asyncio(
                        transport, response, in_fd, position, n, plain=out_fd >= 0
                    )
                if corked:
                    # the headers left with the first chunk; the tail of this one goes
                    # now, and later (paced) chunks are not held back by the cork
                    corked = False
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
                if bucket is None:
                    chunk = next_chunk_bytes(sent, loop.time() - began, n, max_bytes=max_chunk)
                position += sent
                self.meter.bytes_sent(tid, sent, now=loop.time())
                counter.inc(sent)
                if sent < n:
                    raise _FileShrank(f"{issue}/{name} ended at byte {position} of {end}")
            await response.write_eof()
        except _FileShrank as err:
            # The file was truncated under us (replaced files are safe: the open
            # descriptor keeps the old version). The client sees a short body.
            outcome = "file shrank"
            log.warning("%s; the connection is closed short", err)
            transport = request.transport
            if transport is not None:
                transport.close()
        except TimeoutError:
            # The client stopped reading: cut it with a reset (SO_LINGER 0, nginx's
            # reset_timedout_connection), so neither the descriptor nor the megabytes
            # in the kernel's send buffer wait for a client that takes nothing.
            outcome = "stalled"
            self.metrics.timed_out.inc()
            transport = request.transport
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                transport.abort()
        except ConnectionError as err:
            # ConnectionResetError / BrokenPipeError: the client left. Normal for web
            # seeds (libtorrent closes mid-range); nothing to report above DEBUG.
            outcome = "client gone"
            log.debug("%s/%s: client %s left mid-transfer: %r", issue, name, request.remote, err)
        except asyncio.CancelledError:
            outcome = "cut at shutdown"
            self.transfers_cut += 1
            raise
        finally:
            if corked:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
            ended = loop.time()
            sent_total = self.meter.transfer_ended(tid, now=ended)
            self._dirty = True
            seconds = ended - started
            self.metrics.duration.observe(seconds)
            # One line per transfer is per-request work (formatting, a write): the
            # ordinary outcomes at DEBUG, the ones an operator must see at INFO.
            level = logging.DEBUG if outcome in _QUIET_OUTCOMES else logging.INFO
            if log.isEnabledFor(level):
                rate = sent_total / seconds if seconds > 0 else 0.0
                log.log(
                    level,
                    "transfer %s issue=%s file=%s range=%d-%d/%d bytes=%d seconds=%.3f "
                    "rate=%.2fMB/s client=%s",
                    outcome,
                    issue,
                    name,
                    offset,
                    offset + count - 1,
                    size,
                    sent_total,
                    seconds,
                    rate / 1e6,
                    request.remote,
                )

    async def _sendfile_direct(
        self,
        transport: asyncio.Transport,
        out_fd: int,
        in_fd: int,
        offset: int,
        count: int,
        deadline: float,
    ) -> int:
        """sendfile(2) `count` bytes from `offset` of `in_fd` to the socket `out_fd`;
        the bytes sent (fewer only when the file ends first).

        asyncio's ``loop.sendfile`` pauses and resumes the transport's reading, waits
        for an empty-buffer waiter, makes a future and seeks the file on every call:
        over a third of the origin's CPU on 128 KiB - 1 MiB ranges (py-spy). Here a
        chunk the socket's buffer can take costs one system call; only when the kernel
        says EAGAIN does the loop wait for the socket to be writable (the selector's
        writer slot of the transport's descriptor: the transport's own buffer is empty,
        so nothing else writes it), until `deadline` (TimeoutError).
        """
        try:
            sent = os.sendfile(out_fd, in_fd, offset, count)
        except (BlockingIOError, InterruptedError):
            sent = -1
        if sent == 0 or sent == count:
            return sent  # all of it, or the file ended
        # EAGAIN or a short send: the socket buffer is full (asking again at once
        # would cost a system call and an exception for EAGAIN); if the file ended just
        # there, the next call after the wait says 0
        sent = max(sent, 0)
        return sent + await self._sendfile_waiting(
            transport, out_fd, in_fd, offset + sent, count - sent, deadline
        )

    async def _sendfile_waiting(
        self,
        transport: asyncio.Transport,
        out_fd: int,
        in_fd: int,
        offset: int,
        count: int,
        deadline: float,
    ) -> int:
        """The rest of `_sendfile_direct` once the socket is full: one writer
        registration and one timeout for the whole rest of the chunk (not one per
        wait: a slow client or 1,000 connections make many waits).

        The sendfile(2) calls are made by the writer callback itself, which the
        selector runs each time the socket has room; the transfer's task wakes once,
        when the chunk is done (or the file ended, the client left, the deadline
        passed). Waking the task for each writable event, a future and a task step
        each, was most of the origin's user-space CPU on whole files: an 8 MB answer
        makes a dozen or more of them.

        The transport's reading is paused for the wait, as ``loop.sendfile`` does: a
        client's FIN read meanwhile makes the transport close, and its close() removes
        the writer registered here on the same descriptor (asyncio keeps one reader
        and one writer per descriptor) without calling it, so the transfer waited for
        `deadline` (``send_timeout_s``, 60 s) for a client long gone, and then removed
        a writer of a descriptor number the next connection may hold (a test stack's
        stop waited for it: the 57-59 s teardowns, docs/results/2026-11-29-teardowns.md).
        Paused, a client that left shows as an error on the socket, which the
        writer callback sees; one that only half-closed and reads on is served.
        """
        loop: Any = self._loop  # the selector loop's private writer slot, as loop.sendfile
        done: asyncio.Future[None] = loop.create_future()
        sent = 0

        def on_writable() -> None:
            nonlocal sent
            if done.done():
                return
            # the client may have left: the transport then closes (its descriptor
            # too, or soon), so ask before each call
            if transport.is_closing():
                done.set_exception(ConnectionResetError("client closed the connection"))
                return
            try:
                n = os.sendfile(out_fd, in_fd, offset + sent, count - sent)
            except (BlockingIOError, InterruptedError):
                return  # level-triggered: called again when there is room
            except OSError as err:
                done.set_exception(err)
                return
            if n == 0:
                done.set_result(None)  # the file ended
                return
            sent += n
            if sent >= count:
                done.set_result(None)
            # else a short send filled the buffer: called again when there is room

        paused = transport.is_reading()
        if paused:
            transport.pause_reading()
        loop._add_writer(out_fd, on_writable)
        try:
            async with asyncio.timeout_at(deadline):
                await done
        finally:
            loop._remove_writer(out_fd)
            if not done.done():
                done.cancel()  # timed out or cancelled: a late callback does nothing
            if paused:
                transport.resume_reading()  # nothing if it closed meanwhile
        return sent

    async def _sendfile_asyncio(
        self,
        transport: asyncio.Transport,
        response: web.StreamResponse,
        in_fd: int,
        offset: int,
        count: int,
        *,
        plain: bool,
    ) -> int:
        """A plain socket with bytes in the transport's buffer: ``loop.sendfile``
        (which waits for the buffer to drain, then sendfile(2)). TLS: reads at
        explicit offsets and writes of `_COPY_BYTES` (asyncio's own fallback reads
        through the file position, which the transfers sharing the descriptor would
        move under each other)."""
        try:
            async with asyncio.timeout(self.config.send_timeout_s):
                if plain:
                    # a file object of the shared descriptor for loop.sendfile, which
                    # sends at explicit offsets and only seeks it at the end
                    fobj = open(in_fd, "rb", buffering=0, closefd=False)  # noqa: SIM115
                    return await self._loop.sendfile(transport, fobj, offset, count)
                return await self._copy(response, in_fd, offset, count)
        except RuntimeError:
            # loop.sendfile's "Transport is closing": the client left.
            if transport.is_closing():
                raise ConnectionResetError("client closed the connection") from None
            raise

    @staticmethod
    async def _copy(response: web.StreamResponse, in_fd: int, offset: int, count: int) -> int:
        """`count` bytes from `offset` of `in_fd`, read and written through the
        response (which waits for the transport's buffer to drain); fewer when the
        file ends first."""
        sent = 0
        while sent < count:
            data = os.pread(in_fd, min(_COPY_BYTES, count - sent), offset + sent)
            if not data:
                break
            await response.write(data)
            sent += len(data)
        return sent
