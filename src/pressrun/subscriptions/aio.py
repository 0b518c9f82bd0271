"""``pressrun serve subscriptions``: the aiohttp service that hands each subscriber its wrap.

The HTTP API is docs/protocols.md ("Subscription service HTTP"): subscribers ask for
a challenge sealed to their X25519 key, open it, and fetch their own wrap of an issue
version with the token inside (these routes carry CORS headers, through aiohttp-cors,
so a reader web app on another origin can call them); operators (the publisher,
``pressrun subscribers``) add, remove and list subscribers and upload wraps with the
operator token. State is the SQLite store; its writes run on one worker thread.

The embargo (issue 35): an issue version with a signed release notice has its wraps
handed out only from the notice's time, by this service's clock
(:mod:`.embargo`); notices come with the wraps' upload or through
``PUT .../release`` and their signature is checked once, when they arrive, not per
request.

The wrap route is the release minute's hot path: it reads SQLite straight from the
event loop on a second, read-only connection (one primary-key lookup, microseconds,
never blocked by a writer in WAL mode) instead of two hops to the worker thread, and
keeps the release notices in memory, reloaded when ``PRAGMA data_version`` says
another connection (the worker thread, or another service instance on the same file)
committed.

The routes' handlers live beside this module, which keeps the app, the life cycle,
the database connections and the counters: `pressrun.subscriptions.subscriber_http`
(challenge, wrap, device links) and `pressrun.subscriptions.operator_http`
(subscribers, devices, wraps and release notices, under the operator token).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp_cors
from aiohttp import hdrs, web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from pressrun.content.release import SignedRelease
from pressrun.security import (
    UNAUTHORIZED_HEADERS,
    BodyTooLarge,
    ServiceSecurity,
    check_operator_token,
    operator_middleware,
    read_request_limited,
)
from pressrun.service import stop_signals
from pressrun.subscriptions.codec import RequestError, decode_object, error_body
from pressrun.subscriptions.operator_http import (
    MAX_WRAPS_BODY_BYTES,
    OPERATOR_ROUTES,
    OperatorRoutes,
)
from pressrun.subscriptions.store import SubscriptionStore
from pressrun.subscriptions.subscriber_http import SubscriberRoutes

__all__ = [
    "DEFAULT_MAX_DEVICES",
    "DEFAULT_TOKEN_TTL_S",
    "MAX_WRAPS_BODY_BYTES",
    "SubscriptionService",
    "serve",
]

log = logging.getLogger("pressrun.subscriptions")

DEFAULT_TOKEN_TTL_S = 300
#: devices per subscriber (their own key counts as one): ``--max-devices``
DEFAULT_MAX_DEVICES = 5
MAX_SMALL_BODY_BYTES = 4096
#: the wrap histogram's buckets (seconds): a wrap is a token check and one SQLite read
WRAP_SECONDS_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def wall_clock() -> float:
    """Unix seconds: token expiry must mean the same after a restart, so not monotonic."""
    return time.time()  # noqa: TID251 (expiry times are stored in tokens that outlive the process)


class SubscriptionService:
    """The HTTP service around a :class:`SubscriptionStore`."""

    def __init__(
        self,
        store: SubscriptionStore,
        *,
        operator_token: str,
        cors_origins: Sequence[str] = ("*",),
        token_ttl_s: int = DEFAULT_TOKEN_TTL_S,
        clock: Callable[[], float] = wall_clock,
        security: ServiceSecurity | None = None,
        publisher_keys: Sequence[bytes] = (),
        max_devices: int = DEFAULT_MAX_DEVICES,
    ) -> None:
        # the rule every service shares (pressrun.security): 16 characters at least
        check_operator_token(operator_token)
        if token_ttl_s < 1:
            raise ValueError("token_ttl_s must be at least 1")
        if max_devices < 1:
            raise ValueError("max_devices must be at least 1")
        self.max_devices = max_devices
        self.store = store
        self.operator_token = operator_token
        self.cors_origins = tuple(cors_origins) or ("*",)
        self.token_ttl_s = token_ttl_s
        self.clock = clock
        self.security = security or ServiceSecurity()  # TLS (pressrun.security)
        # release notices are accepted only signed by one of these (none: any key,
        # pinned per issue version by its first notice)
        self.publisher_keys = frozenset(bytes(k) for k in publisher_keys) or None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="subscriptions-db")
        self._reader: SubscriptionStore | None = None
        self._releases: dict[tuple[str, int], SignedRelease] = {}
        self._seen_data_version = -1
        self._secret: bytes | None = None
        self._runner: web.AppRunner | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.challenges = Counter(
            "pressrun_subscriptions_challenges_total", "challenges issued", registry=self.registry
        )
        self.wraps_served = Counter(
            "pressrun_subscriptions_wraps_served_total", "wraps handed out", registry=self.registry
        )
        # the release minute's crowd of wrap requests (issue 35): the handler's time
        # from its start to a wrap handed out
        self.wrap_seconds = Histogram(
            "pressrun_subscriptions_wrap_seconds",
            "seconds from a wrap request's handler start to the wrap handed out",
            buckets=WRAP_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.embargo_refusals = Counter(
            "pressrun_subscriptions_embargoed_total",
            "wraps asked for before their release (refused with the release time)",
            registry=self.registry,
        )
        self.refusals = Counter(
            "pressrun_subscriptions_refusals_total",
            "requests refused, by code",
            ["code"],
            registry=self.registry,
        )

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- app

    def make_app(self) -> web.Application:
        """The aiohttp application (routes, CORS on the subscriber routes)."""
        # operator routes: the shared guard of pressrun.security, refusing before any
        # body is read
        guard = operator_middleware(
            self.operator_token, OPERATOR_ROUTES, refuse=self._refuse_operator
        )
        app = web.Application(client_max_size=MAX_WRAPS_BODY_BYTES, middlewares=[guard])
        sub = SubscriberRoutes(self)
        api = OperatorRoutes(self)
        cors = aiohttp_cors.setup(app)
        options = aiohttp_cors.ResourceOptions(  # type: ignore[no-untyped-call]
            allow_credentials=False,
            allow_headers=("Authorization", "Content-Type"),
            allow_methods=("GET", "POST"),
            max_age=600,
        )
        per_origin = dict.fromkeys(self.cors_origins, options)
        cors.add(app.router.add_post("/v1/challenge", self._wrapped(sub.challenge)), per_origin)
        cors.add(
            app.router.add_get(
                "/v1/issues/{issue_id}/versions/{version}/wrap", self._wrapped(sub.get_wrap)
            ),
            per_origin,
        )
        # linking a device (issue 31): a subscribed device asks for a grant, the new
        # device registers its own public key with it (both from the reader's origin)
        cors.add(app.router.add_post("/v1/device-grants", self._wrapped(sub.grant)), per_origin)
        cors.add(app.router.add_post("/v1/devices", self._wrapped(sub.add_device)), per_origin)
        app.router.add_get("/v1/subscribers/{public_key}/devices", self._wrapped(api.list_devices))
        app.router.add_delete("/v1/devices/{public_key}", self._wrapped(api.remove_device))
        # the release notice: the operator reads and replaces it (guarded by the
        # middleware like every operator route); a reader learns the release time from
        # the signed manifest and from the refusal of its wrap
        release = app.router.add_resource("/v1/issues/{issue_id}/versions/{version}/release")
        release.add_route("GET", self._wrapped(api.get_release))
        release.add_route("PUT", self._wrapped(api.put_release))
        # (every route of OPERATOR_ROUTES is guarded by the middleware above)
        app.router.add_get("/v1/subscribers", self._wrapped(api.list_subscribers))
        app.router.add_put("/v1/subscribers/{public_key}", self._wrapped(api.add_subscriber))
        app.router.add_delete("/v1/subscribers/{public_key}", self._wrapped(api.remove_subscriber))
        app.router.add_put(
            "/v1/issues/{issue_id}/versions/{version}/wraps", self._wrapped(api.put_wraps)
        )
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        return app

    def _wrapped(self, handler: Handler) -> Handler:
        async def run(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except RequestError as err:
                self.refusals.labels(err.code).inc()
                return web.json_response(err.body(), status=err.status, headers=err.headers)

        return run

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; answer the port actually bound."""
        self._secret = await self._db(self.store.token_secret)
        # the read-only connection of the wrap route (module docstring)
        self._reader = SubscriptionStore(self.store.path, read_only=True)
        self._fresh_releases()
        self._runner = web.AppRunner(self.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            host,
            port,
            reuse_address=True,
            ssl_context=self.security.server_ssl_context(),
        )
        await site.start()
        bound: int = self._runner.addresses[0][1]
        return bound

    async def close(self) -> None:
        """Stop answering and close the database."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        await self._db(self.store.close)
        self._executor.shutdown(wait=True)

    # -- helpers

    def _refuse_operator(self, message: str) -> web.StreamResponse:
        """The shared operator guard's refusal in this API's error shape (with a code)."""
        self.refusals.labels("bad_token").inc()
        return web.json_response(
            error_body(f"wrong operator token: {message}", "bad_token"),
            status=401,
            headers=UNAUTHORIZED_HEADERS,
        )

    @staticmethod
    async def _small_body(request: web.Request) -> dict[str, Any]:
        try:
            # to its end: content.read(n) answered the first segment of a body sent in two
            body = await read_request_limited(request, MAX_SMALL_BODY_BYTES, "the body")
        except BodyTooLarge:
            raise RequestError(
                413, "too_large", f"the body is over {MAX_SMALL_BODY_BYTES} bytes"
            ) from None
        return decode_object(body)

    @property
    def reader(self) -> SubscriptionStore:
        if self._reader is None:
            raise RuntimeError("the service is not started")
        return self._reader

    def _fresh_releases(self) -> dict[tuple[str, int], SignedRelease]:
        """The release notices, reloaded if any connection committed since the last
        look (a PRAGMA, microseconds; the reload reads one small table)."""
        version = self.reader.data_version()
        if version != self._seen_data_version:
            self._releases = self.reader.releases()
            self._seen_data_version = version
        return self._releases

    @property
    def secret(self) -> bytes:
        if self._secret is None:
            raise RuntimeError("the service is not started")
        return self._secret

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        return web.Response(
            body=generate_latest(self.registry), headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST}
        )


async def serve(
    service: SubscriptionService,
    *,
    host: str,
    port: int,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Run the service until SIGTERM or SIGINT."""
    # the handlers first: a signal right after the "listening" line is a clean stop
    with stop_signals() as stopped:
        bound = await service.start(host, port)
        if ready is not None:
            ready(bound)
        try:
            await stopped.wait()
        finally:
            log.info("subscription service stopping")
            await service.close()
