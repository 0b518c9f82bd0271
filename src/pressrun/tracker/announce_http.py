"""The tracker's BitTorrent endpoints: ``GET /announce`` (BEP 3 with BEP 23 compact
lists) and ``GET /scrape`` (BEP 48), plus ``GET /metrics`` (Prometheus) and
``GET /healthz``.

Announce and scrape errors are bencoded ``failure reason`` answers with HTTP 200, never
a 500: BitTorrent clients read the body of a 200 and ignore the rest. With an
allowlist, an announce for any other info-hash is refused and creates nothing. The
service these handlers feed (core, store, metrics, the announce itself) is
`pressrun.tracker.aio.TrackerService`; ``TrackerService.make_app`` routes to them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import generate_latest

from pressrun.tracker.codec import (
    QueryError,
    encode_announce_reply,
    encode_failure,
    encode_scrape_reply,
    parse_announce_query,
    parse_scrape_query,
)
from pressrun.tracker.events import AnnounceEvent, SwarmStats

if TYPE_CHECKING:
    from pressrun.tracker.aio import TrackerService

log = logging.getLogger(__name__)

BENCODE_TYPE = "text/plain"


class AnnounceRoutes:
    """The handlers of ``/announce``, ``/scrape``, ``/metrics`` and ``/healthz`` for one
    ``TrackerService``."""

    def __init__(self, service: TrackerService) -> None:
        self.service = service
        self.core = service.core
        self.metrics = service.metrics

    @staticmethod
    def _raw_query(request: web.Request) -> str:
        # The request-target as sent: aiohttp's request.query would decode %XX as
        # UTF-8 and corrupt binary info_hash/peer_id values.
        _, _, query = request.raw_path.partition("?")
        return query

    def _failure(self, code: str, reason: str) -> web.Response:
        self.metrics.failures.labels(code).inc()
        return web.Response(body=encode_failure(reason), content_type=BENCODE_TYPE)

    async def announce(self, request: web.Request) -> web.Response:
        """``GET /announce``: BEP 3 with BEP 23 compact lists."""
        try:
            req = parse_announce_query(self._raw_query(request))
        except QueryError as err:
            return self._failure(err.code.value, err.reason)
        refused = self.core.refusal(req.info_hash)
        if refused == "unpublished":
            return self._failure(
                refused, "this tracker serves only published issues; this info_hash is not one"
            )
        if refused is not None:
            return self._failure(refused, "the tracker holds as many swarms as it may; retry later")
        remote = request.remote
        if not remote:
            return self._failure("no_address", "the tracker cannot tell your address")
        try:
            handled = await self.service._handle_announce(req, remote)
        except Exception:
            log.exception("announce failed")
            return self._failure("internal", "tracker error; try again later")
        self.metrics.announces.labels(req.event.value or "none").inc()
        if req.event is AnnounceEvent.STOPPED and handled.record.leave_rule is not None:
            self.metrics.left.labels(handled.record.leave_rule.value).inc()
        return web.Response(body=encode_announce_reply(handled.reply), content_type=BENCODE_TYPE)

    async def scrape(self, request: web.Request) -> web.Response:
        """``GET /scrape`` (BEP 48): the named swarms, or every swarm."""
        try:
            hashes = parse_scrape_query(self._raw_query(request))
        except QueryError as err:
            return self._failure(err.code.value, err.reason)
        try:
            hashes = tuple(h for h in hashes if self.core.is_allowed(h))
            if self.service.store.shared:
                if hashes:
                    for info_hash in hashes:
                        await self.service._load_swarm(info_hash)
                else:
                    await self.service._reload_all()
            stats = [self._counts_stats(h) for h in (hashes or tuple(self.core.info_hashes()))]
        except Exception:
            log.exception("scrape failed")
            return self._failure("internal", "tracker error; try again later")
        self.metrics.scrapes.inc()
        body = encode_scrape_reply(stats, min_interval_s=self.core.config.min_interval_s)
        return web.Response(body=body, content_type=BENCODE_TYPE)

    def _counts_stats(self, info_hash: bytes) -> SwarmStats:
        seeds, leechers, completed = self.core.counts(info_hash)
        return SwarmStats(info_hash, seeds, leechers, completed, 0, 0, {}, 0, False)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: ok."""
        return web.Response(text="ok")
