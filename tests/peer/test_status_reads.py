"""A status read asks libtorrent once for each thing it reads (issue 29).

Every read of a torrent handle (``status``, ``get_peer_info``, ``piece_availability``)
is a synchronous call the session's network thread answers, its answer converted to
Python objects one connection or piece at a time. On the loopback bench at N = 80 the
reads were 41% of a worker's event loop: a status read asked for the availability
twice (the plan's and the sources'), the feed asked again for the peer infos it had
just been given the pieces from, and woke at every read to read the status once more
with nothing to fetch (docs/results/2026-11-28-swarm-limit.md, section 24). These
replay a bringer's read on a fake handle that counts what it is asked; the session's
block alerts are asked for only where the timeline that reads them is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import libtorrent as lt
import pytest

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.config import PeerConfig
from pressrun.peer.session import session_settings
from swarm_status_rig import connected_peer, plan_among, six_piece_status, torrent_status

_HAVE = (True, False, False, False, False, False)


class _CountingHandle:
    """Six pieces, piece 0 held; nobody connected holds 1, 2 or 3, two hold 4 and 5;
    one downloading peer connected. Counts every read."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()

    def piece_availability(self) -> list[int]:
        self.reads["piece_availability"] += 1
        return [1, 0, 0, 0, 2, 2]

    def get_peer_info(self) -> list[object]:
        self.reads["get_peer_info"] += 1
        return [connected_peer(1, down_bps=0)]

    def get_download_queue(self) -> list[object]:
        self.reads["get_download_queue"] += 1
        return []

    def status(self, flags: int | None = None) -> Any:
        self.reads["status"] += 1
        return _status()

    def get_piece_priorities(self) -> list[int]:
        self.reads["get_piece_priorities"] += 1
        return [1] * len(_HAVE)

    def prioritize_pieces(self, priorities: list[int]) -> None:
        pass

    def set_max_uploads(self, slots: int) -> None:
        pass


def _status() -> Any:
    return torrent_status(
        list(_HAVE), up_bps=0, down_bps=0, leechers=2, uploaded=0, downloaded=0, peers=1
    )


async def test_a_status_read_asks_libtorrent_once_for_each_thing() -> None:
    handle = _CountingHandle()
    policy = ChordPolicy()
    policy.set_ring_answers(bring_in=[1])  # (piece 1 is this peer's to bring in: owed)
    status = six_piece_status(handle, policy, upload_limit_bps=1_000_000)
    assert plan_among(status, handle, policy, _HAVE, leechers=2) is not None
    # (a running feed: it counts its connections' rates while pieces are owed)
    status._feed._task = asyncio.ensure_future(asyncio.sleep(0))
    handle.reads.clear()
    status.read(_status(), now=1.0, planning=True)
    assert 1 in status._feed.owed, status._feed.owed
    # (before: the availability twice, the peer infos twice)
    assert handle.reads["piece_availability"] == 1, handle.reads
    assert handle.reads["get_peer_info"] == 1, handle.reads
    await status._feed._task


async def test_a_feed_that_owes_nothing_reads_no_status() -> None:
    # woken at every status read: with nothing owed (and no late connection to judge)
    # there is nothing to pick, and libtorrent's status is not read (before: read)
    handle = _CountingHandle()
    status = six_piece_status(handle, ChordPolicy())
    feed = status._feed
    feed.set_owed(())
    assert feed._next_owed() is None
    assert handle.reads["status"] == 0, handle.reads
    assert feed.queued_elsewhere == 0


def _block_alerts(settings: dict[str, Any]) -> bool:
    block = int(lt.alert.category_t.block_progress_notification)
    return int(settings["alert_mask"]) & block == block


def test_block_alerts_only_where_the_timeline_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # two alerts a 16 KiB block, read by nothing but the timeline's INFO lines
    config = PeerConfig()
    caplog.set_level(logging.WARNING, logger="pressrun.peer.timeline")
    quiet = session_settings(config, listen_interfaces="127.0.0.1:0")
    assert not _block_alerts(quiet)  # (before: asked for whatever the log)
    caplog.set_level(logging.INFO, logger="pressrun.peer.timeline")
    logged = session_settings(config, listen_interfaces="127.0.0.1:0")
    assert _block_alerts(logged)
    assert int(logged["alert_mask"]) & ~int(lt.alert.category_t.block_progress_notification) == (
        int(quiet["alert_mask"])
    )
