"""Real loopback swarms: libtorrent peers (pressrun.peer), the tracker, capped origins.

Every peer is a real libtorrent session on 127.0.0.1 (many in this process; FIELD-NOTES
says about 4 MB each), the tracker is pressrun.tracker on SQLite, the origins are
pressrun.origin with their egress token bucket, the issue is published by
pressrun.content. Ports are ephemeral; files live in tmp_path.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from pressrun.content.manifest import check_file
from pressrun.peer.aio import SwarmPeer, SwarmResult, resume_path_for
from pressrun.peer.config import desktop_profile
from pressrun.peer.events import LeaveRule
from pressrun.peer.loopback import OPERATOR_TOKEN, LoopbackSwarm, loopback_swarm
from pressrun.peer.resume import read_resume
from pressrun.security import bearer

MiB = 1 << 20
ARIA2C = shutil.which("aria2c")


async def swarm_json(swarm: LoopbackSwarm) -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        url = f"{swarm.tracker_base}/v1/swarms/{swarm.manifest.info_hash}"
        async with http.get(url, headers=bearer(OPERATOR_TOKEN)) as resp:
            assert resp.status == 200
            body: dict[str, object] = await resp.json()
            return body


def assert_verified(swarm: LoopbackSwarm, result: SwarmResult) -> None:
    assert result.completed and not result.stalled, result
    assert result.path.read_bytes() == swarm.data
    assert check_file(swarm.manifest, result.path).matches(swarm.manifest)


async def test_twenty_peers_in_a_burst_peers_carry_the_load(tmp_path: Path) -> None:
    size = 8 * MiB
    # Origins' total egress capped at 2 MB/s (16 Mbit/s): alone they would need
    # 20 x 8 MiB / 2 MB/s = 84 s.
    async with loopback_swarm(tmp_path, size_bytes=size, origin_cap_mbps=(8.0, 8.0)) as swarm:
        # one share from the web seeds before dropping them: the fewest origin bytes
        # (the default 2.0 trades origin bytes for time; docs/swarm.md)
        config = desktop_profile(
            upload_limit_bps=1_000_000, counts_interval_s=1.0, web_seed_share_factor=1.0
        )
        results = await asyncio.wait_for(swarm.run_peers(20, config, spread_s=1.0), 90)
        delivered = sum(r.downloaded_bytes for r in results)
        origin_bytes = swarm.origin_bytes_sent()
        for r in results:
            assert_verified(swarm, r)
            # every peer that left had ratio >= 1.0 or names the rule that let it go
            # (the ratio the rule judged: the totals read after the leave can hold a
            # few KiB that were in flight, 0.99973 once)
            assert r.leave_rule is not None
            ratio = r.ratio_at_leave
            assert (ratio is not None and ratio >= 1.0) or r.leave_rule in (
                LeaveRule.NOT_NEEDED,
                LeaveRule.MAX_SEED_TIME,
            ), r
            if r.leave_rule is LeaveRule.RATIO:
                assert ratio is not None and ratio >= 1.0
        assert delivered >= 20 * size
        print(f"origins sent {origin_bytes / size:.2f} copies of {20} delivered")
        assert origin_bytes < 0.2 * 20 * size, f"origins sent {origin_bytes / size:.2f} copies"
        # the peers' own count of web-seed bytes agrees with the origins' counters
        from_web = sum(r.bytes_from_web_seeds for r in results)
        assert from_web <= origin_bytes
        assert sum(r.bytes_from_peers for r in results) > 0.8 * 20 * size

        # The tracker shows the rule each peer named, and its totals.
        body = await swarm_json(swarm)
        by_port = {p["port"]: p for p in body["peers"]}  # type: ignore[attr-defined]
        for r in results:
            record = by_port[r.listen_port]
            assert record["state"] == "left"
            assert r.leave_rule is not None
            assert record["leave_rule"] == r.leave_rule.tracker_value
            # libtorrent announces verified payload as `downloaded` and all payload
            # sent as `uploaded`; pieces the peer fetched from the origins itself
            # (stripes policy) are not in libtorrent's counters
            assert record["downloaded_bytes"] + r.bytes_from_web_seeds >= size
            assert record["uploaded_bytes"] >= 0.95 * r.uploaded_bytes
        rules = body["left_by_rule"]
        assert sum(rules.values()) == 20  # type: ignore[attr-defined]
        assert body["left_fairly"] == sum(1 for r in results if r.leave_rule.fair)  # type: ignore[union-attr]


async def test_tracker_restarted_mid_swarm_loses_no_totals(tmp_path: Path) -> None:
    size = 6 * MiB
    async with loopback_swarm(
        tmp_path, size_bytes=size, origin_cap_mbps=(8.0,), tracker_interval_s=2
    ) as swarm:
        config = desktop_profile(upload_limit_bps=500_000, counts_interval_s=1.0)
        run = asyncio.ensure_future(swarm.run_peers(8, config))
        await asyncio.sleep(2.0)
        info_hash = bytes.fromhex(swarm.manifest.info_hash)
        assert swarm.tracker is not None
        before = {r.port: r for r in swarm.tracker.core.records(info_hash)}
        assert len(before) == 8 and not run.done()
        await swarm.stop_tracker()
        await asyncio.sleep(2.5)
        await swarm.start_tracker()
        results = await asyncio.wait_for(run, 90)
        assert swarm.tracker is not None
        after = {r.port: r for r in swarm.tracker.core.records(info_hash)}
        for r in results:
            assert_verified(swarm, r)
            rec = after[r.listen_port]
            old = before[r.listen_port]
            assert rec.downloaded_total >= old.downloaded_total
            assert rec.uploaded_total >= old.uploaded_total
            # nothing lost: the tracker has at least what the peer last saw of itself
            # (libtorrent reports verified bytes; the pieces a peer fetched from the
            # origins itself, stripes policy, are not in its counters)
            assert rec.downloaded_total + r.bytes_from_web_seeds >= size
            assert rec.uploaded_total >= 0.95 * r.uploaded_bytes
            # nor counted twice across the restart (one copy plus web-seed overlap)
            assert rec.downloaded_total < 2 * size
            assert rec.leave_rule is not None and not rec.active


async def test_a_stalled_peer_hands_its_verified_pieces_to_the_origin_path(
    tmp_path: Path,
) -> None:
    size = 4 * MiB
    async with loopback_swarm(tmp_path, size_bytes=size, origin_cap_mbps=(4.0,)) as swarm:
        config = desktop_profile(stall_after_s=2.0, drop_web_seeds=False)
        peer = swarm.new_peer(0, config)
        await peer.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while (peer.core is None or peer.core.progress is None
               or peer.core.progress.pieces_have < 4):  # fmt: skip
            assert loop.time() < deadline
            await asyncio.sleep(0.1)
        await swarm.origins[0].stop()  # the only source goes away
        assert await asyncio.wait_for(peer.downloaded(), 30) is False
        result = await peer.stop()
        await peer.close()
    assert result.stalled and not result.completed
    assert result.leave_rule is LeaveRule.USER
    assert 4 <= len(result.have_pieces) < swarm.manifest.num_pieces
    # the pieces handed over are right where the origin downloader expects them
    data = bytearray(result.path.read_bytes().ljust(size, b"\0")[:size])
    for index in result.have_pieces:
        start, length = swarm.manifest.piece_span(index)
        assert data[start : start + length] == swarm.data[start : start + length]
    # filling the missing spans (what the origin path does) makes the issue whole
    covered = sum(end - start for start, end in result.missing_spans)
    held = sum(swarm.manifest.piece_span(i)[1] for i in result.have_pieces)
    assert covered + held == size
    for start, end in result.missing_spans:
        data[start:end] = swarm.data[start:end]
    result.path.write_bytes(bytes(data))
    assert check_file(swarm.manifest, result.path).matches(swarm.manifest)
    # the resume data is gone with the handover: a later join rechecks the file
    assert not resume_path_for(result.path.parent, swarm.manifest.file_name).exists()


_KILLED_PEER = """
import asyncio, sys
from pathlib import Path
from pressrun.content.bundle import read_manifest
from pressrun.peer.aio import fetch_via_swarm
from pressrun.peer.config import desktop_profile
torrent, manifest, partial = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
asyncio.run(fetch_via_swarm(
    torrent=torrent, manifest=read_manifest(manifest), partial_dir=partial,
    config=desktop_profile(resume_save_interval_s=0.3), listen_interfaces="127.0.0.1:0"))
