"""``pressrun serve multicast``: FLUTE carousels, the control channel, the control API.

- **Issues prepared at publish time** (`pressrun.multicast.prepare`): one pass of
  each of the newest ``prepare_issues`` issues of the content folder is encoded as
  soon as it is published (at the start, then every ``prepare_interval_s``), so a
  carousel start at peak demand costs no encoding.
- **Carousels.** ``POST /v1/carousels`` with an issue id takes the issue's prepared
  pass (or prepares it then, for an issue not prepared or other FEC settings), plans
  the channels (`pressrun.multicast.core.channel_cycles`) on the groups, ports and
  TSI the issue keeps across restarts (`pressrun.multicast.plans`) and hands the
  carousel to the send thread, which repeats it until ``DELETE``
  (`pressrun.multicast.carousels`).
- **Upkeep** (`pressrun.multicast.carousels`; every ``prepare_interval_s``, each step
  surviving any error): new issues prepared; a running carousel whose issue was
  republished is re-prepared and carries the new version on the same groups; every
  pass in use gets a fresh FDT every ``fdt_renew_s``
  (`pressrun.multicast.prepare.renew_fdt`).
- **The send thread** (`pressrun.multicast.send`) owns every running carousel's
  `CarouselSchedule`: it sleeps until the next packet is due (``time.perf_counter``),
  takes the due batches and hands each to the binding's `PacketBuffer.send`, which
  loops over blocking ``sendto`` with the GIL released (FIELD-NOTES: a thread keeps up
  with the line where an asyncio loop loses packets). Packets are sent already built:
  one pass of each carousel lives in memory (size x channels x (1 + overhead) bytes
  with RaptorQ).
- **The control channel** (`pressrun.multicast.announce`). Every
  ``announce_interval_s`` an `Announcement` of every running carousel, signed with the
  publisher's Ed25519 key, goes to the control group with a sequence number and an
  expiry ``announcement_ttl_s`` later, in as many datagrams (parts of one round) as
  keep each under ``ANNOUNCEMENT_PART_BYTES``.
- **HTTP.** ``/v1/carousels`` (GET, POST), ``/v1/carousels/<issue_id>`` (GET,
  DELETE), all needing ``Authorization: Bearer <token>`` (the shared guard of
  `pressrun.security.operator_middleware`: 401 with ``WWW-Authenticate: Bearer``);
  ``/metrics`` (Prometheus text, `pressrun.multicast.metrics`) and ``/healthz`` are
  open. This module holds the service (`MulticastSender`), its configuration and the
  HTTP API. docs/multicast.md lists it all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nacl.signing
from aiohttp import web
from prometheus_client import generate_latest

from pressrun.multicast.announce import Announcer
from pressrun.multicast.carousels import CarouselRegistry
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.events import Announcement, CarouselPlan
from pressrun.multicast.metrics import SenderMetrics
from pressrun.multicast.net import sender_socket
from pressrun.multicast.plans import MAX_TSI, ChannelPlanner
from pressrun.multicast.prepare import CarouselError, IssuePreparer
from pressrun.multicast.send import RunningCarousel, SendThread
from pressrun.security import ServiceSecurity, check_operator_token, operator_middleware

log = logging.getLogger("pressrun.multicast.sender")

#: the groups of the carousels' range unless configured
DEFAULT_GROUPS = 1024
#: the control API's routes: every one needs ``Authorization: Bearer <token>``
API_ROUTES = frozenset({"/v1/carousels", "/v1/carousels/{issue_id}"})


def wall_clock() -> float:
    """Unix time: announcements are judged by receivers on other machines' clocks."""
    return time.time()  # noqa: TID251 (expiry of announcements read by other hosts)


