"""A swarm download's timeline in the log: where a peer's time went.

`SwarmTimeline` writes INFO lines (logger ``pressrun.peer.timeline``) that an operator
reads to break a swarm client's download down: when the torrent was added (``start``,
with the monotonic clock, which an emulation's held client records at its release too,
so the balancer's directive, the manifest and the torrent before it are the difference),
the tracker's first answer, the first connected peer, the first piece, and once a second
while downloading the bytes from the origins (libtorrent's web seeds and the peer's own
origin feed) against the bytes from peers, the pieces owed to the origins, and the ring's
answers so far. ``pressrun emulate`` keeps every client's log (docs/emulation.md).

Nothing here decides anything: it reads what `pressrun.peer.aio.SwarmPeer` hands it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: seconds between two progress lines while downloading
EVERY_S = 1.0


class SwarmTimeline:
    """One peer's timeline lines; ``now`` is the event loop's (monotonic) clock."""

    def __init__(self, issue_id: str, *, every_s: float = EVERY_S) -> None:
        self.issue_id = issue_id
        self.every_s = every_s
        self.started_at: float | None = None
        self._next_line = 0.0
        self._tracker_answered = False
        self._peer_seen = False
        self._piece_seen = False

    def _since(self, now: float) -> float:
        return now - (self.started_at if self.started_at is not None else now)

    def start(self, now: float, *, policy: str, web_seeds: int) -> None:
        """The torrent was added: the download's clock starts."""
        self.started_at = now
        self._next_line = now
        log.info(
            "%s: timeline start (monotonic %.3f): policy %s, %d web seed(s)",
            self.issue_id,
            now,
            policy,
            web_seeds,
        )

    def tracker_reply(self, now: float, *, peers: int | None, error: str | None) -> None:
        """A tracker answered (the first answer and every error are logged)."""
        if error is not None:
            log.info("%s: +%.2f s tracker error: %s", self.issue_id, self._since(now), error)
            return
        if not self._tracker_answered:
            self._tracker_answered = True
            log.info(
                "%s: +%.2f s tracker's first answer: %s peer(s)",
                self.issue_id,
                self._since(now),
                "?" if peers is None else peers,
            )

    def status(
        self,
        now: float,
        progress: Any,
        *,
        feed_bytes: int,
        web_bytes: int,
        owed: int,
        parallel: int,
        fetch_bps: int,
        download_bps: int,
        ring: Callable[[], Any],
    ) -> None:
        """A status read while downloading: the first peer and piece at once, a
        progress line every ``every_s``."""
        if self.started_at is None:
            return
        t = self._since(now)
        if not self._peer_seen and progress.connected_peers > 0:
            self._peer_seen = True
            log.info("%s: +%.2f s first connected peer", self.issue_id, t)
        if not self._piece_seen and progress.pieces_have > 0:
            self._piece_seen = True
            log.info("%s: +%.2f s first piece", self.issue_id, t)
        if now < self._next_line:
            return
        self._next_line = now + self.every_s
        stats = ring()
        ring_text = (
            ""
            if stats is None
            else f"; ring rounds {stats.rounds}, bring-in {stats.bring_in}, "
            f"first {stats.first}, wait {stats.waits}"
        )
        from_peers = max(0, progress.downloaded_bytes - feed_bytes - web_bytes)
        log.info(
            "%s: +%.2f s %d/%d pieces; from the origins %d B (web seeds %d, feed %d), "
            "from peers %d B; %d peer(s); owed %d, %d in flight at most, feed %d B/s, "
            "peers %d B/s%s",
            self.issue_id,
            t,
            progress.pieces_have,
            progress.pieces_total,
            web_bytes + feed_bytes,
            web_bytes,
            feed_bytes,
            from_peers,
            progress.connected_peers,
            owed,
            parallel,
            fetch_bps,
            download_bps,
            ring_text,
        )

    def verified(self, now: float, *, web_bytes: int, feed_bytes: int, down_bytes: int) -> None:
        """The copy was verified: the download's end."""
        log.info(
            "%s: +%.2f s verified; from the origins %d B, from peers %d B",
            self.issue_id,
            self._since(now),
            web_bytes + feed_bytes,
            max(0, down_bytes - web_bytes - feed_bytes),
        )
