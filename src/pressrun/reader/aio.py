"""``pressrun serve reader``: serves the web reader's files and its ``config.json``.

Endpoints (docs/reader.md):

- ``GET /``: the app (``web/index.html``); ``GET /<file>``: the app's other files
  (ES modules, styles, icons, ``app.webmanifest``);
- ``GET /sw.js``: the service worker, with ``__BUILD__`` replaced by a hash of every
  file the app is made of, so a new version of any file is a new service worker and
  the phone updates its offline copy;
- ``GET /vendor/...``: the npm packages the app imports (libsodium.js, pdf.js and
  pdf.js's fonts and CMaps, webtorrent's browser build), from ``node_modules``
  (``make setup`` installs them from ``package-lock.json``); only the files listed
  in `VENDOR_FILES` / `VENDOR_DIRS`;
- ``GET /config.json``: where the balancer is, the trusted publisher keys and the
  download settings (the client's mobile profile);
- ``POST /csp-report``: where the browser reports a Content-Security-Policy
  violation (``report-uri``; the Reporting API's shape too); each is logged as one WARNING line,
  bounded (`CSP_REPORT_BYTES` a report, `CSP_REPORTS_PER_MINUTE` logged);
- ``PUT /v1/link/<mailbox>``, ``GET /v1/link/<mailbox>``: the one-time mailboxes
  that link a second device to a subscription (`pressrun.reader.link`: a sealed box,
  taken once, forgotten after 10 minutes; the service never sees the key);
- ``GET /healthz``: ``ok``.

Every answer has ``Cache-Control: no-cache``: the service worker keeps the offline
copy; the browser's HTTP cache only revalidates (ETag / Last-Modified). Text files go
out compressed when the browser accepts it (`COMPRESSED_SUFFIXES`); ranges and
conditional requests get them as they are. Every answer
also carries the security headers (`security_headers`): a Content-Security-Policy
that allows only the app's own files (no inline script but the import map, by hash;
WebAssembly for libsodium and pdf.js; no framing), ``X-Content-Type-Options:
nosniff``, ``Referrer-Policy: no-referrer`` (issue 25, finding 8; docs/reader.md).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from pressrun.reader.config import ReaderConfig
from pressrun.reader.link import MAX_BOX_BYTES, LinkError, LinkMailboxes
from pressrun.security import BodyTooLarge, read_request_limited

log = logging.getLogger("pressrun.reader")
#: the link mailboxes' answers are never kept by a cache on the way
NO_STORE = {"Cache-Control": "no-store"}

#: URL path under /vendor/ -> file under node_modules
VENDOR_FILES = {
    "libsodium-wrappers.mjs": "libsodium-wrappers/dist/modules-esm/libsodium-wrappers.mjs",
    "libsodium.mjs": "libsodium/dist/modules-esm/libsodium.mjs",
    "pdfjs/pdf.min.mjs": "pdfjs-dist/build/pdf.min.mjs",
    "pdfjs/pdf.worker.min.mjs": "pdfjs-dist/build/pdf.worker.min.mjs",
    # npm webtorrent's browser build: one self-contained ES module (the swarm peer)
    "webtorrent.min.js": "webtorrent/dist/webtorrent.min.js",
}
#: the files sent compressed when the browser accepts it: the app's modules and the
#: vendored libraries are text, about a quarter of their size in gzip, and a phone on a
#: slow link waits for every module of the app's start before the library shows
COMPRESSED_SUFFIXES = frozenset(
    {".js", ".mjs", ".css", ".html", ".json", ".webmanifest", ".svg", ".map", ".txt"}
)
#: a request with one of these headers gets the file uncompressed (`ReaderService._file`)
UNCOMPRESSED_WHEN = (
    "Range",
    "If-None-Match",
    "If-Modified-Since",
    "If-Match",
    "If-Unmodified-Since",
    "If-Range",
)
#: URL folder under /vendor/ -> folder under node_modules (pdf.js loads these lazily)
VENDOR_DIRS = {
    "pdfjs/standard_fonts": "pdfjs-dist/standard_fonts",
    "pdfjs/cmaps": "pdfjs-dist/cmaps",
    "pdfjs/wasm": "pdfjs-dist/wasm",
    "pdfjs/iccs": "pdfjs-dist/iccs",
}
#: the placeholder in sw.js replaced by the build hash
BUILD_PLACEHOLDER = "__BUILD__"

for _ext, _type in (
    (".mjs", "text/javascript"),
    (".js", "text/javascript"),
    (".webmanifest", "application/manifest+json"),
    (".bcmap", "application/octet-stream"),
    (".pfb", "application/octet-stream"),
    (".wasm", "application/wasm"),
):
    mimetypes.add_type(_type, _ext)


#: where the browser sends CSP violation reports (a route of this service)
CSP_REPORT_PATH = "/csp-report"
#: the largest report read (a real one is under 2 KB); a larger body is refused (413)
CSP_REPORT_BYTES = 16 * 1024
#: reports logged per minute at most (a burst of this many, then this rate); the rest
#: are counted and summed up in the next line logged: a page in a loop, or a stranger
#: posting reports, cannot fill the log
CSP_REPORTS_PER_MINUTE = 30
#: each field of a report is logged cut to this many characters
CSP_FIELD_CHARS = 200
#: inline ``<script>`` elements of index.html (the import map): allowed by their hash
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\ssrc=)[^>]*>(.*?)</script>", re.DOTALL | re.I)


def inline_script_hashes(index_html: str) -> list[str]:
    """The CSP source of each inline ``<script>`` of the page: ``'sha256-<base64>'``.

    The app's one inline script is its import map, which a browser only takes inline;
    it is allowed by its hash, computed from the file served, so an edit to it needs
    no edit here, and any other inline script is refused."""
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(index_html)
    ]


def content_security_policy(script_hashes: list[str]) -> str:
    """The reader's Content-Security-Policy (docs/reader.md, "Security headers").

    - scripts: the app's own files, its import map by hash, and WebAssembly
      compilation ('wasm-unsafe-eval': libsodium.js and pdf.js's decoders are wasm;
      it allows no JavaScript eval);
    - connect-src any http(s) URL: the balancer, the origins it names and the
      subscription service an issue's manifest names are only known at run time;
      and any ws(s) URL: the tracker's /webtorrent a swarm directive names (WebRTC
      itself is not governed by CSP);
    - images: the app's, and the covers it draws (blob:) and pdf.js's (data:);
    - no plugins, no <base>, no forms, never in a frame (frame-ancestors 'none');
    - violations reported to this service with ``report-uri``. Not ``report-to``:
      where both are given, Chromium uses only the Reporting API, which batches
      reports and delivers them up to a minute later (the endpoint takes that format
      too, `csp_reports`).
    """
    script = " ".join(["'self'", "'wasm-unsafe-eval'", *script_hashes])
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src {script}",
            "worker-src 'self'",
            "style-src 'self'",
            "img-src 'self' blob: data:",
            "font-src 'self' data:",
            "connect-src 'self' http: https: ws: wss:",
            "manifest-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
            f"report-uri {CSP_REPORT_PATH}",
        ]
    )


def security_headers(script_hashes: list[str]) -> dict[str, str]:
    """The headers every answer of the reader carries."""
    return {
        "Content-Security-Policy": content_security_policy(script_hashes),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",  # frame-ancestors for browsers without CSP 2
        "Cross-Origin-Opener-Policy": "same-origin",
    }


class ReportLimiter:
    """At most `per_minute` reports logged a minute, with a burst of as many: a token
    bucket driven with ``now`` (monotonic seconds)."""

    def __init__(self, per_minute: int, *, now: float) -> None:
        self.rate_per_s = per_minute / 60.0
        self.burst = float(per_minute)
        self._tokens = self.burst
        self._last = now
        #: reports not logged since the last one that was
        self.dropped = 0

    def allow(self, *, now: float) -> bool:
        """True when this report may be logged now (else it is counted in `dropped`)."""
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._last) * self.rate_per_s)
        self._last = max(self._last, now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.dropped += 1
        return False


def _field(value: object) -> str:
    """A report field as logged: text, cut to `CSP_FIELD_CHARS`, quoted by repr so a
    stranger's newlines cannot forge log lines."""
    return repr(str(value)[:CSP_FIELD_CHARS]) if value is not None else "-"


