"""A swarm client's log says where its pieces came from, and when (issue 29,
`pressrun.peer.timeline`).

In `make emulate SCENARIO=small` of 29 Nov the last swarm client used about 0.4 of its
link for three seconds (2.45x the origin client's time), and its log said only how many
bytes had come from the origins and from peers: not which peer it waited on, nor from
when. Now the log names the first piece from a peer and, at the end, each source (the
pieces the client handed over itself, each web seed, each peer by address and peer id,
what was on disk) with its pieces, bytes and the time of its first and last piece.
"""

from __future__ import annotations

import asyncio
import logging
import re
import types
from pathlib import Path
from typing import Any

import pytest

from pressrun.peer.config import desktop_profile
from pressrun.peer.loopback import loopback_swarm
from pressrun.peer.timeline import (
    ADDED,
    BLOCK_BYTES,
    ON_DISK,
    OTHER,
    PieceSources,
    SwarmTimeline,
)

PIECE = 128 * 1024
SIZE = 4_000_000  # the small scenario's issue: 31 pieces, the last one 67,456 B
PEER_A = ("172.18.0.5", 6881)
PEER_B = ("172.18.0.6", 40312)
ORIGIN = ("172.18.0.2", 8001)
ID_A = b"-PR0100-0123456789ab"


def _piece_bytes(i: int) -> int:
    return min(PIECE, SIZE - i * PIECE)


