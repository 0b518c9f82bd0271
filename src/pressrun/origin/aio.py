"""The origin's asyncio adapter: aiohttp handlers, sendfile transfers, one stats timer.

Endpoints (docs/protocols.md, "Origin HTTP"; docs/origin.md):

- ``GET/HEAD /content/<issue_id>/<name>``: a bundle file, from ``CONTENT/<issue_id>/``.
  Both names must match `pressrun.origin.core.NAME_RE`, so no path can leave the
  content directory. Single ranges give 206, malformed or unsatisfiable ones 416,
  several ranges the whole file (200). Strong ETag, If-None-Match (304), If-Range.
  Without an egress cap the body goes out with ``loop.sendfile`` (sendfile(2)) in
  chunks of ``sendfile_chunk_bytes``; with a cap, in chunks of ``cap_chunk_bytes``
  paced by one `TokenBucket` shared by every transfer. A busy origin slows down: a
  valid request is never refused (libtorrent drops a web seed for good after one 503).
- ``GET /stats``: the status agent's JSON; ``GET /metrics``: Prometheus text from a
  registry of this app only; ``GET /healthz``: ``ok``.

A client that goes away mid-transfer (libtorrent closes web-seed connections mid-range
as a matter of course) ends its transfer quietly: a DEBUG line, and the INFO transfer
line says ``client gone``. A client that stays but stops reading is no load: after
``stalled_after_s`` without a byte its transfer leaves ``active_transfers`` (the
`TrafficMeter` counts bytes moving), and a chunk it has not taken within
``send_timeout_s`` ends the transfer and aborts the connection (``stalled``).
Chunks follow the client's pace (`next_chunk_bytes`): a slow client gets small ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import stat
import struct
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import IO, Any

import psutil
from aiohttp import hdrs, web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from pressrun.cors import enable_cors
from pressrun.origin.config import OriginConfig
from pressrun.origin.core import (
    ByteSpan,
    RangeNotSatisfiable,
    TokenBucket,
    TrafficMeter,
    content_type_for,
    if_range_holds,
    is_small_object,
    make_etag,
    next_chunk_bytes,
    none_match,
    parse_range,
    valid_name,
)
from pressrun.origin.shared import (
    PUBLISH_EVERY_S,
    SharedBucket,
    WorkerShare,
    add_counts,
    merge_samples,
    merge_stats,
)
from pressrun.security import ServiceSecurity

log = logging.getLogger("pressrun.origin")

#: transfer durations (s) for the histogram: a 256 KiB web-seed piece on loopback to a
#: 100 MB issue over a slow link
DURATION_BUCKETS_S = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)


class IssueCatalog:
    """The issues on disk: every directory in CONTENT whose name is a valid issue id.

    ``pressrun publish`` builds a bundle in a hidden folder (``.<id>.publishing-*``,
    not a valid id) and renames it into place, so a valid folder is a whole bundle.
    A rename into or out of CONTENT changes its mtime: the list is rescanned then.
    """

    def __init__(self, content_dir: Path) -> None:
        self.content_dir = content_dir
        self._stamp: int | None = None
        self.issues: list[str] = []

    def refresh(self) -> list[str]:
        """Rescan when the content directory changed; return the sorted issue ids."""
        try:
            stamp = os.stat(self.content_dir).st_mtime_ns
        except OSError:
            self._stamp, self.issues = None, []
            return self.issues
        if stamp != self._stamp:
            found: list[str] = []
            with contextlib.suppress(OSError), os.scandir(self.content_dir) as entries:
                for entry in entries:
                    if valid_name(entry.name) and entry.is_dir():
                        found.append(entry.name)
            self._stamp, self.issues = stamp, sorted(found)
        return self.issues


class SystemCpu:
    """System-wide CPU use between two samples, in percent of all CPUs.

    psutil's own ``cpu_percent(interval=None)`` keeps one baseline per process, so two
    origins in one process (the demo, the tests) would each reset the other's; this
    keeps its own. Busy time is psutil's: everything but idle and iowait.
    """

    def __init__(self) -> None:
        self._last = psutil.cpu_times()

    @staticmethod
    def _busy_total(times: Any) -> tuple[float, float]:
        # Linux counts guest time inside user/nice too (psutil subtracts it likewise).
        guest = float(getattr(times, "guest", 0.0)) + float(getattr(times, "guest_nice", 0.0))
        total = float(sum(times)) - guest
        idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
        return total - idle, total

    def sample(self) -> float:
        """CPU use since the previous sample (or since construction), 0..100."""
        now = psutil.cpu_times()
        busy0, total0 = self._busy_total(self._last)
        busy1, total1 = self._busy_total(now)
        self._last = now
        if total1 <= total0:
            return 0.0
        return round(min(100.0, max(0.0, 100.0 * (busy1 - busy0) / (total1 - total0))), 1)


class OriginMetrics:
    """Prometheus metrics of one origin, in its own registry (not the global one)."""

    def __init__(self, config: OriginConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.bytes_sent = Counter(
            "pressrun_origin_sent_bytes",
            "Body bytes handed to the network, by issue",
            ["issue"],
            registry=r,
        )
        self.requests = Counter(
            "pressrun_origin_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "code"],
            registry=r,
        )
        self.active = Gauge(
            "pressrun_origin_active_transfers",
            "Transfers moving body bytes now (stalled ones not counted)",
            registry=r,
        )
        self.stalled = Gauge(
            "pressrun_origin_stalled_transfers",
            "Transfers open whose client took no byte for --stalled-after-s",
            registry=r,
        )
        self.timed_out = Counter(
            "pressrun_origin_transfers_timed_out",
            "Transfers cut because the client took no chunk for --send-timeout-s",
            registry=r,
        )
        self.duration = Histogram(
            "pressrun_origin_transfer_duration_seconds",
            "Time from the first to the last byte of a transfer (complete or not)",
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.out_rate = Gauge(
            "pressrun_origin_out_bytes_per_second",
            "Outbound body bytes per second over the last stats interval",
            registry=r,
        )
        capacity = Gauge(
            "pressrun_origin_capacity_bytes_per_second",
            "Link capacity the operator configured (--capacity-mbps)",
            registry=r,
        )
        capacity.set(config.capacity_bytes_per_s)
        cap = Gauge(
            "pressrun_origin_egress_cap_bytes_per_second",
            "Egress cap enforced on all transfers (0: no cap)",
            registry=r,
        )
        cap.set(config.egress_cap_bytes_per_s or 0.0)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def families(self) -> list[dict[str, Any]]:
        """Every sample of the registry as plain data (a worker's snapshot)."""
        return [
            {
                "name": metric.name,
                "type": metric.type,
                "documentation": metric.documentation,
                "samples": [[s.name, dict(s.labels), s.value] for s in metric.samples],
            }
            for metric in self.registry.collect()
        ]


class _Families:
    """A collector that yields families given as plain data (the merged workers')."""

    def __init__(self, families: list[dict[str, Any]]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        out = []
        for family in self._families:
            metric = Metric(family["name"], family["documentation"], family["type"])
            for name, labels, value in family["samples"]:
                metric.add_sample(name, labels, value)
            out.append(metric)
        return out


def families_exposition(families: list[dict[str, Any]]) -> bytes:
    """Prometheus text of families given as plain data."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


@functools.lru_cache(maxsize=1024)
def _http_date(mtime: float) -> str:
    """``Last-Modified`` of a file's mtime (cached: the same files, request after request)."""
    return formatdate(mtime, usegmt=True)


#: transfer outcomes logged at DEBUG (the others at INFO)
_QUIET_OUTCOMES = frozenset({"complete", "client gone"})

#: SO_LINGER on, 0 s: close() resets the connection and drops the unsent bytes
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class _FileShrank(Exception):
    """The file ended before the bytes the answer promised."""


class OriginService:
    """One origin: the aiohttp app, the traffic meter, the egress bucket, the timer."""

    def __init__(
        self, config: OriginConfig, *, name: str, share: WorkerShare | None = None
    ) -> None:
        self.config = config
        self.name = name
        self.content_dir = Path(config.content_dir)
        self._content_root = str(self.content_dir)
        self.catalog = IssueCatalog(self.content_dir)
        self.metrics = OriginMetrics(config)
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self.share = share
        meter_start = now
        if share is not None:
            # every worker's intervals start on multiples of the interval of the
            # shared monotonic clock (a replacement's first one is short), so the
            # windows of different workers line up
            meter_start = now - now % config.stats_interval_s
        self.meter = TrafficMeter(
            interval_s=config.stats_interval_s,
            cache_window_s=config.cache_window_s,
            now=meter_start,
            stalled_after_s=config.stalled_after_s,
        )
        cap = config.egress_cap_bytes_per_s
        self.bucket: TokenBucket | SharedBucket | None = None
        if share is not None and share.bucket is not None:
            self.bucket = share.bucket  # one cap for the whole origin
        elif cap is not None:
            self.bucket = TokenBucket(cap, config.cap_burst_bytes, now=now)
        # totals of a worker that ran in this slot before (killed, replaced)
        self._carried: dict[str, Any] = (share.carried() if share is not None else None) or {}
        self._carried_families = merge_samples(
            [self._carried.get("metrics", [])], counters_only=True
        )
        self._dirty = False
        self._publisher: asyncio.TimerHandle | None = None
        self._request_counters: dict[tuple[str, int], Any] = {}
        self.cpu_percent = 0.0
        self.ram_percent = 0.0
        self._cpu = SystemCpu()
        self._sample_host()
        self.catalog.refresh()
        self._timer: asyncio.TimerHandle | None = None
        self.transfers_cut = 0

    # -- lifecycle

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(middlewares=[self._count_requests])
        app.router.add_get("/content/{issue_id}/{name}", self.content, name="content")
        # Anything else under /content/ (extra segments, empty names): a clear 404.
        app.router.add_get("/content/{tail:.*}", self.content_not_found, name="content-other")
        app.router.add_get("/stats", self.stats, name="stats")
        app.router.add_get("/metrics", self.metrics_handler, name="metrics")
        app.router.add_get("/healthz", self.healthz, name="healthz")
        enable_cors(app)  # the web reader reads bundles cross-origin (docs/reader.md)
        return app

    def start_timer(self) -> None:
        """Arm the stats timer at the meter's next deadline."""
        self._timer = self._loop.call_at(self.meter.next_deadline(), self._on_timer)

    def stop_timer(self) -> None:
        """Disarm the stats timer (and the snapshot publisher of a worker)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._publisher is not None:
            self._publisher.cancel()
            self._publisher = None

    def _on_timer(self) -> None:
        report = self.meter.handle_timer(now=self._loop.time())
        self.metrics.out_rate.set(report.out_bytes_per_s)
        self._count_active()
        self._sample_host()
        self.catalog.refresh()
        self.start_timer()
        if self.share is not None:
            self.publish()

    def start_publisher(self) -> None:
        """A worker: publish the snapshot now and whenever the figures moved, at most
        every `PUBLISH_EVERY_S` (the other workers' ``/stats`` read it)."""
        share = self.share
        assert share is not None
        if share.parent_pid and os.getppid() != share.parent_pid:
            # the supervisor is gone (killed): stop as on SIGTERM, do not serve on alone
            log.warning("origin %s worker %d: supervisor gone, stopping", self.name, share.slot)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._dirty or self._publisher is None:
            self.publish()
        self._publisher = self._loop.call_later(PUBLISH_EVERY_S, self.start_publisher)

    def publish(self) -> None:
        """Write this worker's snapshot for the others (an error is logged, not raised:
        the figures are late, the transfers go on)."""
        assert self.share is not None
        self._dirty = False
        try:
            self.share.publish(self.snapshot())
        except OSError as err:
            log.warning("worker %d could not publish its figures: %s", self.share.slot, err)

    def _count_active(self) -> None:
        # set when read (/metrics, the timer), not per transfer: two gauge writes a
        # transfer were measurable per-request work
        self.metrics.active.set(self.meter.active_transfers)
        self.metrics.stalled.set(self.meter.stalled_transfers)

    def _sample_host(self) -> None:
        # System-wide figures, like the paper's agent: the machine is what runs out.
        self.cpu_percent = self._cpu.sample()
        self.ram_percent = float(psutil.virtual_memory().percent)

    # -- middleware

    @web.middleware
    async def _count_requests(self, request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.name or "other"
        endpoint = "content" if route.startswith("content") else route
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            self._count_request(endpoint, exc.status)
            raise
        self._count_request(endpoint, response.status)
        return response

    def _count_request(self, endpoint: str, status: int) -> None:
        # the labelled child looked up once per (endpoint, code): a few of each
        key = (endpoint, status)
        child = self._request_counters.get(key)
        if child is None:
            child = self._request_counters[key] = self.metrics.requests.labels(
                endpoint, str(status)
            )
        child.inc()

    # -- content

    @staticmethod
    def _not_found(text: str) -> web.Response:
        return web.Response(status=404, text=text + "\n")

    async def content_not_found(self, request: web.Request) -> web.Response:
        """404 for a /content/ path that is not ``/content/<issue_id>/<name>``."""
        return self._not_found(
            f"not found: {request.path!r} is not /content/<issue_id>/<file name>"
        )

    async def _open(self, issue: str, name: str) -> tuple[IO[bytes], os.stat_result] | web.Response:
        """The open file and its stat, or the 404 to answer.

        Out of file descriptors (EMFILE/ENFILE) is "busy", not "missing": the request
        waits for a descriptor instead of being refused (a refused web seed is dropped
        for good by libtorrent).
        """
        if not valid_name(issue):
            return self._not_found(f"unknown issue {issue!r}: not a valid issue id")
        if not valid_name(name):
            return self._not_found(f"issue {issue!r} has no file {name!r}: not a valid name")
        waited_s = 0.0
        while True:
            try:
                # Open first, ask why only when it fails (one stat less per request);
                # unbuffered: sendfile(2) reads the file, Python never does.
                fobj = open(  # noqa: SIM115 - closed by the caller
                    f"{self._content_root}/{issue}/{name}", "rb", buffering=0
                )
                break
            except OSError as err:
                if err.errno not in (errno.EMFILE, errno.ENFILE):
                    if not (self.content_dir / issue).is_dir():
                        return self._not_found(
                            f"unknown issue {issue!r}: this origin does not hold it"
                        )
                    return self._not_found(f"issue {issue!r} has no file {name!r}")
                if waited_s == 0.0:
                    log.warning("out of file descriptors: %s/%s waits for one", issue, name)
                await asyncio.sleep(0.05)
                waited_s += 0.05
        st = os.fstat(fobj.fileno())
        if not stat.S_ISREG(st.st_mode):
            fobj.close()
            return self._not_found(f"issue {issue!r} has no file {name!r}")
        return fobj, st

    async def content(self, request: web.Request) -> web.StreamResponse:
        """``GET/HEAD /content/<issue_id>/<name>``."""
        issue = request.match_info["issue_id"]
        name = request.match_info["name"]
        opened = await self._open(issue, name)
        if isinstance(opened, web.Response):
            return opened
        fobj, st = opened
        try:
            return await self._answer(request, issue, name, fobj, st)
        finally:
            fobj.close()

    async def _answer(
        self,
        request: web.Request,
        issue: str,
        name: str,
        fobj: IO[bytes],
        st: os.stat_result,
    ) -> web.StreamResponse:
        size = st.st_size
        etag = make_etag(size, st.st_mtime_ns, st.st_ino)
        last_modified = _http_date(st.st_mtime)
        headers = {
            hdrs.ETAG: etag,
            hdrs.LAST_MODIFIED: last_modified,
            hdrs.ACCEPT_RANGES: "bytes",
        }
        if none_match(request.headers.get(hdrs.IF_NONE_MATCH), etag):
            return web.Response(status=304, headers=headers)
        span: ByteSpan | None = None
        range_header = request.headers.get(hdrs.RANGE)
        if range_header is not None and if_range_holds(
            request.headers.get(hdrs.IF_RANGE), etag, last_modified
        ):
            try:
                span = parse_range(range_header, size)
            except RangeNotSatisfiable as err:
                headers[hdrs.CONTENT_RANGE] = f"bytes */{size}"
                return web.Response(status=416, text=f"{err}\n", headers=headers)
        headers[hdrs.CONTENT_TYPE] = content_type_for(name)
        if span is None:
            status, offset, count = 200, 0, size
        else:
            status, offset, count = 206, span.first, span.length
            headers[hdrs.CONTENT_RANGE] = span.content_range()
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = count
        if request.method == hdrs.METH_HEAD or count == 0:
            await response.prepare(request)
            await response.write_eof()
            return response
        await self._transfer(request, response, issue, name, fobj, offset, count, size)
        return response

    async def _transfer(
        self,
        request: web.Request,
        response: web.StreamResponse,
        issue: str,
        name: str,
        fobj: IO[bytes],
        offset: int,
        count: int,
        size: int,
    ) -> None:
        """Send `count` bytes from `offset`, counted as they go; log one line at the end."""
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
        try:
            await response.prepare(request)
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
            position, end = offset, offset + count
            bucket = self.bucket
            cfg = self.config
            max_chunk = cfg.sendfile_chunk_bytes if bucket is None else cfg.cap_chunk_bytes
            chunk = max_chunk
            counter = self.metrics.bytes_sent.labels(issue)
            # A small object (a manifest, a cover) takes its bytes from the bucket but
            # does not wait behind the bulk transfers' debt: they pay it back (issue 33).
            small = is_small_object(name, size)
            while position < end:
                n = min(chunk, end - position)
                if bucket is not None:
                    wait_s = bucket.take(n, now=loop.time())
                    if wait_s > 0 and not small:
                        await asyncio.sleep(wait_s)
                        self.meter.transfer_paced(tid, now=loop.time())
                if transport.is_closing():
                    raise ConnectionResetError("client closed the connection")
                began = loop.time()
                # a client that takes nothing of a chunk for send_timeout_s stopped
                # reading: TimeoutError
                if out_fd >= 0 and transport.get_write_buffer_size() == 0:
                    sent = await self._sendfile_direct(
                        transport, out_fd, fobj.fileno(), position, n, began + cfg.send_timeout_s
                    )
                else:
                    sent = await self._sendfile_asyncio(transport, fobj, position, n)
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
        transport: asyncio.BaseTransport,
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
        transport: asyncio.BaseTransport,
        out_fd: int,
        in_fd: int,
        offset: int,
        count: int,
        deadline: float,
    ) -> int:
        """The rest of `_sendfile_direct` once the socket is full: one writer
        registration and one timeout for the whole rest of the chunk (not one per
        wait: a slow client or 1,000 connections make many waits)."""
        loop: Any = self._loop  # the selector loop's private writer slot, as loop.sendfile
        waiter: list[asyncio.Future[None]] = [loop.create_future()]

        def wake() -> None:
            if not waiter[0].done():
                waiter[0].set_result(None)

        loop._add_writer(out_fd, wake)
        sent = 0
        try:
            async with asyncio.timeout_at(deadline):
                while sent < count:
                    await waiter[0]
                    # the wait may end because the client left: the transport then
                    # closes (its descriptor too, or soon), so ask before each call
                    if transport.is_closing():
                        raise ConnectionResetError("client closed the connection")
                    waiter[0] = loop.create_future()
                    try:
                        n = os.sendfile(out_fd, in_fd, offset + sent, count - sent)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if n == 0:
                        return sent  # the file ended
                    # a short send filled the buffer: wait for room (level-triggered:
                    # the selector wakes us at once if there is some left)
                    sent += n
        finally:
            loop._remove_writer(out_fd)
        return sent

    async def _sendfile_asyncio(
        self, transport: asyncio.Transport, fobj: IO[bytes], offset: int, count: int
    ) -> int:
        """``loop.sendfile`` (TLS: read and write; a transport with bytes buffered)."""
        try:
            async with asyncio.timeout(self.config.send_timeout_s):
                return await self._loop.sendfile(transport, fobj, offset, count)
        except RuntimeError:
            # loop.sendfile's "Transport is closing": the client left.
            if transport.is_closing():
                raise ConnectionResetError("client closed the connection") from None
            raise

    # -- status agent, metrics, health

    def snapshot(self) -> dict[str, Any]:
        """This worker's figures as plain data (totals include its slot's carried ones)."""
        meter = self.meter
        report = meter.last_report
        carried = self._carried
        self._count_active()
        return {
            "slot": self.share.slot if self.share is not None else 0,
            "pid": os.getpid(),
            "out_bytes_per_s": report.out_bytes_per_s,
            "transfers_seen": report.transfers_seen,
            "mean_transfer_bytes_per_s": report.mean_transfer_bytes_per_s or 0.0,
            "mean_by_issue": report.mean_transfer_bytes_per_s_by_issue,
            "transfers_seen_by_issue": report.transfers_seen_by_issue,
            "recent": [[r.start, r.end, r.out_bytes] for r in meter.recent_reports],
            "active": meter.active_transfers,
            "stalled": meter.stalled_transfers,
            "cached_issues": meter.cached_issues(now=self._loop.time()),
            "active_by_issue": meter.active_transfers_by_issue(),
            "transfers_by_issue": add_counts(
                dict(carried.get("transfers_by_issue", {})), meter.transfers_by_issue
            ),
            "bytes_by_issue": add_counts(
                dict(carried.get("bytes_by_issue", {})), meter.bytes_sent_by_issue
            ),
            "bytes_sent_total": carried.get("bytes_sent_total", 0) + meter.bytes_sent_total,
            "transfers_total": carried.get("transfers_total", 0) + meter.transfers_total,
            "transfers_cut": carried.get("transfers_cut", 0) + self.transfers_cut,
            "metrics": merge_samples([self.metrics.families(), self._carried_families]),
        }

    def _merged(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """This worker's live snapshot (published) and the other workers' last ones."""
        assert self.share is not None
        own = self.snapshot()
        with contextlib.suppress(OSError):
            self.share.publish(own)
        others = [d for slot, d in self.share.read_all().items() if slot != self.share.slot]
        return own, others

    def stats_document(self) -> dict[str, Any]:
        """The ``/stats`` JSON of docs/protocols.md (of the whole origin: with workers,
        this worker's live figures merged with the others' last published ones)."""
        report = self.meter.last_report
        issues = self.catalog.refresh()
        on_disk = set(issues)
        now = self._loop.time()
        if self.share is not None:
            own, others = self._merged()
            merged = merge_stats(own, others, interval_s=self.config.stats_interval_s)
            return {
                "name": self.name,
                "cpu_percent": self.cpu_percent,
                "ram_percent": self.ram_percent,
                "out_bytes_per_s": merged["out_bytes_per_s"],
                "interval_s": round(report.interval_s, 6),
                "capacity_bytes_per_s": self.config.capacity_bytes_per_s,
                "egress_cap_bytes_per_s": self.config.egress_cap_bytes_per_s,
                "active_transfers": merged["active_transfers"],
                "stalled_transfers": merged["stalled_transfers"],
                "issues": issues,
                "cached_issues": [i for i in merged["cached_issues"] if i in on_disk],
                "mean_transfer_bytes_per_s": merged["mean_transfer_bytes_per_s"],
                "mean_transfer_bytes_per_s_by_issue": {
                    issue: rate
                    for issue, rate in merged["mean_transfer_bytes_per_s_by_issue"].items()
                    if issue in on_disk
                },
                "bytes_sent_total": merged["bytes_sent_total"],
                "transfers_total": merged["transfers_total"],
                "active_transfers_by_issue": merged["active_transfers_by_issue"],
                "transfers_total_by_issue": merged["transfers_total_by_issue"],
                "bytes_sent_by_issue": merged["bytes_sent_by_issue"],
                "recent_intervals": merged["recent_intervals"],
                "workers": merged["workers"],
            }
        return {
            "name": self.name,
            "cpu_percent": self.cpu_percent,
            "ram_percent": self.ram_percent,
            "out_bytes_per_s": report.out_bytes_per_s,
            "interval_s": round(report.interval_s, 6),
            "capacity_bytes_per_s": self.config.capacity_bytes_per_s,
            "egress_cap_bytes_per_s": self.config.egress_cap_bytes_per_s,
            "active_transfers": self.meter.active_transfers,
            "stalled_transfers": self.meter.stalled_transfers,
            "issues": issues,
            "cached_issues": [i for i in self.meter.cached_issues(now=now) if i in on_disk],
            "mean_transfer_bytes_per_s": report.mean_transfer_bytes_per_s,
            "mean_transfer_bytes_per_s_by_issue": {
                issue: rate
                for issue, rate in report.mean_transfer_bytes_per_s_by_issue.items()
                if issue in on_disk
            },
            "bytes_sent_total": self.meter.bytes_sent_total,
            "transfers_total": self.meter.transfers_total,
            "active_transfers_by_issue": self.meter.active_transfers_by_issue(),
            "transfers_total_by_issue": dict(sorted(self.meter.transfers_by_issue.items())),
            "bytes_sent_by_issue": dict(sorted(self.meter.bytes_sent_by_issue.items())),
            "recent_intervals": [
                {"start_s": r.start, "end_s": r.end, "bytes": r.out_bytes}
                for r in self.meter.recent_reports
            ],
        }

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /stats``."""
        return web.json_response(self.stats_document())

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``GET /metrics`` (with workers: every worker's samples added up)."""
        self._count_active()
        if self.share is not None:
            own, others = self._merged()
            body = families_exposition(
                merge_samples([own["metrics"], *(d.get("metrics", []) for d in others)])
            )
        else:
            body = self.metrics.exposition()
        return web.Response(body=body, headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return web.Response(text="ok")


@dataclass(slots=True)
class RunningOrigin:
    """A started origin: where it listens and how to stop it."""

    service: OriginService
    runner: web.AppRunner
    host: str
    port: int
    scheme: str = "http"

    @property
    def name(self) -> str:
        """The origin's name in ``/stats``."""
        return self.service.name

    @property
    def url(self) -> str:
        """``http://host:port`` (``https`` with TLS), no trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening, let transfers finish for the grace period, cut the rest."""
        service = self.service
        active = service.meter.active_transfers
        await self.runner.cleanup()
        service.stop_timer()
        share = service.share
        if share is not None:
            service.publish()  # the final totals, for the supervisor's stop line
        log.info(
            "origin %s stopped: %d transfer(s) running at stop, %d cut after %.1f s grace; "
            "%d bytes in %d transfers since start%s",
            self.name,
            active,
            service.transfers_cut,
            service.config.shutdown_grace_s,
            service.meter.bytes_sent_total,
            service.meter.transfers_total,
            "" if share is None else f" (worker {share.slot + 1} of {share.workers})",
        )


async def start_origin(
    config: OriginConfig,
    *,
    sock: socket.socket | None = None,
    share: WorkerShare | None = None,
) -> RunningOrigin:
    """Start an origin on the running loop; return once it accepts connections.

    `sock` and `share`: one worker of a multi-process origin
    (:mod:`pressrun.origin.workers`): it serves on the listening socket `sock` the
    supervisor bound, and `share` is its place among the workers (one cap, figures of
    the whole origin).
    """
    content_dir = Path(config.content_dir)
    if not content_dir.is_dir():
        raise FileNotFoundError(
            f"content directory {content_dir} does not exist: publish an issue into it "
            "first (pressrun publish) or pass the right --content"
        )
    # The name may depend on the port, which is known only after binding.
    service = OriginService(config, name=config.name or "origin", share=share)
    runner = web.AppRunner(
        service.make_app(),
        access_log=None,  # one INFO line per transfer instead (see _transfer)
        shutdown_timeout=config.shutdown_grace_s,
    )
    security = ServiceSecurity(config.tls_cert, config.tls_key)
    await runner.setup()
    site: web.BaseSite
    if sock is not None:
        site = web.SockSite(runner, sock, ssl_context=security.server_ssl_context())
    else:
        site = web.TCPSite(
            runner, config.host, config.port, ssl_context=security.server_ssl_context()
        )
    await site.start()
    port = config.port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            port = int(address[1])
            break
    if config.name is None:
        service.name = f"origin-{port}"
    service.start_timer()
    running = RunningOrigin(
        service=service, runner=runner, host=config.host, port=port, scheme=security.scheme
    )
    if share is not None:
        service.start_publisher()
        log.debug("origin %s worker %d (pid %d) serving", running.name, share.slot, os.getpid())
        return running
    cap = config.egress_cap_mbps
    log.info(
        "origin %s serving %s on %s (capacity %g Mbit/s, egress cap %s, %d issues)",
        running.name,
        content_dir,
        running.url,
        config.capacity_mbps,
        f"{cap:g} Mbit/s" if cap is not None else "none",
        len(service.catalog.issues),
    )
    return running
