"""The peer's libtorrent choker re-ranks its unchoke slots every few seconds.

libtorrent's choker (its `choker.cpp`) gives a downloading peer's unchoke slots to the
peers that sent it the most in the last round; between rounds a slot goes only to a
peer that *becomes* interested while one is free. Its default round is 15 s, most of
a loopback swarm's 20-25 s download, so whoever took a peer's slots in the first
second kept them for most of it (docs/results/2026-11-28-swarm-limit.md, section 17).
These tests use real libtorrent sessions on 127.0.0.1 with the peer's own settings
(`pressrun.peer.session.session_settings`).

A round does not always give the best sender a slot. libtorrent 2.1's
`recalculate_unchoke_slots` ranks its peers with `std::nth_element` up to the slot
limit (8), then unchokes the first `slots - optimistic` (7) of those 8 in the order
they happen to be in, its connections' order in memory: one of the 8 best is left
out, and a lone sender in that place is left out at every round while the others send
nothing. That failed session 24's CI ("X unchokes P: not within 5.0 s"): run 12 times
in one process (29 Nov, load 0.4-2.8), P was once the 9th of X's 10 connections and
got no slot in 7 rounds (20 s). So four peers send here, and the test asserts that
one of those X refused gets a slot at the next round: of the 8 that sent X the most,
X leaves out at most one, whatever the order.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import libtorrent as lt
import pytest

from pressrun.peer.config import PeerConfig
from pressrun.peer.session import UNCHOKE_INTERVAL_S, AlertSession, session_settings

PIECE = 32 * 1024
PIECES = 64
SENDERS = 4
#: the longest a round may take, seconds: libtorrent counts a round in its second ticks,
#: each at least a second after the one before, so its 15 s default is never shorter
#: than 15 s. The peer's 3 s rounds were 3.00-3.19 s apart in 22 runs (29 Nov
#: 15:50-15:57, load 4.3-12.9), a refused sender unchoked 0-2.4 s after the last
#: sender's first bytes; with ``unchoke_interval`` 15 the rounds were 15.0-16.8 s apart
#: and 3 of 3 runs failed on that, though their waits (5.9-7.9 s) were within this
#: bound: the rounds' gaps tell 3 s from 15 s at any load and phase, the slack is for a
#: loaded host
ROUND_MAX_S = 10.0
#: how long a setup step (sessions checking, connecting, interest) may take, seconds:
#: at load 14 the eight peers holding nothing took more than 10 s to connect once in 20
#: (one of them still checking its file: `Peers.add`)
SETUP_S = 30.0
ROUND_LOG = "RECALCULATE UNCHOKE SLOTS"


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


def record_rounds(rounds: list[datetime]) -> Callable[[Any], None]:
    """An alert handler appending the time of each of the choker's rounds to ``rounds``."""

    def on_alert(alert: Any) -> None:
        if isinstance(alert, lt.log_alert) and ROUND_LOG in alert.log_message():
            rounds.append(alert.timestamp())

    return on_alert


