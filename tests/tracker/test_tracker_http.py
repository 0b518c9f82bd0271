"""The tracker over real HTTP on 127.0.0.1 (ephemeral ports), SQLite backend."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote_from_bytes

import aiohttp
import pytest
from live_tracker import (
    OPERATOR,
    OPERATOR_TOKEN,
    LiveTracker,
    announce_query,
    start_tracker,
    wait_for,
)

from pressrun.bencode import bdecode
from pressrun.security import TOKEN_ENV
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.sqlite_store import SqliteStore

# Bytes that break naive parsing: NUL, 0xFF, '%', '&', '=', '+', space.
IH = bytes([0, 0xFF, 0x25, 0x26, 0x3D, 0x2B, 0x20]) + bytes(range(0xE0, 0xED))
IH2 = bytes(range(100, 120))


def pid(n: int) -> bytes:
    return b"-PR0001-" + f"{n:012d}".encode()


async def test_compact_answer_lists_others_in_six_bytes(tracker: LiveTracker) -> None:
    first = await tracker.announce(announce_query(IH, pid(1), 7001, event="started", compact=1))
    assert first[b"peers"] == b"" and first[b"peers6"] == b""
    assert first[b"interval"] == 30 and first[b"min interval"] == 5
    second = await tracker.announce(announce_query(IH, pid(2), 7002, left=0, compact=1))
    assert second[b"peers"] == bytes([127, 0, 0, 1]) + (7001).to_bytes(2, "big")
    assert (second[b"complete"], second[b"incomplete"]) == (1, 1)


async def test_dict_answer_and_ip_from_loopback(tracker: LiveTracker) -> None:
    await tracker.announce(announce_query(IH, pid(1), 7001, ip="10.1.2.3"))
    answer = await tracker.announce(announce_query(IH, pid(2), 7002))
    assert answer[b"peers"] == [{b"peer id": pid(1), b"ip": b"10.1.2.3", b"port": 7001}]


async def test_numwant_huge_is_capped(tracker: LiveTracker) -> None:
    for n in range(30):
        await tracker.announce(announce_query(IH, pid(n), 7000 + n))
    answer = await tracker.announce(announce_query(IH, pid(99), 7099, numwant=10**9, compact=1))
    peers = answer[b"peers"]
    assert isinstance(peers, bytes) and len(peers) == 20 * 6  # the fixture's max_numwant
    assert (7099).to_bytes(2, "big") not in {peers[i + 4 : i + 6] for i in range(0, 120, 6)}


BAD = [
    ("no info_hash", "peer_id=" + "a" * 20 + "&port=1&uploaded=0&downloaded=0&left=0"),
    ("wrong length", announce_query(b"x" * 19, pid(1), 7001)),
    ("bad peer_id", announce_query(IH, b"short", 7001)),
    ("port out of range", announce_query(IH, pid(1), 70000)),
    ("port zero", announce_query(IH, pid(1), 0)),
    ("port missing", announce_query(IH, pid(1), 1).replace("port=1&", "")),
    ("uploaded not a number", announce_query(IH, pid(1), 7001).replace("uploaded=0", "uploaded=x")),
    ("downloaded negative", announce_query(IH, pid(1), 7001, downloaded=-5)),
    ("left float", announce_query(IH, pid(1), 7001).replace("left=100", "left=1.5")),
    ("garbage", "%%%&&&===garbage%zz%"),
    ("empty", ""),
    ("bad event", announce_query(IH, pid(1), 7001, event="exploded")),
    ("bad leave rule", announce_query(IH, pid(1), 7001, event="stopped", leave_rule="meh")),
]


@pytest.mark.parametrize(("name", "query"), BAD, ids=[name for name, _ in BAD])
async def test_bad_announce_gets_bencoded_failure_with_200(
    tracker: LiveTracker, name: str, query: str
) -> None:
    status, body = await tracker.get_raw("/announce?" + query)
    assert status == 200, name
    answer = bdecode(body)
    assert isinstance(answer, dict) and set(answer) == {b"failure reason"}
    reason = answer[b"failure reason"]
    assert isinstance(reason, bytes) and reason
    async with tracker.http.get(tracker.base + "/metrics") as resp:
        assert 'pressrun_tracker_failures_total{reason="' in await resp.text()


async def test_bad_scrape_gets_failure(tracker: LiveTracker) -> None:
    status, body = await tracker.get_raw("/scrape?info_hash=abc")
    assert status == 200 and b"failure reason" in bdecode(body)  # type: ignore[operator]


async def test_scrape_one_several_all(tracker: LiveTracker) -> None:
    await tracker.announce(announce_query(IH, pid(1), 7001, left=0))
    await tracker.announce(announce_query(IH, pid(2), 7002, event="started"))
    await tracker.announce(announce_query(IH, pid(2), 7002, left=0, event="completed"))
    await tracker.announce(announce_query(IH2, pid(3), 7003))

    one = bdecode((await tracker.get_raw("/scrape?info_hash=" + quote_from_bytes(IH, safe="")))[1])
    assert one == {
        b"files": {IH: {b"complete": 2, b"downloaded": 1, b"incomplete": 0}},
        b"flags": {b"min_request_interval": 5},
    }
    both = bdecode(
        (
            await tracker.get_raw(
                f"/scrape?info_hash={quote_from_bytes(IH, safe='')}"
                f"&info_hash={quote_from_bytes(IH2, safe='')}"
            )
        )[1]
    )
    assert isinstance(both, dict)
    assert set(both[b"files"]) == {IH, IH2}  # type: ignore[arg-type]
    every = bdecode((await tracker.get_raw("/scrape"))[1])
    assert isinstance(every, dict) and set(every[b"files"]) == {IH, IH2}  # type: ignore[arg-type]


async def test_v1_swarms_accounting_and_leave_rules(tracker: LiveTracker) -> None:
    # Peer 1 seeds, uploads 300 and leaves by ratio; peer 2 downloads 300 and stays.
    await tracker.announce(announce_query(IH, pid(1), 7001, left=0, event="started", key="k1"))
    await tracker.announce(announce_query(IH, pid(2), 7002, left=300, event="started", key="k2"))
    await tracker.announce(announce_query(IH, pid(2), 7002, left=0, downloaded=300, key="k2"))
    await tracker.announce(
        announce_query(
            IH, pid(1), 7001, left=0, uploaded=300, event="stopped", leave_rule="ratio", key="k1"
        )
    )
    await tracker.announce(
        announce_query(IH, pid(3), 7003, left=0, event="stopped", leave_rule="max_seed_time")
    )
    (swarm,) = await tracker.swarms()
    assert swarm["info_hash"] == IH.hex()
    assert (swarm["seeds"], swarm["leechers"]) == (1, 0)
    assert (swarm["uploaded_bytes"], swarm["downloaded_bytes"]) == (300, 300)
    assert swarm["left_fairly"] == 1
    assert swarm["left_by_rule"] == {
        "ratio": 1,
        "not_needed": 0,
        "max_seed_time": 1,
        "user": 0,
        "unspecified": 0,
        "expired": 0,
        "claim_refused": 0,
    }
    assert swarm["needs_seeds"] is False
    peers = {p["peer_id"]: p for p in swarm["peers"]}  # type: ignore[attr-defined]
    assert peers[pid(1).hex()]["leave_rule"] == "ratio"
    assert peers[pid(1).hex()]["left_fairly"] is True
    assert peers[pid(2).hex()]["state"] == "seed"
    async with tracker.http.get(f"{tracker.base}/v1/swarms/{IH.hex()}/needed") as resp:
        assert await resp.json() == {
            "info_hash": IH.hex(),
            "needs_seeds": False,
            "seeds": 1,
            "leechers": 0,
        }
    async with tracker.http.get(f"{tracker.base}/v1/swarms/{IH2.hex()}", headers=OPERATOR) as resp:
        assert resp.status == 404
    async with tracker.http.get(f"{tracker.base}/v1/swarms/nothex", headers=OPERATOR) as resp:
        assert resp.status == 400
    async with tracker.http.get(tracker.base + "/metrics") as resp:
        text = await resp.text()
    assert 'pressrun_tracker_announces_total{event="stopped"} 2.0' in text
    assert 'pressrun_tracker_left_peers_total{rule="ratio"} 1.0' in text
    assert f'pressrun_tracker_swarm_peers{{info_hash="{IH.hex()}",role="seed"}} 1.0' in text
    events = await tracker.service.store.load_events(IH)  # type: ignore[attr-defined]
    assert [e.event for e in events] == ["started", "started", "stopped", "stopped"]


async def test_silent_peer_expires(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    config = TrackerConfig(interval_s=1, min_interval_s=1, peer_ttl_s=1.2)
    service, port = await start_tracker(SqliteStore(tmp_path / "t.db"), config)
    live = LiveTracker(service, port, http)
    try:
        await live.announce(announce_query(IH, pid(1), 7001))

        async def expired() -> bool:
            (swarm,) = await live.swarms()
            return swarm["left_by_rule"]["expired"] == 1  # type: ignore[index,no-any-return]

        assert await wait_for(expired, timeout_s=5)
        (swarm,) = await live.swarms()
        assert swarm["leechers"] == 0
    finally:
        await service.close()


async def test_restart_keeps_totals(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    db = tmp_path / "tracker.db"
    service, port = await start_tracker(SqliteStore(db))
    live = LiveTracker(service, port, http)
    await live.announce(announce_query(IH, pid(1), 7001, left=0, uploaded=500, key="a1"))
    await live.announce(announce_query(IH, pid(2), 7002, left=10, downloaded=500, key="b1"))
    # Peer 3 seeds (so seeds outnumber leechers: not needed), then leaves by not_needed.
    await live.announce(announce_query(IH, pid(3), 7003, left=0))
    await live.announce(
        announce_query(IH, pid(3), 7003, left=0, event="stopped", leave_rule="not_needed")
    )
    await service.close()

    service, port = await start_tracker(SqliteStore(db))
    live = LiveTracker(service, port, http)
    try:
        (swarm,) = await live.swarms()
        assert (swarm["seeds"], swarm["leechers"], swarm["left_fairly"]) == (1, 1, 1)
        # Same client session continues (same key); peer 2's client restarted (new key).
        await live.announce(announce_query(IH, pid(1), 7001, left=0, uploaded=700, key="a1"))
        answer = await live.announce(
            announce_query(IH, pid(2), 7002, left=0, downloaded=40, event="started", key="b2")
        )
        assert answer[b"complete"] == 2
        (swarm,) = await live.swarms()
        peers = {p["peer_id"]: p for p in swarm["peers"]}  # type: ignore[attr-defined]
        assert peers[pid(1).hex()]["uploaded_bytes"] == 700
        assert peers[pid(2).hex()]["downloaded_bytes"] == 540
        assert (swarm["uploaded_bytes"], swarm["downloaded_bytes"]) == (700, 540)
    finally:
        await service.close()


async def test_cli_sigterm_flushes_and_restart_keeps_totals(tmp_path: Path) -> None:
    """The real `pressrun serve tracker` process: SIGTERM mid-swarm, start again."""
    db = tmp_path / "cli.db"

    async def run_once(query: str) -> list[dict[str, object]]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pressrun.cli", "serve", "tracker", "--port", "0",
            "--db", str(db), "--flush-interval-s", "5", "--allow", IH.hex(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", TOKEN_ENV: OPERATOR_TOKEN},
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            port = int(line.decode().rsplit(":", 1)[1].split("/")[0])
            async with aiohttp.ClientSession() as http:
                live = LiveTracker(None, port, http)  # type: ignore[arg-type]
                await live.announce(query)
                swarms = await live.swarms()
        finally:
            # The flush interval is 5 s: only the SIGTERM handler's flush saves this.
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        return swarms

    await run_once(announce_query(IH, pid(1), 7001, left=0, uploaded=1000, key="c1"))
    swarms = await run_once(announce_query(IH, pid(2), 7002, left=5, downloaded=1000, key="d1"))
    (swarm,) = swarms
    assert (swarm["uploaded_bytes"], swarm["downloaded_bytes"]) == (1000, 1000)
    assert (swarm["seeds"], swarm["leechers"]) == (1, 1)


async def test_ipv6_peer_goes_to_peers6(tracker: LiveTracker) -> None:
    await tracker.announce(announce_query(IH, pid(1), 7001, ip="%3A%3A1"))
    await tracker.announce(announce_query(IH, pid(2), 7002))
    answer = await tracker.announce(announce_query(IH, pid(3), 7003, compact=1))
    assert answer[b"peers6"] == bytes(15) + b"\x01" + (7001).to_bytes(2, "big")
    assert answer[b"peers"] == bytes([127, 0, 0, 1]) + (7002).to_bytes(2, "big")
    full = await tracker.announce(announce_query(IH, pid(3), 7003))
    assert {(p[b"ip"], p[b"port"]) for p in full[b"peers"]} == {  # type: ignore[index,union-attr]
        (b"::1", 7001),
        (b"127.0.0.1", 7002),
    }
