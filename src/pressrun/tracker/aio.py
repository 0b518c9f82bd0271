"""The tracker's asyncio service: ``TrackerService`` around ``TrackerCore``, its life
cycle, its one timer and the copy of the core in the store; ``serve`` runs it.

What it holds: start-up (load the store into the core, the allowlist, listen), close
(stop answering, flush the store), the timer that expires and forgets peers, the
reading of a shared store (a refresh every interval, what changed per swarm), the
persisting of what the core returns, the announce itself (``_handle_announce``, for
HTTP and the WebSocket alike) and the allowlist of published issues (``content_dirs``
of signed bundles, re-read every ``rescan_s``). With an allowlist (those bundles, or a
publisher's ``PUT /v1/allowed``), an announce for any other info-hash is refused and
creates nothing. ``make_app`` is the route table; the handlers are elsewhere:

- `pressrun.tracker.announce_http`: ``/announce`` (BEP 3/23), ``/scrape`` (BEP 48),
  ``/metrics``, ``/healthz``;
- `pressrun.tracker.operator_http`: the JSON API under ``/v1`` (swarms, the
  allowlist), with ``OPERATOR_ROUTES``, the ones the operator token guards;
- `pressrun.tracker.ring_http`: the Chord ring's administration;
- `pressrun.tracker.websocket`: the WebTorrent tracker.

The metrics are `pressrun.tracker.metrics`.

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
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from pressrun.content.bundle import read_manifest
from pressrun.content.codec import ManifestError, valid_issue_id
from pressrun.security import ServiceSecurity, operator_middleware
from pressrun.service import stop_signals
from pressrun.tracker.announce_http import AnnounceRoutes
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import AnnounceHandled, PeerExpired, TrackerCore
from pressrun.tracker.events import AnnounceRequest, PeerRecord, TrackerEvent
from pressrun.tracker.metrics import TrackerMetrics
from pressrun.tracker.operator_http import OPERATOR_ROUTES, OperatorRoutes
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
    wall_clock,
)
from pressrun.tracker.websocket import add_webtorrent_routes

log = logging.getLogger(__name__)


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


def monotonic_clock() -> float:
    """The clock of every deadline in the process (the event loop's clock too)."""
    return time.monotonic()  # noqa: TID251


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
        public = AnnounceRoutes(self)
        api = OperatorRoutes(self)
        app.router.add_get("/announce", public.announce)
        app.router.add_get("/scrape", public.scrape)
        app.router.add_get("/v1/swarms", api.swarms)
        app.router.add_get("/v1/swarms/{info_hash}", api.swarm)
        app.router.add_get("/v1/swarms/{info_hash}/needed", api.needed)
        app.router.add_get("/metrics", public.metrics_handler)
        app.router.add_get("/healthz", public.healthz)
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
        app.router.add_get("/v1/allowed", api.allowed)
        app.router.add_put("/v1/allowed/{info_hash}", api.allow)
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

    # -- the announce (over HTTP and the WebSocket) ---------------------------------

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
