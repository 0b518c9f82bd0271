"""The swarm peer's session close never runs libtorrent's destructor in a command-line
peer, and removes the torrent a cancelled fetch left in it first.

In the flash-crowd pair at 8059ace (29 Nov 14:00, load 112 on 2 cores) a desktop left
its swarm for the carousel 13 s into its download: the fetch was cancelled (no leave
removed the torrent), the session's destructor ran in ``_drop`` holding the GIL, and
the 8 s watchdog ended the process with status 1, its download with it. Measured on
127.0.0.1 (docs/results/2026-11-29-leave.md): the destructor holds the GIL until the
session's network thread ends, which waits for any name lookup in flight (9.2 s with a
DNS server that stopped answering). These tests use real libtorrent sessions in a loopback
swarm (tracker, a capped origin), closed mid-download as that client's was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("libtorrent")

from peer.test_kept_session import LOADED_HOST_WAIT_S, own_sessions
from pressrun.peer import leave, session, watchdog
from pressrun.peer.aio import SwarmPeer
from pressrun.peer.config import desktop_profile
from pressrun.peer.loopback import LoopbackSwarm, loopback_swarm

SIZE = 4 * 1024 * 1024
PIECE = 64 * 1024


@pytest.fixture
def drops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Each destructor `session._drop` ran, as the info-hashes its session still held
    then (the destructor itself still runs); the watchdog's state and the kept list are
    this test's own."""
    seen: list[list[str]] = []
    real_drop = session._drop

    def drop(holder: list[Any]) -> None:
        seen.append([str(h.info_hashes().get_best()) for h in holder[0].get_torrents()])
        real_drop(holder)

    # (a removal the tests assert confirmed gets the time a loaded host may need; the
    # code's bound is REMOVE_WAIT_S, 2 s, for a reader)
    monkeypatch.setattr(leave, "REMOVE_WAIT_S", LOADED_HOST_WAIT_S)
    for _ in own_sessions(monkeypatch, drop):
        yield seen


async def downloading_peer(swarm: LoopbackSwarm, index: int) -> tuple[SwarmPeer, Any]:
    """A peer that has some pieces and not all (the origin is capped, the peer's
    download too): the moment a client leaves its swarm for the carousel; and its
    libtorrent session."""
    peer = swarm.new_peer(index, desktop_profile(download_limit_bps=200_000))
    await peer.start()
    async with asyncio.timeout(30):
        while True:
            p = peer._status.last_progress
            if p is not None and p.done_bytes > 0:
                break
            await asyncio.sleep(0.05)
    p = peer._status.last_progress
    assert p is not None and p.done_bytes < SIZE, "closed mid-download"
    assert peer._alerts is not None
    return peer, peer._alerts.session


async def test_a_command_line_peer_closed_mid_download_runs_no_destructor(
    tmp_path: Path, drops: list[list[str]]
) -> None:
    watchdog.set_close_bound(watchdog.COMMAND_LINE_BOUND_S)  # what pressrun get sets
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(4.0,), piece_size=PIECE
    ) as swarm:
        peer, ses = await downloading_peer(swarm, 0)
        await peer.close()  # what a cancelled fetch's `finally` does
        # on the code before: _drop ran the destructor with the torrent still in the
        # session (the hang at load 112)
        assert drops == []
        closed = peer._leave.session_close
        assert closed is not None and closed.kept and closed.destroy_s is None
        assert closed.removed == 1 and closed.unconfirmed == 0
        assert ses.get_torrents() == []  # libtorrent removed it: no file of it open
        assert ses.is_paused()
        assert [s for s, _ in session._kept] == [ses]
        assert watchdog._kept  # the console script ends the process by os._exit then
        # no leave happened, so no leave step: the close is reported by itself
        assert peer._leave.steps == {}


async def test_a_library_destroys_its_session_after_the_removal(
    tmp_path: Path, drops: list[list[str]]
) -> None:
    # a process that does not end itself (a library, a test, the loopback bench)
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(4.0,), piece_size=PIECE
    ) as swarm:
        peer, _ = await downloading_peer(swarm, 0)
        await peer.close()
        # the destructor ran, and found no torrent left to abort
        assert drops == [[]]
        closed = peer._leave.session_close
        assert closed is not None and not closed.kept
        assert closed.removed == 1 and closed.unconfirmed == 0
        assert closed.destroy_s is not None and closed.destroy_s >= 0
        assert session._kept == []


async def test_a_removal_not_confirmed_in_time_is_logged_and_not_waited_for(
    tmp_path: Path, drops: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    # A leave whose budget ran out gives the close no time for the removal (0 s): the
    # torrent is asked out, the session kept, and the log says what was not confirmed.
    watchdog.set_close_bound(watchdog.COMMAND_LINE_BOUND_S)
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(4.0,), piece_size=PIECE
    ) as swarm:
        peer, ses = await downloading_peer(swarm, 0)
        alerts = peer._alerts
        assert alerts is not None
        with caplog.at_level(logging.WARNING, logger="pressrun.peer.session"):
            closed = await alerts.close(remove_wait_s=0.0)
        assert closed.kept and closed.removed == 1 and closed.unconfirmed == 1
        assert drops == []
        (record,) = [r for r in caplog.records if "had not confirmed the removal" in r.message]
        assert "1 of 1 torrent(s)" in record.message
        assert "kept until the process ends" in record.message
        # libtorrent still removes it, after the close returned
        async with asyncio.timeout(30):
            while ses.get_torrents():
                await asyncio.sleep(0.05)
        peer._alerts = None  # closed above
        await peer.close()