def csp_reports(body: bytes) -> list[dict[str, Any]]:
    """The violations in a report body: ``{"csp-report": {...}}`` (report-uri) or a
    Reporting API list of ``{"type": "csp-violation", "body": {...}}`` (report-to),
    as dicts with the report-uri field names. ValueError if it is neither."""
    doc = json.loads(body)
    if isinstance(doc, dict) and isinstance(doc.get("csp-report"), dict):
        return [doc["csp-report"]]
    if isinstance(doc, list):
        out = []
        for item in doc[:10]:
            if not isinstance(item, dict) or not isinstance(item.get("body"), dict):
                continue
            b = item["body"]
            out.append(
                {
                    "document-uri": b.get("documentURL"),
                    "violated-directive": b.get("effectiveDirective"),
                    "blocked-uri": b.get("blockedURL"),
                    "source-file": b.get("sourceFile"),
                    "line-number": b.get("lineNumber"),
                    "disposition": b.get("disposition"),
                }
            )
        return out
    raise ValueError("neither a report-uri nor a Reporting API document")


class AssetsMissing(Exception):
    """The app's files or its npm packages are not where the config says."""


def check_assets(config: ReaderConfig) -> None:
    """Raise `AssetsMissing` (one line, with the fix) unless every served file exists."""
    if not (config.web_dir / "index.html").is_file():
        raise AssetsMissing(f"the reader's app is missing: no {config.web_dir / 'index.html'}")
    missing = [rel for rel in VENDOR_FILES.values() if not (config.modules_dir / rel).is_file()]
    if missing:
        raise AssetsMissing(
            f"the reader's npm packages are not installed ({config.modules_dir / missing[0]} "
            "is missing): run `make setup` (npm ci in src/pressrun/reader)"
        )


