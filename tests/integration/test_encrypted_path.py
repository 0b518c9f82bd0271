"""Subscribers only, end to end on 127.0.0.1: the subscription service, an encrypted
issue published through it, origins and swarm peers that carry only ciphertext, and
`fetch_issue` / `pressrun get` for subscribers, strangers and removed subscribers, in
origin mode and in swarm mode."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nacl.public
import pytest

from pressrun.clients.aio import FetchError, fetch_issue
from pressrun.clients.library import Library
from pressrun.content.keys import generate_keypair, load_subscriber_key
from pressrun.content.manifest import SignedManifest, check_file
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.peer.config import desktop_profile
from pressrun.peer.loopback import loopback_swarm
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

from .conftest import FAST, ISSUE, PIECE, SIZE, Keys
from .test_swarm_path import FAST as SWARM_FAST
from .test_swarm_path import Recorder as SwarmRecorder
from .test_swarm_path import swarm_balancer

TOKEN = "integration-operator-token"
SWARM_SIZE = 2 * 1024 * 1024 + 999


@dataclass
class Subs:
    url: str
    client: SubscriptionsClient

    @property
    def directory(self) -> HttpSubscriberDirectory:
        return HttpSubscriberDirectory(self.url, TOKEN)


@dataclass
class Reader:
    key: nacl.public.PrivateKey
    key_file: Path
    library: Path

    @property
    def public(self) -> bytes:
        return bytes(self.key.public_key)


def reader(tmp_path: Path, name: str) -> Reader:
    secret, _ = generate_keypair(tmp_path / f"{name}.key", subscriber=True)
    return Reader(load_subscriber_key(secret), secret, tmp_path / f"lib-{name}")


@pytest.fixture
async def subs(tmp_path: Path) -> AsyncIterator[Subs]:
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=TOKEN)
    port = await service.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            yield Subs(url, SubscriptionsClient(url, http, operator_token=TOKEN))
    finally:
        await service.close()


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Testbed]:
    testbed = Testbed(
        tmp_path / "bed",
        (OriginShape("origin-a"), OriginShape("origin-b")),
        poll_interval_s=0.3,
        poll_timeout_s=1.0,
    )
    await testbed.__aenter__()
    try:
        yield testbed
    finally:
        await testbed.close()


async def publish_encrypted(
    bed: Testbed, subs: Subs, keys: Keys, data: bytes, issue_id: str = ISSUE
) -> SignedManifest:
    bundle = await bed.publish(
        data,
        issue_id=issue_id,
        key_path=keys.secret,
        piece_size=PIECE,
        encrypt_for=subs.directory,
    )
    if bed.balancer is None:
        await bed.start_balancer()
    assert bed.balancer is not None
    # the balancer learns a new issue from the origins' next status poll
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(f"{bed.balancer.url}/v1/issues/{issue_id}/directive") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
    return SignedManifest.from_json_bytes((bundle / "manifest.json").read_bytes())


async def get(bed: Testbed, who: Reader, keys: Keys, issue_id: str = ISSUE) -> Path:
    assert bed.balancer is not None
    result = await fetch_issue(
        issue_id,
        balancer_url=bed.balancer.url,
        library=who.library,
        config=FAST,
        trusted_keys=keys.trusted,
        subscriber_key=who.key,
    )
    assert result.encrypted and result.verified
    return result.path


async def run_get(
    bed: Testbed, keys: Keys, library: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[int | None, str, str]:
    """``pressrun get ISSUE`` as a process: (exit code, stdout, stderr)."""
    assert bed.balancer is not None
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pressrun.cli",
        "get",
        ISSUE,
        "--balancer",
        bed.balancer.url,
        "--library",
        str(library),
        "--publisher-key",
        str(keys.public),
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


def nothing_readable(library: Path, data: bytes, issue_id: str = ISSUE) -> None:
    """No issue in the library and no file anywhere under it holding plaintext."""
    assert not (library / issue_id).exists()
    probe = data[PIECE : PIECE + 64]
    for path in library.rglob("*") if library.exists() else []:
        if path.is_file():
            assert probe not in path.read_bytes(), path


async def test_a_subscriber_reads_through_origin_sections(
    bed: Testbed, subs: Subs, keys: Keys, data: bytes, tmp_path: Path
) -> None:
    alice = reader(tmp_path, "alice")
    await subs.client.add_subscriber(alice.public, "alice")
    signed = await publish_encrypted(bed, subs, keys, data)
    m = signed.manifest
    assert m.encryption is not None and m.file_name == f"{ISSUE}.pdf.enc"
    # what the origins hold is ciphertext, hashed as such
    ciphertext = (bed.content_dir / ISSUE / m.file_name).read_bytes()
    assert len(ciphertext) == SIZE + 16 * m.num_pieces == m.size_bytes
    assert hashlib.sha256(ciphertext).hexdigest() == m.sha256
    assert data[:64] not in ciphertext and not (bed.content_dir / ISSUE / f"{ISSUE}.pdf").exists()
    path = await get(bed, alice, keys)
    assert path == alice.library / ISSUE / f"{ISSUE}.pdf"
    assert path.read_bytes() == data
    assert not (alice.library / ".partial").exists()  # no ciphertext or plaintext left over


async def test_a_stranger_holding_every_ciphertext_byte_reads_nothing(
    bed: Testbed, subs: Subs, keys: Keys, data: bytes, tmp_path: Path
) -> None:
    alice, eve = reader(tmp_path, "alice"), reader(tmp_path, "eve")
    await subs.client.add_subscriber(alice.public, "alice")
    m = (await publish_encrypted(bed, subs, keys, data)).manifest
    assert bed.balancer is not None
    # eve fetches every public file from an origin: manifest, torrent, ciphertext ...
    origin = bed.urls["origin-a"]
    partial = Library(eve.library).partial_dir(ISSUE)
    partial.mkdir(parents=True)
    async with aiohttp.ClientSession() as http:
        for name in ("manifest.json", f"{ISSUE}.torrent", m.file_name):
            async with http.get(f"{origin}/content/{ISSUE}/{name}") as r:
                assert r.status == 200
                (partial / name).write_bytes(await r.read())
    # ... and, as a resume state, tells her client it holds every verified piece
    state = {
        "issue_id": ISSUE,
        "file_name": m.file_name,
        "sha256": m.sha256,
        "size_bytes": m.size_bytes,
        "piece_size_bytes": m.piece_size_bytes,
        "verified": list(range(m.num_pieces)),
    }
    (partial / "state.json").write_text(json.dumps(state))
    with pytest.raises(FetchError, match=r"^not subscribed: subscriber key .* cannot read"):
        await get(bed, eve, keys)
    nothing_readable(eve.library, data)
    # without a subscriber key at all: a clear message too
    with pytest.raises(FetchError, match="for subscribers only and no subscriber key"):
        await fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=eve.library,
            config=FAST,
            trusted_keys=keys.trusted,
        )
    # the same through the command line: one line on stderr, exit 1
    code, out, err = await run_get(bed, keys, eve.library, "--subscriber-key", str(eve.key_file))
    assert code == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pressrun get: not subscribed:"), lines
    nothing_readable(eve.library, data)
    # alice, subscribed, reads it through the same command line (subscriber key from
    # the environment), and is told it was decrypted
    code, out, err = await run_get(
        bed, keys, alice.library, env={"PRESSRUN_SUBSCRIBER_KEY": str(alice.key_file)}
    )
    assert code == 0, err
    assert "verified and decrypted" in out
    assert (alice.library / ISSUE / f"{ISSUE}.pdf").read_bytes() == data


async def test_a_subscriber_removed_before_the_next_issue_cannot_read_it(
    bed: Testbed, subs: Subs, keys: Keys, data: bytes, tmp_path: Path
) -> None:
    alice, bob, carol = (
        reader(tmp_path, "alice"),
        reader(tmp_path, "bob"),
        reader(tmp_path, "carol"),
    )
    for who, name in ((alice, "alice"), (bob, "bob")):
        await subs.client.add_subscriber(who.public, name)
    await publish_encrypted(bed, subs, keys, data, "mag-1")
    assert (await get(bed, bob, keys, "mag-1")).read_bytes() == data
    await subs.client.remove_subscriber(bob.public)
    await subs.client.add_subscriber(carol.public, "carol")  # subscribes after mag-1
    second = data[::-1]
    await publish_encrypted(bed, subs, keys, second, "mag-2")
    assert (await get(bed, alice, keys, "mag-2")).read_bytes() == second
    assert (await get(bed, carol, keys, "mag-2")).read_bytes() == second
    with pytest.raises(FetchError, match="not subscribed"):
        await get(bed, bob, keys, "mag-2")
    nothing_readable(bob.library, second, "mag-2")
    # carol joined after mag-1 was published: there is no wrap of it for her
    with pytest.raises(FetchError, match="not subscribed to this issue: there is no wrap"):
        await get(bed, carol, keys, "mag-1")
    # bob keeps what he already read (a get checks his copy, asks for no wrap) ...
    assert (await get(bed, bob, keys, "mag-1")).read_bytes() == data
    # ... and a re-download of mag-1 is refused
    shutil.rmtree(bob.library / "mag-1")
    with pytest.raises(FetchError, match="not subscribed"):
        await get(bed, bob, keys, "mag-1")


async def test_subscribers_read_through_the_swarm_a_peer_without_a_wrap_reads_nothing(
    subs: Subs, tmp_path: Path
) -> None:
    alice, bob, eve = (reader(tmp_path, n) for n in ("alice", "bob", "eve"))
    for who, name in ((alice, "alice"), (bob, "bob")):
        await subs.client.add_subscriber(who.public, name)
    async with loopback_swarm(
        tmp_path / "swarm",
        size_bytes=SWARM_SIZE,
        origin_cap_mbps=(None,),
        piece_size=PIECE,
        tracker_interval_s=2,
        encrypt_for=subs.directory,
    ) as swarm:
        m = swarm.manifest
        assert m.encryption is not None
        trusted = {m.publisher_key_bytes}
        balancer = await swarm_balancer(swarm, swarm.tracker_url)
        try:
            # eve is no subscriber: told so before she downloads anything
            with pytest.raises(FetchError, match=r"^not subscribed"):
                await fetch_issue(
                    swarm.issue_id,
                    balancer_url=balancer.url,
                    library=eve.library,
                    config=SWARM_FAST,
                    trusted_keys=trusted,
                    subscriber_key=eve.key,
                )
            # alice and bob, subscribers, read it through the swarm
            recorders = [SwarmRecorder(), SwarmRecorder()]
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        fetch_issue(
                            swarm.issue_id,
                            balancer_url=balancer.url,
                            library=who.library,
                            config=SWARM_FAST,
                            trusted_keys=trusted,
                            subscriber_key=who.key,
                            progress=rec,
                        )
                        for who, rec in zip((alice, bob), recorders, strict=True)
                    )
                ),
                60,
            )
        finally:
            await balancer.stop()
        for who, result, rec in zip((alice, bob), results, recorders, strict=True):
            assert result.mode == "swarm" and result.encrypted, rec.notices
            assert "swarm" in rec.sources, rec.notices
            assert result.path == who.library / swarm.issue_id / f"{swarm.issue_id}.pdf"
            assert result.path.read_bytes() == swarm.data
        # a relay peer gets the whole issue from the web seed and keeps seeding; then the
        # origins go away, and eve's plain peer gets every ciphertext piece from that
        # peer, verified against the signed manifest: she holds it all and reads nothing
        relay = swarm.new_peer(len(swarm.peers), desktop_profile(max_seed_time_s=60.0))
        await relay.start()
        assert await asyncio.wait_for(relay.downloaded(), 30)
        while swarm.origins:
            await swarm.origins.pop().stop()
        (eve_peer,) = await asyncio.wait_for(
            swarm.run_peers(1, desktop_profile(max_seed_time_s=0.5)), 40
        )
        await relay.stop()
    assert eve_peer.completed and eve_peer.bytes_from_web_seeds == 0
    assert eve_peer.bytes_from_peers >= m.size_bytes
    held = eve_peer.path.read_bytes()
    assert check_file(m, eve_peer.path).matches(m)  # every ciphertext byte, verified
    assert swarm.data[PIECE : PIECE + 64] not in held
    nothing_readable(eve.library, swarm.data, swarm.issue_id)
