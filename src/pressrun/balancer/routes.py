"""The balancer's HTTP routes (aiohttp; JSON bodies, docs/protocols.md), the handlers
`pressrun.balancer.aio.BalancerService` serves (``BalancerService.make_app`` is the
route table):

- ``GET /v1/issues/{issue_id}/directive``: the request parsed, the core asked, the
  directive or refusal encoded; an issue's first directive awaits its swarm a moment
  (``FIRST_SWARM_WAIT_S``); swarm directives name the tracker instances in turn;
- ``GET /issues/{issue_id}``: the 302 to the picked origin's copy of the file;
- ``GET /v1/issues/{issue_id}/prefetch``: the paced prefetch grant
  (`pressrun.balancer.prefetch`), not a reader, so no demand and no pick;
- ``GET /v1/origins``, ``GET /v1/algorithms``, ``GET /metrics``, ``GET /healthz``.

The module docstring of `pressrun.balancer.aio` lists every endpoint's answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import generate_latest

from pressrun.balancer.algorithms import algorithm_class, algorithm_names
from pressrun.balancer.codec import (
    ISSUE_ID_RE,
    RequestFormatError,
    encode_directive,
    encode_refusal,
    encode_status,
    json_score,
    parse_client_hint,
    parse_failed,
    parse_peer,
    parse_request_class,
    parse_reservation,
)
from pressrun.balancer.core import OriginState
from pressrun.balancer.events import Directive, DirectiveRequested, NoDirective, Refusal
from pressrun.balancer.manifests import ManifestUnavailable
from pressrun.balancer.prefetch import client_id, prefetch_answer
from pressrun.tracker.websocket_urls import webtorrent_tracker_url

if TYPE_CHECKING:
    from pressrun.balancer.aio import BalancerService

#: how long an issue's first directive waits for its swarm to be known (seconds)
FIRST_SWARM_WAIT_S = 1.0
#: one line per directive decision and per status received, at DEBUG (docs/balancer.md)
decisions_log = logging.getLogger("pressrun.balancer.decisions")

JSON_TYPE = "application/json"
_NO_FAILED: frozenset[str] = frozenset()


class BalancerRoutes:
    """The handlers of the balancer's HTTP endpoints for one ``BalancerService``."""

    def __init__(self, service: BalancerService) -> None:
        self.service = service
        #: swarm directives answered, to name the tracker instances in turn
        self._swarm_directives = 0

    @staticmethod
    def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
        return web.Response(
            status=status,
            body=json.dumps({"error": message}).encode(),
            content_type=JSON_TYPE,
            headers=headers,
        )

    def _refusal(self, refusal: NoDirective) -> web.Response:
        if refusal.reason is Refusal.UNKNOWN_ISSUE:
            return self._error(404, refusal.message)
        retry = str(max(1, math.ceil(refusal.retry_after_s)))
        if refusal.reservation is not None:  # a reserved start: the token in the body
            return web.json_response(
                encode_refusal(refusal), status=503, headers={"Retry-After": retry}
            )
        return self._error(503, refusal.message, {"Retry-After": retry})

    def _decide(self, request: web.Request) -> Directive | web.Response:
        """Parse a directive request and ask the core; a `web.Response` on errors."""
        issue_id = request.match_info["issue_id"]
        if ISSUE_ID_RE.match(issue_id) is None:
            return self._error(
                400, f"invalid issue id {issue_id[:140]!r}: letters, digits, '.', '_', '-'"
            )
        failed = _NO_FAILED
        client = None
        request_class = None
        webrtc = False
        reservation = None
        if request.query_string:
            try:
                failed = parse_failed(request.query.getall("failed", []))
                client = parse_client_hint(request.query)
                request_class = parse_request_class(request.query)
                webrtc = parse_peer(request.query)
                reservation = parse_reservation(request.query)
            except RequestFormatError as err:
                return self._error(400, str(err))
        now = self.service._now()
        result = self.service.core.handle_directive_requested(
            DirectiveRequested(
                issue_id, failed, client, request.remote, request_class, webrtc, reservation
            ),
            now=now,
        )
        if decisions_log.isEnabledFor(logging.DEBUG):
            self._log_decision(issue_id, result, now)
        if isinstance(result, NoDirective):
            return self._refusal(result)
        if self.service.config.tracker_url is not None and issue_id not in self.service.swarms:
            self.service.manifests.learn_swarm(issue_id, [o.url for o in result.origins])
        if result.swarm is not None and self.service.config.extra_tracker_urls:
            result = self._next_tracker(result)
        self.service.directives_by_mode[result.mode.value] += 1
        return result

    def _log_decision(self, issue_id: str, result: Directive | NoDirective, now: float) -> None:
        """The decision log: the origin picked (or the refusal) and, for every origin
        holding the issue, what the algorithm saw of it after the pick."""
        algorithm = self.service.core.algorithm
        seen = "; ".join(
            f"{name} " + " ".join(f"{k}={v:.3g}" for k, v in view.items())
            for name in algorithm.holders(issue_id)
            for view in (algorithm.explain(name, issue_id),)
        )
        if isinstance(result, Directive):
            picked = f"{result.origins[0].name} mode={result.mode.value}"
        else:
            picked = "REFUSED"
        decisions_log.debug("t=%.3f issue=%s pick=%s | %s", now, issue_id, picked, seen)

    def _next_tracker(self, directive: Directive) -> Directive:
        """The directive naming the next tracker instance in turn."""
        assert directive.swarm is not None and self.service.config.tracker_url is not None
        trackers = (self.service.config.tracker_url, *self.service.config.extra_tracker_urls)
        url = trackers[self._swarm_directives % len(trackers)]
        self._swarm_directives += 1
        swarm = replace(directive.swarm, tracker_url=url)
        if swarm.webtorrent_url is not None:
            # a browser's directive: the WebSocket route of the same instance
            swarm = replace(swarm, webtorrent_url=webtorrent_tracker_url(url) or url)
        return replace(directive, swarm=swarm)

    async def directive(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/{issue_id}/directive[?failed=a,b]``."""
        await self._learn_swarm_first(request.match_info["issue_id"])
        result = self._decide(request)
        if isinstance(result, web.Response):
            return result
        return web.Response(
            body=json.dumps(encode_directive(result)).encode(), content_type=JSON_TYPE
        )

    async def _learn_swarm_first(self, issue_id: str) -> None:
        """Before an issue's first directive, its swarm (read from its manifest) is
        awaited, at most FIRST_SWARM_WAIT_S: learnt in the background after the
        answer, the first arrivals of a flash crowd were answered ``origin`` whatever
        the demand (bench/reader_swarm.py, swarm threshold 1: the first of two desktop
        peers arriving together was sent to the origins, the second to the swarm).
        Only for an issue an origin in rotation holds; the fetch is one per issue."""
        if self.service.config.tracker_url is None or issue_id in self.service.swarms:
            return
        if ISSUE_ID_RE.match(issue_id) is None:
            return
        urls = [
            rec.spec.url
            for rec in self.service.core.origins.values()
            if rec.state is OriginState.UP
            and rec.status is not None
            and issue_id in rec.status.issues
        ]
        if not urls:
            return
        try:
            async with asyncio.timeout(FIRST_SWARM_WAIT_S):
                await asyncio.shield(self.service.manifests.file_name(issue_id, urls))
        except (TimeoutError, ManifestUnavailable):
            pass  # answered as before; the fetch goes on (or is retried) in the background

    async def prefetch_grant(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/{issue_id}/prefetch``: not a reader, so no demand, no pick."""
        issue_id = request.match_info["issue_id"]
        if ISSUE_ID_RE.match(issue_id) is None:
            return self._error(400, f"invalid issue id {issue_id[:140]!r}")
        try:
            who = client_id(request.remote, request.query.get("client"))
        except ValueError as err:
            return self._error(400, str(err))
        up = [
            (name, rec.spec.url, rec.status)
            for name, rec in self.service.core.origins.items()
            if rec.state is OriginState.UP and rec.status is not None
        ]
        status, doc, headers = prefetch_answer(
            self.service.prefetch, up, issue_id, who, now=self.service._now()
        )
        ws = (
            None
            if self.service.config.tracker_url is None
            else webtorrent_tracker_url(self.service.config.tracker_url)
        )
        origins = doc.get("origins")
        if ws is not None and status in (200, 429) and isinstance(origins, list) and origins:
            # the prefetchers' swarm for browsers (issue 35): the torrent (checked against
            # the manifest's info-hash by the reader) and the WebSocket tracker, so a
            # reader trades the ciphertext with the desktop prefetchers, granted or not
            doc["swarm"] = {
                "torrent_url": f"{origins[0]['url']}/content/{issue_id}/{issue_id}.torrent",
                "webtorrent_url": ws,
            }
        return web.json_response(doc, status=status, headers=headers)

    async def redirect(self, request: web.Request) -> web.Response:
        """``GET /issues/{issue_id}``: 302 to the picked origin's copy of the file."""
        result = self._decide(request)
        if isinstance(result, web.Response):
            return result
        issue_id = result.issue_id
        try:
            file_name = await self.service.manifests.file_name(
                issue_id, [o.url for o in result.origins]
            )
        except ManifestUnavailable as err:
            return self._error(502, str(err))
        location = f"{result.origins[0].url}/content/{issue_id}/{file_name}"
        return web.Response(status=302, headers={"Location": location})

    async def origins(self, request: web.Request) -> web.Response:
        """``GET /v1/origins[?issue=ID]``: every origin as the balancer sees it."""
        issue = request.query.get("issue")
        if issue is not None and ISSUE_ID_RE.match(issue) is None:
            return self._error(400, f"invalid issue id {issue[:140]!r}")
        return web.json_response(self.origins_view(issue))

    def origins_view(self, issue: str | None) -> dict[str, Any]:
        """The ``/v1/origins`` document."""
        core = self.service.core
        algorithm = core.algorithm
        now = self.service._now()
        listed = []
        for name, rec in core.origins.items():
            up = rec.state is OriginState.UP
            listed.append(
                {
                    "name": name,
                    "url": rec.spec.url,
                    "weight": rec.spec.weight,
                    "state": rec.state.value,
                    "down_reason": None if up else rec.down_reason,
                    "last_status_age_s": None
                    if rec.last_status_at is None
                    else round(now - rec.last_status_at, 3),
                    "status": None if rec.status is None else encode_status(rec.status),
                    "score": json_score(algorithm.score(name, issue)) if up else None,
                    "picks": rec.picks,
                }
            )
        return {
            "algorithm": algorithm.name,
            "issue_id": issue,
            "poll_interval_s": core.config.poll_interval_s,
            "directives_answered": core.directives_answered,
            "origins": listed,
        }

    async def algorithms(self, request: web.Request) -> web.Response:
        """``GET /v1/algorithms``: what can be chosen with ``--algorithm``."""
        return web.json_response(
            {
                "current": self.service.core.algorithm.name,
                "algorithms": [
                    {"name": name, "summary": algorithm_class(name).summary}
                    for name in algorithm_names()
                ],
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        return web.Response(
            body=generate_latest(self.service.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: ok."""
        return web.Response(text="ok")
