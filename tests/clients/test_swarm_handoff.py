"""Where a swarm client gets the issue's torrent: the directive's URL first, then the
same file on every other origin the directive named (a loaded origin that does not
answer no longer sends the whole download back to origin sections)."""

from __future__ import annotations

from pressrun.clients.swarm_handoff import torrent_urls


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
