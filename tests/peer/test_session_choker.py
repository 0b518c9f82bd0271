"""The peer's libtorrent choker re-ranks its unchoke slots every few seconds.

libtorrent's choker (its `choker.cpp`) gives a downloading peer's unchoke slots to the
peers that sent it the most in the last round; between rounds a slot goes only to a
peer that *becomes* interested while one is free. Its default round is 15 s, most of
a loopback swarm's 20-25 s download, so whoever took a peer's slots in the first
second kept them for most of it (docs/results/2026-11-28-swarm-limit.md, section 17).
These tests use real libtorrent sessions on 127.0.0.1 with the peer's own settings
(`pressrun.peer.session.session_settings`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import libtorrent as lt
import pytest

from pressrun.peer.config import PeerConfig
from pressrun.peer.session import AlertSession, session_settings

PIECE = 32 * 1024
PIECES = 64


def make_torrent(data: bytes) -> Any:
    """A private single-file torrent (private: no peer exchange, so every connection
    is one the test makes)."""
    info = {
        b"name": b"issue.bin",
        b"length": len(data),
        b"piece length": PIECE,
        b"private": 1,
        b"pieces": b"".join(
            hashlib.sha1(data[i : i + PIECE]).digest() for i in range(0, len(data), PIECE)
        ),
    }
    return lt.torrent_info({b"info": info})


class Peers:
    """Sessions with the peer's settings; each torrent added from a directory holding
    the pieces that peer has (libtorrent checks them when it adds the torrent)."""

    def __init__(self, tmp: Path, data: bytes) -> None:
        self.tmp = tmp
        self.data = data
        self.ti = make_torrent(data)
        self.sessions: list[AlertSession] = []

    def add(self, name: str, upload_bps: int, have: range) -> tuple[Any, Any]:
        folder = self.tmp / name
        folder.mkdir()
        content = bytearray(len(self.data))
        for k in have:
            content[k * PIECE : (k + 1) * PIECE] = self.data[k * PIECE : (k + 1) * PIECE]
        (folder / "issue.bin").write_bytes(bytes(content))
        settings = session_settings(
            PeerConfig(upload_limit_bps=upload_bps), listen_interfaces="127.0.0.1:0"
        )
        alerts = AlertSession(
            settings,
            loop=asyncio.get_running_loop(),
            on_alert=lambda alert: None,
            after_alerts=lambda: None,
        )
        self.sessions.append(alerts)
        params = lt.add_torrent_params()
        params.ti = self.ti
        params.save_path = str(folder)
        return alerts.session, alerts.session.add_torrent(params)


@pytest.fixture
async def peers(tmp_path: Path) -> AsyncIterator[Peers]:
    data = bytes(range(256)) * (PIECE * PIECES // 256)
    made = Peers(tmp_path, data)
    yield made
    for alerts in made.sessions:
        await alerts.close()


async def until(what: str, check: Any, timeout_s: float) -> float:
    """Seconds until ``check()`` holds (polled every 50 ms), or a failure naming it."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def pieces_held(handle: Any) -> int:
    return int(handle.status().num_pieces)


def unchokes(handle: Any, port: int) -> bool:
    """Whether this torrent unchokes the peer listening on ``port`` (its outgoing
    connection to it)."""
    return any(
        p.ip[1] == port and not p.flags & lt.peer_info.choked for p in handle.get_peer_info()
    )


def interested_unchoked(handle: Any) -> tuple[int, int]:
    infos = [p for p in handle.get_peer_info() if p.flags & lt.peer_info.remote_interested]
    return len(infos), sum(1 for p in infos if not p.flags & lt.peer_info.choked)


async def test_a_peer_that_sends_gets_a_slot_within_a_round_of_a_few_seconds(peers: Peers) -> None:
    half = PIECES // 2
    # X holds the first half and uploads slowly, so nothing it serves completes here
    x_ses, x = peers.add("x", 16_000, range(half))
    await until("X checked its pieces", lambda: pieces_held(x) == half, 10)
    # peers holding nothing take X's eight unchoke slots as they become interested
    # (libtorrent's preemptive unchoke; its first round leaves seven of them, and the
    # next newcomer takes the eighth); they send X nothing
    for k in range(8):
        _, g = peers.add(f"g{k}", 0, range(0))
        g.connect_peer(("127.0.0.1", x_ses.listen_port()))
    await until("X's first round", lambda: interested_unchoked(x)[0] == 8, 10)
    await asyncio.sleep(1.5)
    for k in range(8, 12):
        if interested_unchoked(x)[1] == 8:
            break
        _, g = peers.add(f"g{k}", 0, range(0))
        g.connect_peer(("127.0.0.1", x_ses.listen_port()))
        await until("a newcomer interested", lambda k=k: interested_unchoked(x)[0] == k + 1, 10)
    # P holds the other half: it wants X's pieces and sends X its own (it has free slots)
    p_ses, p = peers.add("p", 64_000, range(half, PIECES))
    await until("P checked its pieces", lambda: pieces_held(p) == half, 10)
    x.connect_peer(("127.0.0.1", p_ses.listen_port()))
    await until("P sends X a piece", lambda: pieces_held(x) > half, 10)
    # X gives P a slot at its next round (the peer that sent it the most): within the
    # round and a tick; with libtorrent's 15 s round P waited up to 15 s, choked by
    # peers that sent nothing
    await until("X unchokes P", lambda: unchokes(x, p_ses.listen_port()), 5.0)