"""


def saved_pieces(resume: Path) -> int:
    """How many pieces the peer's resume file records as held (0 before its first
    save, or while a save is being replaced)."""
    params, _ = read_resume(resume)
    return 0 if params is None else sum(1 for held in params.have_pieces if held)


async def test_resume_after_being_killed(tmp_path: Path) -> None:
    size = 6 * MiB
    async with loopback_swarm(tmp_path, size_bytes=size, origin_cap_mbps=(4.0,)) as swarm:
        torrent = tmp_path / "issue.torrent"
        torrent.write_bytes(swarm.torrent)
        manifest = tmp_path / "content" / swarm.issue_id / "manifest.json"
        partial = tmp_path / "reader" / ".partial" / swarm.issue_id
        resume = resume_path_for(partial, swarm.manifest.file_name)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _KILLED_PEER, str(torrent), str(manifest), str(partial),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # kill -9 once its saved resume data holds more than 1.5 MiB of the file (what
        # the origins sent is not enough: the resume data of its last save may hold less,
        # and the resumed peer then took 1 MiB of it again, a fresh-clone suite run)
        piece = swarm.manifest.piece_size_bytes
        while not (saved_pieces(resume) * piece > 1.5 * MiB):
            if loop.time() > deadline or proc.returncode is not None:
                proc.kill()
                assert proc.stderr is not None
                pytest.fail(f"peer process: {(await proc.stderr.read()).decode()[-2000:]}")
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        sent_before = swarm.origin_bytes_sent()
        assert sent_before < size

        peer = SwarmPeer(
            torrent=swarm.torrent,
            manifest=swarm.manifest,
            partial_dir=partial,
            config=desktop_profile(),
            listen_interfaces="127.0.0.1:0",
        )
        try:
            await peer.start()
            assert await asyncio.wait_for(peer.downloaded(), 30)
            result = await peer.stop()
        finally:
            await peer.close()
    assert_verified(swarm, result)
    # it resumed: the origins did not send the whole file again
    assert swarm.origin_bytes_sent() - sent_before < size - MiB
    # all-time totals survive the kill: more than this session fetched (resume data
    # holds the totals of its last save)
    assert result.downloaded_bytes > swarm.origin_bytes_sent() - sent_before + MiB // 2


def free_ports(n: int) -> str:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(str(s.getsockname()[1]))
    return ",".join(ports)


async def aria2c(*args: str) -> asyncio.subprocess.Process:
    assert ARIA2C is not None
    return await asyncio.create_subprocess_exec(
        ARIA2C, "--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
        "--enable-peer-exchange=false", f"--listen-port={free_ports(3)}", "--quiet=true",
        "--bt-tracker-interval=1", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.skipif(ARIA2C is None, reason="aria2c is not installed")
async def test_aria2c_downloads_from_our_peers_and_web_seeds(tmp_path: Path) -> None:
    size = 4 * MiB
    async with loopback_swarm(tmp_path, size_bytes=size, origin_cap_mbps=(4.0,)) as swarm:
        # our seed: a peer whose partial file is already the whole issue
        seed = swarm.new_peer(0, desktop_profile(seed_until_stopped=True))
        seed.path.parent.mkdir(parents=True)
        seed.path.write_bytes(swarm.data)
        await seed.start()
        assert await asyncio.wait_for(seed.downloaded(), 20)
        torrent = tmp_path / "issue.torrent"
        torrent.write_bytes(swarm.torrent)
        out = tmp_path / "aria2c"
        proc = await aria2c(f"--dir={out}", "--seed-time=0", str(torrent))
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert (out / swarm.manifest.file_name).read_bytes() == swarm.data
        # our seed uploaded to it (the origins, capped at 0.5 MB/s, could not alone)
        result = await seed.stop()
        await seed.close()
        assert result.uploaded_bytes > 0
        body = await swarm_json(swarm)
        clients = {bytes.fromhex(p["peer_id"])[:3] for p in body["peers"]}  # type: ignore[attr-defined]
        assert b"A2-" in clients


@pytest.mark.skipif(ARIA2C is None, reason="aria2c is not installed")
async def test_our_peer_downloads_from_aria2c(tmp_path: Path) -> None:
    size = 4 * MiB
    async with loopback_swarm(tmp_path, size_bytes=size, origin_cap_mbps=(4.0,)) as swarm:
        for origin in swarm.origins:  # no web seed: aria2c is the only source
            await origin.stop()
        data_dir = tmp_path / "aria2c"
        data_dir.mkdir()
        (data_dir / swarm.manifest.file_name).write_bytes(swarm.data)
        torrent = tmp_path / "issue.torrent"
        torrent.write_bytes(swarm.torrent)
        proc = await aria2c(
            f"--dir={data_dir}", "--check-integrity=true", "--seed-ratio=0.0", str(torrent)
        )
        try:
            peer = swarm.new_peer(1, desktop_profile(max_seed_time_s=0.0))
            result = await asyncio.wait_for(swarm.run_peer(peer), 60)
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    assert_verified(swarm, result)
    assert result.bytes_from_peers == result.downloaded_bytes >= size
    assert result.bytes_from_web_seeds == 0
    assert os.path.getsize(result.path) == size


async def test_peers_started_at_once_announce_and_connect_at_once(tmp_path: Path) -> None:
    # libtorrent adds a torrent paused and auto-managed unless told otherwise, and its
    # session's queue unpauses it on the next one-second tick: 17 of 20 peers started
    # at once announced 0.7 to 1.0 s after their start, and none traded until then (the
    # loopback bench's first second). A peer's torrent now starts when it is added.
    async with loopback_swarm(tmp_path, size_bytes=2 * MiB) as swarm:
        config = desktop_profile(upload_limit_bps=1_000_000)
        peers = [swarm.new_peer(i, config, uploader_policy="stripes") for i in range(8)]
        for p in peers:
            await p.open()
        await asyncio.gather(*(p.start() for p in peers))
        # (right after the start: before, paused until the queue's next tick)
        at_start = [p._handle.status().paused for p in peers]
        await asyncio.sleep(0.4)
        statuses = [p._handle.status() for p in peers]
        for p in peers:
            await p.stop()
    assert at_start == [False] * 8
    # every one announced and met the others (each is told of those before it)
    assert all(st.num_peers >= 1 for st in statuses), [st.num_peers for st in statuses]