@dataclass(frozen=True)
class SenderServiceConfig:
    """Everything ``pressrun serve multicast`` is started with (docs/multicast.md)."""

    content_dir: Path
    control_group: tuple[str, int]
    signing_key: nacl.signing.SigningKey
    token: str
    interface: str = "127.0.0.1"
    host: str = "127.0.0.1"
    port: int = 0
    carousel: CarouselConfig = field(default_factory=CarouselConfig)
    group_base: str = "239.255.71.1"
    #: the carousels' groups are group_base .. group_base + group_count - 1 (None: 1024,
    #: or as many as there are up to 239.255.255.255)
    group_count: int | None = None
    channel_port_base: int = 0  # 0: ports derived from the issue id (plans.py)
    #: where each issue's groups, ports and TSI are kept across restarts (None: only
    #: in memory; without it they are still derived from the issue id)
    state_file: Path | None = None
    announce_interval_s: float = 0.5
    announcement_ttl_s: float = 5.0
    #: 2: a relay or SSM router one hop from the sender gets the carousel (issue 34)
    multicast_ttl: int = 2
    tls: ServiceSecurity = field(default_factory=ServiceSecurity)  # HTTPS for the API
    #: the newest issues of the content folder encoded ahead of their carousels (0: none;
    #: each holds one pass in memory: size x channels x (1 + overhead) with RaptorQ)
    prepare_issues: int = 2
    #: how often the content folder is looked at for newly published issues (seconds)
    prepare_interval_s: float = 10.0
    #: a pass's FDT expires this long after it is built (seconds) ...
    fdt_duration_s: int = 86400
    #: ... and is built again this often while the pass is in use (seconds)
    fdt_renew_s: float = 600.0

    def __post_init__(self) -> None:
        if self.prepare_issues < 0 or not self.prepare_interval_s > 0:
            raise ValueError("need prepare_issues >= 0 and prepare_interval_s > 0")
        check_operator_token(self.token)  # the one token rule of every service
        if not ipaddress.IPv4Address(self.group_base).is_multicast:
            raise ValueError(f"--group-base {self.group_base} is not a multicast address")
        count = self.groups()
        last = int(ipaddress.IPv4Address(self.group_base)) + count - 1
        if count < 1 or not ipaddress.IPv4Address(last).is_multicast:
            raise ValueError(
                f"--group-count {count} from --group-base {self.group_base} "
                "leaves the multicast range"
            )
        if not 0 < self.announce_interval_s < self.announcement_ttl_s:
            raise ValueError("need 0 < announce interval < announcement ttl")
        if not 0 < self.fdt_renew_s < self.fdt_duration_s:
            raise ValueError("need 0 < fdt_renew_s < fdt_duration_s")

    def groups(self) -> int:
        """How many groups the carousels' range has (``group_count`` or its default)."""
        if self.group_count is not None:
            return self.group_count
        left = int(ipaddress.IPv4Address("239.255.255.255")) - int(
            ipaddress.IPv4Address(self.group_base)
        )
        return max(1, min(DEFAULT_GROUPS, left + 1))


def plan_to_json(plan: CarouselPlan) -> dict[str, Any]:
    """A carousel plan as the control API shows it (the announcement's form)."""
    from pressrun.multicast.codec import announcement_to_dict

    doc = announcement_to_dict(Announcement("0" * 64, 1, 1.0, 2.0, (plan,)))
    carousel: dict[str, Any] = doc["carousels"][0]
    return carousel


