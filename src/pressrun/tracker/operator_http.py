"""The tracker's JSON API under ``/v1``: ``GET /v1/swarms[?peers=0]``,
``GET /v1/swarms/<info_hash hex>``, ``GET /v1/swarms/<info_hash hex>/needed``,
``GET /v1/allowed`` and ``PUT /v1/allowed/<info_hash hex>`` (the allowlist).

``/v1/swarms``, one swarm's peers and ``/v1/allowed`` are operator endpoints
(``OPERATOR_ROUTES``): they list peers or change state, so they need the operator
token (pressrun.security); ``/needed`` is public. With a shared store (Redis) every
answer reads what changed first, and a store that does not answer gives a 503 with
``Retry-After``. The service these read (core, store) is
`pressrun.tracker.aio.TrackerService`; ``TrackerService.make_app`` routes to them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pressrun.tracker.events import PeerRecord, SwarmStats

if TYPE_CHECKING:
    from pressrun.tracker.aio import TrackerService

log = logging.getLogger(__name__)

#: routes that list peers or change state: the operator token guards them
OPERATOR_ROUTES = frozenset(
    {"/v1/swarms", "/v1/swarms/{info_hash}", "/v1/allowed", "/v1/allowed/{info_hash}"}
)


def _peer_json(record: PeerRecord) -> dict[str, Any]:
    return {
        "peer_id": record.peer_id.hex(),
        "ip": record.ip,
        "port": record.port,
        "family": record.family.value,
        "state": "left" if not record.active else ("seed" if record.left == 0 else "leecher"),
        "left": record.left,
        "uploaded_bytes": record.uploaded_total,
        "downloaded_bytes": record.downloaded_total,
        "ratio": (
            round(record.uploaded_total / record.downloaded_total, 4)
            if record.downloaded_total
            else None
        ),
        "completed": record.completed_count,
        "leave_rule": record.leave_rule.value if record.leave_rule else None,
        "left_fairly": bool(record.leave_rule and record.leave_rule.fair and not record.active),
    }


def swarm_json(stats: SwarmStats, records: Sequence[PeerRecord] | None) -> dict[str, Any]:
    """One swarm as ``/v1/swarms`` shows it (peers only when ``records`` is given)."""
    body: dict[str, Any] = {
        "info_hash": stats.info_hash.hex(),
        "seeds": stats.seeds,
        "leechers": stats.leechers,
        "completed": stats.completed,
        "uploaded_bytes": stats.uploaded_bytes,
        "downloaded_bytes": stats.downloaded_bytes,
        "left_by_rule": stats.left_by_rule,
        "left_fairly": stats.left_fairly,
        "needs_seeds": stats.needs_seeds,
    }
    if records is not None:
        body["peers"] = [
            _peer_json(r) for r in sorted(records, key=lambda r: (r.peer_id, r.family.value))
        ]
    return body


def _store_unavailable(err: Exception) -> web.HTTPServiceUnavailable:
    log.error("the shared store did not answer: %s", err)
    return web.HTTPServiceUnavailable(
        text=json.dumps({"error": f"the tracker's shared store did not answer ({err}); retry"}),
        content_type="application/json",
        headers={"Retry-After": "5"},
    )


def _info_hash_of(request: web.Request) -> bytes:
    """The ``<info_hash>`` of a route's path, or a 400 saying what it must be."""
    try:
        info_hash = bytes.fromhex(request.match_info["info_hash"])
        if len(info_hash) != 20:
            raise ValueError
    except ValueError:
        raise web.HTTPBadRequest(
            text='{"error": "info_hash must be 40 hex digits"}',
            content_type="application/json",
        ) from None
    return info_hash


class OperatorRoutes:
    """The handlers of the ``/v1`` JSON API for one ``TrackerService``."""

    def __init__(self, service: TrackerService) -> None:
        self.service = service
        self.core = service.core

    async def swarms(self, request: web.Request) -> web.Response:
        """``GET /v1/swarms[?peers=0]``: every swarm, with its peers unless peers=0."""
        if self.service.store.shared:
            try:
                await self.service._reload_all()
            except Exception as err:
                raise _store_unavailable(err) from err
        with_peers = request.query.get("peers", "1") != "0"
        body = []
        for info_hash in self.core.info_hashes():
            stats = self.core.stats(info_hash)
            assert stats is not None
            body.append(swarm_json(stats, self.core.records(info_hash) if with_peers else None))
        return web.json_response({"swarms": body})

    async def _one(self, request: web.Request) -> SwarmStats:
        info_hash = _info_hash_of(request)
        if self.service.store.shared:
            try:
                await self.service._load_swarm(info_hash)
            except Exception as err:
                raise _store_unavailable(err) from err
        stats = self.core.stats(info_hash)
        if stats is None:
            raise web.HTTPNotFound(
                text='{"error": "the tracker has seen no announce for this info_hash"}',
                content_type="application/json",
            )
        return stats

    async def swarm(self, request: web.Request) -> web.Response:
        """``GET /v1/swarms/<hex>``: one swarm with its peers."""
        stats = await self._one(request)
        return web.json_response(swarm_json(stats, self.core.records(stats.info_hash)))

    async def needed(self, request: web.Request) -> web.Response:
        """``GET /v1/swarms/<hex>/needed``: whether seeds are still needed."""
        stats = await self._one(request)
        return web.json_response(
            {
                "info_hash": stats.info_hash.hex(),
                "needs_seeds": stats.needs_seeds,
                "seeds": stats.seeds,
                "leechers": stats.leechers,
            }
        )

    async def allowed(self, request: web.Request) -> web.Response:
        """``GET /v1/allowed`` (operator): the allowlist, or ``null`` when open."""
        allowlist = self.core.allowlist
        listed = None if allowlist is None else sorted(h.hex() for h in allowlist)
        return web.json_response({"allowed": listed})

    async def allow(self, request: web.Request) -> web.Response:
        """``PUT /v1/allowed/<hex>`` (operator): a publisher announces a new issue."""
        info_hash = _info_hash_of(request)
        await self.service.store.add_allowed(info_hash)  # kept first: a restart keeps it
        added = self.core.allow([info_hash])
        log.info("allowlist: %s added by the operator API", info_hash.hex())
        return web.json_response({"info_hash": info_hash.hex(), "added": bool(added)})
