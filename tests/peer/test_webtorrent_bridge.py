"""Desktop peers and the WebSocket tracker: the STUN server libtorrent's WebRTC uses
comes from configuration (none by default), and a torrent may name a ws:// tracker."""

from __future__ import annotations

from pathlib import Path

from pressrun.content.publish import _check_inputs
from pressrun.peer.config import desktop_profile
from pressrun.peer.session import session_settings


def test_the_stun_server_is_ours_or_none_never_libtorrents_default() -> None:
    plain = session_settings(desktop_profile(), listen_interfaces="127.0.0.1:0")
    assert plain["webtorrent_stun_server"] == ""  # libtorrent's default is Google's
    stun = session_settings(
        desktop_profile(stun_server="stun.example:3478"), listen_interfaces="127.0.0.1:0"
    )
    assert stun["webtorrent_stun_server"] == "stun.example:3478"


def test_publish_accepts_a_websocket_tracker(tmp_path: Path) -> None:
    issue = tmp_path / "issue.pdf"
    issue.write_bytes(b"%PDF-1.4 x")
    trackers = ["http://t:6969/announce", "ws://t:6969/webtorrent", "wss://t/webtorrent"]
    assert _check_inputs(issue, "w1", "W", 262144, [], trackers) == issue.stat().st_size