class MulticastSender:
    """The sender service: carousels, control channel, HTTP API, metrics."""

    def __init__(
        self, config: SenderServiceConfig, *, clock: Callable[[], float] = wall_clock
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = SenderMetrics()
        self.sock = sender_socket(config.interface, ttl=config.multicast_ttl)
        self.thread = SendThread(self.sock, self.metrics)
        self.publisher_key = bytes(config.signing_key.verify_key).hex()
        self.planner = ChannelPlanner(
            group_base=config.group_base,
            group_count=config.groups(),
            channel_port_base=config.channel_port_base,
            state_file=config.state_file,
        )
        self.preparer = IssuePreparer(
            config.content_dir,
            prepared=self.metrics.prepared,
            encodes=self.metrics.encodes,
            encode_seconds=self.metrics.encode_seconds,
            fdt_duration_s=config.fdt_duration_s,
        )
        self.carousels = CarouselRegistry(
            config,
            thread=self.thread,
            planner=self.planner,
            preparer=self.preparer,
            metrics=self.metrics,
            clock=clock,
        )
        self.announcer = Announcer(
            config,
            sock=self.sock,
            thread=self.thread,
            metrics=self.metrics,
            publisher_key=self.publisher_key,
            clock=clock,
        )
        self._announcer: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- carousels (`pressrun.multicast.carousels`) --------------------------------------

    async def start_carousel(
        self, issue_id: str, carousel: CarouselConfig, *, tsi: int | None = None
    ) -> CarouselPlan:
        """Encode the issue and start its carousel; the plan (`CarouselRegistry`),
        announced at once."""
        plan = await self.carousels.start_carousel(issue_id, carousel, tsi=tsi)
        self.announcer.carousels_changed()
        return plan

    def stop_carousel(self, issue_id: str) -> bool:
        """Stop an issue's carousel (announced at once); False if none ran."""
        stopped = self.carousels.stop_carousel(issue_id)
        if stopped:
            self.announcer.carousels_changed()
        return stopped

    # -- HTTP ---------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        # the shared operator-token guard (pressrun.security), with this API's token
        app = web.Application(middlewares=[operator_middleware(self.config.token, API_ROUTES)])
        app.router.add_get("/v1/carousels", self.list_carousels)
        app.router.add_post("/v1/carousels", self.post_carousel)
        app.router.add_get("/v1/carousels/{issue_id}", self.get_carousel)
        app.router.add_delete("/v1/carousels/{issue_id}", self.delete_carousel)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", self.healthz)
        return app

    def _status(self, carousel: RunningCarousel) -> dict[str, Any]:
        doc = plan_to_json(carousel.plan)
        schedule = carousel.schedule
        doc["sent"] = [
            {
                "packets": schedule.sent(c),
                "cycles": round(schedule.cycles_done(c), 3),
                "slipped": schedule.slipped(c),
            }
            for c in range(len(carousel.plan.channels))
        ]
        doc["running_s"] = round(time.perf_counter() - carousel.started_at, 3)
        return doc

    async def list_carousels(self, request: web.Request) -> web.Response:
        """``GET /v1/carousels``: every running carousel with its counters."""
        return web.json_response(
            {
                "control_group": "{}:{}".format(*self.config.control_group),
                "publisher_key": self.publisher_key,
                "carousels": [self._status(c) for c in self.thread.running()],
            }
        )

    async def get_carousel(self, request: web.Request) -> web.Response:
        """``GET /v1/carousels/<issue_id>``."""
        carousel = self.thread.get(request.match_info["issue_id"])
        if carousel is None:
            return web.json_response({"error": "no carousel for that issue"}, status=404)
        return web.json_response(self._status(carousel))

    async def post_carousel(self, request: web.Request) -> web.Response:
        """``POST /v1/carousels`` ``{"issue_id", "channels"?, "rate_mbps"?, "fec"?}``."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("issue_id"), str):
            return web.json_response({"error": 'give {"issue_id": ...}'}, status=400)
        overrides: dict[str, Any] = {}
        try:
            if "channels" in body:
                overrides["channels"] = int(body["channels"])
            if "rate_mbps" in body:
                overrides["rate_bps"] = float(body["rate_mbps"]) * 1e6
            if "fec" in body:
                overrides["fec"] = str(body["fec"])
            carousel = replace(self.config.carousel, **overrides)
            tsi = body.get("tsi")
            if tsi is not None and (
                isinstance(tsi, bool) or not isinstance(tsi, int) or not 1 <= tsi <= MAX_TSI
            ):
                raise ValueError(f"tsi must be an integer 1 .. {MAX_TSI}")
        except (TypeError, ValueError) as err:
            return web.json_response({"error": str(err)}, status=400)
        issue_id = body["issue_id"]
        was_running = self.thread.get(issue_id) is not None
        try:
            plan = await self.start_carousel(issue_id, carousel, tsi=tsi)
        except CarouselError as err:
            return web.json_response({"error": str(err)}, status=err.status)
        except Exception as err:  # the caller gets the reason, not a bare 500
            log.exception("the carousel of %s did not start", issue_id)
            return web.json_response(
                {"error": f"the carousel of {issue_id} did not start: {err!r}"}, status=500
            )
        return web.json_response(plan_to_json(plan), status=200 if was_running else 201)

    async def delete_carousel(self, request: web.Request) -> web.Response:
        """``DELETE /v1/carousels/<issue_id>``."""
        issue_id = request.match_info["issue_id"]
        if not self.stop_carousel(issue_id):
            return web.json_response({"error": "no carousel for that issue"}, status=404)
        return web.json_response({"stopped": issue_id})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text."""
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return web.json_response(
            {
                "ok": True,
                "carousels": len(self.thread.running()),
                "prepared": sorted(self.preparer.prepared),
                "failed": {issue: f[2] for issue, f in sorted(self.preparer.failed.items())},
            }
        )

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> str:
        """Start the send thread, the announcements and the HTTP API; the API's URL."""
        self.thread.start()
        self._announcer = asyncio.get_running_loop().create_task(self.announcer.run())
        self._upkeep = asyncio.get_running_loop().create_task(self.carousels.upkeep_loop())
        self._runner = web.AppRunner(self.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.config.host,
            self.config.port,
            ssl_context=self.config.tls.server_ssl_context(),
        )
        await site.start()
        port: int = self._runner.addresses[0][1]
        self.url = f"{self.config.tls.scheme}://{self.config.host}:{port}"
        return self.url

    async def close(self) -> None:
        """Stop the API, the announcements and every carousel."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        loops = [t for t in (self._announcer, self._upkeep) if t is not None]
        for loop_task in loops:
            loop_task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self.carousels.cancel()
        self.thread.stop()
        if self.thread.is_alive():
            await asyncio.to_thread(self.thread.join, 5.0)
        self.sock.close()
