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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp_cors
import nacl.public
from aiohttp import hdrs, web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from pressrun.content.codec import is_hex
from pressrun.content.release import ReleaseError, SignedRelease
from pressrun.security import (
    UNAUTHORIZED_HEADERS,
    BodyTooLarge,
    ServiceSecurity,
    check_operator_token,
    operator_middleware,
    read_request_limited,
)
from pressrun.service import stop_signals
from pressrun.subscriptions.codec import (
    GRANT_NONCE_BYTES,
    RequestError,
    bearer,
    check_grant,
    check_token,
    decode_object,
    error_body,
    make_grant,
    make_token,
    parse_issue_version,
    parse_name,
    parse_public_key,
    parse_wraps,
)
from pressrun.subscriptions.embargo import embargo_refusal
from pressrun.subscriptions.store import (
    DeviceRefused,
    ReleaseRefused,
    SubscriptionStore,
    device_limit_message,
)

__all__ = [
    "DEFAULT_MAX_DEVICES",
    "DEFAULT_TOKEN_TTL_S",
    "MAX_WRAPS_BODY_BYTES",
    "SubscriptionService",
    "serve",
]

log = logging.getLogger("pressrun.subscriptions")

#: the operator routes (resource patterns): the operator token guards every method
OPERATOR_ROUTES = frozenset(
    {
        "/v1/subscribers",
        "/v1/subscribers/{public_key}",
        "/v1/issues/{issue_id}/versions/{version}/wraps",
        "/v1/issues/{issue_id}/versions/{version}/release",
        "/v1/subscribers/{public_key}/devices",
        "/v1/devices/{public_key}",
    }
)

