"""What the tracker's stores share: the ``TrackerStore`` protocol, the record's JSON
codec and the conversions between the core's clock and the stored one.

The adapter (`pressrun.tracker.aio`) talks to ``TrackerStore``. Two implementations:

- ``SqliteStore`` (`pressrun.tracker.sqlite_store`): one file in WAL mode, written
  behind, for one tracker process.
- ``RedisStore`` (`pressrun.tracker.redis_store`): records in Redis shared by every
  tracker instance (``shared`` is true); it keeps records as ``record_to_json``.

Time: stores keep wall-clock epoch seconds (they outlive the process and, with Redis,
are read by other processes); the core's records carry monotonic seconds.
``stored_record`` and ``live_record`` convert, and ``live_record`` never compares a
stored time with the wall clock to decide that a peer is gone: an active peer read
back is heard at the time it was read (issue 24: a step of the wall clock expired
every peer at once).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from pressrun.tracker.events import AddressFamily, LeaveRule, PeerRecord, TrackerEvent
from pressrun.tracker.swarm import ForgottenTotals


def wall_clock() -> float:
    """Epoch seconds, for what the stores keep (never for a deadline)."""
    return time.time()  # noqa: TID251


def stored_record(record: PeerRecord, *, now: float, wall_now: float) -> PeerRecord:
    """``record`` (times in the core's monotonic clock, ``now``) with its times as
    wall-clock epoch seconds, for a store."""
    shift = wall_now - now
    return replace(
        record,
        first_seen=record.first_seen + shift,
        last_seen=record.last_seen + shift,
        left_at=None if record.left_at is None else record.left_at + shift,
    )


def live_record(
    stored: PeerRecord, *, now: float, wall_now: float, record_ttl_s: float
) -> PeerRecord:
    """A record read from a store, with its times in the core's clock (``now``).

    An active peer is heard ``now``: it gets a full TTL whatever the wall clock says
    (it may have been stepped, or the tracker down). A record that left keeps its age
    since leaving, bounded to [0, ``record_ttl_s``]: a clock step forgets it early or
    late by at most that, and its totals stay either way.
    """
    age_left = 0.0
    if stored.left_at is not None:
        age_left = min(max(wall_now - stored.left_at, 0.0), record_ttl_s)
    first_age = max(wall_now - stored.first_seen, 0.0)
    return replace(
        stored,
        first_seen=now - first_age,
        last_seen=now if stored.active else now - age_left,
        left_at=None if stored.left_at is None else now - age_left,
    )


def stored_event(event: TrackerEvent, *, now: float, wall_now: float) -> TrackerEvent:
    """An event stamped in the core's clock, restamped in wall-clock seconds."""
    return replace(event, at=event.at + (wall_now - now))


class TrackerStore(Protocol):
    """Persistence of peer records and the event log."""

    @property
    def shared(self) -> bool:
        """True when other processes write the same records (reload before deciding)."""
        ...

    async def load_all(self) -> list[PeerRecord]:
        """Every record of every swarm."""
        ...

    async def load_swarm(self, info_hash: bytes) -> list[PeerRecord]:
        """Every record of one swarm."""
        ...

    async def save(
        self, records: Sequence[PeerRecord], events: Sequence[TrackerEvent] = ()
    ) -> list[PeerRecord]:
        """Store records (and log events); answer the records refused as stale."""
        ...

    async def flush(self) -> None:
        """Make everything saved so far durable (a no-op where saves are immediate)."""
        ...

    async def forget(self, records: Sequence[PeerRecord], swarms: Sequence[bytes] = ()) -> None:
        """Delete records the core forgot (unless the store holds a newer version),
        adding each one deleted to its swarm's totals; delete ``swarms`` whole."""
        ...

    async def load_totals(self) -> dict[bytes, ForgottenTotals]:
        """The totals of the records forgotten so far, by swarm."""
        ...

    async def load_allowed(self) -> set[bytes]:
        """The info-hashes operators added with ``PUT /v1/allowed`` (kept across restarts)."""
        ...

    async def add_allowed(self, info_hash: bytes) -> None:
        """Keep an operator-added info-hash (durable when this returns)."""
        ...

    async def close(self) -> None:
        """Flush and release the connection."""
        ...


def record_to_json(record: PeerRecord) -> dict[str, Any]:
    """A record as JSON-friendly values (bytes as hex)."""
    return {
        "info_hash": record.info_hash.hex(),
        "peer_id": record.peer_id.hex(),
        "family": record.family.value,
        "ip": record.ip,
        "port": record.port,
        "left": record.left,
        "uploaded_total": record.uploaded_total,
        "downloaded_total": record.downloaded_total,
        "session_uploaded": record.session_uploaded,
        "session_downloaded": record.session_downloaded,
        "session_key": record.session_key,
        "active": record.active,
        "session_stopped": record.session_stopped,
        "completed_count": record.completed_count,
        "first_seen": record.first_seen,
        "last_seen": record.last_seen,
        "leave_rule": record.leave_rule.value if record.leave_rule else None,
        "left_at": record.left_at,
        "version": record.version,
    }


def record_from_json(data: dict[str, Any]) -> PeerRecord:
    """The inverse of ``record_to_json``."""
    return PeerRecord(
        info_hash=bytes.fromhex(data["info_hash"]),
        peer_id=bytes.fromhex(data["peer_id"]),
        family=AddressFamily(data["family"]),
        ip=data["ip"],
        port=int(data["port"]),
        left=int(data["left"]),
        uploaded_total=int(data["uploaded_total"]),
        downloaded_total=int(data["downloaded_total"]),
        session_uploaded=int(data["session_uploaded"]),
        session_downloaded=int(data["session_downloaded"]),
        session_key=data["session_key"],
        active=bool(data["active"]),
        session_stopped=bool(data["session_stopped"]),
        completed_count=int(data["completed_count"]),
        first_seen=float(data["first_seen"]),
        last_seen=float(data["last_seen"]),
        leave_rule=LeaveRule(data["leave_rule"]) if data["leave_rule"] else None,
        left_at=data["left_at"],
        version=int(data["version"]),
    )
