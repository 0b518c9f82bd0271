"""The origin's asyncio adapter: the aiohttp app, its handlers, one stats timer.

The body of a content answer goes out in :mod:`pressrun.origin.transfer`, the
``/stats`` figures are assembled in :mod:`pressrun.origin.status`, the Prometheus
registry is :mod:`pressrun.origin.metrics`'s.

Endpoints (docs/protocols.md, "Origin HTTP"; docs/origin.md):

- ``GET/HEAD /content/<issue_id>/<name>``: a bundle file, from ``CONTENT/<issue_id>/``.
  Both names must match `pressrun.origin.core.NAME_RE`, so no path can leave the
  content directory. Single ranges give 206, malformed or unsatisfiable ones 416,
  several ranges the whole file (200). Strong ETag, If-None-Match (304), If-Range.
  Without an egress cap the body goes out with sendfile(2) (the transfer module's own
  loop) in chunks of ``sendfile_chunk_bytes``; with a cap, in chunks of ``cap_chunk_bytes``
  paced by one `TokenBucket` shared by every transfer. A busy origin slows down: a
  valid request is never refused (libtorrent drops a web seed for good after one 503).
  ``GET``/``HEAD`` of this route is answered straight from aiohttp's server handler
  (`OriginService.fast_handler`), without the Application's router, middleware and
  signals; every other request goes through the app.
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
import errno
import logging
import os
import re
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST

from pressrun.cors import EXPOSED_HEADERS, enable_cors
from pressrun.origin.config import OriginConfig
from pressrun.origin.core import (
    ByteSpan,
    RangeNotSatisfiable,
    TokenBucket,
    TrafficMeter,
    if_range_holds,
    none_match,
    parse_range,
    valid_name,
)
from pressrun.origin.files import OpenFile, OpenFiles
from pressrun.origin.metrics import OriginMetrics, families_exposition
from pressrun.origin.shared import (
    PUBLISH_EVERY_S,
    SharedBucket,
    WorkerShare,
    merge_samples,
)
from pressrun.origin.status import IssueCatalog, StatusMixin, SystemCpu
from pressrun.origin.transfer import TransferMixin
from pressrun.security import ServiceSecurity

log = logging.getLogger("pressrun.origin")

#: a handler of aiohttp's low-level server (`web.Server.request_handler`)
RequestHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

#: the content route ``/content/{issue_id}/{name}`` as aiohttp's router matches it
#: (a dynamic segment is ``[^{}/]+`` of the request's ``rel_url.path_safe``)
_CONTENT_PATH = re.compile(r"/content/([^{}/]+)/([^{}/]+)")

#: aiohttp-cors's answer to a request with an ``Origin`` header (pressrun.cors: every
#: origin may read; these response headers exposed), for the fast path to add itself
_EXPOSE_HEADERS = ",".join(EXPOSED_HEADERS)

#: the runner's wait when there is no grace: aiohttp reads a shutdown timeout of 0 as
#: no bound at all
_NO_GRACE_S = 0.001


def runner_shutdown_timeout(grace_s: float) -> float:
    """aiohttp's ``shutdown_timeout`` that cuts a transfer ``grace_s`` after a stop.

    aiohttp's stop gives a connection with an answer running its ``shutdown_timeout``
    twice: once to finish, then again after failing the request's payload (which a
    sending handler does not read) before it cancels the handler; and it reads 0 as
    no bound. So half the grace, and a grace of 0 becomes a millisecond: with 0 passed
    as is, a stop waited for every running answer to end, for a client that stopped
    reading until ``send_timeout_s`` (60 s) cut it (the test stacks' 57-59 s
    teardowns, docs/origin.md).
    """
    return max(grace_s / 2, _NO_GRACE_S)


def _unquote_segment(value: str) -> str:
    """A path segment as the router hands it over: ``path_safe`` keeps ``%2F`` and
    ``%25`` encoded so they cannot split segments; a match decodes them."""
    if "%" not in value:
        return value
    return value.replace("%2F", "/").replace("%25", "%")


class OriginService(TransferMixin, StatusMixin):
    """One origin: the aiohttp app, the traffic meter, the egress bucket, the timer.

    The transfer loop is `TransferMixin`'s (:mod:`pressrun.origin.transfer`), the
    ``/stats`` figures `StatusMixin`'s (:mod:`pressrun.origin.status`).
    """

    def __init__(
        self, config: OriginConfig, *, name: str, share: WorkerShare | None = None
    ) -> None:
        self.config = config
        self.name = name
        self.content_dir = Path(config.content_dir)
        self.files = OpenFiles(str(self.content_dir))
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
        self._sent_counters: dict[str, Any] = {}
        self.cpu_percent = 0.0
        self.ram_percent = 0.0
        self._cpu = SystemCpu()
        self._sample_host()
        self.catalog.refresh()
        self._timer: asyncio.TimerHandle | None = None
        self.transfers_cut = 0
        #: the app's own request handler (router, middleware, signals), which
        #: `fast_handler` hands every request but the content route's GET/HEAD
        self.app_handler: RequestHandler | None = None

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

    def fast_handler(self, app_handler: RequestHandler) -> RequestHandler:
        """aiohttp's server handler: ``GET``/``HEAD /content/<issue_id>/<name>`` straight
        to `_content`, everything else to the app's own handler (`app_handler`).

        Measured: the Application's per-request work (the router's resolve and its
        match info, the middleware chain, the response-prepare signal that
        aiohttp-cors hooks) was a part of every range answer's user-space CPU. The
        fast path answers as the app did: the same route match, the request counted
        under ``content``, aiohttp-cors's two headers when the request has an
        ``Origin``. Other methods (405, the CORS preflight), other paths and the
        other routes go through the app unchanged.
        """
        content = self._content
        count = self._count_request

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            method = request.method
            # (an Expect header goes to the app, which answers it before the handler)
            if (method == hdrs.METH_GET or method == hdrs.METH_HEAD) and (
                hdrs.EXPECT not in request.headers
            ):
                match = _CONTENT_PATH.fullmatch(request.rel_url.path_safe)
                if match is not None:
                    response = await content(
                        request,
                        _unquote_segment(match[1]),
                        _unquote_segment(match[2]),
                        cors=True,
                    )
                    count("content", response.status)
                    return response
            return await app_handler(request)

        return handle

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
            # an idle worker publishes fresh samples (its last transfer's counts are
            # in them at once); a busy one at most every METRICS_EVERY_S
            idle = self.meter.active_transfers == 0
            self.share.publish(self.snapshot(fresh_metrics=idle))
        except OSError as err:
            log.warning("worker %d could not publish its figures: %s", self.share.slot, err)

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

    @staticmethod
    def _add_cors(request: web.BaseRequest, headers: Any) -> None:
        """aiohttp-cors's headers on an answer of the fast path (see `fast_handler`)."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None:
            headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = _EXPOSE_HEADERS
            headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin

    async def content_not_found(self, request: web.Request) -> web.Response:
        """404 for a /content/ path that is not ``/content/<issue_id>/<name>``."""
        return self._not_found(
            f"not found: {request.path!r} is not /content/<issue_id>/<file name>"
        )

    async def _open(self, issue: str, name: str) -> OpenFile | web.Response:
        """The file's current version, referenced (`OpenFiles`), or the 404 to answer.

        Out of file descriptors (EMFILE/ENFILE) is "busy", not "missing": the kept
        files no transfer reads are closed, and if that was not enough the request
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
                return self.files.take(issue, name)
            except OSError as err:
                if err.errno not in (errno.EMFILE, errno.ENFILE):
                    if not (self.content_dir / issue).is_dir():
                        return self._not_found(
                            f"unknown issue {issue!r}: this origin does not hold it"
                        )
                    return self._not_found(f"issue {issue!r} has no file {name!r}")
                if self.files.drop_unused():
                    continue
                if waited_s == 0.0:
                    log.warning("out of file descriptors: %s/%s waits for one", issue, name)
                await asyncio.sleep(0.05)
                waited_s += 0.05

    async def content(self, request: web.Request) -> web.StreamResponse:
        """``GET/HEAD /content/<issue_id>/<name>`` through the app (when the fast path
        is not installed: `fast_handler`)."""
        return await self._content(
            request, request.match_info["issue_id"], request.match_info["name"], cors=False
        )

    async def _content(
        self, request: web.BaseRequest, issue: str, name: str, *, cors: bool
    ) -> web.StreamResponse:
        """The answer for the file `name` of `issue`; `cors`: add aiohttp-cors's
        headers here (the fast path, which the app's CORS hook does not see)."""
        opened = await self._open(issue, name)
        if isinstance(opened, web.Response):
            if cors:
                self._add_cors(request, opened.headers)
            return opened
        try:
            return await self._answer(request, issue, name, opened, cors)
        finally:
            self.files.give_back(opened)

    async def _answer(
        self,
        request: web.BaseRequest,
        issue: str,
        name: str,
        opened: OpenFile,
        cors: bool,
    ) -> web.StreamResponse:
        size = opened.size
        etag = opened.etag
        last_modified = opened.last_modified
        headers = {
            hdrs.ETAG: etag,
            hdrs.LAST_MODIFIED: last_modified,
            hdrs.ACCEPT_RANGES: "bytes",
        }
        if cors:
            self._add_cors(request, headers)
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
        headers[hdrs.CONTENT_TYPE] = opened.content_type
        if span is None:
            status, offset, count = 200, 0, size
        else:
            status, offset, count = 206, span.first, span.length
            headers[hdrs.CONTENT_RANGE] = span.content_range()
        # the length as a header, not through the content_length setter (its checks
        # were per-request work); prepare() sends it as it is
        headers[hdrs.CONTENT_LENGTH] = str(count)
        response = web.StreamResponse(status=status, headers=headers)
        if request.method == hdrs.METH_HEAD or count == 0:
            await response.prepare(request)
            await response.write_eof()
            return response
        await self._transfer(request, response, issue, name, opened.fd, offset, count, size)
        return response

    # -- status agent, metrics, health

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
        service.files.close()
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
        shutdown_timeout=runner_shutdown_timeout(config.shutdown_grace_s),
    )
    security = ServiceSecurity(config.tls_cert, config.tls_key)
    await runner.setup()
    server = runner.server
    assert server is not None  # set up
    # the content route without the app's router, middleware and signals (fast_handler)
    service.app_handler = server.request_handler
    server.request_handler = service.fast_handler(server.request_handler)
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
