"""One subscription on several devices (issue 31), against a real ``pressrun serve
subscriptions`` process on 127.0.0.1 with its SQLite file and ``--max-devices 2``.

A subscribed device gets a link grant; a second device registers its OWN key with
it (no private key leaves either device); ``pressrun publish --encrypt`` wraps the
issue's content key to each device key; the second device opens its own wrap; a
third device is refused at the publisher's limit; a device removed with ``pressrun
subscribers remove-device`` gets no wrap of the next issue while the other keeps
getting theirs. The store's rules (grants spent once, a database from before devices
migrated) are tested on a real SQLite file.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import nacl.public
import pytest

from pressrun.cli import main
from pressrun.content.bundle import Bundle
from pressrun.content.encryption import open_wrap
from pressrun.content.keys import generate_keypair
from pressrun.subscriptions.client import (
    DeviceLimit,
    NotSubscribed,
    NoWrap,
    SubscriptionError,
    SubscriptionsClient,
)
from pressrun.subscriptions.store import DeviceRefused, SubscriptionStore

TOKEN = "operator-secret-token"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    """``pressrun serve subscriptions --max-devices 2`` as a process."""
    env = {**os.environ, "PRESSRUN_SUBSCRIPTIONS_TOKEN": TOKEN}
    command = [sys.executable, "-m", "pressrun.cli", "serve", "subscriptions", "--port", "0"]
    command += ["--db", str(tmp_path / "subs.db"), "--max-devices", "2"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, (line, proc.stderr.read() if proc.stderr else "")
        yield match.group(0)
    finally:
        proc.terminate()
        proc.wait(10)


def publish(tmp_path: Path, url: str, issue: str) -> Bundle:
    """``pressrun publish --encrypt`` of a small issue: its wraps go to every device."""
    key = tmp_path / "publisher.key"
    if not key.exists():
        generate_keypair(key)
    source = tmp_path / f"{issue}.pdf"
    source.write_bytes(os.urandom(50_000))
    argv = ["publish", str(source), "--issue", issue, "--title", issue, "--key", str(key)]
    argv += ["--content", str(tmp_path / "content"), "--encrypt", "--subscriptions", url]
    assert main(argv) == 0
    return Bundle.load(tmp_path / "content" / issue)


def pk(key: nacl.public.PrivateKey) -> bytes:
    return bytes(key.public_key)


async def test_devices_link_read_by_their_own_wrap_are_limited_and_removed(
    service: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PRESSRUN_SUBSCRIPTIONS_TOKEN", TOKEN)
    phone, tablet, laptop = (nacl.public.PrivateKey.generate() for _ in range(3))
    async with aiohttp.ClientSession() as http:
        operator = SubscriptionsClient(service, http, operator_token=TOKEN)
        device = SubscriptionsClient(service, http)  # no operator token: a reader's calls
        await operator.add_subscriber(pk(phone), "ada")
        # not a subscriber: no grant to give
        with pytest.raises(SubscriptionError, match="not subscribed"):
            await device.device_grant(tablet)
        grant = await device.device_grant(phone)
        assert pk(phone).hex() not in grant[64:]  # only public parts: the linking key, times
        record = await device.register_device(tablet, grant, "tablet")
        assert record["subscriber"] == pk(phone).hex()
        assert record["public_key"] == pk(tablet).hex()
        assert record["linked_by"] == pk(phone).hex()
        # the grant is spent: a second device cannot use it
        with pytest.raises(SubscriptionError, match="used already"):
            await device.register_device(laptop, grant, "laptop")
        # the publisher's limit (2): the phone cannot even get a grant, and a grant made
        # before the tablet joined is refused at registration
        with pytest.raises(DeviceLimit, match="already has 2 devices"):
            await device.device_grant(tablet)

        bundle = await asyncio.to_thread(publish, tmp_path, service, "weekly-01")
        enc = bundle.manifest.encryption
        assert enc is not None
        keys = []
        for holder in (phone, tablet):
            wrap = await device.fetch_wrap("weekly-01", enc.version, holder)
            keys.append(open_wrap(wrap, holder, enc.key_check))
        assert keys[0] == keys[1]  # one content key, a wrap per device
        with pytest.raises(NotSubscribed):
            await device.fetch_wrap("weekly-01", enc.version, laptop)

    # the publisher's tools: list the devices, remove the tablet
    assert (
        await asyncio.to_thread(
            main, ["subscribers", "devices", pk(phone).hex(), "--service", service]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert pk(phone).hex() in out and pk(tablet).hex() in out
    assert "tablet (linked by" in out and out.strip().endswith("2 of at most 2 devices")
    assert await asyncio.to_thread(main, ["subscribers", "list", "--service", service]) == 0
    assert "2 device(s)  ada" in capsys.readouterr().out
    assert (
        await asyncio.to_thread(
            main, ["subscribers", "remove-device", pk(tablet).hex(), "--service", service]
        )
        == 0
    )
    assert "1 wrap deleted" in capsys.readouterr().out
    assert (
        await asyncio.to_thread(
            main, ["subscribers", "remove-device", pk(tablet).hex(), "--service", service]
        )
        == 1
    )
    assert "is not a device" in capsys.readouterr().err

    bundle = await asyncio.to_thread(publish, tmp_path, service, "weekly-02")
    enc = bundle.manifest.encryption
    assert enc is not None
    async with aiohttp.ClientSession() as http:
        device = SubscriptionsClient(service, http)
        assert len(open_wrap(await device.fetch_wrap("weekly-02", 1, phone), phone, enc.key_check))
        with pytest.raises(NotSubscribed):  # removed: no wrap of the next issue (nor the last)
            await device.fetch_wrap("weekly-02", 1, tablet)
        # a place freed: the laptop links now
        grant = await device.device_grant(phone)
        await device.register_device(laptop, grant, "laptop")
        with pytest.raises(NoWrap):  # linked after weekly-02: wrapped from the next one
            await device.fetch_wrap("weekly-02", 1, laptop)
    db = sqlite3.connect(tmp_path / "subs.db")
    (tablet_wraps,) = db.execute(
        "SELECT count(*) FROM wraps WHERE public_key = ?", (pk(tablet),)
    ).fetchone()
    db.close()
    assert tablet_wraps == 0


def test_a_grant_is_spent_once_and_forgotten_when_stale(tmp_path: Path) -> None:
    store = SubscriptionStore(tmp_path / "subs.db")
    ada, tab, pad = os.urandom(32), os.urandom(32), os.urandom(32)
    store.add_subscriber(ada, "ada", "t0")

    def register(key: bytes, nonce: bytes, now: float) -> bool:
        return store.register_device(
            key,
            linked_by=ada,
            name="x",
            added_at="t1",
            grant_nonce=nonce,
            grant_expires_at=1_000,
            now_unix=now,
            max_devices=5,
        )[1]

    assert register(tab, b"n" * 16, now=10.0)
    assert not register(tab, b"m" * 16, now=11.0)  # already hers: as is
    with pytest.raises(DeviceRefused, match="used already"):
        register(pad, b"n" * 16, now=12.0)
    (spent,) = store.db.execute("SELECT count(*) FROM used_grants").fetchone()
    assert spent == 1
    register(pad, b"p" * 16, now=1_000.0)  # the first grant's time is over: forgotten
    assert store.db.execute("SELECT nonce FROM used_grants").fetchall() == [(b"p" * 16,)]
    # another subscriber's device cannot be added as a subscriber, nor linked to another
    with pytest.raises(DeviceRefused, match="is a device of subscriber"):
        store.add_subscriber(tab, "tab", "t2")
    assert store.remove_subscriber(ada) == 0
    assert store.db.execute("SELECT count(*) FROM devices").fetchone() == (0,)
    store.close()


def test_a_database_from_before_devices_keeps_its_wraps(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE subscribers (public_key BLOB PRIMARY KEY, name TEXT NOT NULL,"
        " added_at TEXT NOT NULL);"
        "CREATE TABLE wraps (issue_id TEXT NOT NULL, version INTEGER NOT NULL,"
        " public_key BLOB NOT NULL REFERENCES subscribers(public_key) ON DELETE CASCADE,"
        " wrap BLOB NOT NULL, PRIMARY KEY (issue_id, version, public_key));"
        "CREATE INDEX wraps_by_key ON wraps(public_key);"
    )
    ada = os.urandom(32)
    db.execute("INSERT INTO subscribers VALUES (?, 'ada', 't0')", (ada,))
    db.execute("INSERT INTO wraps VALUES ('mag', 1, ?, ?)", (ada, b"w" * 80))
    db.commit()
    db.close()
    store = SubscriptionStore(path)
    assert store.wrap("mag", 1, ada) == b"w" * 80
    assert [s.devices for s in store.subscribers()] == [(ada,)]
    fks = store.db.execute("PRAGMA foreign_key_list(wraps)").fetchall()
    assert [row[2] for row in fks] == ["devices"]
    store.close()
    SubscriptionStore(path).close()  # opened again: nothing to migrate
