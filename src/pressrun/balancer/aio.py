"""The balancer's asyncio adapter: aiohttp around ``BalancerCore``, one timer.

The core decides; this module answers HTTP with it. The rest of the service lives
beside it, one concern a module:

- `pressrun.balancer.routes`: the HTTP handlers below (``BalancerRoutes``; this
  module's ``make_app`` is the route table);
- `pressrun.balancer.poller`: the core's one timer and the ``/stats`` polls it asks for
  (``loop.call_at(core.next_deadline())``, answers decoded by the codec and fed back);
- `pressrun.balancer.manifests`: each issue's manifest read once from the origins (the
  file name of the 302, the swarm);
- `pressrun.balancer.carousels`: the client of the multicast sender's control API;
- `pressrun.balancer.metrics`: the Prometheus collector over the core's counts.

HTTP endpoints:

``GET /v1/issues/{issue_id}/directive[?failed=a,b&have=B&size=B&rate=R]``
    200 directive JSON (docs/protocols.md); 404 no origin holds the issue; 503 with
    ``Retry-After`` when every origin holding it is down, full or named in ``failed``;
    400 for an invalid issue id, ``failed`` list or ``have``/``size``/``rate`` (what a
    downloading client tells of itself: bytes it has, the file's size, its rate).
    Errors are ``{"error": "..."}``.
``GET /v1/issues/{issue_id}/prefetch[?client=ID]``
    a paced grant for pre-positioning an embargoed issue, counted apart from readers
    (`pressrun.balancer.prefetch`): 200 rate and origins, 429 with ``Retry-After``.
``GET /issues/{issue_id}``
    302 to ``<origin>/content/<issue_id>/<file_name>``; the file name is read once per
    issue from ``<origin>/content/<issue_id>/manifest.json`` and cached.
``GET /v1/origins[?issue=ID]``
    each origin's state, down reason, status age, latest status, score, picks.
``GET /v1/algorithms``
    the registered scoring algorithms and the one in use.
``GET /metrics``
    Prometheus text format (own registry).
``GET /healthz``
    ``ok``.

Programmatic start (tests, the demo)::

    from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
    from pressrun.balancer.config import BalancerConfig
    from pressrun.balancer.events import OriginSpec

    running = await start_balancer(BalancerServiceConfig(
        origins=(OriginSpec("origin-a", "http://127.0.0.1:8001"),
                 OriginSpec("origin-b", "http://127.0.0.1:8002")),
        balancer=BalancerConfig(poll_interval_s=0.5, algorithm="alg2"),
    ))                      # host 127.0.0.1, port 0: any free port
    running.port, running.url           # the bound port, "http://127.0.0.1:<port>"
    running.core                        # the BalancerCore, for inspection
    await running.wait_until_up(2)      # optional: until 2 origins answered /stats
    await running.stop()
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter as TallyCounter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore, ModePolicy
from pressrun.balancer.demand import DemandConfig, DemandPolicy
from pressrun.balancer.demand_metrics import DemandCollector
from pressrun.balancer.events import MulticastInfo, OriginSpec, SwarmInfo
from pressrun.balancer.health import HealthConfig
from pressrun.balancer.manifests import ManifestReader, ManifestUnavailable
from pressrun.balancer.metrics import BalancerCollector, PrefetchCollector
from pressrun.balancer.poller import OriginPoller
from pressrun.balancer.prefetch import PrefetchConfig, PrefetchPacer
from pressrun.balancer.routes import BalancerRoutes
from pressrun.balancer.shared import SharedDemand
from pressrun.cors import enable_cors
from pressrun.security import ServiceSecurity, client_connector
from pressrun.service import stop_signals

__all__ = [
    "BalancerService",
    "BalancerServiceConfig",
    "ManifestUnavailable",
    "RunningBalancer",
    "serve",
    "start_balancer",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BalancerServiceConfig:
    """Everything `start_balancer` needs.

    origins: the origins, in order (names must be unique).
    balancer: the core's config (poll interval, staleness, directive size, algorithm).
    host, port: where to listen; port 0 binds any free port (read it back).
    seed: seed of the `random.Random` handed to the algorithm (None: from the OS).
    algorithm_params: the algorithm's parameters (e.g. ``{"w_max": 10}``).
    poll_timeout_s: timeout of one /stats poll; default 0.8 x the poll interval, so a
        hung origin is out of rotation before its next poll is due.
    manifest_timeout_s: timeout of the one manifest fetch per issue for ``/issues/``.
    access_log: log every request at INFO (off by default: it costs directive
        throughput; docs/balancer.md has the measured numbers).
    tracker_url: the tracker's announce URL; given, the service answers ``swarm`` for
        an issue whose demand passes ``demand.enter_downloaders`` (a `DemandPolicy`
        over the issues whose manifest it has read; an issue not read yet is answered
        ``origin`` and its manifest is fetched in the background).
    demand: the demand policy's thresholds (used only with ``tracker_url`` or a
        multicast sender).
    multicast_sender_url, multicast_token, multicast: the multicast sender's control
        API, its token, and the control group clients get; given, an issue whose demand
        passes ``demand.multicast_enter_downloaders`` gets a carousel and ``multicast``
        directives (`pressrun.balancer.carousels`).
    extra_tracker_urls: more tracker instances sharing ``tracker_url``'s state (Redis);
        swarm directives name ``tracker_url`` and these in turn, spreading the
        announces over them.
    security: TLS of the listening socket (``--tls-cert/--tls-key``).
    ca_file: an extra CA the origins' certificates may chain to (besides the
        system's and ``PRESSRUN_CA_FILE``).
    redis_url: Redis shared by several balancer instances (`pressrun.balancer.shared`):
        they share each issue's demand, and one of them orders the carousels; None: a
        balancer alone.
    health: rise/fall/slowstart of the origins' polls (`pressrun.balancer.health`;
        default: one poll decides, as before issue 30; ``pressrun serve balancer``
        uses HAProxy's rise 2, fall 3 and a 10 s slow start).
    """

    origins: tuple[OriginSpec, ...]
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    host: str = "127.0.0.1"
    port: int = 0
    seed: int | None = None
    algorithm_params: Mapping[str, float] | None = None
    poll_timeout_s: float | None = None
    manifest_timeout_s: float = 5.0
    access_log: bool = False
    tracker_url: str | None = None
    demand: DemandConfig = field(default_factory=DemandConfig)
    extra_tracker_urls: tuple[str, ...] = ()
    multicast_sender_url: str | None = None
    multicast_token: str | None = None
    multicast: MulticastInfo | None = None
    security: ServiceSecurity = field(default_factory=ServiceSecurity)
    ca_file: Path | None = None
    health: HealthConfig = field(default_factory=HealthConfig.immediate)
    redis_url: str | None = None
    #: the prefetch pacing (issue 35, `pressrun.balancer.prefetch`)
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)

    def effective_poll_timeout_s(self) -> float:
        """The poll timeout in force: the configured one or 0.8 x the interval."""
        if self.poll_timeout_s is not None:
            return self.poll_timeout_s
        return 0.8 * self.balancer.poll_interval_s


class BalancerService:
    """The balancer over HTTP: feeds the core, performs its polls, one timer."""

    def __init__(
        self, config: BalancerServiceConfig, *, mode_policy: ModePolicy | None = None
    ) -> None:
        self.config = config
        self._mode_policy = mode_policy
        #: issue id -> its swarm (torrent on the origin whose manifest answered)
        self.swarms: dict[str, SwarmInfo] = {}
        #: issue id -> its running carousel (kept by `keep_carousels`)
        self.carousels: dict[str, MulticastInfo] = {}
        self._demand: DemandPolicy | None = None
        if mode_policy is None and (
            config.tracker_url is not None or config.multicast_sender_url is not None
        ):
            self._demand = DemandPolicy(config.demand, self.swarms, self.carousels)
            self._mode_policy = self._demand
        self._loop: asyncio.AbstractEventLoop | None = None
        self._core: BalancerCore | None = None
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._poller: OriginPoller | None = None
        self._manifests: ManifestReader | None = None
        self.shared: SharedDemand | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.directives_by_mode: TallyCounter[str] = TallyCounter()
        self.prefetch = PrefetchPacer(config.prefetch)
        self.registry = CollectorRegistry()
        self.registry.register(BalancerCollector(lambda: self.core, self.directives_by_mode))
        self.registry.register(PrefetchCollector(lambda: self.prefetch))
        if self._demand is not None:  # what the demand policy saw and decided (issue 28)
            self.registry.register(
                DemandCollector(
                    self._demand,
                    self.carousels,
                    lambda: self._now() if self._loop is not None else 0.0,
                    lambda: self.shared.is_leader() if self.shared is not None else None,
                )
            )

    @property
    def core(self) -> BalancerCore:
        """The decision core (exists once started)."""
        if self._core is None:
            raise RuntimeError("the balancer service is not started")
        return self._core

    # -- life cycle ---------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application()
        routes = BalancerRoutes(self)
        app.router.add_get("/v1/issues/{issue_id}/directive", routes.directive)
        app.router.add_get("/issues/{issue_id}", routes.redirect)
        app.router.add_get("/v1/issues/{issue_id}/prefetch", routes.prefetch_grant)
        app.router.add_get("/v1/origins", routes.origins)
        app.router.add_get("/v1/algorithms", routes.algorithms)
        app.router.add_get("/metrics", routes.metrics)
        app.router.add_get("/healthz", routes.healthz)
        enable_cors(app)  # the web reader asks for directives cross-origin (docs/reader.md)
        return app

    async def start(self) -> int:
        """Build the core, start polling, listen; answer the port actually bound."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._loop = loop
        # The seed is the operator's: an algorithm that draws random numbers gets its
        # own Random, so a seeded run is reproducible.
        rng = random.Random(cfg.seed)
        algorithm = make_algorithm(cfg.balancer.algorithm, cfg.origins, rng, cfg.algorithm_params)
        self._core = BalancerCore(
            cfg.balancer,
            cfg.origins,
            algorithm,
            self._mode_policy,
            now=loop.time(),
            health=cfg.health,
            count_every_pick_from=cfg.demand.count_every_request_from,
        )
        self._http = aiohttp.ClientSession(
            connector=client_connector(cfg.ca_file, limit=0, ttl_dns_cache=300),
            headers={"User-Agent": "pressrun-balancer"},
        )
        self._poller = OriginPoller(
            self._core,
            self._http,
            loop,
            poll_timeout_s=cfg.effective_poll_timeout_s(),
            registry=self.registry,
            spawn=self._spawn,
        )
        self._manifests = ManifestReader(
            self._http,
            timeout_s=cfg.manifest_timeout_s,
            tracker_url=cfg.tracker_url,
            swarms=self.swarms,
            spawn=self._spawn,
            track=self._track,
        )
        access_log: logging.Logger | None = None
        if cfg.access_log:
            # Asked for explicitly: shown even when the process logs at WARNING.
            access_log = logging.getLogger("aiohttp.access")
            access_log.setLevel(logging.INFO)
        self._runner = web.AppRunner(self.make_app(), access_log=access_log, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            cfg.host,
            cfg.port,
            reuse_address=True,
            ssl_context=cfg.security.server_ssl_context(),
        )
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        bound: int = sockets[0].getsockname()[1] if sockets else cfg.port
        self._poller.start()  # the first polls are due now
        if self._demand is not None and cfg.redis_url:
            self.shared = SharedDemand(
                cfg.redis_url,
                self._demand,
                # half a poll: what one instance counted reaches the others within one
                interval_s=cfg.balancer.poll_interval_s / 2,
                now=self._now,
            )
            self._spawn(self.shared.run())
        if self._demand is not None and cfg.multicast_sender_url and cfg.multicast is not None:
            from pressrun.balancer.carousels import CarouselClient, keep_carousels

            client = CarouselClient(self._http, cfg.multicast_sender_url, cfg.multicast_token or "")
            self._spawn(
                keep_carousels(
                    self._demand,
                    self.carousels,
                    client,
                    cfg.multicast,
                    interval_s=cfg.balancer.poll_interval_s,
                    now=self._now,
                    is_leader=self.shared.is_leader if self.shared is not None else None,
                )
            )
        return bound

    async def close(self) -> None:
        """Stop polling and answering; close the client session."""
        self._closed = True
        if self._manifests is not None:
            self._manifests.closed = True
        if self._poller is not None:
            self._poller.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.shared is not None:
            await self.shared.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def wait_until_up(self, count: int | None = None, timeout_s: float = 10.0) -> None:
        """Until `count` origins (default: all) are in rotation; TimeoutError if not."""
        want = len(self.config.origins) if count is None else count
        if self._poller is None:
            raise RuntimeError("the balancer service is not started")
        await self._poller.wait_until_up(want, timeout_s)

    @property
    def manifests(self) -> ManifestReader:
        """The issues' manifests as read from the origins (exists once started)."""
        if self._manifests is None:
            raise RuntimeError("the balancer service is not started")
        return self._manifests

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _spawn(self, coro: Any) -> None:
        self._track(asyncio.get_running_loop().create_task(coro))

    def _track(self, task: asyncio.Task[Any]) -> None:
        # Every task of the service is cancelled by `close`.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@dataclass(slots=True)
