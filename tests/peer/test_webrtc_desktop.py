"""Desktop peers over WebRTC (libtorrent's WebTorrent) through pressrun's WebSocket
tracker, with the tracker served by this very process's event loop.

That is the case that hung for good before: the binding destroys a session holding
the GIL, the destructor waits for the WebSocket close handshake, and the tracker that
should answer it runs on the frozen loop (pressrun.peer.session). A watchdog turns a
hang into a failed run (the process ends with a thread dump) instead of a stuck one.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import WSMsgType, web

from pressrun.bencode import bencode
from pressrun.content.bundle import read_manifest
from pressrun.content.codec import Manifest
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish
from pressrun.peer.aio import SwarmPeer, fetch_via_swarm
from pressrun.peer.config import desktop_profile
from pressrun.peer.events import LeaveRule
from pressrun.security import ServiceSecurity
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

MiB = 1 << 20


@pytest.fixture(autouse=True)
def hang_watchdog() -> Iterator[None]:
    """A hang (the GIL held by a session's destructor) ends the run after 40 s."""
    faulthandler.dump_traceback_later(40, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@dataclass
class Issue:
    manifest: Manifest
    torrent: bytes
    data: bytes
    bundle: Path


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[tuple[TrackerService, int]]:
    service = TrackerService(
        TrackerCore(TrackerConfig(interval_s=5, min_interval_s=1), random.Random(3)),
        SqliteStore(tmp_path / "tracker.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token="webrtc-test-operator-token"),
    )
    port = await service.start("127.0.0.1", 0)
    try:
        yield service, port
    finally:
        await service.close()


def publish_issue(tmp_path: Path, trackers: list[str], *, webtorrent: bool = False) -> Issue:
    source = tmp_path / "w1.pdf"
    data = random.Random(5).randbytes(3 * MiB + 777)
    source.write_bytes(data)
    secret, _ = generate_keypair(tmp_path / "publisher.key")
    bundle = publish(
        source,
        issue_id="w1",
        title="w1",
        key_path=secret,
        content_dir=tmp_path / "content",
        trackers=trackers,
        webtorrent=webtorrent,
    )
    manifest = read_manifest(bundle / "manifest.json")
    return Issue(manifest, (bundle / "w1.torrent").read_bytes(), data, bundle)


async def seeding_peer(tmp_path: Path, issue: Issue) -> SwarmPeer:
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    shutil.copy(issue.bundle / issue.manifest.file_name, seed_dir / issue.manifest.file_name)
    seed = SwarmPeer(
        torrent=issue.torrent,
        manifest=issue.manifest,
        partial_dir=seed_dir,
        config=desktop_profile(seed_until_stopped=True),
        listen_interfaces="127.0.0.1:0",
    )
    await seed.start()
    assert await asyncio.wait_for(seed.downloaded(), 10)
    return seed


async def test_a_peer_gets_an_issue_over_webrtc_only_and_both_close_promptly(
    tmp_path: Path, tracker: tuple[TrackerService, int]
) -> None:
    service, port = tracker
    # only the WebSocket tracker, no web seed: the bytes can come over WebRTC only
    issue = publish_issue(tmp_path, [f"ws://127.0.0.1:{port}/webtorrent"])
    seed = await seeding_peer(tmp_path, issue)
    peers: list[SwarmPeer] = []
    try:
        started = time.monotonic()
        result = await asyncio.wait_for(
            fetch_via_swarm(
                torrent=issue.torrent,
                manifest=issue.manifest,
                partial_dir=tmp_path / "leech",
                config=desktop_profile(max_seed_time_s=0.2),
                listen_interfaces="127.0.0.1:0",
                on_peer=peers.append,
            ),
            30,
        )
        total_s = time.monotonic() - started
        assert result.completed and result.path.read_bytes() == issue.data
        assert result.bytes_from_peers >= len(issue.data) and result.bytes_from_web_seeds == 0
        assert result.leave_rule is LeaveRule.MAX_SEED_TIME
        # download, 0.2 s of seeding, leave and close: the close took seconds, not forever
        assert result.download_s is not None and total_s - result.download_s < 5.0, total_s
        # both are peers of the swarm in the tracker's accounting (WebRTC: port 0)
        records = service.core.records(bytes.fromhex(issue.manifest.info_hash))
        assert len(records) == 2 and {r.port for r in records} == {0}
        print(f"3 MiB over WebRTC in {result.download_s:.2f} s; get returned after {total_s:.2f} s")
    finally:
        started = time.monotonic()
        await seed.stop()
        await seed.close()
        closed_s = time.monotonic() - started
    assert closed_s < 3.0, closed_s


async def test_a_desktop_peer_on_both_trackers_leaves_once_by_its_rule(
    tmp_path: Path, tracker: tuple[TrackerService, int]
) -> None:
    service, port = tracker
    issue = publish_issue(tmp_path, [f"http://127.0.0.1:{port}/announce"], webtorrent=True)
    info_hash = bytes.fromhex(issue.manifest.info_hash)
    seed = await seeding_peer(tmp_path, issue)
    try:
        assert seed.websocket_trackers == [f"ws://127.0.0.1:{port}/webtorrent"]

        async def on_both() -> bool:
            records = service.core.records(info_hash)
            relay = service.webtorrent.relay  # type: ignore[attr-defined]
            return relay.swarm_size(info_hash) == 1 and any(
                r.port == seed.listen_port for r in records
            )

        deadline = time.monotonic() + 10
        while not await on_both():
            assert time.monotonic() < deadline, "the seed did not announce on both trackers"
            await asyncio.sleep(0.05)
    finally:
        result = await seed.stop()
        await seed.close()
    assert result.leave_rule is LeaveRule.USER
    (record,) = service.core.records(info_hash)
    # the record is the HTTP one (its port), left by the rule the peer named
    assert record.port == seed.listen_port and not record.active
    assert record.leave_rule is not None and record.leave_rule.value == "user"
    store = service.store
    assert isinstance(store, SqliteStore)
    await store.flush()
    stops = [e for e in await store.load_events(info_hash) if e.event == "stopped"]
    # one leave: the WebSocket's `stopped` does not replace the rule the HTTP one named
    assert len(stops) == 1, stops
    assert stops[0].leave_rule is not None and stops[0].leave_rule.value == "user"


PRESSRUN = str(Path(sys.executable).with_name("pressrun"))


@contextlib.asynccontextmanager
async def tracker_frozen_at_close() -> AsyncIterator[int]:
    """A tracker whose WebSocket stops answering when the peer closes it (what a
    tracker that froze, or whose network went, does mid-close): ``/announce`` answers,
    ``/webtorrent`` answers announces and never the close frame; its port."""

    released = asyncio.Event()

    async def announce(_: web.Request) -> web.Response:
        return web.Response(body=bencode({b"interval": 30, b"peers": b""}))

    async def webtorrent(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoclose=False)
        await ws.prepare(request)
        while not released.is_set():
            # (``async for`` ends at the close frame, and aiohttp then answers it)
            try:
                msg = await ws.receive(timeout=0.2)
            except TimeoutError:
                continue
            if msg.type is WSMsgType.TEXT:
                doc = json.loads(msg.data)
                if doc.get("action") == "announce" and "answer" not in doc:
                    reply = {"action": "announce", "info_hash": doc["info_hash"]}
                    await ws.send_str(json.dumps({**reply, "interval": 120}))
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
                await released.wait()  # never the close frame back (until the test ends)
        return ws

    app = web.Application()
    app.router.add_get("/announce", announce)
    app.router.add_get("/webtorrent", webtorrent)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        released.set()
        await runner.cleanup()


async def test_pressrun_seed_ends_when_its_websocket_tracker_never_answers_the_close(
    tmp_path: Path,
) -> None:
    # The WebSocket close handshake can never complete: the session's destructor
    # would wait for good, holding the GIL (no signal handler runs). The session had
    # WebRTC peers and its torrent has left, so it is kept until the process ends itself
    # (pressrun.peer.session): the destructor never runs. Before (e982b92) the watchdog
    # ended the process at the bound, 2 s here, with status 1 and a thread dump.
    async with tracker_frozen_at_close() as port:
        issue = publish_issue(tmp_path, [f"http://127.0.0.1:{port}/announce"], webtorrent=True)
        copy = tmp_path / "library" / issue.manifest.file_name
        copy.parent.mkdir()
        copy.write_bytes(issue.data)
        seed = await asyncio.create_subprocess_exec(
            PRESSRUN, "seed", str(copy), "--torrent", str(issue.bundle / "w1.torrent"),
            "--manifest", str(issue.bundle / "manifest.json"),
            "--trusted-key", str(tmp_path / "publisher.key.pub"),
            "--listen", "127.0.0.1:0", "--until-stopped",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PRESSRUN_CLOSE_BOUND_S": "2"},
        )  # fmt: skip
        try:
            assert seed.stdout is not None
            while b"seeding" not in (out := await asyncio.wait_for(seed.stdout.readline(), 30)):
                assert out, "pressrun seed ended before seeding"
            await asyncio.sleep(1.0)  # announced on both trackers (the WebSocket open)
            started = time.monotonic()
            seed.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(seed.communicate(), 20)
            ended_s = time.monotonic() - started
        finally:
            if seed.returncode is None:
                seed.kill()
                await seed.wait()
    assert b"left the swarm by rule user" in out, out
    # the user's stop is a clean end: status 0, no watchdog dump, within the close's
    # 0.5 s for the WebSocket and the leave's announces
    assert seed.returncode == 0 and b"Timeout" not in err, (seed.returncode, err[-800:])
    assert ended_s < 6.0, ended_s
    print(f"pressrun seed ended {ended_s:.2f} s after SIGTERM (the close never answered)")
