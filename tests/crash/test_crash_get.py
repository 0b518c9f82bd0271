"""``pressrun get`` killed, or its disk full, at every step while it replaces an older
copy of an issue in a library (a real origin and balancer on 127.0.0.1): the library
holds the old copy or the new one, whole and verified (with ``RENAME_EXCHANGE`` even
before any recovery; with the two-rename fallback once recovered); a rerun ends with
the new copy verified, no leftover, and downloads at most the pieces the crash had not
verified (none once the file was whole)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from crashpoint import Outcome, Zygote, fresh_copy, sweep

from pressrun.clients.aio import fetch_issue
from pressrun.clients.codec import ResumeState
from pressrun.clients.config import DESKTOP
from pressrun.content.bundle import verify_issue
from pressrun.content.keys import generate_keypair, load_public_key, load_subscriber_key
from pressrun.content.publish import publish
from pressrun.demo.testbed import OriginShape, Testbed, wait_for_directive
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

ISSUE = "mag-1"
PIECE = 128 * 1024
SIZE = 300_001  # three pieces of 128 KiB, the last one short
TOKEN = "crash-get-operator-token"


@dataclass
class Bed:
    bed: Testbed
    public: Path
    trusted: set[bytes]
    old: bytes
    new: bytes

    @property
    def url(self) -> str:
        assert self.bed.balancer is not None
        return self.bed.balancer.url


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    # three origins: a sweep asks for hundreds of directives in seconds, and one
    # origin's admission slots fill up (the balancer then refuses for a poll or two)
    shapes = (OriginShape("origin-a"), OriginShape("origin-b"), OriginShape("origin-c"))
    testbed = Testbed(tmp_path / "bed", shapes, poll_interval_s=0.3)
    await testbed.__aenter__()
    try:
        old = random.Random(1).randbytes(SIZE - 99)
        new = random.Random(2).randbytes(SIZE)
        await testbed.publish(old, issue_id=ISSUE, key_path=secret, piece_size=PIECE)
        await testbed.start_balancer()
        yield Bed(testbed, public, {load_public_key(public)}, old, new)
    finally:
        await testbed.close()


def file_in(library: Path) -> bytes | None:
    """The issue's file in the library, verified against the manifest beside it."""
    folder = library / ISSUE
    if not folder.exists():
        return None
    report = verify_issue(folder)
    return report.file_path.read_bytes()


def verified_bytes(library: Path) -> int:
    """The bytes a partial download's state file lists as verified (old or new name)."""
    for name in (".state.json", "state.json"):
        try:
            state = ResumeState.from_json_bytes((library / ".partial" / ISSUE / name).read_bytes())
        except OSError:
            continue
        if state is not None:
            pieces = state.verified
            last = (SIZE - 1) // PIECE
            return sum(PIECE if i != last else SIZE - last * PIECE for i in pieces)
    return 0


