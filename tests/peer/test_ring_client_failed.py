"""The ring client's supernodes found silent: taken back when they answer again,
forgotten after ``failed_forget_s``, at most `MAX_FAILED` kept. Kept for good before:
a supernode that answered late once (a loaded host) or refused one report was left out
of the owners guessed, and named ``failed`` in every lookup, for the peer's life."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from fronts import served
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.ring_client import RingClient
from pressrun.peer.ring_pacing import FAILED_FORGET_S, MAX_FAILED

#: supernode A answers for keys up to 0x10.., B for those up to 0x80..
ID_A, ID_B = 0x10 << 152, 0x80 << 152
#: pieces 0 and 1 are A's, 2 and 3 B's
KEYS = [0x05 << 152, 0x06 << 152, 0x50 << 152, 0x60 << 152]


def client(tracker_base: str = "http://127.0.0.1:9", **pacing: Any) -> RingClient:
    """A ring client of a 4-piece issue that holds every piece (it reports them)."""
    return RingClient(
        tracker_base=tracker_base,
        info_hash="12" * 20,
        num_pieces=len(KEYS),
        peer_id="ab" * 20,
        address="127.0.0.1:7",
        policy=ChordPolicy(),
        have=lambda: (True,) * len(KEYS),
        unheld=frozenset,
        totals=lambda: (0, 0),
        connect=lambda host, port: None,
        **pacing,
    )


def test_a_silent_supernode_is_forgotten_after_a_while_and_the_claims_are_bounded() -> None:
    c = client()
    c._keys = KEYS
    c._ids = {ID_A: "127.0.0.1:1", ID_B: "127.0.0.1:2"}
    c._found_silent("127.0.0.1:1", 100.0)  # A did not answer a report at 100 s
    c._guess_owners([0, 1, 2, 3], 100.0)
    assert c._owner == {0: "127.0.0.1:2", 1: "127.0.0.1:2", 2: "127.0.0.1:2", 3: "127.0.0.1:2"}
    c._owner.clear()
    c._guess_owners([0, 1], 100.0 + FAILED_FORGET_S - 0.1)  # still left out
    assert c._owner == {0: "127.0.0.1:2", 1: "127.0.0.1:2"}
    c._owner.clear()
    c._guess_owners([0, 1], 100.0 + FAILED_FORGET_S)  # forgotten: its keys are its own
    assert c._owner == {0: "127.0.0.1:1", 1: "127.0.0.1:1"}
    assert c._silent(100.0 + FAILED_FORGET_S) == set()
    # a flood of supernodes found silent (a ring of thousands, or a tracker listing
    # junk): the newest MAX_FAILED claims are kept
    for i in range(10 * MAX_FAILED):
        c._found_silent(f"10.0.{i // 256}.{i % 256}:7000", 200.0 + i / 1000)
    silent = c._silent(201.0)
    assert len(silent) == MAX_FAILED and "10.0.2.127:7000" in silent
    assert len(c.stats.failed_supernodes) <= MAX_FAILED
    assert c.stats.supernode_failures == 1 + 10 * MAX_FAILED


async def test_a_supernode_that_answers_again_is_no_longer_named_failed() -> None:
    # A refuses the first report (503: a loaded host), then answers. B answers
    # `not_mine` for A's keys (A is on the ring), so the client has them looked up, and
    # the lookups name A. Once A answered again, the client's lookups must not name it
    # `failed` any more (before: every lookup for the client's life did, and each made
    # the supernodes check the claim through the ring again).
    lookups: list[list[str]] = []
    reports = {"a": 0, "b": 0}
    addr: dict[str, str] = {}

    def supernode(name: str) -> web.Application:
        async def pieces(request: web.Request) -> web.Response:
            doc = await request.json()
            reports[name] += 1
            if name == "a" and reports["a"] == 1:
                return web.json_response({"error": "busy"}, status=503)
            if name == "a" and reports["a"] == 2:
                return web.json_response({"uploaders": [], "not_mine": [0]})  # once
            theirs = [p for p in doc["have"] if p < 2] if name == "b" else []
            return web.json_response({"uploaders": [], "not_mine": theirs})

        async def lookup(request: web.Request) -> web.Response:
            doc = await request.json()
            lookups.append(list(doc["failed"]))
            owners = {
                k: {"id": f"{ID_A:040x}", "address": addr["a"]}
                for k in doc["keys"]
                if int(k, 16) <= ID_A
            }
            return web.json_response({"owners": owners})

        app = web.Application()
        app.router.add_post("/chord/v1/pieces", pieces)
        app.router.add_post("/chord/v1/lookup", lookup)
        return app

    async def ring(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "num_pieces": len(KEYS),
                "piece_keys": [f"{k:040x}" for k in KEYS],
                "supernodes": [
                    {"id": f"{ID_A:040x}", "address": addr["a"]},
                    {"id": f"{ID_B:040x}", "address": addr["b"]},
                ],
            }
        )

    tracker = web.Application()
    tracker.router.add_get("/v1/ring/{info_hash}", ring)
    async with served(supernode("a")) as a, served(supernode("b")) as b, served(tracker) as t:
        addr["a"], addr["b"] = a.removeprefix("http://"), b.removeprefix("http://")
        c = client(t, interval_s=0.1, min_gap_s=0.02, keepalive_s=0.2)
        c.start()
        try:
            async with asyncio.timeout(8):
                # A refused, answered (not_mine for piece 0), and piece 0 was looked up
                # again after that
                while reports["a"] < 3 or len(lookups) < 2:
                    await asyncio.sleep(0.02)
        finally:
            await c.close()
    assert lookups[0] == [addr["a"]], lookups  # (found silent: named at first)
    assert lookups[-1] == [], lookups  # (before: A named for good)
    assert c.stats.failed_supernodes == {addr["a"]}  # (the record keeps it)
