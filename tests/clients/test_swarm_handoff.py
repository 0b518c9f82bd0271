"""Where a swarm client gets the issue's torrent: the directive's URL first, then the
same file on every other origin the directive named (a loaded origin that does not
answer no longer sends the whole download back to origin sections); the uploader
policy a client asks for, and the address a ring-asking peer listens on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pressrun.clients.config import UPLOADER_POLICY_ENV, ClientConfig
from pressrun.clients.swarm_handoff import _listen_interfaces, torrent_urls


def test_torrent_from_the_directive_then_every_other_origin() -> None:
    urls = torrent_urls(
        "http://origin-a:8001/content/i-47/i-47.torrent",
        ["http://origin-a:8001", "http://origin-b:8002/", "http://origin-c:8003"],
        "i-47",
    )
    assert urls == [
        "http://origin-a:8001/content/i-47/i-47.torrent",
        "http://origin-b:8002/content/i-47/i-47.torrent",
        "http://origin-c:8003/content/i-47/i-47.torrent",
    ]


def test_no_origin_known_leaves_the_directive_url_alone() -> None:
    assert torrent_urls("http://o:1/content/x/x.torrent", [], "x") == [
        "http://o:1/content/x/x.torrent"
    ]


def test_a_ring_policy_listens_on_the_address_the_tracker_is_reached_from() -> None:
    # the `chord` peer tells the ring its listening address, which other peers then
    # connect to: not 0.0.0.0, nor the tracker's host name
    assert asyncio.run(_listen_interfaces("chord", "http://127.0.0.1:6969")) == "127.0.0.1:0"
    assert asyncio.run(_listen_interfaces("stripes", "http://127.0.0.1:6969")) == "0.0.0.0:0"


def test_an_unknown_uploader_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown uploader policy 'ringy'.*stripes"):
        ClientConfig(uploader_policy="ringy")
    assert ClientConfig(uploader_policy="chord").uploader_policy == "chord"


def test_pressrun_get_takes_the_policy_from_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from pressrun.cli import main

    monkeypatch.setenv(UPLOADER_POLICY_ENV, "ringy")
    args = ["get", "i-47", "--balancer", "http://127.0.0.1:9", "--library", str(tmp_path)]
    assert main(args) == 2
    assert "unknown uploader policy 'ringy'" in capsys.readouterr().err