def leftovers(library: Path) -> list[str]:
    """Anything in the library besides the issue and pressrun's locks."""
    found = [p.name for p in library.iterdir() if p.name not in (ISSUE, ".pressrun")]
    state = library / ".pressrun"
    if state.exists():
        found += [p.name for p in state.iterdir() if p.suffix != ".lock"]
    return found


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
async def test_get_replacing_an_issue_at_every_step(
    tmp_path: Path, bed: Bed, exchange: bool
) -> None:
    template = tmp_path / "template"
    result = await fetch_issue(
        ISSUE,
        balancer_url=bed.url,
        library=template,
        config=DESKTOP,
        trusted_keys=bed.trusted,
    )
    assert result.path.read_bytes() == bed.old
    # the publisher replaces the issue: the reader's get now replaces the old copy
    source = tmp_path / "new" / "mag-1.pdf"
    source.parent.mkdir()
    source.write_bytes(bed.new)
    await asyncio.to_thread(
        publish,
        source,
        issue_id=ISSUE,
        title="Magazine 1, corrected",
        key_path=bed.public.with_suffix(""),
        content_dir=bed.bed.content_dir,
        web_seeds=list(bed.bed.urls.values()),
        piece_size=PIECE,
        force=True,
    )
    library = tmp_path / "library"
    argv = ["get", ISSUE, "--balancer", bed.url, "--library", str(library)]
    argv += ["--publisher-key", str(bed.public), "--give-up-after-s", "5", "--json"]
    left = [0]

    async def after_crash(outcome: Outcome, mode: str, n: int) -> None:
        if not outcome.killed and outcome.rc != 0:
            assert outcome.err.startswith("pressrun get: "), outcome.err
        if not exchange:
            if mode == "enospc":  # an error between the renames puts the old copy back
                assert file_in(library) in (bed.old, bed.new), "no issue after the error"
            # killed between the two renames: no issue folder until recovered
            from pressrun.clients.library import Library

            Library(library).recover()
        have = file_in(library)
        assert have in (bed.old, bed.new), "the issue that was in the library is gone"
        left[0] = 0 if have == bed.new else SIZE - verified_bytes(library)

    async def rerun() -> None:
        again = await zygote.run(argv, cwd=tmp_path, exchange=exchange)
        assert again.rc == 0, again.err
        assert file_in(library) == bed.new
        assert leftovers(library) == []
        fetched = json.loads(again.out)["bytes_from_origins"]
        assert fetched <= left[0], f"the rerun fetched {fetched} bytes, {left[0]} were missing"

    async with Zygote(tmp_path / "zygote") as zygote:
        done = await sweep(
            zygote,
            argv,
            cwd=tmp_path,
            prepare=lambda: fresh_copy(template, library),
            after_crash=after_crash,
            rerun=rerun,
            exchange=exchange,
        )
    assert done.calls >= 15


async def test_get_of_an_encrypted_issue_at_every_step(tmp_path: Path, bed: Bed) -> None:
    # an encrypted issue: the ciphertext is verified, decrypted beside it in .partial,
    # and the plaintext installed; the file is named like pressrun's own manifest
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    port = await service.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        reader_secret, _ = generate_keypair(tmp_path / "reader.key", subscriber=True)
        reader = load_subscriber_key(reader_secret)
        async with aiohttp.ClientSession() as http:
            operator = SubscriptionsClient(url, http, operator_token=TOKEN)
            await operator.add_subscriber(bytes(reader.public_key), "reader")
        source = tmp_path / "enc" / "manifest.json"
        source.parent.mkdir()
        source.write_bytes(bed.new)
        await asyncio.to_thread(
            publish,
            source,
            issue_id="enc-1",
            title="Encrypted",
            key_path=bed.public.with_suffix(""),
            content_dir=bed.bed.content_dir,
            web_seeds=list(bed.bed.urls.values()),
            piece_size=PIECE,
            encrypt_for=HttpSubscriberDirectory(url, TOKEN),
        )
        await wait_for_directive(bed.url, "enc-1", 10.0)
        library = tmp_path / "library"
        empty = tmp_path / "empty"
        empty.mkdir()
        argv = ["get", "enc-1", "--balancer", bed.url, "--library", str(library)]
        argv += ["--publisher-key", str(bed.public), "--subscriber-key", str(reader_secret)]
        argv += ["--give-up-after-s", "5", "--json"]

        async def after_crash(outcome: Outcome, mode: str, n: int) -> None:
            if not outcome.killed and outcome.rc != 0:
                assert outcome.err.startswith("pressrun get: "), outcome.err
            folder = library / "enc-1"
            if folder.exists():  # whole, or not there at all
                assert (folder / "manifest.json").read_bytes() == bed.new
                verify_issue(folder, bed.trusted)

        async def rerun() -> None:
            again = await zygote.run(argv, cwd=tmp_path)
            assert again.rc == 0, again.err
            assert (library / "enc-1" / "manifest.json").read_bytes() == bed.new
            assert verify_issue(library / "enc-1", bed.trusted).decrypted
            assert [p.name for p in library.iterdir() if p.name != ".pressrun"] == ["enc-1"]
            assert [p.suffix for p in (library / ".pressrun").iterdir()] == [".lock"]

        async with Zygote(tmp_path / "zygote") as zygote:
            done = await sweep(
                zygote,
                argv,
                cwd=tmp_path,
                prepare=lambda: fresh_copy(empty, library),
                after_crash=after_crash,
                rerun=rerun,
            )
        assert done.calls >= 15
    finally:
        await service.close()
