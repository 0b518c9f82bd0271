"""The balancer's asyncio adapter: aiohttp around ``BalancerCore``, one timer.

The core decides; this module only feeds it and carries out what it returns, in the
aioquic shape: one timer armed with ``loop.call_at(core.next_deadline())``; when it
fires, ``core.handle_timer(now=loop.time())`` returns `PollOrigin` effects, each
performed as a GET of ``<origin>/stats`` with a shared ``aiohttp.ClientSession`` and a
timeout shorter than the poll interval; the answer is decoded by
:func:`pressrun.balancer.codec.decode_status` and fed back as `StatusReceived`, any
failure (refused, timeout, HTTP error, malformed JSON) as `PollFailed`. `OriginWentDown`
is logged at WARNING and `OriginCameBack` at INFO.

HTTP endpoints:

``GET /v1/issues/{issue_id}/directive[?failed=a,b]``
    200 directive JSON (docs/protocols.md); 404 no origin holds the issue; 503 with
    ``Retry-After`` when every origin holding it is down, full or named in ``failed``;
    400 for an invalid issue id or ``failed`` list. Errors are ``{"error": "..."}``.
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
import json
import logging
import math
import random
import re
import time
from collections import Counter as TallyCounter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pressrun.balancer.algorithms import algorithm_class, algorithm_names, make_algorithm
from pressrun.balancer.codec import (
    ISSUE_ID_RE,
    RequestFormatError,
    StatusFormatError,
    decode_status,
    encode_directive,
    encode_status,
    json_score,
    parse_failed,
)
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore, ModePolicy, OriginState
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    Effect,
    MulticastInfo,
    NoDirective,
    OriginCameBack,
    OriginSpec,
    OriginWentDown,
    PollFailed,
    PollOrigin,
    Refusal,
    StatusReceived,
    SwarmInfo,
)
from pressrun.content.bundle import MAX_MANIFEST_BYTES
from pressrun.cors import enable_cors
from pressrun.security import BodyTooLarge, ServiceSecurity, client_connector, read_body_limited
from pressrun.service import wait_for_stop_signal

log = logging.getLogger(__name__)

JSON_TYPE = "application/json"
_NO_FAILED: frozenset[str] = frozenset()


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

    def effective_poll_timeout_s(self) -> float:
        """The poll timeout in force: the configured one or 0.8 x the interval."""
        if self.poll_timeout_s is not None:
            return self.poll_timeout_s
        return 0.8 * self.balancer.poll_interval_s


#: a /stats answer larger than this is malformed (it is a few hundred bytes per issue)
MAX_STATS_BYTES = 4 * 1024 * 1024


class ManifestUnavailable(Exception):
    """No origin answered a usable manifest for an issue."""


class _BalancerCollector(Collector):
    """Counts the core and the service already keep, read when Prometheus scrapes, so
    answering a directive costs no metric update."""

    def __init__(self, service: BalancerService) -> None:
        self.service = service

    def collect(self) -> Iterable[Metric]:
        service = self.service
        core = service.core
        algorithm = core.algorithm
        directives = CounterMetricFamily(
            "pressrun_balancer_directives",
            "Directives answered, by delivery mode and scoring algorithm",
            labels=["mode", "algorithm"],
        )
        for mode, count in sorted(service.directives_by_mode.items()):
            directives.add_metric([mode, algorithm.name], count)
        refusals = CounterMetricFamily(
            "pressrun_balancer_refusals",
            "Directive requests refused, by reason",
            labels=["reason"],
        )
        for reason, count in core.refusals.items():
            refusals.add_metric([reason.value], count)
        picks = CounterMetricFamily(
            "pressrun_balancer_picks",
            "Clients sent to each origin (first origin of a directive)",
            labels=["origin"],
        )
        up = GaugeMetricFamily(
            "pressrun_balancer_origin_up", "1 if the origin is in rotation", labels=["origin"]
        )
        score = GaugeMetricFamily(
            "pressrun_balancer_origin_score",
            "The origin's current score for each issue it holds (algorithms with scores)",
            labels=["origin", "issue"],
        )
        for name, rec in core.origins.items():
            picks.add_metric([name], rec.picks)
            is_up = rec.state is OriginState.UP
            up.add_metric([name], 1.0 if is_up else 0.0)
            if is_up and rec.status is not None:
                for issue in sorted(rec.status.issues):
                    value = algorithm.score(name, issue)
                    if value is not None and math.isfinite(value):
                        score.add_metric([name, issue], value)
        return [directives, refusals, picks, up, score]


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
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None
        self._rearm_pending = False
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._poll_timeout = aiohttp.ClientTimeout(total=config.effective_poll_timeout_s())
        self._file_names: dict[str, str] = {}
        self._manifest_fetches: dict[str, asyncio.Task[str]] = {}
        self._up_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.directives_by_mode: TallyCounter[str] = TallyCounter()
        self._swarm_directives = 0
        self.registry = CollectorRegistry()
        self.registry.register(_BalancerCollector(self))
        self.poll_seconds = Histogram(
            "pressrun_balancer_poll_seconds",
            "Time to poll an origin's /stats, by outcome",
            ["outcome"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.poll_failures = Counter(
            "pressrun_balancer_poll_failures",
            "Failed /stats polls, by origin",
            ["origin"],
            registry=self.registry,
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
        app.router.add_get("/v1/issues/{issue_id}/directive", self.directive)
        app.router.add_get("/issues/{issue_id}", self.redirect)
        app.router.add_get("/v1/origins", self.origins)
        app.router.add_get("/v1/algorithms", self.algorithms)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
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
            cfg.balancer, cfg.origins, algorithm, self._mode_policy, now=loop.time()
        )
        self._http = aiohttp.ClientSession(
            connector=client_connector(cfg.ca_file, limit=0, ttl_dns_cache=300),
            headers={"User-Agent": "pressrun-balancer"},
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
        self._rearm()  # the first polls are due now
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
                )
            )
        return bound

    async def close(self) -> None:
        """Stop polling and answering; close the client session."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        for _, waiter in self._up_waiters:
            if not waiter.done():
                waiter.cancel()

    async def wait_until_up(self, count: int | None = None, timeout_s: float = 10.0) -> None:
        """Until `count` origins (default: all) are in rotation; TimeoutError if not."""
        want = len(self.config.origins) if count is None else count
        if self._count_up() >= want:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._up_waiters.append((want, waiter))
        await asyncio.wait_for(waiter, timeout_s)

    def _count_up(self) -> int:
        return sum(1 for rec in self.core.origins.values() if rec.state is OriginState.UP)

    # -- timer and effects -------------------------------------------------------

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _schedule_rearm(self) -> None:
        # Several poll answers in one loop iteration re-arm once (next_deadline is
        # O(origins)).
        if not self._rearm_pending and self._loop is not None:
            self._rearm_pending = True
            self._loop.call_soon(self._rearm)

    def _rearm(self) -> None:
        self._rearm_pending = False
        if self._loop is None or self._core is None or self._closed:
            return
        deadline = self._core.next_deadline()
        if deadline == self._armed_for:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_for = deadline
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        armed = self._armed_for
        self._timer = None
        self._armed_for = None
        # asyncio may run a timer up to one clock resolution early; the core must see
        # the deadline as reached or it would answer nothing and be re-armed at once.
        now = self._now()
        if armed is not None and now < armed:
            now = armed
        self._apply(self.core.handle_timer(now=now))
        self._rearm()

    def _apply(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, PollOrigin):
                if not self._closed:
                    self._spawn(self._poll(effect.name, effect.url))
            elif isinstance(effect, OriginWentDown):
                url = self.core.origins[effect.name].spec.url
                log.warning(
                    "origin %s did not answer /stats: %s; it is out of rotation until it does",
                    url,
                    effect.reason,
                )
            elif isinstance(effect, OriginCameBack):
                spec = self.core.origins[effect.name].spec
                log.info("origin %s (%s) answers /stats; it is in rotation", spec.name, spec.url)
                self._wake_up_waiters()

    def _wake_up_waiters(self) -> None:
        if not self._up_waiters:
            return
        up = self._count_up()
        for want, waiter in list(self._up_waiters):
            if up >= want and not waiter.done():
                waiter.set_result(None)
        self._up_waiters = [(w, f) for w, f in self._up_waiters if not f.done()]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poll(self, name: str, url: str) -> None:
        """Perform one `PollOrigin`: GET /stats, feed the answer or the failure."""
        assert self._http is not None
        started = time.perf_counter()
        reason: str | None = None
        try:
            async with self._http.get(url + "/stats", timeout=self._poll_timeout) as resp:
                if resp.status != 200:
                    raise StatusFormatError("", f"HTTP {resp.status} instead of 200")
                body = await read_body_limited(resp, MAX_STATS_BYTES, f"{url}/stats")
            status = decode_status(body, origin_name=name)
        except TimeoutError:
            reason = f"no answer within {self.config.effective_poll_timeout_s():g} s"
        except aiohttp.ClientError as err:
            reason = str(err) or type(err).__name__
        except StatusFormatError as err:
            reason = str(err)
        except BodyTooLarge as err:
            reason = str(StatusFormatError("", str(err)))
        except OSError as err:
            reason = str(err) or type(err).__name__
        except Exception as err:
            # Whatever happened, the core must hear back: an origin whose poll never
            # ends would stay "polling" and never be polled again.
            log.exception("polling %s/stats failed unexpectedly", url)
            reason = f"{type(err).__name__}: {err}"
        elapsed = time.perf_counter() - started
        core = self.core
        now = self._now()
        if reason is None:
            self.poll_seconds.labels("ok").observe(elapsed)
            self._apply(core.handle_status_received(StatusReceived(status), now=now))
        else:
            self.poll_seconds.labels("failed").observe(elapsed)
            self.poll_failures.labels(name).inc()
            rec = core.origins[name]
            first_failure = rec.state is OriginState.UNKNOWN
            self._apply(core.handle_poll_failed(PollFailed(name, reason), now=now))
            if first_failure:
                # The core reports only UP -> DOWN; an origin down from the start is
                # worth the same warning, once.
                log.warning(
                    "origin %s did not answer /stats: %s; it is out of rotation until it does",
                    url,
                    reason,
                )
        self._schedule_rearm()

    # -- handlers -----------------------------------------------------------------

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
        return self._error(503, refusal.message, {"Retry-After": retry})

    def _decide(self, request: web.Request) -> Directive | web.Response:
        """Parse a directive request and ask the core; a `web.Response` on errors."""
        issue_id = request.match_info["issue_id"]
        if ISSUE_ID_RE.match(issue_id) is None:
            return self._error(
                400, f"invalid issue id {issue_id[:140]!r}: letters, digits, '.', '_', '-'"
            )
        failed = _NO_FAILED
        if request.query_string:
            try:
                failed = parse_failed(request.query.getall("failed", []))
            except RequestFormatError as err:
                return self._error(400, str(err))
        result = self.core.handle_directive_requested(
            DirectiveRequested(issue_id, failed), now=self._now()
        )
        if isinstance(result, NoDirective):
            return self._refusal(result)
        if self.config.tracker_url is not None and issue_id not in self.swarms:
            self._learn_swarm(issue_id, [o.url for o in result.origins])
        if result.swarm is not None and self.config.extra_tracker_urls:
            result = self._next_tracker(result)
        self.directives_by_mode[result.mode.value] += 1
        return result

    def _next_tracker(self, directive: Directive) -> Directive:
        """The directive naming the next tracker instance in turn."""
        assert directive.swarm is not None and self.config.tracker_url is not None
        trackers = (self.config.tracker_url, *self.config.extra_tracker_urls)
        url = trackers[self._swarm_directives % len(trackers)]
        self._swarm_directives += 1
        return replace(directive, swarm=replace(directive.swarm, tracker_url=url))

    async def directive(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/{issue_id}/directive[?failed=a,b]``."""
        result = self._decide(request)
        if isinstance(result, web.Response):
            return result
        return web.Response(
            body=json.dumps(encode_directive(result)).encode(), content_type=JSON_TYPE
        )

    async def redirect(self, request: web.Request) -> web.Response:
        """``GET /issues/{issue_id}``: 302 to the picked origin's copy of the file."""
        result = self._decide(request)
        if isinstance(result, web.Response):
            return result
        issue_id = result.issue_id
        try:
            file_name = await self._file_name(issue_id, [o.url for o in result.origins])
        except ManifestUnavailable as err:
            return self._error(502, str(err))
        location = f"{result.origins[0].url}/content/{issue_id}/{file_name}"
        return web.Response(status=302, headers={"Location": location})

    def _learn_swarm(self, issue_id: str, urls: Sequence[str]) -> None:
        """Read the issue's manifest in the background (once) to learn its swarm."""
        if issue_id in self._manifest_fetches or issue_id in self._file_names or self._closed:
            return

        async def learn() -> None:
            try:
                await self._file_name(issue_id, urls)
            except ManifestUnavailable as err:
                log.warning("no swarm for %s yet: %s", issue_id, err)

        self._spawn(learn())

    async def _file_name(self, issue_id: str, urls: Sequence[str]) -> str:
        cached = self._file_names.get(issue_id)
        if cached is not None:
            return cached
        task = self._manifest_fetches.get(issue_id)
        if task is None:
            # One fetch per issue however many clients ask at once.
            task = asyncio.get_running_loop().create_task(self._fetch_file_name(issue_id, urls))
            self._manifest_fetches[issue_id] = task
            self._tasks.add(task)

            def done(t: asyncio.Task[str]) -> None:
                self._tasks.discard(t)
                self._manifest_fetches.pop(issue_id, None)
                if not t.cancelled():
                    t.exception()  # retrieved here, so never "never retrieved"

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _fetch_file_name(self, issue_id: str, urls: Sequence[str]) -> str:
        assert self._http is not None
        timeout = aiohttp.ClientTimeout(total=self.config.manifest_timeout_s)
        problems: list[str] = []
        for url in urls:
            manifest_url = f"{url}/content/{issue_id}/manifest.json"
            try:
                async with self._http.get(manifest_url, timeout=timeout) as resp:
                    if resp.status != 200:
                        problems.append(f"{manifest_url}: HTTP {resp.status}")
                        continue
                    body = await read_body_limited(resp, MAX_MANIFEST_BYTES, manifest_url)
                doc = json.loads(body)
                manifest = doc["manifest"]
                file_name = manifest["file_name"]
                info_hash = manifest.get("info_hash")
            except TimeoutError:
                problems.append(f"{manifest_url}: no answer within {timeout.total:g} s")
                continue
            except (aiohttp.ClientError, OSError, BodyTooLarge) as err:
                problems.append(f"{manifest_url}: {err}")
                continue
            except (ValueError, KeyError, TypeError) as err:
                problems.append(f"{manifest_url}: not a manifest ({err!r})")
                continue
            if not isinstance(file_name, str) or ISSUE_ID_RE.match(file_name) is None:
                problems.append(f"{manifest_url}: invalid file_name {file_name!r}")
                continue
            self._file_names[issue_id] = file_name
            tracker = self.config.tracker_url
            if (
                tracker is not None
                and isinstance(info_hash, str)
                and re.fullmatch(r"[0-9a-f]{40}", info_hash) is not None
            ):
                self.swarms[issue_id] = swarm_info_for(url, tracker, issue_id, info_hash)
            return file_name
        raise ManifestUnavailable(
            f"could not read the manifest of {issue_id!r}: " + "; ".join(problems)
        )

    async def origins(self, request: web.Request) -> web.Response:
        """``GET /v1/origins[?issue=ID]``: every origin as the balancer sees it."""
        issue = request.query.get("issue")
        if issue is not None and ISSUE_ID_RE.match(issue) is None:
            return self._error(400, f"invalid issue id {issue[:140]!r}")
        return web.json_response(self.origins_view(issue))

    def origins_view(self, issue: str | None) -> dict[str, Any]:
        """The ``/v1/origins`` document."""
        core = self.core
        algorithm = core.algorithm
        now = self._now()
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
                "current": self.core.algorithm.name,
                "algorithms": [
                    {"name": name, "summary": algorithm_class(name).summary}
                    for name in algorithm_names()
                ],
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        return web.Response(
            body=generate_latest(self.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: ok."""
        return web.Response(text="ok")


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
        await wait_for_stop_signal()
    finally:
        log.info("balancer stopping")
        await running.stop()
