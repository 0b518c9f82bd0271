"""A stranger against the Chord ring and the tracker's ring administration, on
127.0.0.1 with real supernodes and a real tracker (issue 25, findings 3 to 5; issue 24,
items 6 and 9). The stranger speaks from 127.0.0.2: Linux routes all of 127/8 to the
loopback, so its connections come from another address than the honest peers'."""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator, Sized
from pathlib import Path

import aiohttp
import pytest

from pressrun.chord.aio import Supernode
from pressrun.chord.codec import id_hex
from pressrun.chord.config import ChordConfig
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.content.publish import publish
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

IH = "ab" * 20
PIECES = 40
STRANGER = "127.0.0.2"
FAST = ChordConfig(stabilize_interval_s=0.3, fix_fingers_interval_s=0.2)


def stranger() -> aiohttp.ClientSession:
    """A client whose connections come from 127.0.0.2."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(STRANGER, 0)))


@pytest.fixture
async def open_tracker(tmp_path: Path) -> AsyncIterator[TrackerService]:
    svc = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1)), SqliteStore(tmp_path / "t.db")
    )
    await svc.start("127.0.0.1", 0)
    try:
        yield svc
    finally:
        await svc.close()


def base(svc: TrackerService) -> str:
    assert svc._runner is not None
    return f"http://127.0.0.1:{svc._runner.addresses[0][1]}"


@pytest.fixture
async def supernode(open_tracker: TrackerService) -> AsyncIterator[Supernode]:
    node = Supernode(
        tracker_base=base(open_tracker), info_hash=IH, num_pieces=PIECES, config=FAST, seed=1
    )
    await node.start()
    await node.wait_on_ring()
    try:
        yield node
    finally:
        await node.close(graceful=False)


async def pieces(http: aiohttp.ClientSession, node: Supernode, body: dict[str, object]) -> int:
    async with http.post(f"http://{node.address}/chord/v1/pieces", json=body) as r:
        await r.read()
        return r.status


async def ask(
    http: aiohttp.ClientSession, node: Supernode, peer: str, piece: int
) -> dict[str, object]:
    body = {"peer_id": peer, "address": f"127.0.0.1:{6000 + len(peer)}", "want": [piece]}
    async with http.post(f"http://{node.address}/chord/v1/pieces", json=body) as r:
        assert r.status == 200, await r.text()
        (answer,) = (await r.json())["uploaders"]
        return dict(answer)


# --- finding 3: a report about a holder is accepted only from that holder ------------


async def test_a_stranger_can_neither_redirect_nor_retire_an_honest_holder(
    supernode: Supernode,
) -> None:
    honest = {"peer_id": "honest", "address": "127.0.0.1:5001", "have": [3], "downloaded": 9}
    async with aiohttp.ClientSession() as http, stranger() as evil:
        assert await pieces(http, supernode, honest) == 200
        # the honest holder's peer id, another address; then "it left"
        moved = {**honest, "address": f"{STRANGER}:6666"}
        assert await pieces(evil, supernode, moved) == 403
        claimed = {**honest, "address": "127.0.0.1:5001"}  # (its own address, from elsewhere)
        assert await pieces(evil, supernode, claimed) == 403
        assert await pieces(evil, supernode, {**honest, "left": True}) == 403
        answer = await ask(http, supernode, "asker", 3)
        assert answer["address"] == "127.0.0.1:5001" and answer["bring_in"] is False
        # the honest peer reports again: still the one named
        assert await pieces(http, supernode, honest) == 200
        assert (await ask(http, supernode, "asker-2", 3))["address"] == "127.0.0.1:5001"


async def test_a_holder_is_where_its_reports_come_from(supernode: Supernode) -> None:
    # a stranger holding the piece (or saying so) sends askers to itself, nowhere else
    async with aiohttp.ClientSession() as http, stranger() as evil:
        body = {"peer_id": "evil", "address": "198.18.0.9:6881", "have": [5], "downloaded": 9}
        assert await pieces(evil, supernode, body) == 200
        answer = await ask(http, supernode, "asker", 5)
        assert answer["address"] == f"{STRANGER}:6881"


async def test_forged_peer_ids_are_bounded_per_address_and_forgotten(supernode: Supernode) -> None:
    d = supernode.directory
    async with stranger() as evil:
        refused = 0
        for i in range(600):
            body = {"peer_id": f"forged-{i}", "address": f"{STRANGER}:{7000 + i}", "have": [1]}
            refused += await pieces(evil, supernode, body) == 429
    # (docs/chord.md: at most 128 holders reporting from one address)
    assert len(d.holders) <= 128 and refused == 600 - len(d.holders)
    # the holder TTL later, one honest report: the forged ones are gone
    now = supernode._now() + d.holder_ttl_s + 1
    d.handle_report(
        peer_id="late",
        address="127.0.0.1:1",
        have=[1],
        uploaded_bytes=0,
        downloaded_bytes=0,
        now=now,
    )
    assert set(d.holders) == {"late"} and d.pieces.get(1) == {"late"}


# --- finding 5: lookups only for the issue's piece keys, caches bounded ---------------


async def test_lookups_of_keys_that_are_no_piece_cost_nothing(supernode: Supernode) -> None:
    rng = random.Random(5)
    async with stranger() as evil:
        for _ in range(3):
            keys = [id_hex(rng.getrandbits(160)) for _ in range(1000)]
            url = f"http://{supernode.address}/chord/v1/lookup"
            async with evil.post(url, json={"keys": keys}) as r:
                assert r.status == 400 and "piece" in (await r.json())["error"]
    assert len(supernode._owners) <= PIECES and supernode.stats.lookups == 0


# --- issue 24 item 9: GET /v1/ring/<any string> remembers nothing ---------------------


def _sized_cells(svc: TrackerService) -> list[Sized]:
    # what the ring's GET handler keeps between requests: its closure, the closures of
    # the functions in it, and the attributes of the objects there
    for route in svc._runner.app.router.routes() if svc._runner else []:
        handler = route.handler
        if getattr(handler, "__name__", "") == "get_ring":
            break
    else:
        raise AssertionError("no get_ring route")
    found: list[Sized] = []
    todo, seen = [handler], set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            value = cell.cell_contents
            if callable(value) and hasattr(value, "__closure__"):
                todo.append(value)
            elif isinstance(value, set | dict | list):
                found.append(value)
            elif hasattr(value, "__dict__") and not isinstance(value, type):
                found += [v for v in vars(value).values() if isinstance(v, set | dict | list)]
    return found


async def test_ring_gets_for_any_string_remember_nothing(open_tracker: TrackerService) -> None:
    rng = random.Random(9)
    async with stranger() as evil:
        for i in range(3000):
            if i % 2:
                name = "".join(rng.choices(string.ascii_letters, k=30))
            else:
                name = rng.randbytes(20).hex()
            async with evil.get(f"{base(open_tracker)}/v1/ring/{name}") as r:
                assert r.status in (400, 404)
    assert all(len(c) <= 1024 for c in _sized_cells(open_tracker))


# --- finding 4: made-up ring state at the tracker -----------------------------------


@pytest.fixture
async def published_tracker(tmp_path: Path) -> AsyncIterator[tuple[TrackerService, str, int]]:
    """A tracker whose allowlist is a content folder with one signed bundle (16 pieces
    of 64 KiB): (service, info-hash, piece count)."""
    secret, pub = generate_keypair(tmp_path / "publisher.key")
    (tmp_path / "issue.pdf").write_bytes(random.Random(1).randbytes(16 * 65536))
    content = tmp_path / "content"
    content.mkdir()
    bundle = publish(
        tmp_path / "issue.pdf",
        issue_id="weekly-47",
        title="Weekly 47",
        key_path=secret,
        content_dir=content,
        piece_size=65536,
    )
    from pressrun.content.bundle import read_manifest

    manifest = read_manifest(bundle / "manifest.json")
    svc = TrackerService(
        TrackerCore(TrackerConfig(), random.Random(1), allowed=[]),
        SqliteStore(tmp_path / "t.db"),
        content_dirs=[content],
        trusted_keys={load_public_key(pub)},
    )
    await svc.start("127.0.0.1", 0)
    try:
        yield svc, manifest.info_hash, manifest.num_pieces
    finally:
        await svc.close()


async def register(
    http: aiohttp.ClientSession, svc: TrackerService, ih: str, address: str, num_pieces: int
) -> tuple[int, dict[str, object]]:
    url = f"{base(svc)}/v1/ring/{ih}/supernodes"
    async with http.post(url, json={"address": address, "num_pieces": num_pieces}) as r:
        return r.status, dict(await r.json())


async def test_the_piece_count_is_the_published_torrents(
    published_tracker: tuple[TrackerService, str, int],
) -> None:
    svc, ih, num_pieces = published_tracker
    assert num_pieces == 16
    async with stranger() as evil, aiohttp.ClientSession() as http:
        status, doc = await register(evil, svc, ih, f"{STRANGER}:7000", 1 << 20)
        assert status == 400 and "16 pieces" in str(doc["error"])
        status, doc = await register(http, svc, ih, "127.0.0.1:7000", num_pieces)
        assert status == 200, doc
        async with http.get(f"{base(svc)}/v1/ring/{ih}") as r:
            view = await r.json()
    assert view["num_pieces"] == 16 and len(view["piece_keys"]) == 16


async def test_a_port_flood_from_one_address_leaves_room_for_the_real_supernode(
    published_tracker: tuple[TrackerService, str, int],
) -> None:
    svc, ih, num_pieces = published_tracker
    async with stranger() as evil, aiohttp.ClientSession() as http:
        statuses = [
            (await register(evil, svc, ih, f"{STRANGER}:{10000 + port}", num_pieces))[0]
            for port in range(1024)
        ]
        status, doc = await register(http, svc, ih, "127.0.0.1:7000", num_pieces)
        assert status == 200, doc
    assert statuses.count(200) <= 8 and set(statuses) <= {200, 429}


def test_the_dead_supernodes_a_supernode_remembers_are_bounded() -> None:
    # (a ring running for weeks routes around many: the list grew with every one)
    from pressrun.chord.events import NodeFailed
    from pressrun.chord.ids import NodeRef

    node = Supernode(tracker_base="http://127.0.0.1:9", info_hash=IH, num_pieces=PIECES)
    node._apply([NodeFailed(NodeRef(i, f"10.0.{i // 250}.{i % 250}:1")) for i in range(5000)])
    assert len(node.stats.nodes_failed) <= 64
    assert node.stats.nodes_failed[-1] == "10.0.19.249:1"  # (the latest kept)
