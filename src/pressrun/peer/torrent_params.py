"""What a peer adds its torrent to the session with: trackers, web seeds, resume data.

The directive's tracker replaces the torrent's HTTP trackers and its WebSocket trackers
stay (`websocket_trackers`: browser readers reach a desktop peer through them); the
origins are added as web seeds where the torrent does not name them already; the
resume data saved next to the file (`pressrun.peer.resume`) is the start, if any.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import libtorrent as lt

from pressrun.content.codec import TorrentMeta
from pressrun.peer.resume import read_resume
from pressrun.tracker.websocket_urls import webtorrent_tracker_url

#: tracker URL schemes of the WebTorrent tracker (tracker/websocket.py)
WEBSOCKET_SCHEMES = ("ws://", "wss://")


def websocket_trackers(meta: TorrentMeta, tracker_url: str | None) -> list[str]:
    """The torrent's ``ws://``/``wss://`` trackers (WebRTC peers, browser readers);
    for a torrent that names no tracker at all (published without ``--tracker``, as
    the benches and the emulation do), the directive's tracker's WebSocket twin,
    where the balancer sends browsers: without it the desktop never met a reader
    (issue 26). A torrent naming only HTTP trackers (``--no-webtorrent``) gets none."""
    if not meta.trackers and tracker_url is not None:
        twin = webtorrent_tracker_url(tracker_url)
        return [] if twin is None else [twin]
    return [t for t in meta.trackers if t.startswith(WEBSOCKET_SCHEMES)]


def add_torrent_params(
    *,
    info: Any,
    meta: TorrentMeta,
    partial_dir: Path,
    resume_path: Path,
    tracker_url: str | None,
    web_seeds: Sequence[str],
) -> tuple[Any, int]:
    """libtorrent's add_torrent_params for the torrent ``info`` (``meta`` parsed), and
    the bytes the peer fetched from the origins itself (kept in the resume data)."""
    atp, fed_bytes = read_resume(resume_path)
    if atp is None:
        atp = lt.add_torrent_params()
    atp.ti = info
    atp.save_path = str(partial_dir)
    # Started now, not by libtorrent's queue: its default flags add a torrent
    # paused and auto-managed, and the session's queue unpauses it on its next
    # one-second tick, so the first announce (and every connection) waited up to
    # 1 s: 17 of 20 peers started at once announced 0.7-1.0 s after their start
    # (docs/results/2026-11-28-swarm-limit.md). One torrent a session needs no queue.
    atp.flags &= ~(lt.torrent_flags.paused | lt.torrent_flags.auto_managed)
    if tracker_url is not None:
        # the directive's tracker replaces the torrent's HTTP ones; its WebSocket
        # trackers stay: that is how browser readers reach this peer (WebRTC)
        atp.trackers = [tracker_url, *websocket_trackers(meta, tracker_url)]
    # Only the origins the torrent does not name already: libtorrent keeps a
    # duplicate as a second web seed, which remove_url_seed() does not remove.
    in_torrent = set(meta.web_seeds)
    atp.url_seeds = [u for u in web_seeds if u not in in_torrent]
    return atp, fed_bytes
