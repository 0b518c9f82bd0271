"""The supernodes beside an origin follow its catalogue (issue 24, item 6): one per
bundle while the issue is read, retired when its bundle goes or nobody used it for
``idle_s``, started again when the tracker's swarm has peers. A real tracker and
real supernodes on 127.0.0.1."""

from __future__ import annotations

import random
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote_from_bytes

import aiohttp
import pytest

from pressrun.chord.host import SupernodeHost
from pressrun.content.bundle import read_manifest
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.content.publish import publish
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore


@pytest.fixture
async def catalogue(tmp_path: Path) -> AsyncIterator[tuple[str, Path, list[str]]]:
    """(tracker base URL, content folder, the info-hashes of its two issues)."""
    secret, pub = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    content.mkdir()
    hashes = []
    for n in (47, 48):
        src = tmp_path / f"weekly-{n}.pdf"
        src.write_bytes(random.Random(n).randbytes(4 * 65536))
        bundle = publish(
            src,
            issue_id=f"weekly-{n}",
            title=f"Weekly {n}",
            key_path=secret,
            content_dir=content,
            piece_size=65536,
        )
        hashes.append(read_manifest(bundle / "manifest.json").info_hash)
    svc = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1), allowed=[]),
        SqliteStore(tmp_path / "t.db"),
        content_dirs=[content],
        trusted_keys={load_public_key(pub)},
    )
    port = await svc.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", content, hashes
    finally:
        await svc.close()


async def ring_listed(tracker: str, ih: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{tracker}/v1/ring/{ih}") as r:
        return r.status == 200


async def test_a_removed_bundle_retires_its_supernode(
    catalogue: tuple[str, Path, list[str]],
) -> None:
    tracker, content, (ih47, ih48) = catalogue
    host = SupernodeHost(tracker_base=tracker, host="127.0.0.1", content_dir=content)
    try:
        assert await host.scan() == 2
        assert await ring_listed(tracker, ih47) and await ring_listed(tracker, ih48)
        shutil.rmtree(content / "weekly-47")
        await host.scan()
        assert set(host.supernodes) == {ih48}
        assert not await ring_listed(tracker, ih47)  # (it left the ring gracefully)
    finally:
        await host.close()


async def test_an_idle_issue_is_retired_and_comes_back_with_readers(
    catalogue: tuple[str, Path, list[str]],
) -> None:
    tracker, content, (ih47, ih48) = catalogue
    now = [0.0]
    host = SupernodeHost(
        tracker_base=tracker,
        host="127.0.0.1",
        content_dir=content,
        idle_s=60.0,
        clock=lambda: now[0],
    )
    try:
        assert await host.scan() == 2
        # a reader asks weekly-48's supernode something; weekly-47's is asked nothing
        sn48 = host.supernodes[ih48]
        body = {"peer_id": "reader", "address": "127.0.0.1:5001", "want": [0]}
        now[0] = 50.0
        url = f"http://{sn48.address}/chord/v1/pieces"
        async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
            assert r.status == 200
        now[0] = 70.0
        await host.scan()
        assert set(host.supernodes) == {ih48}
        assert not await ring_listed(tracker, ih47)
        await host.scan()  # (no reader yet: not started again)
        assert set(host.supernodes) == {ih48}
        # a reader announces weekly-47 to the tracker: its supernode is back
        query = (
            f"info_hash={quote_from_bytes(bytes.fromhex(ih47), safe='')}"
            f"&peer_id={'-PR0001-' + 'a' * 12}&port=6881&uploaded=0&downloaded=0&left=100"
        )
        async with aiohttp.ClientSession() as http, http.get(f"{tracker}/announce?{query}") as r:
            assert r.status == 200
        await host.scan()
        assert set(host.supernodes) == {ih47, ih48}
        assert await ring_listed(tracker, ih47)
    finally:
        await host.close()
