"""The sharing session's line on its connections (`pressrun.peer.sharing.connections_line`):
what each connected peer gets from it, the busiest first (issue 28: the second reader of
flash-crowd-50-desktops got 43-157 of the 110-189 pieces the ring named it from the
first reader's sharing session, and no log said why)."""

from __future__ import annotations

import types
from typing import Any

import libtorrent as lt

from pressrun.peer.sharing import connections_line


def _info(
    last: int,
    *,
    up_bps: int = 0,
    asks: int = 0,
    choked: bool = False,
    interested: bool = True,
    pieces: int = 0,
    web: bool = False,
    flags: int = 0,
) -> Any:
    f = flags
    if choked:
        f |= lt.peer_info.choked
    if interested:
        f |= lt.peer_info.remote_interested
    return types.SimpleNamespace(
        connection_type=lt.peer_info.web_seed if web else lt.peer_info.standard_bittorrent,
        flags=f,
        pid=types.SimpleNamespace(to_bytes=lambda: bytes(19) + bytes([last])),
        payload_up_speed=up_bps,
        upload_queue_length=asks,
        num_pieces=pieces,
        rtt=12,
    )


def test_each_connection_says_what_it_gets_the_busiest_first() -> None:
    line = connections_line(
        [
            _info(1, up_bps=300_000, asks=2, pieces=40),
            _info(2, up_bps=2_100_000, asks=14, pieces=120),
            _info(3, choked=True, interested=False),
        ]
    )
    assert line == (
        "000000000002 unchoked, interested, asks 14, sends 2100 kB/s, holds 120, rtt 12 ms; "
        "000000000001 unchoked, interested, asks 2, sends 300 kB/s, holds 40, rtt 12 ms; "
        "000000000003 choked, not interested, asks 0, sends 0 kB/s, holds 0, rtt 12 ms"
    )


def test_at_most_a_few_connections_are_named_and_no_web_seed_or_handshake() -> None:
    peers = [_info(i, up_bps=i * 1000) for i in range(1, 8)]
    peers.append(_info(9, web=True, up_bps=10**9))
    peers.append(_info(10, flags=lt.peer_info.handshake, up_bps=10**9))
    line = connections_line(peers, limit=4)
    assert line.startswith("000000000007 ")
    assert line.count("unchoked") == 4
    assert line.endswith("; and 3 more")
    assert "00000000000a" not in line and "000000000009" not in line
    assert connections_line([]) == "no peer connected"


class _Handle:
    def __init__(self, peers: list[Any]) -> None:
        self.peers = peers

    def get_peer_info(self) -> list[Any]:
        return self.peers

    def status(self) -> Any:
        return types.SimpleNamespace(all_time_upload=9_200_000)


def _sharing_peer(peers: list[Any]) -> Any:
    from pressrun.peer.sharing import SharingPeer

    peer = SharingPeer.__new__(SharingPeer)  # (no session: the handle's answers only)
    peer._handle = _Handle(peers)
    peer._sharing = True
    peer.offered = {0, 1, 2}
    peer.manifest = types.SimpleNamespace(issue_id="flash-2026-47")  # type: ignore[assignment]
    return peer


def test_the_sharing_session_logs_its_connections_each_look(caplog: Any) -> None:
    caplog.set_level("INFO", logger="pressrun.peer.sharing")
    _sharing_peer([_info(2, up_bps=2_100_000, asks=14, pieces=120)]).note_connections(3.04)
    assert caplog.messages == [
        "flash-2026-47: sharing +3.0 s: 3 pieces offered, 9.2 MB uploaded; "
        "000000000002 unchoked, interested, asks 14, sends 2100 kB/s, holds 120, rtt 12 ms"
    ]
    caplog.clear()
    _sharing_peer([]).note_connections(4.0)  # no connection: no line
    assert caplog.messages == []
