"""The tracker's SQLite store: ``SqliteStore``, one file in WAL mode (default
``tracker.db``), kept across restarts, for one tracker process.

The core in memory is the truth and the file its write-behind copy: ``save`` only
queues, and a flush every ``flush_interval_s`` (default 0.1 s) writes every changed
record and the event log in one transaction with ``synchronous=NORMAL``. Trade-off:
a crash of the process (SIGKILL, power loss) loses at most the last flush interval of
announces; a SIGTERM flushes first and loses nothing. Peers re-announce every
interval and their counters are cumulative, so what a crash loses comes back with
their next announce, except events such as ``stopped`` of peers that then left.
The info-hashes an operator adds with ``PUT /v1/allowed/<hex>`` go to the table
``allowed`` at once (committed before the answer: they are rare and a publisher
counts on them).

Pruning: the core forgets a record ``record_ttl_s`` after it left; ``forget`` deletes it
from the store and adds its bytes, completions and leave rule to the swarm's totals
(table ``swarm_totals``), so the file holds the peers of the last hour and a row of
totals per swarm, not every peer ever seen. A swarm forgotten whole (its last record,
or evicted for a new one) loses its rows, totals and events. Events older than
``event_ttl_s`` (a week) are deleted at most once a minute.

The protocol it implements, and the conversions of times between the core's clock
and the stored wall-clock seconds, are in `pressrun.tracker.store`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pressrun.security import private_file
from pressrun.tracker.events import AddressFamily, LeaveRule, PeerRecord, TrackerEvent
from pressrun.tracker.store import wall_clock
from pressrun.tracker.swarm import ForgottenTotals

log = logging.getLogger(__name__)

RecordKey = tuple[bytes, bytes, AddressFamily]

#: events older than this are deleted from the store's log (a week)
EVENT_TTL_S = 7 * 86400.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS peers (
    info_hash BLOB NOT NULL,
    peer_id BLOB NOT NULL,
    family INTEGER NOT NULL,
    ip TEXT NOT NULL,
    port INTEGER NOT NULL,
    left_bytes INTEGER NOT NULL,
    uploaded_total INTEGER NOT NULL,
    downloaded_total INTEGER NOT NULL,
    session_uploaded INTEGER NOT NULL,
    session_downloaded INTEGER NOT NULL,
    session_key TEXT,
    active INTEGER NOT NULL,
    session_stopped INTEGER NOT NULL,
    completed_count INTEGER NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    leave_rule TEXT,
    left_at REAL,
    version INTEGER NOT NULL,
    PRIMARY KEY (info_hash, peer_id, family)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    info_hash BLOB NOT NULL,
    peer_id BLOB NOT NULL,
    family INTEGER NOT NULL,
    event TEXT NOT NULL,
    uploaded_total INTEGER NOT NULL,
    downloaded_total INTEGER NOT NULL,
    left_bytes INTEGER NOT NULL,
    leave_rule TEXT
);
CREATE INDEX IF NOT EXISTS events_by_swarm ON events (info_hash, at);
CREATE INDEX IF NOT EXISTS events_by_time ON events (at);
CREATE TABLE IF NOT EXISTS allowed (
    info_hash BLOB PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS swarm_totals (
    info_hash BLOB PRIMARY KEY,
    peers INTEGER NOT NULL,
    uploaded INTEGER NOT NULL,
    downloaded INTEGER NOT NULL,
    completed INTEGER NOT NULL,
    left_by_rule TEXT NOT NULL
) WITHOUT ROWID;
"""

_COLUMNS = (
    "info_hash, peer_id, family, ip, port, left_bytes, uploaded_total, downloaded_total, "
    "session_uploaded, session_downloaded, session_key, active, session_stopped, "
    "completed_count, first_seen, last_seen, leave_rule, left_at, version"
)


def _record_row(r: PeerRecord) -> tuple[object, ...]:
    return (
        r.info_hash,
        r.peer_id,
        r.family.value,
        r.ip,
        r.port,
        r.left,
        r.uploaded_total,
        r.downloaded_total,
        r.session_uploaded,
        r.session_downloaded,
        r.session_key,
        int(r.active),
        int(r.session_stopped),
        r.completed_count,
        r.first_seen,
        r.last_seen,
        r.leave_rule.value if r.leave_rule else None,
        r.left_at,
        r.version,
    )


