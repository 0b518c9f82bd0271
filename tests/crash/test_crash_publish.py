"""``pressrun publish`` (new, ``--force``, ``--force --encrypt``) killed, or its disk
full, at every step: CONTENT holds the old bundle or the new one, whole and verified
(with ``renameat2(RENAME_EXCHANGE)`` even before any recovery; with the two-rename
fallback once recovered), a rerun publishes and leaves no leftover, and an encrypted
issue's versions never go back: no version whose wraps were stored is used again."""

from __future__ import annotations

import asyncio
import random
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from crashpoint import Outcome, Zygote, fresh_copy, sweep

import pressrun.durable
from pressrun.content.bundle import Bundle, verify_issue
from pressrun.content.encryption import open_wrap
from pressrun.content.keys import generate_keypair, load_public_key, load_subscriber_key
from pressrun.content.publish import publish
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

ISSUE = "mag-1"
SIZE = 300_001  # three pieces of 128 KiB, the last one short
TOKEN = "crash-operator-token"
#: pressrun's own state in CONTENT (``durable.STATE_DIR``; spelled out so that this
#: file also runs against the code before issue 27, to show what it found there)
STATE_DIR = ".pressrun"


def recover(content: Path) -> None:
    """What ``publish`` does first: finish or roll back what a crash left."""
    swaps = getattr(pressrun.durable, "FolderSwaps", None)
    if swaps is not None:  # (the code before issue 27 had no recovery)
        swaps(content, "publishing").recover()


def reserved_version(content: Path) -> int:
    """The last version reserved in CONTENT (``.pressrun/<issue>.version``), 0 if none."""
    try:
        return int((content / STATE_DIR / f"{ISSUE}.version").read_text().strip())
    except (OSError, ValueError):
        return 0


@dataclass
class World:
    """A publisher's machine: key pair, two versions of the issue, a content folder."""

    root: Path
    key: Path
    trusted: set[bytes]
    source: Path

    @property
    def content(self) -> Path:
        return self.root / "content"

    def argv(self, *extra: str) -> list[str]:
        return [
            "publish",
            str(self.source),
            "--issue",
            ISSUE,
            "--title",
            "Magazine 1",
            "--key",
            str(self.key),
            "--content",
            str(self.content),
            "--web-seed",
            "http://127.0.0.1:9",
            *extra,
        ]


@pytest.fixture
def world(tmp_path: Path) -> World:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    source = tmp_path / "src" / "mag-1.pdf"
    source.parent.mkdir()
    source.write_bytes(random.Random(1).randbytes(SIZE))
    return World(tmp_path, secret, {load_public_key(public)}, source)


def leftovers(content: Path) -> list[str]:
    """Anything in CONTENT besides bundles and pressrun's locks and versions."""
    found = [p.name for p in content.iterdir() if p.name not in (ISSUE, STATE_DIR)]
    state = content / STATE_DIR
    if state.exists():
        found += [p.name for p in state.iterdir() if p.suffix not in (".lock", ".version")]
    return found


def template_with_bundle(world: World, *, encrypt_for: HttpSubscriberDirectory | None) -> Path:
    """CONTENT with version 1 of the issue (other bytes than the source's), copied."""
    old_source = world.root / "old" / "mag-1.pdf"
    old_source.parent.mkdir(exist_ok=True)
    old_source.write_bytes(random.Random(2).randbytes(SIZE - 77))
    publish(
        old_source,
        issue_id=ISSUE,
        title="Magazine 1 (first)",
        key_path=world.key,
        content_dir=world.content,
        encrypt_for=encrypt_for,
    )
    template = world.root / "template"
    shutil.copytree(world.content, template)
    return template


