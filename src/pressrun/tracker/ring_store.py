"""Where the tracker keeps each issue's ring list: beside its peer records.

The ring's administration (`pressrun.tracker.ring.RingAdmin`) decides; this keeps what
it decided (per issue: the piece count and, per supernode address, the ring id the
tracker placed it at and when it last registered, wall-clock seconds) in the
tracker's own store, so that

- two tracker instances on one Redis (``serve tracker --redis``) give every supernode
  and every peer the same list and place a newcomer knowing the others' supernodes
  (`RedisRingStore`: a hash ``<prefix>ring:<info-hash hex>``, one field per supernode
  address with ``[id hex, seen]`` as JSON, and ``num_pieces``);
- a restarted tracker on SQLite gives the supernodes their ids back
  (`SqliteRingStore`: the table ``ring_supernodes`` in the tracker's file).

Two instances placing two new supernodes at the same moment may each see the other's
list of just before: both newcomers then split the same arc (the ring stays correct,
only less balanced until one of them leaves).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from redis.exceptions import RedisError

from pressrun.security import private_file

#: what a store that does not answer raises (the routes answer 503 with Retry-After)
STORE_ERRORS: tuple[type[Exception], ...] = (RedisError, sqlite3.Error, OSError)
#: per supernode address: (ring id, last registration in wall-clock seconds)
Members = dict[str, tuple[int, float]]


class RingStore(Protocol):
    """Persistence of the issues' ring lists."""

    @property
    def shared(self) -> bool:
        """True when other tracker instances write the same lists (load before use)."""
        ...

    async def load(self, info_hash: str) -> tuple[int, Members] | None:
        """(num_pieces, members) of one issue's ring, None if it has none."""
        ...

    async def put(
        self, info_hash: str, num_pieces: int, address: str, node_id: int, seen: float
    ) -> None:
        """Add or refresh one supernode."""
        ...

    async def drop(self, info_hash: str, addresses: list[str]) -> None:
        """Take supernodes off the list (left, or silent too long)."""
        ...

    async def forget(self, info_hash: str) -> None:
        """Delete everything kept of one issue's ring (the administration forgot it)."""
        ...

    async def close(self) -> None:
        """Release the connection."""
        ...


class SqliteRingStore:
    """The ring lists in the tracker's SQLite file (its own connection and thread)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracker-ring")
        self._db: sqlite3.Connection | None = None

    @property
    def shared(self) -> bool:
        """One tracker process owns the file."""
        return False

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            private_file(self.path)  # supernode addresses: the owner's alone (0600)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS ring_supernodes (info_hash TEXT NOT NULL, "
                "address TEXT NOT NULL, node_id TEXT NOT NULL, seen REAL NOT NULL, "
                "num_pieces INTEGER NOT NULL, PRIMARY KEY (info_hash, address))"
            )
            self._db = db
        return self._db

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def load(self, info_hash: str) -> tuple[int, Members] | None:
        """(num_pieces, members), None if the issue has no supernode stored."""

        def select() -> list[tuple[str, str, float, int]]:
            return (
                self._conn()
                .execute(
                    "SELECT address, node_id, seen, num_pieces FROM ring_supernodes "
                    "WHERE info_hash = ?",
                    (info_hash,),
                )
                .fetchall()
            )

        rows: list[tuple[str, str, float, int]] = await self._run(select)
        if not rows:
            return None
        return rows[0][3], {a: (int(i, 16), float(s)) for a, i, s, _ in rows}

    async def put(
        self, info_hash: str, num_pieces: int, address: str, node_id: int, seen: float
    ) -> None:
        """Add or refresh one supernode."""
        await self._run(
            self._conn().execute,
            "INSERT OR REPLACE INTO ring_supernodes VALUES (?, ?, ?, ?, ?)",
            (info_hash, address, f"{node_id:040x}", seen, num_pieces),
        )

    async def drop(self, info_hash: str, addresses: list[str]) -> None:
        """Take supernodes off the list."""
        for address in addresses:
            await self._run(
                self._conn().execute,
                "DELETE FROM ring_supernodes WHERE info_hash = ? AND address = ?",
                (info_hash, address),
            )

    async def forget(self, info_hash: str) -> None:
        """Delete the issue's rows."""
        await self._run(
            self._conn().execute, "DELETE FROM ring_supernodes WHERE info_hash = ?", (info_hash,)
        )

    async def close(self) -> None:
        """Close the file."""
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)


class RedisRingStore:
    """The ring lists in Redis, shared by every tracker instance pointed at it."""

    def __init__(self, url: str, *, prefix: str = "pressrun:tracker:") -> None:
        import redis.asyncio as aioredis

        self.prefix = prefix
        self._redis: Any = aioredis.Redis.from_url(url)

    @property
    def shared(self) -> bool:
        """Other instances write the same lists."""
        return True

    def _key(self, info_hash: str) -> str:
        return f"{self.prefix}ring:{info_hash}"

    async def load(self, info_hash: str) -> tuple[int, Members] | None:
        """(num_pieces, members), None if the issue has no ring in Redis."""
        raw: dict[bytes, bytes] = await self._redis.hgetall(self._key(info_hash))
        pieces = raw.pop(b"num_pieces", None)
        if pieces is None:
            return None
        members: Members = {}
        for field, body in raw.items():
            node_hex, seen = json.loads(body)
            members[field.decode()[3:]] = (int(node_hex, 16), float(seen))
        return int(pieces), members

    async def put(
        self, info_hash: str, num_pieces: int, address: str, node_id: int, seen: float
    ) -> None:
        """Add or refresh one supernode (fields ``sn:<address>``)."""
        await self._redis.hset(
            self._key(info_hash),
            mapping={
                "num_pieces": num_pieces,
                f"sn:{address}": json.dumps([f"{node_id:040x}", seen]),
            },
        )

    async def drop(self, info_hash: str, addresses: list[str]) -> None:
        """Take supernodes off the list."""
        if addresses:
            await self._redis.hdel(self._key(info_hash), *(f"sn:{a}" for a in addresses))

    async def forget(self, info_hash: str) -> None:
        """Delete the issue's hash."""
        await self._redis.delete(self._key(info_hash))

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