def _row_record(row: Sequence[Any]) -> PeerRecord:
    return PeerRecord(
        info_hash=bytes(row[0]),
        peer_id=bytes(row[1]),
        family=AddressFamily(row[2]),
        ip=row[3],
        port=row[4],
        left=row[5],
        uploaded_total=row[6],
        downloaded_total=row[7],
        session_uploaded=row[8],
        session_downloaded=row[9],
        session_key=row[10],
        active=bool(row[11]),
        session_stopped=bool(row[12]),
        completed_count=row[13],
        first_seen=row[14],
        last_seen=row[15],
        leave_rule=LeaveRule(row[16]) if row[16] else None,
        left_at=row[17],
        version=row[18],
    )


def _totals_of(row: Sequence[Any]) -> ForgottenTotals:
    rules = json.loads(row[4])
    return ForgottenTotals(
        peers=row[0],
        uploaded_bytes=row[1],
        downloaded_bytes=row[2],
        completed=row[3],
        left_by_rule=tuple(sorted((str(k), int(v)) for k, v in rules.items())),
    )


def _totals_row(t: ForgottenTotals) -> tuple[object, ...]:
    rules = json.dumps(dict(t.left_by_rule), sort_keys=True)
    return (t.peers, t.uploaded_bytes, t.downloaded_bytes, t.completed, rules)


def _event_row(e: TrackerEvent) -> tuple[object, ...]:
    return (
        e.at,
        e.info_hash,
        e.peer_id,
        e.family.value,
        e.event,
        e.uploaded_total,
        e.downloaded_total,
        e.left,
        e.leave_rule.value if e.leave_rule else None,
    )


