"""A swarm download's timeline in the log: where a peer's time went.

`SwarmTimeline` writes INFO lines (logger ``pressrun.peer.timeline``) that an operator
reads to break a swarm client's download down: when the torrent was added (``start``,
with the monotonic clock, which an emulation's held client records at its release too,
so the balancer's directive, the manifest and the torrent before it are the difference),
the tracker's first answer, the first connected peer, the first piece, the first piece
from a peer (not the origins), and once a second while downloading the bytes from the
origins (libtorrent's web seeds and the peer's own origin feed) against the bytes from
peers, the pieces owed to the origins, and the ring's answers so far. At the copy's
verification, one line per source (`PieceSources`): the pieces this client handed to
libtorrent itself (its feed from the origins, or its carousel copy), each web seed and
each peer (its address and peer id, which its own log's ``start`` line names), and the
pieces found on disk at the start, with the pieces and bytes of each and when its
first and last piece passed libtorrent's check: which peer a slow
download waited on, and from when. ``pressrun emulate`` keeps every client's log
(docs/emulation.md).

Nothing here decides anything: it reads what `pressrun.peer.aio.SwarmPeer` hands it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pressrun.peer.uploader import HOLD_PRIORITY

if TYPE_CHECKING:
    from pressrun.peer.feed import OwedPieceFeed
    from pressrun.peer.status import SwarmStatus

log = logging.getLogger(__name__)

#: seconds between two progress lines while downloading
EVERY_S = 1.0
#: libtorrent's block, what a peer sends in one message (its ``default_block_size``)
BLOCK_BYTES = 16 * 1024
#: sources named one by one (the later ones are counted together as `OTHER`): the
#: log stays a screenful whatever the peers that come and go
MAX_SOURCES = 16
#: the source of a piece this client handed to libtorrent itself (``add_piece``: its
#: feed from the origins, or its carousel copy; libtorrent reports its blocks as from
#: 0.0.0.0, port 0)
ADDED = "add_piece"
#: the source of a piece found on disk by the check at the torrent's start (resume, a
#: carousel copy that seeds)
ON_DISK = "on disk"
#: the sources past `MAX_SOURCES`
OTHER = "other"
#: the last pieces named one by one at the end (when each was first asked for, when
#: it passed, from whom): a download's tail is where a slow source shows
LAST_PIECES = 4


@dataclass
class SourceCount:
    """What one source gave: pieces (each counted to the source of most of its bytes),
    bytes (of verified pieces, block by block), and when its first and last piece
    was verified (monotonic)."""

    peer_id: str = ""
    pieces: int = 0
    bytes: int = 0
    first_at: float | None = None
    last_at: float | None = None


class PieceSources:
    """Where each piece came from, from libtorrent's block and piece alerts. Pure:
    times come with the calls. ``piece_bytes(i)`` is piece ``i``'s length.

    A piece's source is known once it passed the hash check and its blocks were
    reported, in either order (libtorrent reports a block once it is written, which
    may come after the piece's hash check: at their pass, 8 of 31 pieces fed to a
    loopback peer had a block reported). The blocks of the piece that completes the
    torrent are never reported (libtorrent drops its piece picker at once, and with it
    the report of the writes still under way): such a piece is counted to the peer it
    was last asked of, or to `ADDED` if nobody was asked (a block asked of a peer or
    web seed is reported when asked, ``block_downloading_alert``; a piece handed over
    with ``add_piece`` is asked of nobody). A piece that passed before the torrent's
    check at its start ended (`checked`) was found on disk (`ON_DISK`). State is
    bounded: the torrent's pieces, and `MAX_SOURCES` named sources."""

    def __init__(self, piece_bytes: Callable[[int], int], *, max_sources: int = MAX_SOURCES):
        self._piece_bytes = piece_bytes
        self.max_sources = max_sources
        #: each source's peer id (as text); `ADDED`'s, `ON_DISK`'s and `OTHER`'s too
        self.peer_ids: dict[str, str] = {ON_DISK: ""}
        self._named = 0  # sources in `peer_ids` but `ADDED`, `ON_DISK` and `OTHER`
        self._checking = True  # the torrent's check at its start has not ended
        #: the bytes of each piece by source, the source each was last asked of, and
        #: when each piece passed
        self._blocks: dict[int, dict[str, int]] = {}
        self._asked: dict[int, str] = {}
        self._passed: dict[int, float] = {}
        #: when each piece was first asked of a peer or web seed
        self.asked_at: dict[int, float] = {}

    def block(
        self,
        piece: int,
        block: int,
        endpoint: tuple[str, int],
        peer_id: bytes,
        *,
        now: float = 0.0,
        asked: bool = False,
    ) -> None:
        """A block of ``piece`` came from ``endpoint`` (libtorrent's
        ``block_finished_alert``), or was asked of it (``asked``,
        ``block_downloading_alert``) at ``now``."""
        key = self._source(endpoint, peer_id)
        if asked:
            self._asked[piece] = key
            self.asked_at.setdefault(piece, now)
            return
        start = block * BLOCK_BYTES
        size = max(0, min(BLOCK_BYTES, self._piece_bytes(piece) - start))
        blocks = self._blocks.setdefault(piece, {})
        blocks[key] = blocks.get(key, 0) + size

    def _source(self, endpoint: tuple[str, int], peer_id: bytes) -> str:
        address, port = str(endpoint[0]), int(endpoint[1])
        key = ADDED if port == 0 else f"{address}:{port}"
        if key not in self.peer_ids:
            if key != ADDED and self._named >= self.max_sources:
                key = OTHER
            elif key != ADDED:
                self._named += 1
            self.peer_ids.setdefault(key, _peer_id_text(peer_id))
        return key

    def piece_done(self, now: float, piece: int) -> None:
        """``piece`` passed libtorrent's hash check."""
        if self._checking:
            self._blocks[piece] = {ON_DISK: self._piece_bytes(piece)}
        self._passed.setdefault(piece, now)

    def checked(self) -> None:
        """The torrent's check at its start ended (``torrent_checked_alert``): a piece
        that passes from now on came from somewhere."""
        self._checking = False

    def piece_failed(self, piece: int) -> None:
        """``piece`` failed the hash check: its blocks are not counted."""
        self._blocks.pop(piece, None)
        self._passed.pop(piece, None)

    def _bytes_of(self, piece: int) -> dict[str, int]:
        # (a passed piece none of whose blocks was reported: the class docstring)
        blocks = self._blocks.get(piece)
        if blocks or piece not in self._passed:
            return blocks or {}
        key = self._asked.get(piece, ADDED)
        self.peer_ids.setdefault(key, "")
        return {key: self._piece_bytes(piece)}

    def source_of(self, piece: int) -> str | None:
        """The source of most of ``piece``'s bytes (None: none reported yet)."""
        blocks = self._bytes_of(piece)
        return max(blocks, key=lambda k: blocks[k]) if blocks else None

    def counts(self) -> dict[str, SourceCount]:
        """What each source gave of the pieces passed: each piece counted to the source
        of most of its bytes, the bytes to each block's source."""
        out: dict[str, SourceCount] = {}
        for piece, at in self._passed.items():
            for key, size in self._bytes_of(piece).items():
                out.setdefault(key, SourceCount(peer_id=self.peer_ids[key])).bytes += size
            source = self.source_of(piece)
            if source is None:
                continue
            count = out[source]
            count.pieces += 1
            count.first_at = at if count.first_at is None else min(count.first_at, at)
            count.last_at = at if count.last_at is None else max(count.last_at, at)
        return out

    def last_passed(self, n: int) -> list[tuple[int, float]]:
        """The last ``n`` pieces to pass, and when, oldest first."""
        return sorted(self._passed.items(), key=lambda item: item[1])[-n:]

    def first_from_peer(self, web: Collection[tuple[str, int]]) -> tuple[float, str] | None:
        """When the first piece from a peer passed, and that peer's key: not one this
        client added or found on disk, not a web seed (``web``: the web-seed
        connections' addresses)."""
        best: tuple[float, str] | None = None
        for piece, at in self._passed.items():
            source = self.source_of(piece)
            if source is None or self.kind(source, web) != "peer":
                continue
            if best is None or at < best[0]:
                best = (at, source)
        return best

    @staticmethod
    def kind(key: str, web: Collection[tuple[str, int]]) -> str:
        """``added``, ``on disk``, ``web seed`` or ``peer`` (`OTHER` counts as peers)."""
        if key in (ADDED, ON_DISK):
            return "added" if key == ADDED else "on disk"
        address, _, port = key.rpartition(":")
        if address and port.isdigit() and (address, int(port)) in web:
            return "web seed"
        return "peer"


