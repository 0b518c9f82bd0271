"""A peer that brought a piece in asks for the next one in the same request that reports
it, and hears of the piece when libtorrent finishes it, not at the next status read.

A supernode's fetch limit frees a place among its pieces being brought in only when
the bringer reports the piece; the next piece goes out when someone asks about a piece
nobody holds. The askers' ``wait`` answers hold their questions back 1-3 s, so on the
loopback bench at N = 40 with ten fetches at once the origins had no fetch in flight
at 1.0 s: the first ten done at 0.24-0.82 s, the next handed out at 1.03-1.07 s
(docs/results/2026-11-28-swarm-limit.md, section 18)."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from fronts import served
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.ring_client import RingClient
from pressrun.peer.ring_pacing import AskPacing
from pressrun.peer.status import SwarmStatus

PIECES = 16


@contextlib.asynccontextmanager
async def bringing_ring() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """One supernode (this loopback server, also the tracker front): the first piece
    asked about goes to the asker to bring in, every other is ``wait``; every question's
    body is kept."""
    asked: list[dict[str, Any]] = []
    handed: list[int] = []

    async def ring(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "num_pieces": PIECES,
                "piece_keys": [f"{k:040x}" for k in range(PIECES)],
                "supernodes": [{"id": "f" * 40, "address": request.host}],
            }
        )

    async def pieces(request: web.Request) -> web.Response:
        doc = await request.json()
        asked.append(doc)
        answers = []
        for p in doc["want"]:
            if not handed:
                handed.append(p)
                answers.append({"piece": p, "address": doc["address"], "bring_in": True})
            else:
                answers.append({"piece": p, "address": "", "wait": True})
        return web.json_response({"uploaders": answers})

    app = web.Application()
    app.router.add_get("/v1/ring/{info_hash}", ring)
    app.router.add_post("/chord/v1/pieces", pieces)
    async with served(app) as base:
        yield base, asked


async def test_the_report_of_a_piece_brought_in_asks_for_the_next() -> None:
    have = [False] * PIECES
    policy = ChordPolicy()
    async with bringing_ring() as (base, asked):
        c = RingClient(
            tracker_base=base,
            info_hash="12" * 20,
            num_pieces=PIECES,
            peer_id="ab" * 20,
            address="127.0.0.1:7",
            policy=policy,
            have=lambda: tuple(have),
            unheld=lambda: {p for p in range(PIECES) if not have[p]},
            lonely=lambda: set(),
            totals=lambda: (0, 0),
            connect=lambda host, port: None,
            interval_s=2.0,
            min_gap_s=0.05,
        )
        c.start()
        try:
            async with asyncio.timeout(5):
                while not policy.bring_in:
                    await asyncio.sleep(0.01)
            (piece,) = policy.bring_in
            waited = set(asked[0]["want"]) - {piece}
            assert waited, asked[0]
            await asyncio.sleep(0.1)
            have[piece] = True  # brought in (0.1 s after the answer: within the 1 s wait)
            c.nudge()
            async with asyncio.timeout(1.0):
                while not any(piece in q["have"] for q in asked):
                    await asyncio.sleep(0.01)
        finally:
            await c.close()
    report = next(q for q in asked if piece in q["have"])
    # the same request asks again about the pieces answered ``wait`` (on the code
    # before: none, they waited for their 1 s)
    assert waited & set(report["want"]), report


def test_ask_again_only_the_pieces_answered_wait() -> None:
    pacing = AskPacing(peer_id="ab", num_pieces=4, reask_s=3.0, max_wants=8)
    for p in (0, 1):
        assert pacing.may_ask(p, False, 0.0)
    pacing.answered(0, 0.0, wait=True)
    pacing.answered(1, 0.0, wait=False)  # given an uploader: asked again after reask_s
    assert not pacing.askable(0, False, 0.5) and not pacing.askable(1, False, 0.5)
    pacing.ask_again([0, 1, 2], 0.5)
    assert pacing.askable(0, False, 0.5)
    assert not pacing.askable(1, False, 0.5)


def test_a_finished_piece_is_held_for_the_ring_at_once() -> None:
    # libtorrent's finished alert: the ring client's view and its nudge, before the
    # next status read
    nudges: list[int] = []
    status = SwarmStatus(
        manifest=types.SimpleNamespace(num_pieces=4, piece_size_bytes=1),  # type: ignore[arg-type]
        policy=ChordPolicy(),
        feed=None,  # type: ignore[arg-type]
        handle=lambda: None,
        peer_id=lambda: "ab",
        on_pieces_changed=lambda: nudges.append(1),
    )
    status.piece_finished(2)  # no status read yet: nothing to update
    assert status.have_bits is None and not nudges
    status.have_bits = (True, False, False, False)
    status.piece_finished(2)
    assert status.have_bits == (True, False, True, False) and nudges == [1]
    status.piece_finished(2)  # held already
    status.piece_finished(9)  # not a piece
    assert nudges == [1]