def whole_bundle(world: World) -> Bundle | None:
    """The bundle in CONTENT, fully verified, or None when there is none."""
    if not (world.content / ISSUE).exists():
        return None
    verify_issue(world.content / ISSUE, world.trusted)
    return Bundle.load(world.content / ISSUE, world.trusted)


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
async def test_publish_force_at_every_step(tmp_path: Path, world: World, exchange: bool) -> None:
    template = template_with_bundle(world, encrypt_for=None)
    argv = world.argv("--force")

    async def after_crash(outcome: Outcome, mode: str, n: int) -> None:
        if not exchange:
            if mode == "enospc":  # an error between the renames puts the old one back
                assert whole_bundle(world) is not None, "no bundle after the error"
            recover(world.content)  # killed between the two renames: none until recovered
        assert whole_bundle(world) is not None, "the bundle that was there is gone"
        if not outcome.killed and outcome.rc != 0:
            assert outcome.err.startswith("pressrun publish: "), outcome.err

    async def rerun() -> None:
        again = await zygote.run(argv, cwd=world.root, exchange=exchange)
        assert again.rc == 0, again.err
        bundle = whole_bundle(world)
        assert bundle is not None and bundle.file_path.read_bytes() == world.source.read_bytes()
        assert leftovers(world.content) == []

    async with Zygote(tmp_path / "zygote") as zygote:
        done = await sweep(
            zygote,
            argv,
            cwd=world.root,
            prepare=lambda: fresh_copy(template, world.content),
            after_crash=after_crash,
            rerun=rerun,
            exchange=exchange,
        )
    assert done.calls >= 10


async def test_publish_new_at_every_step(tmp_path: Path, world: World) -> None:
    argv = world.argv()
    empty = tmp_path / "empty"
    empty.mkdir()

    async def after_crash(outcome: Outcome, mode: str, n: int) -> None:
        whole_bundle(world)  # none, or a whole one

    async def rerun() -> None:
        again = await zygote.run(argv, cwd=world.root)
        if again.rc != 0:  # the crash's bundle was whole and in place (or finished now)
            assert "already exists" in again.err, again.err
        assert whole_bundle(world) is not None
        assert leftovers(world.content) == []

    async with Zygote(tmp_path / "zygote") as zygote:
        await sweep(
            zygote,
            argv,
            cwd=world.root,
            prepare=lambda: fresh_copy(empty, world.content),
            after_crash=after_crash,
            rerun=rerun,
        )


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[str]:
    svc = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    port = await svc.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await svc.close()


async def test_publish_force_encrypt_at_every_step(
    tmp_path: Path, world: World, service: str
) -> None:
    reader_secret, _ = generate_keypair(tmp_path / "reader.key", subscriber=True)
    reader = load_subscriber_key(reader_secret)
    async with aiohttp.ClientSession() as http:
        operator = SubscriptionsClient(service, http, operator_token=TOKEN)
        await operator.add_subscriber(bytes(reader.public_key), "reader")
    directory = HttpSubscriberDirectory(service, TOKEN)
    template = await asyncio.to_thread(template_with_bundle, world, encrypt_for=directory)
    argv = world.argv("--force", "--encrypt", "--subscriptions", service)
    env = {"PRESSRUN_SUBSCRIPTIONS_TOKEN": TOKEN}
    seen: dict[int, bytes] = {}  # version -> key_check of every bundle readers could see
    reserved = [0]

    def see() -> int:
        bundle = whole_bundle(world)
        assert bundle is not None, "the bundle that was there is gone"
        enc = bundle.manifest.encryption
        assert enc is not None
        assert seen.setdefault(enc.version, enc.key_check) == enc.key_check, (
            f"version {enc.version} was published twice with different keys"
        )
        return enc.version

    async def readable(version: int, key_check: bytes) -> None:
        async with aiohttp.ClientSession() as http:
            client = SubscriptionsClient(service, http)
            wrap = await client.fetch_wrap(ISSUE, version, reader)
        open_wrap(wrap, reader, key_check)  # WrapError: its wraps were overwritten

    def prepare() -> None:
        fresh_copy(template, world.content)
        seen.clear()
        see()

    async def after_crash(outcome: Outcome, mode: str, n: int) -> None:
        see()
        reserved[0] = reserved_version(world.content)

    async def rerun() -> None:
        again = await zygote.run(argv, cwd=world.root, env=env)
        assert again.rc == 0, again.err
        before = set(seen)
        version = see()
        assert version > max(before) and version > reserved[0], (
            f"version {version} again (seen {sorted(before)}, reserved {reserved[0]})"
        )
        for v, check in seen.items():
            await readable(v, check)
        assert leftovers(world.content) == []

    async with Zygote(tmp_path / "zygote") as zygote:
        done = await sweep(
            zygote,
            argv,
            cwd=world.root,
            prepare=prepare,
            after_crash=after_crash,
            rerun=rerun,
            env=env,
        )
    assert done.calls >= 10
