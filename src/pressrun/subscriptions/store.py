"""The subscription service's SQLite database (default ``subscriptions.db``).

``subscribers`` (X25519 public key, name, when added), ``devices`` (issue 31: each
device's own X25519 public key under its subscriber; a subscriber's own key is its
first device; deleted with their subscriber), ``wraps`` (one 80-byte sealed content
key per issue version and device; deleted with their device), ``used_grants`` (the
link grants already spent, until they expire), ``releases`` (the signed release
notice of an embargoed issue version, its sequence and publisher key, issue 35) and
``settings`` (the token secret, made on first start, so tokens survive a restart).
Calls are synchronous and short; the service runs its writes on one worker thread
and reads wraps on the event loop through a second, read-only connection (one
:class:`SubscriptionStore` is never shared between threads at once).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pressrun.content.release import SignedRelease
from pressrun.security import private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS subscribers (
    public_key BLOB PRIMARY KEY,
    name TEXT NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    public_key BLOB PRIMARY KEY,
    subscriber BLOB NOT NULL REFERENCES subscribers(public_key) ON DELETE CASCADE,
    name TEXT NOT NULL,
    added_at TEXT NOT NULL,
    linked_by BLOB
);
CREATE INDEX IF NOT EXISTS devices_by_subscriber ON devices(subscriber);
CREATE TABLE IF NOT EXISTS wraps (
    issue_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    public_key BLOB NOT NULL REFERENCES devices(public_key) ON DELETE CASCADE,
    wrap BLOB NOT NULL,
    PRIMARY KEY (issue_id, version, public_key)
);
CREATE INDEX IF NOT EXISTS wraps_by_key ON wraps(public_key);
CREATE TABLE IF NOT EXISTS used_grants (
    nonce BLOB PRIMARY KEY,
    expires_at INTEGER NOT NULL
);
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


#: the first device's name, for a subscriber's own key
FIRST_DEVICE = "first device"


@dataclass(frozen=True)
class Subscriber:
    """One subscriber as listed, with their devices' public keys."""

    public_key: bytes
    name: str
    added_at: str
    devices: tuple[bytes, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON of ``GET /v1/subscribers``."""
        return {
            "public_key": self.public_key.hex(),
            "name": self.name,
            "added_at": self.added_at,
            "devices": [d.hex() for d in self.devices],
        }


@dataclass(frozen=True)
class Device:
    """One device of a subscriber: its own X25519 public key (wraps are made to it)."""

    public_key: bytes
    subscriber: bytes
    name: str
    added_at: str
    linked_by: bytes | None

    def to_json(self) -> dict[str, Any]:
        """The JSON of ``GET /v1/subscribers/<key>/devices``."""
        return {
            "public_key": self.public_key.hex(),
            "subscriber": self.subscriber.hex(),
            "name": self.name,
            "added_at": self.added_at,
            "linked_by": None if self.linked_by is None else self.linked_by.hex(),
        }


class DeviceRefused(Exception):
    """A device that cannot be registered: ``code`` for the HTTP answer, one line."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


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
        self._migrate_wraps_to_devices()
        self.db.executescript(SCHEMA)
        # a database from before devices (issue 31): every subscriber's own key is
        # their first device (idempotent: a no-op once done)
        self.db.execute(
            "INSERT OR IGNORE INTO devices (public_key, subscriber, name, added_at)"
            " SELECT public_key, public_key, ?, added_at FROM subscribers",
            (FIRST_DEVICE,),
        )

    def _migrate_wraps_to_devices(self) -> None:
        """Rebuild a ``wraps`` table whose keys referenced ``subscribers`` (before
        issue 31) so they reference ``devices``; the wraps are kept."""
        fks = self.db.execute("PRAGMA foreign_key_list(wraps)").fetchall()
        if not any(row[2] == "subscribers" for row in fks):
            return
        # one script, one transaction (executescript commits what came before it);
        # foreign keys off while the table is swapped, as SQLite's ALTER TABLE asks
        self.db.execute("PRAGMA foreign_keys = OFF")
        try:
            self.db.executescript(
                "BEGIN IMMEDIATE;"
                "ALTER TABLE wraps RENAME TO wraps_before_devices;"
                "DROP INDEX IF EXISTS wraps_by_key;"
                + SCHEMA
                + "INSERT OR IGNORE INTO devices (public_key, subscriber, name, added_at)"
                f" SELECT public_key, public_key, '{FIRST_DEVICE}', added_at FROM subscribers;"
                "INSERT INTO wraps SELECT * FROM wraps_before_devices;"
                "DROP TABLE wraps_before_devices;"
                "COMMIT;"
            )
        finally:
            self.db.execute("PRAGMA foreign_keys = ON")

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
        """Add a subscriber (or rename one), their own key their first device;
        ``(subscriber, created)``. DeviceRefused 409 when the key is another
        subscriber's linked device."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            owner = self.db.execute(
                "SELECT subscriber FROM devices WHERE public_key = ?", (public_key,)
            ).fetchone()
            if owner is not None and bytes(owner[0]) != public_key:
                raise DeviceRefused(
                    409,
                    "already_linked",
                    f"{public_key.hex()[:16]}... is a device of subscriber "
                    f"{bytes(owner[0]).hex()[:16]}...; remove the device first",
                )
            row = self.db.execute(
                "SELECT added_at FROM subscribers WHERE public_key = ?", (public_key,)
            ).fetchone()
            if row is None:
                self.db.execute(
                    "INSERT INTO subscribers (public_key, name, added_at) VALUES (?, ?, ?)",
                    (public_key, name, added_at),
                )
                self.db.execute(
                    "INSERT INTO devices (public_key, subscriber, name, added_at)"
                    " VALUES (?, ?, ?, ?)",
                    (public_key, public_key, FIRST_DEVICE, added_at),
                )
                return Subscriber(public_key, name, added_at, (public_key,)), True
            self.db.execute(
                "UPDATE subscribers SET name = ? WHERE public_key = ?", (name, public_key)
            )
            return Subscriber(public_key, name, str(row[0]), self._device_keys(public_key)), False

    def _device_keys(self, subscriber: bytes) -> tuple[bytes, ...]:
        rows = self.db.execute(
            "SELECT public_key FROM devices WHERE subscriber = ? ORDER BY added_at, public_key",
            (subscriber,),
        ).fetchall()
        return tuple(bytes(k) for (k,) in rows)

    def remove_subscriber(self, public_key: bytes) -> int | None:
        """Remove a subscriber and all their wraps; the wraps deleted, None if unknown."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            (wraps,) = self.db.execute(
                "SELECT count(*) FROM wraps WHERE public_key IN"
                " (SELECT public_key FROM devices WHERE subscriber = ?)",
                (public_key,),
            ).fetchone()
            cur = self.db.execute("DELETE FROM subscribers WHERE public_key = ?", (public_key,))
            if cur.rowcount == 0:
                return None
            return int(wraps)

    def subscribers(self) -> list[Subscriber]:
        """Every subscriber with their devices' keys (oldest first), by name then key.

        Two scans, the devices' unsorted (sorting 50,000 devices in SQL took 3x the
        subscribers' own list); a subscriber's few devices are ordered here."""
        devices: dict[bytes, list[tuple[str, bytes]]] = {}
        for key, sub, added in self.db.execute(
            "SELECT public_key, subscriber, added_at FROM devices"
        ):
            devices.setdefault(bytes(sub), []).append((str(added), bytes(key)))
        rows = self.db.execute(
            "SELECT public_key, name, added_at FROM subscribers ORDER BY name, public_key"
        ).fetchall()
        out = []
        for k, n, a in rows:
            mine = devices.get(bytes(k), [])
            if len(mine) > 1:
                mine.sort()
            out.append(Subscriber(bytes(k), str(n), str(a), tuple(d for _, d in mine)))
        return out

    def is_subscriber(self, public_key: bytes) -> bool:
        """True if ``public_key`` is a current subscriber's device (their own key, or
        one linked since)."""
        row = self.db.execute(
            "SELECT 1 FROM devices WHERE public_key = ?", (public_key,)
        ).fetchone()
        return row is not None

    def devices(self, subscriber: bytes) -> list[Device] | None:
        """The devices of ``subscriber`` (oldest first), None if not a subscriber."""
        if (
            self.db.execute(
                "SELECT 1 FROM subscribers WHERE public_key = ?", (subscriber,)
            ).fetchone()
            is None
        ):
            return None
        rows = self.db.execute(
            "SELECT public_key, subscriber, name, added_at, linked_by FROM devices"
            " WHERE subscriber = ? ORDER BY added_at, public_key",
            (subscriber,),
        ).fetchall()
        return [_device(r) for r in rows]

    def device(self, public_key: bytes) -> Device | None:
        """One device by its key, or None."""
        row = self.db.execute(
            "SELECT public_key, subscriber, name, added_at, linked_by FROM devices"
            " WHERE public_key = ?",
            (public_key,),
        ).fetchone()
        return None if row is None else _device(row)

    def register_device(
        self,
        public_key: bytes,
        *,
        linked_by: bytes,
        name: str,
        added_at: str,
        grant_nonce: bytes,
        grant_expires_at: int,
        now_unix: float,
        max_devices: int,
    ) -> tuple[Device, bool]:
        """Register ``public_key`` as a device of the subscriber that ``linked_by``
        (a device) belongs to, spending the grant ``grant_nonce``; ``(device,
        created)``. In one transaction: the grant unspent, ``linked_by`` still a
        device, the key nobody else's, fewer than ``max_devices`` devices. A key
        already that subscriber's device is answered as is (the grant not spent).
        DeviceRefused otherwise."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            # spent grants are kept only until they expire (bounded by the minutes)
            self.db.execute("DELETE FROM used_grants WHERE expires_at <= ?", (int(now_unix),))
            linker = self.db.execute(
                "SELECT subscriber FROM devices WHERE public_key = ?", (linked_by,)
            ).fetchone()
            if linker is None:
                raise DeviceRefused(
                    403,
                    "not_subscribed",
                    "the device that made this code is no longer subscribed",
                )
            subscriber = bytes(linker[0])
            existing = self.device(public_key)
            if existing is not None:
                if existing.subscriber == subscriber:
                    return existing, False
                raise DeviceRefused(
                    409, "already_linked", "this device already belongs to another subscriber"
                )
            if self.db.execute(
                "SELECT 1 FROM subscribers WHERE public_key = ?", (public_key,)
            ).fetchone():
                raise DeviceRefused(
                    409, "already_linked", "this device's key is another subscriber's own key"
                )
            if self.db.execute(
                "SELECT 1 FROM used_grants WHERE nonce = ?", (grant_nonce,)
            ).fetchone():
                raise DeviceRefused(403, "grant_used", "this link code was used already")
            (count,) = self.db.execute(
                "SELECT count(*) FROM devices WHERE subscriber = ?", (subscriber,)
            ).fetchone()
            if int(count) >= max_devices:
                raise DeviceRefused(409, "device_limit", device_limit_message(max_devices))
            self.db.execute(
                "INSERT INTO devices (public_key, subscriber, name, added_at, linked_by)"
                " VALUES (?, ?, ?, ?, ?)",
                (public_key, subscriber, name, added_at, linked_by),
            )
            self.db.execute(
                "INSERT INTO used_grants (nonce, expires_at) VALUES (?, ?)",
                (grant_nonce, grant_expires_at),
            )
            return Device(public_key, subscriber, name, added_at, linked_by), True

    def device_count(self, device_key: bytes) -> tuple[bytes, int] | None:
        """``(subscriber, devices)`` of the subscriber ``device_key`` belongs to, or None."""
        row = self.db.execute(
            "SELECT subscriber, (SELECT count(*) FROM devices d WHERE d.subscriber ="
            " devices.subscriber) FROM devices WHERE public_key = ?",
            (device_key,),
        ).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    def remove_device(self, public_key: bytes) -> tuple[Device, int] | None:
        """Remove one device and its wraps (the next issue is not wrapped for it);
        ``(device, wraps deleted)``, None if unknown. Its subscriber stays."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            device = self.device(public_key)
            if device is None:
                return None
            (wraps,) = self.db.execute(
                "SELECT count(*) FROM wraps WHERE public_key = ?", (public_key,)
            ).fetchone()
            self.db.execute("DELETE FROM devices WHERE public_key = ?", (public_key,))
            return device, int(wraps)

    def put_wraps(
        self,
        issue_id: str,
        version: int,
        wraps: dict[bytes, bytes],
        release: SignedRelease | None = None,
    ) -> tuple[int, list[bytes]]:
        """Replace the wraps of one issue version; ``(stored, skipped keys)``.

        Keys that are not devices of a subscriber (any more) are skipped, in one transaction with
        the check, so a subscriber removed meanwhile never gets a wrap stored. With
        ``release`` (verified by the caller), the embargo is stored in the same
        transaction: no wrap of an embargoed version is ever there without it.
        ReleaseRefused as :meth:`put_release`.
        """
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            if release is not None:
                self._put_release(release)
            # wraps are per device (issue 31): a removed device is not current
            current = {bytes(k) for (k,) in self.db.execute("SELECT public_key FROM devices")}
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


def _device(row: tuple[Any, ...]) -> Device:
    k, sub, name, added, by = row
    return Device(bytes(k), bytes(sub), str(name), str(added), None if by is None else bytes(by))


def device_limit_message(max_devices: int) -> str:
    """The refusal of one device too many (the reader shows its own words for it)."""
    return (
        f"this subscription already has {max_devices} device"
        f"{'' if max_devices == 1 else 's'}, the publisher's limit; remove one first"
    )


class ReleaseRefused(Exception):
    """A release notice that cannot replace the stored one (one line)."""