_LABELS = {
    "added": "add_piece (its feed from the origins, or its carousel copy)",
    "on disk": "on disk at the start",
}


def _peer_id_text(peer_id: bytes) -> str:
    # (BitTorrent peer ids are mostly printable: "-PR0100-" and 12 hex characters)
    if peer_id and all(32 < b < 127 for b in peer_id):
        return peer_id.decode("ascii")
    return peer_id.hex()


class SwarmTimeline:
    """One peer's timeline lines; ``now`` is the event loop's (monotonic) clock;
    ``piece_bytes(i)`` is piece ``i``'s length (`PieceSources`)."""

    def __init__(
        self, issue_id: str, piece_bytes: Callable[[int], int], *, every_s: float = EVERY_S
    ) -> None:
        self.issue_id = issue_id
        self.every_s = every_s
        self.started_at: float | None = None
        self.sources = PieceSources(piece_bytes)
        self._next_line = 0.0
        self._tracker_answered = False
        self._peer_seen = False
        self._piece_seen = False
        self._peer_piece_seen = False
        #: pieces the policy's plan held off: since when, until when (None: still)
        self._held: dict[int, tuple[float, float | None]] = {}

    def _since(self, now: float) -> float:
        return now - (self.started_at if self.started_at is not None else now)

    def start(self, now: float, *, policy: str, web_seeds: int, peer_id: bytes = b"") -> None:
        """The torrent was added: the download's clock starts (``peer_id``: this
        peer's, as other peers' logs name it in their sources)."""
        self.started_at = now
        self._next_line = now
        log.info(
            "%s: timeline start (monotonic %.3f): policy %s, %d web seed(s)%s",
            self.issue_id,
            now,
            policy,
            web_seeds,
            f", peer id {_peer_id_text(peer_id)}" if peer_id else "",
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

    def block(self, alert: Any, now: float, *, asked: bool) -> None:
        """A block arrived, or was asked for (`PieceSources.block`): libtorrent's
        ``block_finished_alert`` or ``block_downloading_alert``."""
        self.sources.block(
            int(alert.piece_index),
            int(alert.block_index),
            alert.endpoint,
            alert.pid.to_bytes(),
            now=now,
            asked=asked,
        )

    def checked(self) -> None:
        """The torrent's check at its start ended (`PieceSources.checked`)."""
        self.sources.checked()

    def piece_done(self, now: float, piece: int) -> None:
        """A piece passed the hash check (`PieceSources.piece_done`)."""
        self.sources.piece_done(now, piece)

    def piece_failed(self, piece: int) -> None:
        """A piece failed the hash check (`PieceSources.piece_failed`)."""
        self.sources.piece_failed(piece)

    def status(
        self,
        now: float,
        progress: Any,
        *,
        feed: OwedPieceFeed,
        status: SwarmStatus,
        ring: Callable[[], Any],
    ) -> None:
        """A status read while downloading: the first peer and piece at once, a
        progress line every ``every_s``."""
        if self.started_at is None or not log.isEnabledFor(logging.INFO):
            # (nothing here but lines: where they are not logged, the peer's session
            # does not post the block alerts either, `pressrun.peer.session.alert_mask`)
            return
        t = self._since(now)
        if not self._peer_seen and progress.connected_peers > 0:
            self._peer_seen = True
            log.info("%s: +%.2f s first connected peer", self.issue_id, t)
        if not self._piece_seen and progress.pieces_have > 0:
            self._piece_seen = True
            log.info("%s: +%.2f s first piece", self.issue_id, t)
        self._first_from_peer(status.tally.web_endpoints)
        self._holds(now, status.last_plan)
        if now < self._next_line:
            return
        # (a whole step on from the last line's due time: status reads come every half
        # second from the start, and "now + every_s" fell a few ms after the read due
        # then, a line every 1.5 s; half a step on at least after a late read)
        self._next_line = max(self._next_line + self.every_s, now + self.every_s / 2)
        stats = ring()
        ring_text = (
            ""
            if stats is None
            else f"; ring rounds {stats.rounds}, bring-in {stats.bring_in}, "
            f"first {stats.first}, wait {stats.waits}"
        )
        web_bytes = status.tally.web_bytes
        feed_bytes = feed.session_bytes
        from_peers = max(0, progress.downloaded_bytes - feed_bytes - web_bytes)
        log.info(
            "%s: +%.2f s %d/%d pieces; from the origins %d B (web seeds %d, feed %d), "
            "from peers %d B; %d peer(s); owed %d (%d queued on a peer), %d in flight at "
            "most, feed %d B/s, peers %d B/s%s",
            self.issue_id,
            t,
            progress.pieces_have,
            progress.pieces_total,
            web_bytes + feed_bytes,
            web_bytes,
            feed_bytes,
            from_peers,
            progress.connected_peers,
            len(feed.owed),
            feed.queued_elsewhere,
            feed.parallel,
            feed.fetch_bps,
            status.download_bps,
            ring_text,
        )

    def _holds(self, now: float, plan: tuple[int, ...] | None) -> None:
        # when the uploader policy's plan held each piece off (priority 0, the `chord`
        # policy's hold on a piece one connected peer holds), for the last pieces line
        held = {i for i, p in enumerate(plan or ()) if p == HOLD_PRIORITY}
        for piece in held - set(self._held):
            self._held[piece] = (now, None)
        for piece, (since, until) in self._held.items():
            if until is None and piece not in held:
                self._held[piece] = (since, now)

    def _first_from_peer(self, web: Collection[tuple[str, int]]) -> None:
        # (told at the status read after it: the web seeds' addresses are known from
        # the peer infos read there, and a web seed's piece is not a peer's)
        if self._peer_piece_seen:
            return
        first = self.sources.first_from_peer(web)
        if first is None:
            return
        self._peer_piece_seen = True
        at, key = first
        log.info(
            "%s: +%.2f s first piece from a peer: %s (%s)",
            self.issue_id,
            self._since(at),
            key,
            self.sources.peer_ids[key],
        )

    def verified(self, now: float, *, feed: OwedPieceFeed, status: SwarmStatus) -> None:
        """The copy was verified: the download's end, and where its pieces came from."""
        if not log.isEnabledFor(logging.INFO):
            return
        p = status.last_progress
        web_bytes, feed_bytes = status.tally.web_bytes, feed.session_bytes
        web = status.tally.web_endpoints
        self._first_from_peer(web)
        log.info(
            "%s: +%.2f s verified; from the origins %d B, from peers %d B",
            self.issue_id,
            self._since(now),
            web_bytes + feed_bytes,
            max(0, (p.downloaded_bytes if p else 0) - web_bytes - feed_bytes),
        )
        order = {"on disk": 0, "added": 1, "web seed": 2, "peer": 3}
        counts = self.sources.counts()
        for key in sorted(
            counts, key=lambda k: (order[self.sources.kind(k, web)], -counts[k].bytes, k)
        ):
            c = counts[key]
            kind = self.sources.kind(key, web)
            named = "other peers" if key == OTHER else f"{kind} {key} ({c.peer_id})"
            who = _LABELS.get(kind, named)
            when = (
                ""
                if c.first_at is None or c.last_at is None
                else f", verified +{self._since(c.first_at):.2f} to +{self._since(c.last_at):.2f} s"
            )
            log.info(
                "%s: source %s: %d piece(s), %d B%s", self.issue_id, who, c.pieces, c.bytes, when
            )
        self._last_pieces(feed.started_at, web)

    def _last_pieces(self, fed_at: dict[int, float], web: Collection[tuple[str, int]]) -> None:
        # the download's tail: each of the last pieces, whom it came from, when it was
        # first asked for (of a peer or web seed; from the origins by the feed) and when
        # it passed
        parts = []
        for piece, at in self.sources.last_passed(LAST_PIECES):
            source = self.sources.source_of(piece) or "?"
            kind = self.sources.kind(source, web)
            asked = fed_at.get(piece) if kind == "added" else self.sources.asked_at.get(piece)
            asked_text = "" if asked is None else f" asked +{self._since(asked):.2f},"
            who = kind if kind in _LABELS else f"{kind} {source}"
            hold = self._held.get(piece)
            held_text = (
                ""
                if hold is None
                else f" held off +{self._since(hold[0]):.2f} to "
                + ("the end," if hold[1] is None else f"+{self._since(hold[1]):.2f},")
            )
            parts.append(f"{piece} ({who}){asked_text}{held_text} passed +{self._since(at):.2f}")
        if parts:
            log.info("%s: last pieces: %s", self.issue_id, "; ".join(parts))
