"""The subscription service's SQLite database (default ``subscriptions.db``).

Three tables: ``subscribers`` (X25519 public key, name, when added), ``wraps`` (one
80-byte sealed content key per issue version and subscriber; deleted with their
subscriber) and ``settings`` (the token secret, made on first start, so tokens
survive a restart). Calls are synchronous and short; the service runs them on one
worker thread (:class:`SubscriptionStore` is not shared between threads at once).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from pressrun.security import private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS subscribers (
    public_key BLOB PRIMARY KEY,
    name TEXT NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS wraps (
    issue_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    public_key BLOB NOT NULL REFERENCES subscribers(public_key) ON DELETE CASCADE,
    wrap BLOB NOT NULL,
    PRIMARY KEY (issue_id, version, public_key)
);
CREATE INDEX IF NOT EXISTS wraps_by_key ON wraps(public_key);
CREATE TABLE IF NOT EXISTS settings (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
"""


@dataclass(frozen=True)
class Subscriber:
    """One subscriber as listed."""

    public_key: bytes
    name: str
    added_at: str

    def to_json(self) -> dict[str, str]:
        """The JSON of ``GET /v1/subscribers``."""
        return {"public_key": self.public_key.hex(), "name": self.name, "added_at": self.added_at}


class SubscriptionStore:
    """Subscribers and wraps in one SQLite file."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        private_file(self.path)  # names, keys and the token secret: owner only
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA foreign_keys = ON")
        if self.path != ":memory:":
            self.db.execute("PRAGMA journal_mode = WAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def token_secret(self) -> bytes:
        """The 32-byte token secret, made and stored on first use."""
        row = self.db.execute("SELECT value FROM settings WHERE name = 'token_secret'").fetchone()
        if row is not None:
            return bytes(row[0])
        secret = os.urandom(32)
        self.db.execute(
            "INSERT OR IGNORE INTO settings (name, value) VALUES ('token_secret', ?)", (secret,)
        )
        row = self.db.execute("SELECT value FROM settings WHERE name = 'token_secret'").fetchone()
        return bytes(row[0])

    def add_subscriber(
        self, public_key: bytes, name: str, added_at: str
    ) -> tuple[Subscriber, bool]:
        """Add a subscriber (or rename one); ``(subscriber, created)``."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute(
                "SELECT added_at FROM subscribers WHERE public_key = ?", (public_key,)
            ).fetchone()
            if row is None:
                self.db.execute(
                    "INSERT INTO subscribers (public_key, name, added_at) VALUES (?, ?, ?)",
                    (public_key, name, added_at),
                )
                return Subscriber(public_key, name, added_at), True
            self.db.execute(
                "UPDATE subscribers SET name = ? WHERE public_key = ?", (name, public_key)
            )
            return Subscriber(public_key, name, str(row[0])), False

    def remove_subscriber(self, public_key: bytes) -> int | None:
        """Remove a subscriber and all their wraps; the wraps deleted, None if unknown."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            (wraps,) = self.db.execute(
                "SELECT count(*) FROM wraps WHERE public_key = ?", (public_key,)
            ).fetchone()
            cur = self.db.execute("DELETE FROM subscribers WHERE public_key = ?", (public_key,))
            if cur.rowcount == 0:
                return None
            return int(wraps)

    def subscribers(self) -> list[Subscriber]:
        """Every subscriber, by name then key."""
        rows = self.db.execute(
            "SELECT public_key, name, added_at FROM subscribers ORDER BY name, public_key"
        ).fetchall()
        return [Subscriber(bytes(k), str(n), str(a)) for k, n, a in rows]

    def is_subscriber(self, public_key: bytes) -> bool:
        """True if ``public_key`` is a current subscriber."""
        row = self.db.execute(
            "SELECT 1 FROM subscribers WHERE public_key = ?", (public_key,)
        ).fetchone()
        return row is not None

    def put_wraps(
        self, issue_id: str, version: int, wraps: dict[bytes, bytes]
    ) -> tuple[int, list[bytes]]:
        """Replace the wraps of one issue version; ``(stored, skipped keys)``.

        Keys that are not subscribers (any more) are skipped, in one transaction with
        the check, so a subscriber removed meanwhile never gets a wrap stored.
        """
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            current = {bytes(k) for (k,) in self.db.execute("SELECT public_key FROM subscribers")}
            self.db.execute(
                "DELETE FROM wraps WHERE issue_id = ? AND version = ?", (issue_id, version)
            )
            keep = [(issue_id, version, k, w) for k, w in wraps.items() if k in current]
            self.db.executemany(
                "INSERT INTO wraps (issue_id, version, public_key, wrap) VALUES (?, ?, ?, ?)", keep
            )
        return len(keep), sorted(k for k in wraps if k not in current)

    def wrap(self, issue_id: str, version: int, public_key: bytes) -> bytes | None:
        """The wrap of one issue version for one subscriber, or None."""
        row = self.db.execute(
            "SELECT wrap FROM wraps WHERE issue_id = ? AND version = ? AND public_key = ?",
            (issue_id, version, public_key),
        ).fetchone()
        return None if row is None else bytes(row[0])
