"""A small real HTTP origin for balancer tests: ``/stats`` from a dict the test edits,
and ``/content/<issue>/manifest.json``. Used until the tests switch to
``pressrun.origin``'s real server, and by ``bench/balancer.py``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def stats_doc(name: str, issues: list[str], **fields: Any) -> dict[str, Any]:
    """A valid /stats document (docs/protocols.md), overridable field by field."""
    doc: dict[str, Any] = {
        "name": name,
        "cpu_percent": 10.0,
        "ram_percent": 20.0,
        "out_bytes_per_s": 0.0,
        "interval_s": 1.0,
        "capacity_bytes_per_s": 125_000_000.0,
        "egress_cap_bytes_per_s": None,
        "active_transfers": 0,
        "issues": issues,
        "cached_issues": [],
        "mean_transfer_bytes_per_s": None,
        "mean_transfer_bytes_per_s_by_issue": {},
        "bytes_sent_total": 0,
        "transfers_total": 0,
    }
    doc.update(fields)
    return doc


@dataclass
class FakeOrigin:
    """A running fake origin; edit `stats` to change what /stats answers."""

    name: str
    stats: dict[str, Any]
    file_names: dict[str, str] = field(default_factory=dict)
    stats_status: int = 200
    manifest_fetches: int = 0
    port: int = 0
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/stats", self._stats)
        app.router.add_get("/content/{issue}/manifest.json", self._manifest)
        return app

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(
            status=self.stats_status, body=json.dumps(self.stats), content_type="application/json"
        )

    async def _manifest(self, request: web.Request) -> web.Response:
        issue = request.match_info["issue"]
        if issue not in self.file_names:
            raise web.HTTPNotFound()
        self.manifest_fetches += 1
        doc = {
            "manifest": {"format": 1, "issue_id": issue, "file_name": self.file_names[issue]},
            "signature": "00" * 64,
        }
        return web.json_response(doc)

    async def start(self, port: int | None = None) -> None:
        """Listen on 127.0.0.1 (port 0 the first time, the same port on a restart)."""
        self.runner = web.AppRunner(self.make_app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port if port is None else port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def start_fake_origin(
    name: str, issues: list[str], file_names: dict[str, str] | None = None, **fields: Any
) -> FakeOrigin:
    """A fake origin listening on an ephemeral port of 127.0.0.1."""
    origin = FakeOrigin(name, stats_doc(name, issues, **fields), dict(file_names or {}))
    await origin.start()
    return origin
