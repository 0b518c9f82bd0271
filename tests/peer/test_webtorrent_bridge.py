"""Desktop peers and the WebSocket tracker: the STUN server libtorrent's WebRTC uses
comes from configuration (none by default), a torrent may name a ws:// tracker, and a
peer keeps it beside the directive's tracker and announces to every tier."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_the_directives_tracker_replaces_the_http_ones_and_the_websocket_ones_stay(
    tmp_path: Path,
) -> None:
    from pressrun.content.bundle import read_manifest
    from pressrun.content.keys import generate_keypair
    from pressrun.content.publish import publish
    from pressrun.peer.aio import SwarmPeer
    from pressrun.peer.session import session_settings

    issue = tmp_path / "w.pdf"
    issue.write_bytes(b"%PDF-1.4 " * 5000)
    secret, _ = generate_keypair(tmp_path / "k")
    bundle = publish(
        issue,
        issue_id="w",
        title="w",
        key_path=secret,
        content_dir=tmp_path / "c",
        trackers=["http://t1:6969/announce"],
        webtorrent=True,
    )
    peer = SwarmPeer(
        torrent=(bundle / "w.torrent").read_bytes(),
        manifest=read_manifest(bundle / "manifest.json"),
        partial_dir=tmp_path / "p",
        config=desktop_profile(),
        tracker_url="http://t2:6969/announce",
    )
    assert peer.websocket_trackers == ["ws://t1:6969/webtorrent"]
    assert list(peer._add_params().trackers) == [
        "http://t2:6969/announce",
        "ws://t1:6969/webtorrent",
    ]
    # every tier, so the ws:// tracker beside an http:// one in tier 0 is announced to
    settings = session_settings(desktop_profile(), listen_interfaces="127.0.0.1:0")
    assert settings["announce_to_all_tiers"] is True


def test_the_command_lines_close_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from pressrun.peer import watchdog

    monkeypatch.delenv(watchdog.BOUND_ENV, raising=False)
    assert watchdog.command_line_bound() == watchdog.COMMAND_LINE_BOUND_S
    monkeypatch.setenv(watchdog.BOUND_ENV, "2.5")
    assert watchdog.command_line_bound() == 2.5
    for bad in ("0", "-1", "nan", "soon"):
        monkeypatch.setenv(watchdog.BOUND_ENV, bad)
        with pytest.raises(ValueError, match="positive number of seconds"):
            watchdog.command_line_bound()
    # a library (no bound set) arms nothing: the block runs as is
    monkeypatch.setattr(watchdog, "_bound_s", None)
    assert watchdog.close_bound() is None
    with watchdog.bounded():
        pass