class SqliteStore:
    """Records in one SQLite file (WAL, synchronous=NORMAL), written behind.

    All SQLite calls run on one worker thread, so the event loop never waits on the
    disk. ``save`` queues; a flush is scheduled ``flush_interval_s`` after the first
    queued change, and ``flush``/``close`` write whatever is queued.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        flush_interval_s: float = 0.1,
        event_ttl_s: float = EVENT_TTL_S,
        clock: Callable[[], float] = wall_clock,
    ) -> None:
        """``event_ttl_s``: how long the event log keeps an event (wall-clock age, by
        ``clock``: a step of it prunes early or late, and the log is all it touches)."""
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        self.event_ttl_s = event_ttl_s
        self.clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracker-sqlite")
        self._db: sqlite3.Connection | None = None
        self._dirty: dict[RecordKey, PeerRecord] = {}
        self._events: list[TrackerEvent] = []
        self._forget: dict[tuple[RecordKey, int], PeerRecord] = {}
        self._forget_swarms: set[bytes] = set()
        self._pruned_at = float("-inf")  # the event loop's time of the last prune
        self._flush_handle: asyncio.TimerHandle | None = None
        self._flush_lock = asyncio.Lock()
        self._flush_tasks: set[asyncio.Task[None]] = set()
        self.flushes = 0

    @property
    def shared(self) -> bool:
        """SQLite belongs to one tracker process."""
        return False

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> None:
        # readers' addresses, ports and peer ids: the owner's alone (0600, as every
        # service's state; SQLite gives its -wal/-shm files the database's mode)
        private_file(self.path)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        self._db = db

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._open()
        assert self._db is not None
        return self._db

    async def open(self) -> None:
        """Create the file and tables if needed."""
        await self._run(self._conn)

    def _select(self, where: str, args: tuple[object, ...]) -> list[PeerRecord]:
        rows = self._conn().execute(f"SELECT {_COLUMNS} FROM peers {where}", args).fetchall()
        return [_row_record(row) for row in rows]

    async def load_all(self) -> list[PeerRecord]:
        """Every stored record (queued changes included)."""
        stored: list[PeerRecord] = await self._run(self._select, "", ())
        return self._overlay(stored, None)

    async def load_swarm(self, info_hash: bytes) -> list[PeerRecord]:
        """One swarm's stored records (queued changes included)."""
        stored: list[PeerRecord] = await self._run(
            self._select, "WHERE info_hash = ?", (info_hash,)
        )
        return self._overlay(stored, info_hash)

    def _overlay(self, stored: list[PeerRecord], info_hash: bytes | None) -> list[PeerRecord]:
        merged = {(r.info_hash, r.peer_id, r.family): r for r in stored}
        for key, record in self._dirty.items():
            if info_hash is None or key[0] == info_hash:
                merged[key] = record
        return list(merged.values())

    async def load_allowed(self) -> set[bytes]:
        """The operator-added info-hashes (table ``allowed``)."""

        def select() -> set[bytes]:
            rows = self._conn().execute("SELECT info_hash FROM allowed").fetchall()
            return {bytes(row[0]) for row in rows}

        allowed: set[bytes] = await self._run(select)
        return allowed

    async def add_allowed(self, info_hash: bytes) -> None:
        """Insert into ``allowed``, committed at once (autocommit)."""

        def insert() -> None:
            self._conn().execute(
                "INSERT OR IGNORE INTO allowed (info_hash) VALUES (?)", (info_hash,)
            )

        await self._run(insert)

    async def load_events(self, info_hash: bytes) -> list[TrackerEvent]:
        """The event log of one swarm, oldest first (after a flush)."""
        await self.flush()

        def select() -> list[TrackerEvent]:
            rows = (
                self._conn()
                .execute(
                    "SELECT at, info_hash, peer_id, family, event, uploaded_total, "
                    "downloaded_total, left_bytes, leave_rule FROM events "
                    "WHERE info_hash = ? ORDER BY id",
                    (info_hash,),
                )
                .fetchall()
            )
            return [
                TrackerEvent(
                    at=r[0],
                    info_hash=bytes(r[1]),
                    peer_id=bytes(r[2]),
                    family=AddressFamily(r[3]),
                    event=r[4],
                    uploaded_total=r[5],
                    downloaded_total=r[6],
                    left=r[7],
                    leave_rule=LeaveRule(r[8]) if r[8] else None,
                )
                for r in rows
            ]

        result: list[TrackerEvent] = await self._run(select)
        return result

    async def load_totals(self) -> dict[bytes, ForgottenTotals]:
        """The totals of forgotten records, by swarm (table ``swarm_totals``)."""

        def select() -> dict[bytes, ForgottenTotals]:
            rows = (
                self._conn()
                .execute(
                    "SELECT info_hash, peers, uploaded, downloaded, completed, left_by_rule "
                    "FROM swarm_totals"
                )
                .fetchall()
            )
            return {bytes(r[0]): _totals_of(r[1:]) for r in rows}

        totals: dict[bytes, ForgottenTotals] = await self._run(select)
        return totals

    async def counts(self) -> dict[str, int]:
        """Rows per table (for tests and the bench: the file stays bounded)."""

        def count() -> dict[str, int]:
            db = self._conn()
            return {
                table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("peers", "events", "swarm_totals")
            }

        await self.flush()
        counted: dict[str, int] = await self._run(count)
        return counted

    async def save(
        self, records: Sequence[PeerRecord], events: Sequence[TrackerEvent] = ()
    ) -> list[PeerRecord]:
        """Queue records and events; nothing is refused (one writer)."""
        self.queue(records, events)
        return []

    async def forget(self, records: Sequence[PeerRecord], swarms: Sequence[bytes] = ()) -> None:
        """Queue the deletion of forgotten records (folded into ``swarm_totals``) and
        of whole swarms; written with the next flush."""
        for record in records:
            key = (record.info_hash, record.peer_id, record.family)
            queued = self._dirty.get(key)
            if queued is not None and queued.version <= record.version:
                del self._dirty[key]  # not written yet: nothing to write
            self._forget[(key, record.version)] = record
        self._forget_swarms.update(swarms)
        for info_hash in swarms:
            self._dirty = {k: r for k, r in self._dirty.items() if k[0] != info_hash}
            self._forget = {k: r for k, r in self._forget.items() if k[0][0] != info_hash}
        self._schedule()

    def queue(self, records: Sequence[PeerRecord], events: Sequence[TrackerEvent] = ()) -> None:
        """Queue without awaiting (the announce path's fast form of ``save``)."""
        for record in records:
            self._dirty[(record.info_hash, record.peer_id, record.family)] = record
        self._events.extend(events)
        self._schedule()

    def _pending(self) -> bool:
        return bool(self._dirty or self._events or self._forget or self._forget_swarms)

    def _schedule(self) -> None:
        if self._flush_handle is None and self._pending():
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self.flush_interval_s, self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_handle = None
        task = asyncio.get_running_loop().create_task(self._flush_or_retry())
        self._flush_tasks.add(task)
        task.add_done_callback(self._flush_tasks.discard)

    async def _flush_or_retry(self) -> None:
        """A scheduled flush: one that fails (the disk full, the file locked) is logged
        and tried again, whether or not anything else is queued meanwhile."""
        try:
            await self.flush()
        except Exception:
            retry_s = max(1.0, self.flush_interval_s)
            log.exception(
                "writing the tracker's records to %s failed; again in %.0f s", self.path, retry_s
            )
            if self._flush_handle is None and self._pending():
                loop = asyncio.get_running_loop()
                self._flush_handle = loop.call_later(retry_s, self._flush_soon)

    def _write(
        self,
        rows: list[tuple[object, ...]],
        events: list[tuple[object, ...]],
        forgets: list[PeerRecord],
        swarms: list[bytes],
        prune_before: float | None,
    ) -> None:
        db = self._conn()
        db.execute("BEGIN")
        try:
            for info_hash in swarms:
                for table in ("peers", "events", "swarm_totals"):
                    db.execute(f"DELETE FROM {table} WHERE info_hash = ?", (info_hash,))
            # The core is the truth here: every record it forgot is folded in, written
            # or not (one written after its forgetting is a newer version, kept).
            added: dict[bytes, ForgottenTotals] = {}
            for r in forgets:
                db.execute(
                    "DELETE FROM peers WHERE info_hash = ? AND peer_id = ? AND family = ? "
                    "AND version <= ?",
                    (r.info_hash, r.peer_id, r.family.value, r.version),
                )
                added[r.info_hash] = added.get(r.info_hash, ForgottenTotals()).plus(r)
            for info_hash, more in added.items():
                row = db.execute(
                    "SELECT peers, uploaded, downloaded, completed, left_by_rule "
                    "FROM swarm_totals WHERE info_hash = ?",
                    (info_hash,),
                ).fetchone()
                total = more if row is None else _totals_of(row) + more
                db.execute(
                    "INSERT OR REPLACE INTO swarm_totals (info_hash, peers, uploaded, "
                    "downloaded, completed, left_by_rule) VALUES (?, ?, ?, ?, ?, ?)",
                    (info_hash, *_totals_row(total)),
                )
            if prune_before is not None:
                db.execute("DELETE FROM events WHERE at < ?", (prune_before,))
            marks = ", ".join("?" * 19)
            db.executemany(f"INSERT OR REPLACE INTO peers ({_COLUMNS}) VALUES ({marks})", rows)
            db.executemany(
                "INSERT INTO events (at, info_hash, peer_id, family, event, uploaded_total, "
                "downloaded_total, left_bytes, leave_rule) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                events,
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def flush(self) -> None:
        """Write every queued change in one transaction."""
        async with self._flush_lock:
            now = asyncio.get_running_loop().time()
            prune = now - self._pruned_at >= 60.0
            if not self._pending() and not prune:
                return
            dirty, self._dirty = self._dirty, {}
            events, self._events = self._events, []
            forgets, self._forget = self._forget, {}
            swarms, self._forget_swarms = self._forget_swarms, set()
            rows = [_record_row(r) for r in dirty.values()]
            prune_before = self.clock() - self.event_ttl_s if prune else None
            try:
                await self._run(
                    self._write,
                    rows,
                    [_event_row(e) for e in events],
                    list(forgets.values()),
                    sorted(swarms),
                    prune_before,
                )
            except BaseException:
                # Keep what failed queued (newer changes win) so a later flush retries.
                for key, record in dirty.items():
                    self._dirty.setdefault(key, record)
                self._events[:0] = events
                for fkey, record in forgets.items():
                    self._forget.setdefault(fkey, record)
                self._forget_swarms |= swarms
                raise
            if prune:
                self._pruned_at = now
            self.flushes += 1

    async def close(self) -> None:
        """Flush what is queued and close the file."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        await self.flush()
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)