class Peers:
    """Sessions with the peer's settings; each torrent added from a directory holding
    the pieces that peer has, if any (libtorrent checks them when it adds the torrent)."""

    def __init__(self, tmp: Path, data: bytes) -> None:
        self.tmp = tmp
        self.data = data
        self.ti = make_torrent(data)
        self.sessions: list[AlertSession] = []

    def add(
        self, name: str, upload_bps: int, have: range, *, rounds: list[datetime] | None = None
    ) -> tuple[Any, Any]:
        """A peer; with ``rounds``, the times (libtorrent's clock) of its choker's
        rounds are appended to it (its session log, which changes no decision)."""
        folder = self.tmp / name
        folder.mkdir()
        if have:
            content = bytearray(len(self.data))
            for k in have:
                content[k * PIECE : (k + 1) * PIECE] = self.data[k * PIECE : (k + 1) * PIECE]
            (folder / "issue.bin").write_bytes(bytes(content))
        # a peer holding nothing gets no file to check (at load 7-20 one of eight such
        # peers was still checking its 2 MiB of zeros after 30 s, once in 10 runs)
        settings = session_settings(
            PeerConfig(upload_limit_bps=upload_bps), listen_interfaces="127.0.0.1:0"
        )
        if rounds is not None:
            settings["alert_mask"] |= int(lt.alert_category.session_log)
        alerts = AlertSession(
            settings,
            loop=asyncio.get_running_loop(),
            on_alert=(lambda alert: None) if rounds is None else record_rounds(rounds),
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


def connections(handle: Any, ports: list[int]) -> dict[int, Any]:
    """This torrent's outgoing connections to the peers listening on ``ports``."""
    return {p.ip[1]: p for p in handle.get_peer_info() if p.ip[1] in ports}


def interested_unchoked(handle: Any) -> tuple[int, int]:
    infos = [p for p in handle.get_peer_info() if p.flags & lt.peer_info.remote_interested]
    return len(infos), sum(1 for p in infos if not p.flags & lt.peer_info.choked)


async def test_a_peer_that_sends_gets_a_slot_within_a_round_of_a_few_seconds(peers: Peers) -> None:
    half = PIECES // 2
    rounds: list[datetime] = []
    # X holds the first half and uploads slowly, so nothing it serves completes here
    x_ses, x = peers.add("x", 16_000, range(half), rounds=rounds)
    x_alerts = peers.sessions[-1]
    await until("X checked its pieces", lambda: pieces_held(x) == half, SETUP_S)
    # peers holding nothing take X's eight unchoke slots as they become interested
    # (libtorrent's preemptive unchoke; its first round leaves seven of them, and the
    # next newcomer takes the eighth); they send X nothing
    for k in range(8):
        _, g = peers.add(f"g{k}", 0, range(0))
        g.connect_peer(("127.0.0.1", x_ses.listen_port()))
    await until("X's first round", lambda: interested_unchoked(x)[0] == 8, SETUP_S)
    await asyncio.sleep(1.5)
    for k in range(8, 12):
        if interested_unchoked(x)[1] == 8:
            break
        _, g = peers.add(f"g{k}", 0, range(0))
        g.connect_peer(("127.0.0.1", x_ses.listen_port()))
        await until(
            "a newcomer interested", lambda k=k: interested_unchoked(x)[0] == k + 1, SETUP_S
        )
    # the senders hold the other half: they want X's pieces and send X their own (they
    # have free slots), slowly enough that X is still downloading from them at the end
    # (4 x 16 kB/s: 16 s for the half). They say they are interested right after the
    # handshake, before any piece: X refuses them a slot, but for one if a round (each
    # leaves one free) came after the last newcomer, and one more if another round came
    # while X connected to them (its connections start at its second ticks)
    ports = []
    for k in range(SENDERS):
        s_ses, s = peers.add(f"p{k}", 16_000, range(half, PIECES))
        await until("a sender checked its pieces", lambda s=s: pieces_held(s) == half, SETUP_S)
        ports.append(s_ses.listen_port())
    for port in ports:
        x.connect_peer(("127.0.0.1", port))
    choked_at_interest: dict[int, bool] = {}

    def note_interest() -> bool:
        for port, p in connections(x, ports).items():
            if port not in choked_at_interest and p.flags & lt.peer_info.remote_interested:
                choked_at_interest[port] = bool(p.flags & lt.peer_info.choked)
        return len(choked_at_interest) == SENDERS

    await until("the senders interested", note_interest, SETUP_S)
    choked = [port for port, was_choked in choked_at_interest.items() if was_choked]
    assert len(choked) >= 2, f"X gave {SENDERS - len(choked)} of {SENDERS} senders a free slot"

    def all_send() -> bool:
        found = connections(x, ports).values()
        return len(found) == SENDERS and all(p.total_download > 0 for p in found)

    await until("every sender sends X", all_send, SETUP_S)
    # X's next round gives one of those it refused a slot (of the 8 that sent it the most
    # it leaves out at most one); with libtorrent's 15 s round they waited up to 15 s,
    # choked by peers that sent nothing
    await until(
        "X unchokes a sender it refused",
        lambda: any(not p.flags & lt.peer_info.choked for p in connections(x, choked).values()),
        ROUND_MAX_S,
    )
    # the round that unchoked it logged before it unchoked: take its alert now, if the
    # loop has not yet
    x_alerts.drain()
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(rounds)]
    assert gaps, "X's choker ran no rounds"
    assert max(gaps) <= ROUND_MAX_S, f"X's rounds {gaps} s apart ({UNCHOKE_INTERVAL_S} s set)"
