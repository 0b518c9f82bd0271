"""Where a pressrun tracker's WebSocket (WebTorrent) route is, from its announce URL.

The tracker serves ``/announce`` and ``/webtorrent`` on one port
(`pressrun.tracker.websocket`), so the one follows from the other: publish names both
in a torrent, and the balancer names the WebSocket one to browser readers. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit


def webtorrent_tracker_url(tracker_url: str) -> str | None:
    """The WebSocket tracker of a pressrun tracker's announce URL, or None.

    ``http://host:port/announce`` -> ``ws://host:port/webtorrent`` (``https`` ->
    ``wss``); a query (``?leave_rule=``) is dropped. None for any other URL."""
    parts = urlsplit(tracker_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme)
    if scheme is None or not parts.hostname or not parts.path.endswith("/announce"):
        return None
    path = parts.path[: -len("/announce")] + "/webtorrent"
    return f"{scheme}://{parts.netloc}{path}"


def with_webtorrent_trackers(trackers: Sequence[str]) -> list[str]:
    """``trackers`` with each HTTP tracker's WebSocket twin after them (once each)."""
    out = list(dict.fromkeys(trackers))
    for url in trackers:
        ws = webtorrent_tracker_url(url)
        if ws is not None and ws not in out:
            out.append(ws)
    return out