class RunningBalancer:
    """A balancer started by `start_balancer`."""

    service: BalancerService
    port: int
    host: str

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123`` (``https`` with TLS)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.service.config.security.scheme}://{host}:{self.port}"

    @property
    def core(self) -> BalancerCore:
        """The decision core."""
        return self.service.core

    async def wait_until_up(self, count: int | None = None, timeout_s: float = 10.0) -> None:
        """Until `count` origins (default: all) are in rotation."""
        await self.service.wait_until_up(count, timeout_s)

    async def stop(self) -> None:
        """Stop polling and answering."""
        await self.service.close()


async def start_balancer(
    config: BalancerServiceConfig, *, mode_policy: ModePolicy | None = None
) -> RunningBalancer:
    """Start a balancer service in the running loop; `await running.stop()` ends it."""
    service = BalancerService(config, mode_policy=mode_policy)
    try:
        port = await service.start()
    except BaseException:
        await service.close()
        raise
    host = "127.0.0.1" if config.host in ("", "0.0.0.0") else config.host
    return RunningBalancer(service, port, host)


async def serve(
    config: BalancerServiceConfig, *, ready: Callable[[RunningBalancer], None] | None = None
) -> None:
    """Run the balancer until SIGTERM or SIGINT, then stop cleanly."""
    # the handlers first: a signal right after the "listening" line is a clean stop
    with stop_signals() as stopped:
        running = await start_balancer(config)
        log.info(
            "balancer listening on %s (algorithm %s, %d origins, polling every %g s)",
            running.url,
            config.balancer.algorithm,
            len(config.origins),
            config.balancer.poll_interval_s,
        )
        if ready is not None:
            ready(running)
        try:
            await stopped.wait()
        finally:
            log.info("balancer stopping")
            await running.stop()
