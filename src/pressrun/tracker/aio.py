"""The tracker's asyncio adapter: aiohttp handlers around ``TrackerCore``, one timer.

Endpoints: ``/announce`` (BEP 3/23), ``/scrape`` (BEP 48), ``/v1/swarms`` (JSON),
``/v1/swarms/<info_hash hex>``, ``/v1/swarms/<info_hash hex>/needed``, ``/metrics``
(Prometheus, own registry), ``/healthz``; ``GET /v1/allowed`` and
``PUT /v1/allowed/<info_hash hex>`` (the allowlist). ``/v1/swarms``, one swarm's peers
and ``/v1/allowed`` are operator endpoints: they list peers or change state, so they
need the operator token (pressrun.security). With an allowlist (``content_dirs`` of
signed bundles, or a publisher's ``PUT``), an announce for any other info-hash is
refused and creates nothing. Announce and scrape errors are bencoded
``failure reason`` answers with HTTP 200, never a 500: BitTorrent clients read the
body of a 200 and ignore the rest.

Clocks (issue 24): the core runs on ``monotonic`` (``time.monotonic``, the event
loop's clock), so every deadline inside the process (peer expiry, forgetting) is immune
to steps of the wall clock. Records live in SQLite across restarts and in Redis across
processes, where a per-process monotonic clock means nothing: they are stored with
wall-clock times (``clock``, ``time.time``) and read back as heard at the time they
were read (`pressrun.tracker.store.live_record`), never expired by comparing a stored
time with the wall clock. ``clock`` is also the ring's (wall) clock. Tests inject both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pressrun.content.bundle import read_manifest
from pressrun.content.codec import ManifestError, valid_issue_id
from pressrun.security import ServiceSecurity, operator_middleware
from pressrun.service import stop_signals
from pressrun.tracker.codec import (
    QueryError,
    encode_announce_reply,
    encode_failure,
    encode_scrape_reply,
    parse_announce_query,
    parse_scrape_query,
)
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import AnnounceHandled, PeerExpired, TrackerCore
from pressrun.tracker.events import (
    AnnounceEvent,
    AnnounceRequest,
    PeerRecord,
    SwarmStats,
    TrackerEvent,
)
from pressrun.tracker.redis_store import RedisStore
from pressrun.tracker.ring import RingAdmin
from pressrun.tracker.ring_http import add_ring_routes
from pressrun.tracker.ring_store import RedisRingStore, RingStore, SqliteRingStore
from pressrun.tracker.sqlite_store import SqliteStore
from pressrun.tracker.store import (
    TrackerStore,
    live_record,
    stored_event,
    stored_record,
)
from pressrun.tracker.websocket import add_webtorrent_routes

log = logging.getLogger(__name__)

BENCODE_TYPE = "text/plain"
#: routes that list peers or change state: the operator token guards them
OPERATOR_ROUTES = frozenset(
    {"/v1/swarms", "/v1/swarms/{info_hash}", "/v1/allowed", "/v1/allowed/{info_hash}"}
)
#: /metrics names at most this many swarms (the largest); the rest only in the totals
MAX_METRIC_SWARMS = 50


def published_info_hashes(
    content_dirs: Sequence[Path], trusted_keys: Collection[bytes] | None
) -> dict[bytes, int]:
    """The info-hashes of the signed bundles in ``content_dirs`` (``<dir>/<issue>/
    manifest.json``) whose signature verifies with one of ``trusted_keys``, each with
    its torrent's piece count (the ring's, `pressrun.tracker.ring`)."""
    found: dict[bytes, int] = {}
    for content_dir in content_dirs:
        try:
            entries = sorted(content_dir.iterdir())
        except OSError as err:
            log.warning("cannot list the content folder %s: %s", content_dir, err)
            continue
        for entry in entries:
            if not valid_issue_id(entry.name) or not (entry / "manifest.json").is_file():
                continue
            try:
                manifest = read_manifest(entry / "manifest.json", trusted_keys)
            except ManifestError as err:
                log.warning("not allowing %s: %s", entry.name, err)
                continue
            found[bytes.fromhex(manifest.info_hash)] = manifest.num_pieces
    return found


def wall_clock() -> float:
    """Epoch seconds: the only clock that means the same after a restart and in
    another tracker process sharing the Redis store (what is stored, never a
    deadline)."""
    return time.time()  # noqa: TID251


def monotonic_clock() -> float:
    """The clock of every deadline in the process (the event loop's clock too)."""
    return time.monotonic()  # noqa: TID251


class _SwarmCollector(Collector):
    """Swarm sizes, read from the core when Prometheus scrapes."""

    def __init__(self, core: TrackerCore) -> None:
        self.core = core

    def collect(self) -> Iterable[GaugeMetricFamily]:
        peers = GaugeMetricFamily(
            "pressrun_tracker_swarm_peers", "Active peers per swarm", labels=["info_hash", "role"]
        )
        swarms = GaugeMetricFamily("pressrun_tracker_swarms", "Swarms the tracker knows")
        total = GaugeMetricFamily(
            "pressrun_tracker_peers", "Active peers over all swarms", labels=["role"]
        )
        hashes = self.core.info_hashes()
        counted = [(self.core.counts(h)[:2], h) for h in hashes]
        # Bounded labels: only the largest swarms get a series of their own.
        largest = sorted(counted, key=lambda c: (-(c[0][0] + c[0][1]), c[1]))
        for (seeds, leechers), info_hash in largest[:MAX_METRIC_SWARMS]:
            peers.add_metric([info_hash.hex(), "seed"], seeds)
            peers.add_metric([info_hash.hex(), "leecher"], leechers)
        total.add_metric(["seed"], sum(c[0][0] for c in counted))
        total.add_metric(["leecher"], sum(c[0][1] for c in counted))
        swarms.add_metric([], len(hashes))
        return [peers, total, swarms]


class TrackerMetrics:
    """The tracker's Prometheus metrics, in a registry of its own."""

    def __init__(self, core: TrackerCore) -> None:
        self.registry = CollectorRegistry()
        self.announces = Counter(
            "pressrun_tracker_announces",
            "Announces answered, by event",
            ["event"],
            registry=self.registry,
        )
        self.failures = Counter(
            "pressrun_tracker_failures",
            "Requests answered with a failure reason, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.scrapes = Counter(
            "pressrun_tracker_scrapes", "Scrapes answered", registry=self.registry
        )
        self.expired = Counter(
            "pressrun_tracker_expired_peers", "Peers expired after the TTL", registry=self.registry
        )
        self.left = Counter(
            "pressrun_tracker_left_peers",
            "Peers that left (stopped or expired), by rule",
            ["rule"],
            registry=self.registry,
        )
        self.registry.register(_SwarmCollector(core))


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


class TrackerService:
    """The tracker over HTTP: feeds the core, persists what it returns, one timer."""

    def __init__(
        self,
        core: TrackerCore,
        store: TrackerStore,
        *,
        clock: Callable[[], float] = wall_clock,
        monotonic: Callable[[], float] = monotonic_clock,
        security: ServiceSecurity | None = None,
        content_dirs: Sequence[Path] = (),
        trusted_keys: Collection[bytes] | None = None,
        rescan_s: float = 10.0,
    ) -> None:
        """``clock``: wall-clock seconds, for what is stored (and the ring);
        ``monotonic``: the core's clock, the one timers are armed on (the event loop's,
        or one that advances with it). ``security``: TLS and the operator token.
        ``content_dirs``: folders of
        signed bundles whose info-hashes form the allowlist (re-read every
        ``rescan_s``), verified with ``trusted_keys``; with any, the core becomes an
        allowlisting one."""
        self.core = core
        self.store = store
        self.clock = clock
        self.monotonic = monotonic
        self.security = security or ServiceSecurity()
        self.content_dirs = tuple(content_dirs)
        self.trusted_keys = trusted_keys
        self.rescan_s = rescan_s
        self._rescan_task: asyncio.Task[None] | None = None
        self.metrics = TrackerMetrics(core)
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresh_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        # (the ring's piece counts: the published torrents', filled by `_scan`)
        self.piece_counts: dict[str, int] = {}
        self.ring = RingAdmin(
            expected_supernodes=core.config.ring_supernodes,
            published_pieces=self.piece_counts.get,
        )
        # the ring lists live beside the peer records (two instances on one Redis share
        # them; SQLite keeps them across a restart)
        self.ring_store: RingStore | None = None
        if isinstance(store, SqliteStore):
            self.ring_store = SqliteRingStore(store.path)
        elif isinstance(store, RedisStore):
            self.ring_store = RedisRingStore(store.url, prefix=store.prefix)

    # -- life cycle ---------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(
            middlewares=[operator_middleware(self.security.operator_token, OPERATOR_ROUTES)]
        )
        app.router.add_get("/announce", self.announce)
        app.router.add_get("/scrape", self.scrape)
        app.router.add_get("/v1/swarms", self.swarms)
        app.router.add_get("/v1/swarms/{info_hash}", self.swarm)
        app.router.add_get("/v1/swarms/{info_hash}/needed", self.needed)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", self.healthz)
        # the Chord ring's administration, for published issues only
        add_ring_routes(
            app,
            self.ring,
            self.clock,
            self.core.is_allowed,
            self.ring_store,
            monotonic=self.monotonic,  # (the ring's deadlines; the store keeps wall time)
        )
        # the WebTorrent (WebSocket) tracker beside /announce: browsers and WebRTC peers
        add_webtorrent_routes(app, self)
        app.router.add_get("/v1/allowed", self.allowed)
        app.router.add_put("/v1/allowed/{info_hash}", self.allow)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Load state, listen, and answer the port actually bound."""
        opener = getattr(self.store, "open", None)
        if opener is not None:
            await opener()
        stored = await self.store.load_all()
        totals = await self.store.load_totals()
        now = self.monotonic()
        self.core.restore([self._live(r, now) for r in stored], now=now, totals=totals)
        await self._restore_allowed()
        if self.content_dirs:
            self.core.allow(await self._scan())
            self._rescan_task = asyncio.get_running_loop().create_task(self._rescan_loop())
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
        # The port actually bound (the one asked for, or the kernel's pick for 0).
        bound: int = self._runner.addresses[0][1]
        self._rearm()
        if self.store.shared:
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_loop())
        return bound

    async def close(self) -> None:
        """Stop answering, then flush the store and close it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in (self._refresh_task, self._rescan_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.close()
        if self.ring_store is not None:
            await self.ring_store.close()

    async def _refresh_loop(self) -> None:
        """Shared store: read every swarm changed since the last refresh, each
        interval, so this instance also expires peers that only ever talked to an
        instance that has since died."""
        while True:
            await asyncio.sleep(self.core.config.interval_s)
            try:
                await self._reload_all()
                await self._restore_allowed()  # what other instances were told
                self._rearm()
            except Exception:  # keep refreshing; Redis may come back
                log.exception("refreshing swarms from the shared store failed")

    # -- the clocks of the core and of the store -------------------------------------

    def _live(self, stored: PeerRecord, now: float) -> PeerRecord:
        return live_record(
            stored, now=now, wall_now=self.clock(), record_ttl_s=self.core.config.record_ttl_s
        )

    def _stored(self, records: Sequence[PeerRecord]) -> list[PeerRecord]:
        now, wall = self.monotonic(), self.clock()
        return [stored_record(r, now=now, wall_now=wall) for r in records]

    def _stored_events(self, events: Sequence[TrackerEvent]) -> list[TrackerEvent]:
        now, wall = self.monotonic(), self.clock()
        return [stored_event(e, now=now, wall_now=wall) for e in events]

    def _adopt(self, info_hash: bytes, stored: Sequence[PeerRecord], *, whole: bool) -> None:
        """Records read from the shared store into the core: one the core holds
        unchanged keeps the core's copy (and its times); the others are heard now."""
        now = self.monotonic()
        adopted = []
        for r in stored:
            mine = self.core.record(info_hash, r.peer_key)
            if mine is not None and same_change(mine, r):
                adopted.append(mine)
            else:
                adopted.append(self._live(r, now))
        if whole:
            self.core.load_swarm(info_hash, adopted)
        else:
            self.core.merge_swarm(info_hash, adopted)

    async def _load_swarm(self, info_hash: bytes) -> None:
        """Bring one swarm up to date from the shared store (what changed only)."""
        store = self.store
        if isinstance(store, RedisStore):
            whole, changed = await store.load_changes(info_hash)
            self._adopt(info_hash, changed, whole=whole)
        else:
            self._adopt(info_hash, await store.load_swarm(info_hash), whole=True)

    def _forget_in_store(self) -> None:
        """Hand the store what the core forgot (records and whole swarms)."""
        records, swarms = self.core.drain_forgotten()
        if records or swarms:
            self._spawn(self._persist_forgotten(records, swarms))

    async def _persist_forgotten(self, records: list[PeerRecord], swarms: list[bytes]) -> None:
        try:
            await self.store.forget(records, swarms)
        except Exception:
            # the records stay in the store; the next start forgets them again
            log.exception("forgetting %d records in the store failed", len(records))

    async def _restore_allowed(self) -> None:
        """Add the info-hashes operators added before (kept by the store), unless this
        tracker is open: an operator who starts it with ``--allow-any`` gets an open
        tracker whatever an earlier run was told."""
        if self.core.allowlist is None:
            return
        added = self.core.allow(await self.store.load_allowed())
        if added:
            log.info("allowlist: %d info-hash(es) added by operators before", added)

    async def _scan(self) -> dict[bytes, int]:
        found = await asyncio.to_thread(published_info_hashes, self.content_dirs, self.trusted_keys)
        self.piece_counts.update((h.hex(), n) for h, n in found.items())
        return found

    async def _rescan_loop(self) -> None:
        """Allow issues published after start-up (new bundles in the content dirs)."""
        while True:
            await asyncio.sleep(self.rescan_s)
            try:
                added = self.core.allow(await self._scan())
            except Exception:
                log.exception("re-reading the published issues failed")
                continue
            if added:
                log.info("allowlist: %d newly published issue(s)", added)

    async def _reload_all(self) -> None:
        store = self.store
        if isinstance(store, RedisStore):
            for info_hash in await store.changed_swarms():
                await self._load_swarm(info_hash)
            return
        by_swarm: dict[bytes, list[PeerRecord]] = {}
        for record in await store.load_all():
            by_swarm.setdefault(record.info_hash, []).append(record)
        for info_hash, records in by_swarm.items():
            self._adopt(info_hash, records, whole=True)

    # -- timer --------------------------------------------------------------------

    def _rearm(self) -> None:
        deadline = self.core.next_deadline()
        if deadline is None:
            return
        if self._armed_for is not None and self._armed_for <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, deadline - self.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)
        self._armed_for = deadline

    def _on_timer(self) -> None:
        self._timer = None
        self._armed_for = None
        try:
            expired = self.core.handle_timer(now=self.monotonic())
            if expired:
                self._spawn(self._persist_expired(expired))
            self._forget_in_store()
        except Exception:
            # The timer is the only thing that expires peers: it must outlive any bug.
            log.exception("the tracker's timer failed; it goes on")
        finally:
            self._rearm()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _persist_expired(self, expired: list[PeerExpired]) -> None:
        self.metrics.expired.inc(len(expired))
        self.metrics.left.labels("expired").inc(len(expired))
        try:
            refused = await self.store.save(
                self._stored([e.record for e in expired]),
                self._stored_events([e.logged for e in expired]),
            )
            # Another instance saw these peers more recently: adopt its view instead.
            for info_hash in {r.info_hash for r in refused}:
                self._adopt(info_hash, await self.store.load_swarm(info_hash), whole=True)
        except Exception:
            # SQLite keeps the queue for the next flush; with Redis the next refresh
            # or announce reloads the swarm and the peer expires again.
            log.exception("saving %d expired peers failed", len(expired))
        self._rearm()

    # -- handlers -----------------------------------------------------------------

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
            handled = await self._handle_announce(req, remote)
        except Exception:
            log.exception("announce failed")
            return self._failure("internal", "tracker error; try again later")
        self.metrics.announces.labels(req.event.value or "none").inc()
        if req.event is AnnounceEvent.STOPPED and handled.record.leave_rule is not None:
            self.metrics.left.labels(handled.record.leave_rule.value).inc()
        return web.Response(body=encode_announce_reply(handled.reply), content_type=BENCODE_TYPE)

    async def _handle_announce(self, req: AnnounceRequest, remote: str) -> AnnounceHandled:
        store = self.store
        if isinstance(store, SqliteStore):
            # The core is the truth; the store copies it behind (fast path, no await).
            handled = self.core.handle_announce(req, remote=remote, now=self.monotonic())
            logged: list[TrackerEvent] = [handled.logged] if handled.logged else []
            store.queue(self._stored([handled.record]), self._stored_events(logged))
            self._forget_in_store()  # a dead swarm evicted for this one
            self._rearm()
            return handled
        whole = False
        for _attempt in range(3):
            if whole:
                self._adopt(req.info_hash, await store.load_swarm(req.info_hash), whole=True)
            else:
                await self._load_swarm(req.info_hash)
            handled = self.core.handle_announce(req, remote=remote, now=self.monotonic())
            logged = [handled.logged] if handled.logged else []
            refused = await store.save(self._stored([handled.record]), self._stored_events(logged))
            self._forget_in_store()
            if not refused:
                self._rearm()
                return handled
            whole = True  # lost a race: read the swarm whole before trying again
        raise RuntimeError("announce lost three races for the same peer record")

    async def scrape(self, request: web.Request) -> web.Response:
        """``GET /scrape`` (BEP 48): the named swarms, or every swarm."""
        try:
            hashes = parse_scrape_query(self._raw_query(request))
        except QueryError as err:
            return self._failure(err.code.value, err.reason)
        try:
            hashes = tuple(h for h in hashes if self.core.is_allowed(h))
            if self.store.shared:
                if hashes:
                    for info_hash in hashes:
                        await self._load_swarm(info_hash)
                else:
                    await self._reload_all()
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

    async def swarms(self, request: web.Request) -> web.Response:
        """``GET /v1/swarms[?peers=0]``: every swarm, with its peers unless peers=0."""
        if self.store.shared:
            try:
                await self._reload_all()
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
        if self.store.shared:
            try:
                await self._load_swarm(info_hash)
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
        await self.store.add_allowed(info_hash)  # kept first: a restart keeps it
        added = self.core.allow([info_hash])
        log.info("allowlist: %s added by the operator API", info_hash.hex())
        return web.json_response({"info_hash": info_hash.hex(), "added": bool(added)})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: ok."""
        return web.Response(text="ok")


def same_change(mine: PeerRecord, stored: PeerRecord) -> bool:
    """Whether the core's record is the stored one (times aside: they are in two
    clocks). The version alone is not enough: an instance that expired a peer while
    the store was out of reach holds a version the store may have given to another
    instance's announce of the same peer."""
    return (
        mine.version == stored.version
        and mine.active == stored.active
        and mine.left == stored.left
        and mine.leave_rule == stored.leave_rule
        and mine.session_uploaded == stored.session_uploaded
        and mine.session_downloaded == stored.session_downloaded
        and mine.uploaded_total == stored.uploaded_total
        and mine.downloaded_total == stored.downloaded_total
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


async def serve(
    config: TrackerConfig,
    store: TrackerStore,
    *,
    host: str,
    port: int,
    seed: int | None = None,
    ready: Callable[[int], None] | None = None,
    security: ServiceSecurity | None = None,
    content_dirs: Sequence[Path] = (),
    trusted_keys: Collection[bytes] | None = None,
    allowed: Iterable[bytes] | None = None,
) -> None:
    """Run the tracker until SIGTERM or SIGINT, then flush and exit cleanly.

    ``allowed`` None and no ``content_dirs``: an open tracker (any info-hash)."""
    core = TrackerCore(config, random.Random(seed), allowed=allowed)
    service = TrackerService(
        core, store, security=security, content_dirs=content_dirs, trusted_keys=trusted_keys
    )
    # the handlers first: a signal right after the "listening" line is a clean stop
    with stop_signals() as stopped:
        bound = await service.start(host, port)
        if ready is not None:
            ready(bound)
        try:
            await stopped.wait()
        finally:
            log.info("tracker stopping: flushing the store")
            await service.close()
