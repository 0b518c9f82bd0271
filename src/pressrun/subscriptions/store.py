"""The subscription service's SQLite database (default ``subscriptions.db``).

Four tables: ``subscribers`` (X25519 public key, name, when added), ``wraps`` (one
80-byte sealed content key per issue version and subscriber; deleted with their
subscriber), ``releases`` (the signed release notice of an embargoed issue version,
its sequence and publisher key, issue 35) and ``settings`` (the token secret, made on
first start, so tokens survive a restart). Calls are synchronous and short; the service
runs its writes on one worker thread and reads wraps on the event loop through a second,
read-only connection (one :class:`SubscriptionStore` is never shared between threads
at once).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pressrun.content.release import SignedRelease
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
CREATE TABLE IF NOT EXISTS releases (
    issue_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    sequence INTEGER NOT NULL,
    publisher_key TEXT NOT NULL,
    notice TEXT NOT NULL,
    PRIMARY KEY (issue_id, version)
);
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

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        """Open (and create) the file; ``read_only``: a second connection to a file the
        service already opened, for reads on the event loop (mode=ro, no schema)."""
        self.path = str(path)
        if read_only:
            uri = f"file:{quote(str(Path(self.path).resolve()))}?mode=ro"
            # a reader in WAL mode is not blocked by the writer; the rare busy moment
            # (a checkpoint's WAL reset) is waited for briefly, on the event loop
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=0.2)
            return
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
        self,
        issue_id: str,
        version: int,
        wraps: dict[bytes, bytes],
        release: SignedRelease | None = None,
    ) -> tuple[int, list[bytes]]:
        """Replace the wraps of one issue version; ``(stored, skipped keys)``.

        Keys that are not subscribers (any more) are skipped, in one transaction with
        the check, so a subscriber removed meanwhile never gets a wrap stored. With
        ``release`` (verified by the caller), the embargo is stored in the same
        transaction: no wrap of an embargoed version is ever there without it.
        ReleaseRefused as :meth:`put_release`.
        """
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            if release is not None:
                self._put_release(release)
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

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: changes when another connection (another
        service instance on the same file) commits; what cached state is checked by."""
        (version,) = self.db.execute("PRAGMA data_version").fetchone()
        return int(version)

    def put_release(self, release: SignedRelease) -> None:
        """Store a (verified) release notice; ReleaseRefused when it does not replace
        the stored one (not a higher sequence, or another publisher key)."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self._put_release(release)

    def _put_release(self, release: SignedRelease) -> None:
        n = release.notice
        row = self.db.execute(
            "SELECT sequence, publisher_key FROM releases WHERE issue_id = ? AND version = ?",
            (n.issue_id, n.version),
        ).fetchone()
        if row is not None:
            if str(row[1]) != n.publisher_key:
                raise ReleaseRefused(
                    f"the release of {n.issue_id} version {n.version} was signed by "
                    f"{str(row[1])[:16]}...; a notice of another publisher key cannot replace it"
                )
            if int(row[0]) >= n.sequence:
                raise ReleaseRefused(
                    f"the release of {n.issue_id} version {n.version} is at sequence "
                    f"{int(row[0])}; a notice replaces it only with a higher one"
                )
        self.db.execute(
            "INSERT OR REPLACE INTO releases (issue_id, version, sequence, publisher_key, notice)"
            " VALUES (?, ?, ?, ?, ?)",
            (n.issue_id, n.version, n.sequence, n.publisher_key, json.dumps(release.to_json())),
        )

    def releases(self) -> dict[tuple[str, int], SignedRelease]:
        """Every stored release notice, by ``(issue_id, version)``."""
        rows = self.db.execute("SELECT issue_id, version, notice FROM releases").fetchall()
        return {(str(i), int(v)): SignedRelease.from_json(json.loads(t)) for i, v, t in rows}


class ReleaseRefused(Exception):
    """A release notice that cannot replace the stored one (one line)."""