def build_hash(config: ReaderConfig) -> str:
    """A short hash of every app file and of the npm lockfile (the app's version)."""
    h = hashlib.sha256()
    for path in sorted(p for p in config.web_dir.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(config.web_dir)).encode())
        h.update(path.read_bytes())
    lock = config.modules_dir.parent / "package-lock.json"
    if lock.is_file():
        h.update(lock.read_bytes())
    return h.hexdigest()[:16]


def _inside(root: Path, rel: str) -> Path | None:
    """``root / rel`` if it is a file inside ``root`` (no ``..``, no symlink out)."""
    if not rel or rel.startswith("/") or "\\" in rel:
        return None
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        return None
    return path


class ReaderService:
    """The reader's aiohttp app: static files, the service worker, config.json."""

    def __init__(self, config: ReaderConfig) -> None:
        check_assets(config)
        self.config = config
        self.build = build_hash(config)
        sw = (config.web_dir / "sw.js").read_text(encoding="utf-8")
        self._sw = sw.replace(BUILD_PLACEHOLDER, self.build).encode("utf-8")
        index = (config.web_dir / "index.html").read_text(encoding="utf-8")
        self.headers = security_headers(inline_script_hashes(index))
        self._limiter: ReportLimiter | None = None
        #: CSP violation reports received (logged or not)
        self.csp_reports_received = 0
        #: the device-linking mailboxes (in this process: see docs/reader.md)
        self.links = LinkMailboxes()

    def app_config(self) -> dict[str, Any]:
        """The ``config.json`` document the app reads at start (docs/reader.md)."""
        d = self.config.download
        return {
            "build": self.build,
            "balancer_url": self.config.balancer_urls[0],
            "balancer_urls": list(self.config.balancer_urls),  # tried in order (issue 30)
            "publisher_keys": list(self.config.publisher_keys),
            "trust_on_first_use": self.config.trust_on_first_use,
            "download": {
                "profile": d.profile,
                "concurrency": d.concurrency,
                "max_sections": d.max_sections,
                "section_bytes": d.section_bytes,
                "max_section_bytes": d.max_section_bytes,
                "stall_timeout_s": d.stall_timeout_s,
                "balancer_timeout_s": d.balancer_timeout_s,
                "max_attempts_without_progress": d.max_attempts_without_progress,
                "failed_ttl_s": d.failed_ttl_s,
                "retry_backoff_s": d.retry_backoff_s,
                "retry_backoff_max_s": d.retry_backoff_max_s,
                "retry_jitter": d.retry_jitter,
            },
            "swarm": self.config.swarm.app_config(),
        }

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(middlewares=[self._add_headers])
        app.router.add_post(CSP_REPORT_PATH, self.csp_report)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/config.json", self.config_json)
        app.router.add_put("/v1/link/{name}", self.link_put)
        app.router.add_get("/v1/link/{name}", self.link_take)
        app.router.add_get("/sw.js", self.service_worker)
        app.router.add_get("/vendor/{rel:.+}", self.vendor)
        app.router.add_get("/{rel:.*}", self.web_file)
        return app

    @web.middleware
    async def _add_headers(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every answer (404s and errors too) with the security headers."""
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(self.headers)
            raise
        response.headers.update(self.headers)
        return response

    async def csp_report(self, request: web.Request) -> web.Response:
        """``POST /csp-report``: log a CSP violation the browser reports (bounded)."""
        try:
            body = await read_request_limited(request, CSP_REPORT_BYTES, "a CSP report")
        except BodyTooLarge:
            return web.Response(status=413, text=f"a report is at most {CSP_REPORT_BYTES} bytes\n")
        try:
            reports = csp_reports(body)
        except ValueError:
            return web.Response(status=400, text="not a CSP violation report\n")
        loop = asyncio.get_running_loop()
        if self._limiter is None:
            self._limiter = ReportLimiter(CSP_REPORTS_PER_MINUTE, now=loop.time())
        for report in reports:
            self.csp_reports_received += 1
            if not self._limiter.allow(now=loop.time()):
                continue
            dropped, self._limiter.dropped = self._limiter.dropped, 0
            log.warning(
                "CSP violation: directive=%s blocked=%s document=%s source=%s:%s from %s%s",
                _field(report.get("violated-directive") or report.get("effective-directive")),
                _field(report.get("blocked-uri")),
                _field(report.get("document-uri")),
                _field(report.get("source-file")),
                _field(report.get("line-number")),
                request.remote,
                f" ({dropped} earlier reports not logged: over {CSP_REPORTS_PER_MINUTE}/min)"
                if dropped
                else "",
            )
        return web.Response(status=204)

    async def link_put(self, request: web.Request) -> web.Response:
        """``PUT /v1/link/<mailbox>``: keep a sealed box for the device being linked."""
        try:
            body = await read_request_limited(request, MAX_BOX_BYTES, "a sealed box")
            expires_at = self.links.put(
                request.match_info["name"], body, now=asyncio.get_running_loop().time()
            )
        except BodyTooLarge:
            return web.Response(status=413, text=f"a sealed box is at most {MAX_BOX_BYTES} bytes\n")
        except LinkError as err:
            return web.Response(status=400, text=f"{err}\n")
        ttl_s = expires_at - asyncio.get_running_loop().time()
        return web.json_response({"expires_in_s": round(ttl_s)}, status=201, headers=NO_STORE)

    async def link_take(self, request: web.Request) -> web.Response:
        """``GET /v1/link/<mailbox>``: the sealed box, once (404 when there is none)."""
        try:
            sealed = self.links.take(
                request.match_info["name"], now=asyncio.get_running_loop().time()
            )
        except LinkError as err:
            return web.Response(status=400, text=f"{err}\n")
        if sealed is None:
            return web.Response(
                status=404,
                text="no such box: taken already, expired, or never made\n",
                headers=NO_STORE,
            )
        return web.Response(body=sealed, content_type="application/octet-stream", headers=NO_STORE)

    @staticmethod
    def _file(path: Path, request: web.Request) -> web.FileResponse:
        """A file of the app or of an npm package; text compressed (gzip or deflate, as
        the browser accepts) when the whole file is sent: not for a range, a HEAD or a
        conditional request (`UNCOMPRESSED_WHEN`), whose answer may be a 304, a 206 or
        a 412, which aiohttp would follow with a compressed empty body: bytes after a
        304 that broke the next answer on the connection (the suite run at c9387fa:
        the app never started again after a reload)."""
        response = web.FileResponse(
            path, headers={"Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
        )
        if (
            path.suffix in COMPRESSED_SUFFIXES
            and request.method == "GET"
            and not any(name in request.headers for name in UNCOMPRESSED_WHEN)
        ):
            response.enable_compression()
        return response

    @staticmethod
    def _not_found(path: str) -> web.Response:
        return web.Response(status=404, text=f"not found: {path!r} is not a file of the reader\n")

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return web.Response(text="ok\n")

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics`` (Prometheus text; the deployment scrapes every service):
        the CSP violation reports received."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily

        reports = CounterMetricFamily(
            "pressrun_reader_csp_reports", "CSP violation reports received"
        )
        reports.add_metric([], self.csp_reports_received)

        class _Collector:
            def collect(self) -> list[CounterMetricFamily]:
                return [reports]

        registry = CollectorRegistry()
        registry.register(_Collector())
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def config_json(self, request: web.Request) -> web.Response:
        """``GET /config.json``."""
        return web.Response(
            text=json.dumps(self.app_config(), indent=2) + "\n",
            content_type="application/json",
            headers={"Cache-Control": "no-cache"},
        )

    async def service_worker(self, request: web.Request) -> web.Response:
        """``GET /sw.js`` with the build hash filled in."""
        return web.Response(
            body=self._sw,
            content_type="text/javascript",
            headers={"Cache-Control": "no-cache", "Service-Worker-Allowed": "/"},
        )

    async def vendor(self, request: web.Request) -> web.StreamResponse:
        """``GET /vendor/<rel>``: an allowed file of an npm package."""
        rel = request.match_info["rel"]
        modules = self.config.modules_dir
        if rel in VENDOR_FILES:
            return self._file(modules / VENDOR_FILES[rel], request)
        for prefix, folder in VENDOR_DIRS.items():
            if rel.startswith(prefix + "/"):
                path = _inside(modules / folder, rel[len(prefix) + 1 :])
                if path is not None:
                    return self._file(path, request)
        return self._not_found(request.path)

    async def web_file(self, request: web.Request) -> web.StreamResponse:
        """``GET /<rel>``: a file of the app; ``/`` is ``index.html``."""
        rel = request.match_info["rel"] or "index.html"
        path = _inside(self.config.web_dir, rel)
        if path is None:
            return self._not_found(request.path)
        return self._file(path, request)


@dataclass
class RunningReader:
    """A started reader service: where it listens and how to stop it."""

    service: ReaderService
    runner: web.AppRunner
    host: str
    port: int
    scheme: str = "http"

    @property
    def url(self) -> str:
        """``http://host:port`` (``https`` with TLS), no trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening."""
        await self.runner.cleanup()


async def start_reader(config: ReaderConfig) -> RunningReader:
    """Start the reader service on the running loop; `AssetsMissing` if not installed."""
    service = ReaderService(config)
    runner = web.AppRunner(service.make_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner, config.host, config.port, ssl_context=config.tls.server_ssl_context()
    )
    await site.start()
    port: int = runner.addresses[0][1]  # the port bound (config.port may be 0)
    running = RunningReader(
        service=service, runner=runner, host=config.host, port=port, scheme=config.tls.scheme
    )
    log.info(
        "reader serving the web app (build %s) on %s (balancer %s)",
        service.build,
        running.url,
        config.balancer_url,
    )
    return running