def _whole(sources: PieceSources, piece: int, endpoint: tuple[str, int], pid: bytes) -> None:
    for block in range(-(-_piece_bytes(piece) // BLOCK_BYTES)):
        sources.block(piece, block, endpoint, pid)


def test_each_piece_is_counted_to_the_source_of_most_of_its_bytes() -> None:
    sources = PieceSources(_piece_bytes)
    sources.checked()  # (the torrent's check at its start ended: nothing on disk)
    _whole(sources, 0, ("0.0.0.0", 0), bytes(20))  # add_piece: the feed
    _whole(sources, 1, PEER_A, ID_A)
    # piece 2: five blocks from A, three from B
    for block in range(8):
        sources.block(2, block, PEER_A if block < 5 else PEER_B, ID_A if block < 5 else b"\x07")
    _whole(sources, 30, ORIGIN, b"\x01" * 20)  # the last, short piece from a web seed
    for at, piece in ((1.0, 0), (1.5, 1), (2.0, 2), (2.5, 30)):
        sources.piece_done(at, piece)
    _whole(sources, 3, PEER_B, b"\x07")  # not passed yet: not counted
    counts = sources.counts()
    a = counts["172.18.0.5:6881"]
    assert (a.pieces, a.bytes, a.first_at, a.last_at) == (2, PIECE + 5 * BLOCK_BYTES, 1.5, 2.0)
    assert a.peer_id == "-PR0100-0123456789ab"
    b = counts["172.18.0.6:40312"]
    assert (b.pieces, b.bytes, b.peer_id) == (0, 3 * BLOCK_BYTES, "07")  # (not printable: hex)
    assert counts["172.18.0.2:8001"].bytes == SIZE - 30 * PIECE
    assert counts[ADDED].pieces == 1
    # a web seed is told from a peer by the web-seed connections' addresses
    web = {ORIGIN}
    assert sources.kind("172.18.0.2:8001", web) == "web seed"
    assert sources.kind("172.18.0.5:6881", web) == "peer"
    assert sources.kind(ADDED, web) == "added"
    assert sources.first_from_peer(web) == (1.5, "172.18.0.5:6881")


def test_a_piece_is_counted_whether_its_blocks_or_its_pass_came_first() -> None:
    # libtorrent reports a block once written, which may be after the piece's hash
    # check: of 31 pieces fed to a loopback peer, 8 had a block reported at their pass
    sources = PieceSources(_piece_bytes)
    sources.checked()  # (the torrent's check at its start ended: nothing on disk)
    sources.piece_done(1.0, 5)
    assert sources.first_from_peer(set()) is None
    _whole(sources, 5, PEER_A, ID_A)
    assert sources.first_from_peer(set()) == (1.0, "172.18.0.5:6881")
    assert sources.counts()["172.18.0.5:6881"].pieces == 1


def test_the_piece_that_completes_the_torrent_is_counted_to_whom_it_was_asked_of() -> None:
    # (its blocks are never reported: libtorrent drops its piece picker at once)
    sources = PieceSources(_piece_bytes)
    sources.checked()  # (the torrent's check at its start ended: nothing on disk)
    sources.block(30, 0, PEER_A, ID_A, asked=True)
    sources.piece_done(3.0, 30)
    sources.piece_done(3.1, 7)  # asked of nobody: the feed's add_piece
    counts = sources.counts()
    assert (counts["172.18.0.5:6881"].pieces, counts["172.18.0.5:6881"].bytes) == (
        1,
        SIZE - 30 * PIECE,
    )
    assert (counts[ADDED].pieces, counts[ADDED].bytes) == (1, PIECE)


def test_a_failed_piece_counts_nothing() -> None:
    sources = PieceSources(_piece_bytes)
    sources.checked()  # (the torrent's check at its start ended: nothing on disk)
    _whole(sources, 4, PEER_A, ID_A)
    sources.piece_failed(4)
    _whole(sources, 4, PEER_B, b"\x07")  # fetched again, from B
    sources.piece_done(1.0, 4)
    counts = sources.counts()
    assert "172.18.0.5:6881" not in counts
    assert (counts["172.18.0.6:40312"].pieces, counts["172.18.0.6:40312"].bytes) == (1, PIECE)


def test_pieces_found_on_disk_at_the_start_came_from_nobody() -> None:
    # (a carousel copy that seeds the swarm: libtorrent's check at the torrent's start
    # passes every piece, and asked of nobody they looked like add_piece's)
    sources = PieceSources(_piece_bytes)
    for piece in range(31):
        sources.piece_done(0.01, piece)
    sources.checked()
    counts = sources.counts()
    assert list(counts) == [ON_DISK]
    assert (counts[ON_DISK].pieces, counts[ON_DISK].bytes) == (31, SIZE)
    assert sources.kind(ON_DISK, set()) == "on disk"
    assert sources.first_from_peer(set()) is None


def test_the_sources_named_are_bounded() -> None:
    # (a source is network input: peers come and go; past the bound they are summed)
    sources = PieceSources(_piece_bytes, max_sources=3)
    sources.checked()
    for n in range(10):
        _whole(sources, n, (f"10.0.0.{n}", 6881), ID_A)
        sources.piece_done(float(n), n)
    counts = sources.counts()
    assert len(counts) == 4
    assert counts[OTHER].pieces == 7  # 3 named, the 7 after them summed
    assert sum(c.bytes for c in counts.values()) == 10 * PIECE


def _feed_and_status(plan: tuple[int, ...] | None = None) -> tuple[Any, Any]:
    # what the timeline reads of the feed and of the status
    feed = types.SimpleNamespace(
        session_bytes=0, owed=(), parallel=1, fetch_bps=0, queued_elsewhere=0, started_at={}
    )
    status = types.SimpleNamespace(
        tally=types.SimpleNamespace(web_bytes=0, web_endpoints=frozenset()),
        download_bps=0,
        last_plan=plan,
        last_progress=None,
    )
    return feed, status


def test_the_last_pieces_say_when_the_policy_held_them_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (the `chord` policy holds a piece one connected peer holds off, priority 0, for
    # up to 4 s: a piece asked of a peer before it was held waits out the hold)
    timeline = SwarmTimeline("issue", _piece_bytes)
    caplog.set_level(logging.INFO, logger="pressrun.peer.timeline")
    progress = types.SimpleNamespace(
        connected_peers=1, pieces_have=0, pieces_total=31, downloaded_bytes=0
    )
    timeline.start(10.0, policy="chord", web_seeds=3)
    timeline.checked()
    timeline.sources.block(3, 0, PEER_A, ID_A, now=10.2, asked=True)
    held = tuple(0 if i == 3 else 1 for i in range(31))
    for now, plan in ((10.5, None), (11.0, held), (11.5, held), (13.0, None)):
        feed, status = _feed_and_status(plan)
        timeline.status(now, progress, feed=feed, status=status, ring=lambda: None)
    _whole(timeline.sources, 3, PEER_A, ID_A)
    timeline.piece_done(13.2, 3)
    timeline.verified(13.3, feed=feed, status=status)
    last = [r.getMessage() for r in caplog.records if ": last pieces: " in r.getMessage()]
    assert last == [
        "issue: last pieces: 3 (peer 172.18.0.5:6881) asked +0.20, held off +1.00 to +3.00,"
        " passed +3.20"
    ]


def test_a_progress_line_every_second_from_the_start(caplog: pytest.LogCaptureFixture) -> None:
    # status reads every 0.5 s from the start: a line at +0, +1, +2 (it was every 1.5 s:
    # the next line was due a few ms after the read of +1.0)
    timeline = SwarmTimeline("issue", _piece_bytes)
    progress = types.SimpleNamespace(
        connected_peers=0, pieces_have=0, pieces_total=31, downloaded_bytes=0
    )
    feed, status = _feed_and_status()
    caplog.set_level(logging.INFO, logger="pressrun.peer.timeline")
    timeline.start(100.0, policy="chord", web_seeds=3, peer_id=ID_A)
    for step in range(5):
        timeline.status(
            100.003 + 0.5 * step if step == 0 else 100.0 + 0.5 * step,
            progress,
            feed=feed,  # type: ignore[arg-type]
            status=status,  # type: ignore[arg-type]
            ring=lambda: None,
        )
    lines = [r.getMessage() for r in caplog.records if "pieces;" in r.getMessage()]
    assert [line.split(" s ")[0] for line in lines] == [
        "issue: +0.00",
        "issue: +1.00",
        "issue: +2.00",
    ]
    assert "peer id -PR0100-0123456789ab" in caplog.records[0].getMessage()


async def test_a_swarm_clients_log_names_its_sources(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Two real peers staggered like the small scenario's first two swarm clients (one
    # 20 Mbit/s origin, 2.5 MB/s links, the second 1.3 s after the first): the first
    # takes the issue from the origin's feed, the second from the feed and its peer.
    caplog.set_level(logging.INFO, logger="pressrun.peer.timeline")
    async with loopback_swarm(
        tmp_path, size_bytes=SIZE, origin_cap_mbps=(20.0,), piece_size=PIECE
    ) as swarm:
        config = desktop_profile(download_limit_bps=2_500_000)
        first, second = (swarm.new_peer(i, config, uploader_policy="stripes") for i in range(2))
        for peer in (first, second):
            await peer.open()
        results = await asyncio.gather(swarm.run_peer(first), swarm.run_peer(second, delay_s=1.3))
    assert all(r.completed for r in results)
    text = [r.getMessage() for r in caplog.records]
    ids = [m.group(1) for t in text if (m := re.search(r"peer id (\S+)$", t))]
    assert len(ids) == 2 and all(i.startswith("-PR0100-") for i in ids)
    sources = [
        m.groups() for t in text if (m := re.search(r"source (.+): (\d+) piece\(s\), (\d+) B", t))
    ]
    # every piece of both copies is counted once, every byte of them once
    assert sum(int(n) for _, n, _ in sources) == 2 * 31
    assert sum(int(b) for _, _, b in sources) == 2 * SIZE
    assert any(who.startswith("add_piece (its feed") for who, _, _ in sources)
    # the second names its peer, the first, by its peer id, and says when it began
    from_peer = [who for who, _, _ in sources if who.startswith("peer 127.0.0.1:")]
    assert from_peer and ids[0] in from_peer[0]
    assert any(re.search(r"first piece from a peer: 127\.0\.0\.1:\d+ \(-PR0100-", t) for t in text)
    # and each names its last pieces: from whom, when asked for, when passed
    last = [t for t in text if ": last pieces: " in t]
    assert len(last) == 2
    assert all(
        re.search(r"\d+ \((added|peer 127\.0\.0\.1:\d+)\) asked \+[\d.]+, passed", t) for t in last
    )
