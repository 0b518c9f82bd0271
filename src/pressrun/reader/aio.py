"""``pressrun serve reader``: serves the web reader's files and its ``config.json``.

Endpoints (docs/reader.md):

- ``GET /``: the app (``web/index.html``); ``GET /<file>``: the app's other files
  (ES modules, styles, icons, ``app.webmanifest``);
- ``GET /sw.js``: the service worker, with ``__BUILD__`` replaced by a hash of every
  file the app is made of, so a new version of any file is a new service worker and
  the phone updates its offline copy;
- ``GET /vendor/...``: the npm packages the app imports (libsodium.js, pdf.js and
  pdf.js's fonts and CMaps), from ``node_modules`` (``make setup`` installs them from
  ``package-lock.json``); only the files listed in `VENDOR_FILES` / `VENDOR_DIRS`;
- ``GET /config.json``: where the balancer is, the trusted publisher keys and the
  download settings (the client's mobile profile);
- ``GET /healthz``: ``ok``.

Every answer has ``Cache-Control: no-cache``: the service worker keeps the offline
copy; the browser's HTTP cache only revalidates (ETag / Last-Modified).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from pressrun.reader.config import ReaderConfig

log = logging.getLogger("pressrun.reader")

#: URL path under /vendor/ -> file under node_modules
VENDOR_FILES = {
    "libsodium-wrappers.mjs": "libsodium-wrappers/dist/modules-esm/libsodium-wrappers.mjs",
    "libsodium.mjs": "libsodium/dist/modules-esm/libsodium.mjs",
    "pdfjs/pdf.min.mjs": "pdfjs-dist/build/pdf.min.mjs",
    "pdfjs/pdf.worker.min.mjs": "pdfjs-dist/build/pdf.worker.min.mjs",
}
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

    def app_config(self) -> dict[str, Any]:
        """The ``config.json`` document the app reads at start (docs/reader.md)."""
        d = self.config.download
        return {
            "build": self.build,
            "balancer_url": self.config.balancer_url.rstrip("/"),
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
            },
        }

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/config.json", self.config_json)
        app.router.add_get("/sw.js", self.service_worker)
        app.router.add_get("/vendor/{rel:.+}", self.vendor)
        app.router.add_get("/{rel:.*}", self.web_file)
        return app

    @staticmethod
    def _file(path: Path) -> web.FileResponse:
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    @staticmethod
    def _not_found(path: str) -> web.Response:
        return web.Response(status=404, text=f"not found: {path!r} is not a file of the reader\n")

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return web.Response(text="ok\n")

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
            return self._file(modules / VENDOR_FILES[rel])
        for prefix, folder in VENDOR_DIRS.items():
            if rel.startswith(prefix + "/"):
                path = _inside(modules / folder, rel[len(prefix) + 1 :])
                if path is not None:
                    return self._file(path)
        return self._not_found(request.path)

    async def web_file(self, request: web.Request) -> web.StreamResponse:
        """``GET /<rel>``: a file of the app; ``/`` is ``index.html``."""
        rel = request.match_info["rel"] or "index.html"
        path = _inside(self.config.web_dir, rel)
        if path is None:
            return self._not_found(request.path)
        return self._file(path)


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