DEFAULT_TOKEN_TTL_S = 300
#: devices per subscriber (their own key counts as one): ``--max-devices``
DEFAULT_MAX_DEVICES = 5
#: how long a link grant can be spent: the reader's link code's 10 minutes
GRANT_TTL_S = 600
MAX_SMALL_BODY_BYTES = 4096
MAX_WRAPS_BODY_BYTES = 64 << 20
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
        cors = aiohttp_cors.setup(app)
        options = aiohttp_cors.ResourceOptions(  # type: ignore[no-untyped-call]
            allow_credentials=False,
            allow_headers=("Authorization", "Content-Type"),
            allow_methods=("GET", "POST"),
            max_age=600,
        )
        per_origin = dict.fromkeys(self.cors_origins, options)
        cors.add(app.router.add_post("/v1/challenge", self._wrapped(self.challenge)), per_origin)
        cors.add(
            app.router.add_get(
                "/v1/issues/{issue_id}/versions/{version}/wrap", self._wrapped(self.get_wrap)
            ),
            per_origin,
        )
        # linking a device (issue 31): a subscribed device asks for a grant, the new
        # device registers its own public key with it (both from the reader's origin)
        cors.add(app.router.add_post("/v1/device-grants", self._wrapped(self.grant)), per_origin)
        cors.add(app.router.add_post("/v1/devices", self._wrapped(self.add_device)), per_origin)
        app.router.add_get("/v1/subscribers/{public_key}/devices", self._wrapped(self.list_devices))
        app.router.add_delete("/v1/devices/{public_key}", self._wrapped(self.remove_device))
        # the release notice: the operator reads and replaces it (guarded by the
        # middleware like every operator route); a reader learns the release time from
        # the signed manifest and from the refusal of its wrap
        release = app.router.add_resource("/v1/issues/{issue_id}/versions/{version}/release")
        release.add_route("GET", self._wrapped(self.get_release))
        release.add_route("PUT", self._wrapped(self.put_release))
        # (every route of OPERATOR_ROUTES is guarded by the middleware above)
        app.router.add_get("/v1/subscribers", self._wrapped(self.list_subscribers))
        app.router.add_put("/v1/subscribers/{public_key}", self._wrapped(self.add_subscriber))
        app.router.add_delete("/v1/subscribers/{public_key}", self._wrapped(self.remove_subscriber))
        app.router.add_put(
            "/v1/issues/{issue_id}/versions/{version}/wraps", self._wrapped(self.put_wraps)
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

    def _verified_release(self, doc: object, issue_id: str, version: int) -> SignedRelease:
        """A signed release notice from a request body, for this issue version, with a
        good signature of a trusted publisher key; RequestError 400 if not."""
        try:
            release = SignedRelease.from_json(doc)
            notice = release.verify(self.publisher_keys)
        except ReleaseError as err:
            raise RequestError(400, "bad_release", str(err)) from None
        if (notice.issue_id, notice.version) != (issue_id, version):
            raise RequestError(
                400,
                "bad_release",
                f"the release notice is for {notice.issue_id} version {notice.version}, "
                f"not {issue_id} version {version}",
            )
        return release

    @property
    def secret(self) -> bytes:
        if self._secret is None:
            raise RuntimeError("the service is not started")
        return self._secret

    # -- subscriber routes

    async def challenge(self, request: web.Request) -> web.Response:
        """``POST /v1/challenge``: a token sealed to the key in the body, for any key."""
        doc = await self._small_body(request)
        public_key = parse_public_key(doc.get("subscriber"))
        expires_at = int(self.clock()) + self.token_ttl_s
        token = make_token(self.secret, public_key, expires_at)
        try:
            sealed = nacl.public.SealedBox(nacl.public.PublicKey(public_key)).encrypt(token)
        except Exception:  # libsodium refuses some degenerate points
            raise RequestError(400, "bad_request", "that is not a usable X25519 key") from None
        self.challenges.inc()
        return web.json_response(
            {
                "subscriber": public_key.hex(),
                "sealed_token": bytes(sealed).hex(),
                "expires_in_s": self.token_ttl_s,
            }
        )

    async def get_wrap(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/<id>/versions/<v>/wrap``: this subscriber's own wrap."""
        began = time.perf_counter()
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        raw = bearer(request.headers.get(hdrs.AUTHORIZATION), "token from /v1/challenge")
        try:
            token = bytes.fromhex(raw)
        except ValueError:
            raise RequestError(401, "bad_token", "the token must be hex") from None
        now_unix = self.clock()
        public_key = check_token(self.secret, token, now_unix=now_unix)
        # one lookup on the loop's read-only connection: a wrap is deleted with its
        # subscriber, so a wrap found is a current subscriber's
        try:
            wrap = self.reader.wrap(issue_id, version, public_key)
            subscribed = wrap is not None or self.reader.is_subscriber(public_key)
            release = self._fresh_releases().get((issue_id, version))
        except sqlite3.Error as err:  # the database busy or failing: ask again
            log.warning("wrap of %s version %d: the database: %s", issue_id, version, err)
            raise RequestError(
                503,
                "unavailable",
                "the subscription service cannot read its database now; ask again",
                headers={"Retry-After": "1"},
            ) from None
        if not subscribed:
            raise RequestError(
                403,
                "not_subscribed",
                f"key {public_key.hex()[:16]}... is not a subscriber; subscribe to read {issue_id}",
            )
        if wrap is None:
            raise RequestError(
                404,
                "no_wrap",
                f"there is no wrap of {issue_id} version {version} for this subscriber (it "
                "was published before the subscription began, or no such version exists)",
            )
        refusal = embargo_refusal(release, now_unix=now_unix)
        if refusal is not None:
            if refusal.code == "embargoed":
                self.embargo_refusals.inc()
            raise refusal
        self.wraps_served.inc()
        self.wrap_seconds.observe(time.perf_counter() - began)
        return web.json_response(
            {
                "issue_id": issue_id,
                "version": version,
                "subscriber": public_key.hex(),
                "wrap": wrap.hex(),
            }
        )

    def _token_key(self, request: web.Request) -> bytes:
        """The public key of the request's good challenge token; RequestError 401."""
        raw = bearer(request.headers.get(hdrs.AUTHORIZATION), "token from /v1/challenge")
        try:
            token = bytes.fromhex(raw)
        except ValueError:
            raise RequestError(401, "bad_token", "the token must be hex") from None
        return check_token(self.secret, token, now_unix=self.clock())

    async def grant(self, request: web.Request) -> web.Response:
        """``POST /v1/device-grants``: a subscribed device (its token) gets a grant that
        lets one new device register under its subscriber (docs/subscriptions.md)."""
        device_key = self._token_key(request)
        found = await self._db(self.store.device_count, device_key)
        if found is None:
            raise RequestError(
                403, "not_subscribed", "this device is not subscribed, so it cannot link another"
            )
        if found[1] >= self.max_devices:  # said early; add_device decides
            raise RequestError(
                409,
                "device_limit",
                device_limit_message(self.max_devices),
                extra={"max_devices": self.max_devices},
            )
        expires_at = int(self.clock()) + GRANT_TTL_S
        grant = make_grant(self.secret, device_key, expires_at, os.urandom(GRANT_NONCE_BYTES))
        return web.json_response(
            {
                "grant": grant.hex(),
                "expires_in_s": GRANT_TTL_S,
                "devices": found[1],
                "max_devices": self.max_devices,
            }
        )

    async def add_device(self, request: web.Request) -> web.Response:
        """``POST /v1/devices`` with ``{"grant": hex, "name": ...}`` and the new
        device's own token: its public key joins the grant's subscriber."""
        public_key = self._token_key(request)  # the new device holds its secret key
        doc = await self._small_body(request)
        raw = doc.get("grant")
        if not isinstance(raw, str) or not is_hex(raw, len(raw)) or len(raw) % 2:
            raise RequestError(400, "bad_request", 'the body must be {"grant": hex, ...}')
        now_unix = self.clock()
        linked_by, expires_at, nonce = check_grant(
            self.secret, bytes.fromhex(raw), now_unix=now_unix
        )
        name = parse_name(doc) or "linked device"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            device, created = await self._db(
                functools.partial(
                    self.store.register_device,
                    public_key,
                    linked_by=linked_by,
                    name=name,
                    added_at=now,
                    grant_nonce=nonce,
                    grant_expires_at=expires_at,
                    now_unix=now_unix,
                    max_devices=self.max_devices,
                )
            )
        except DeviceRefused as err:
            raise RequestError(
                err.status, err.code, err.message, extra={"max_devices": self.max_devices}
            ) from None
        log.info(
            "device %s linked to subscriber %s by %s",
            public_key.hex()[:16],
            device.subscriber.hex()[:16],
            linked_by.hex()[:16],
        )
        return web.json_response(device.to_json(), status=201 if created else 200)

    # -- operator routes

    async def list_devices(self, request: web.Request) -> web.Response:
        """``GET /v1/subscribers/<key>/devices``."""
        public_key = parse_public_key(request.match_info["public_key"])
        devices = await self._db(self.store.devices, public_key)
        if devices is None:
            raise RequestError(404, "unknown_subscriber", f"{public_key.hex()} is not a subscriber")
        return web.json_response(
            {"devices": [d.to_json() for d in devices], "max_devices": self.max_devices}
        )

    async def remove_device(self, request: web.Request) -> web.Response:
        """``DELETE /v1/devices/<key>``: the device and its wraps; the next issue is
        not wrapped for it."""
        public_key = parse_public_key(request.match_info["public_key"])
        removed = await self._db(self.store.remove_device, public_key)
        if removed is None:
            raise RequestError(404, "unknown_device", f"{public_key.hex()} is not a device")
        device, wraps = removed
        log.info(
            "device %s of %s removed with %d wraps",
            public_key.hex()[:16],
            device.subscriber.hex()[:16],
            wraps,
        )
        return web.json_response({**device.to_json(), "wraps_deleted": wraps})

    async def list_subscribers(self, request: web.Request) -> web.Response:
        """``GET /v1/subscribers``."""
        subs = await self._db(self.store.subscribers)
        return web.json_response({"subscribers": [s.to_json() for s in subs]})

    async def add_subscriber(self, request: web.Request) -> web.Response:
        """``PUT /v1/subscribers/<key>`` with ``{"name": ...}``."""
        public_key = parse_public_key(request.match_info["public_key"])
        name = parse_name(await self._small_body(request))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            sub, created = await self._db(self.store.add_subscriber, public_key, name, now)
        except DeviceRefused as err:
            raise RequestError(err.status, err.code, err.message) from None
        log.info(
            "subscriber %s %s (%s)", public_key.hex()[:16], "added" if created else "renamed", name
        )
        return web.json_response(sub.to_json(), status=201 if created else 200)

    async def remove_subscriber(self, request: web.Request) -> web.Response:
        """``DELETE /v1/subscribers/<key>``: the subscriber and their wraps."""
        public_key = parse_public_key(request.match_info["public_key"])
        deleted = await self._db(self.store.remove_subscriber, public_key)
        if deleted is None:
            raise RequestError(404, "unknown_subscriber", f"{public_key.hex()} is not a subscriber")
        log.info("subscriber %s removed with %d wraps", public_key.hex()[:16], deleted)
        return web.json_response({"public_key": public_key.hex(), "wraps_deleted": deleted})

    async def put_wraps(self, request: web.Request) -> web.Response:
        """``PUT /v1/issues/<id>/versions/<v>/wraps``: replace one version's wraps."""
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(
                413, "too_large", f"the wraps body is over {MAX_WRAPS_BODY_BYTES} bytes"
            ) from None
        doc = decode_object(body)
        wraps = parse_wraps(doc)
        release = None
        if doc.get("release") is not None:
            release = self._verified_release(doc["release"], issue_id, version)
        try:
            stored, skipped = await self._db(
                self.store.put_wraps, issue_id, version, wraps, release
            )
        except ReleaseRefused as err:
            raise RequestError(409, "release_refused", str(err)) from None
        if release is not None:
            log.info(
                "%s version %d: embargoed until %s (release sequence %d)",
                issue_id,
                version,
                release.notice.release_at,
                release.notice.sequence,
            )
        log.info(
            "%s version %d: %d wraps stored, %d skipped (not subscribers)",
            issue_id,
            version,
            stored,
            len(skipped),
        )
        return web.json_response({"stored": stored, "skipped": [k.hex() for k in skipped]})

    async def get_release(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/<id>/versions/<v>/release``: the signed notice, whether it is
        released by this service's clock, and the seconds left."""
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        release = self._fresh_releases().get((issue_id, version))
        if release is None:
            raise RequestError(
                404, "no_release", f"{issue_id} version {version} has no embargo here"
            )
        at = release.notice.release_at_unix
        now_unix = self.clock()
        return web.json_response(
            {
                **release.to_json(),
                "released": at is not None and now_unix >= at,
                "retry_after_s": None if at is None else round(max(0.0, at - now_unix), 3),
            }
        )

    async def put_release(self, request: web.Request) -> web.Response:
        """``PUT /v1/issues/<id>/versions/<v>/release``: a later signed notice (move the
        release, or revoke it)."""
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        release = self._verified_release(await self._small_body(request), issue_id, version)
        try:
            await self._db(self.store.put_release, release)
        except ReleaseRefused as err:
            raise RequestError(409, "release_refused", str(err)) from None
        n = release.notice
        log.info(
            "%s version %d: release %s (sequence %d)",
            issue_id,
            version,
            "revoked" if n.revoked else f"at {n.release_at}",
            n.sequence,
        )
        return web.json_response(release.to_json())

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
