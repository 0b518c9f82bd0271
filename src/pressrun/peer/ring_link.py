"""The `chord` policy's link from a `pressrun.peer.aio.SwarmPeer` to the ring.

`RingLink` is a mixin of `SwarmPeer`: it starts the peer's `RingClient` (the ring's
address is the tracker's) and feeds it from the peer's status, its origin feed and its
handle; the peer nudges it when its pieces change. Moved as it was from
``pressrun.peer.aio``; the attributes it reads are the peer's (declared here for the
type checker only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yarl

from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.ring_client import RingClient, RingClientStats

if TYPE_CHECKING:
    from pressrun.content.codec import Manifest
    from pressrun.peer.config import PeerConfig
    from pressrun.peer.feed import OwedPieceFeed
    from pressrun.peer.status import SwarmStatus
    from pressrun.peer.uploader import UploaderPolicy


def ring_endpoint(tracker_url: str, listen_interfaces: str, port: int) -> tuple[str, str]:
    """The ring's base URL (the tracker's origin: the ring's address is the tracker's)
    and the ``host:port`` a peer listening on ``listen_interfaces`` at ``port`` reports
    to it: the interface's host, or the tracker's host when it listens on every one."""
    tracker = yarl.URL(tracker_url)
    host = listen_interfaces.rsplit(":", 1)[0].strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = tracker.host or "127.0.0.1"
    return str(tracker.origin()), f"{host}:{port}"


class RingLink:
    """`SwarmPeer`'s ring client: started by `_start_ring`, read by `ring_stats`."""

    # the peer's own attributes and method (pressrun.peer.aio.SwarmPeer)
    config: PeerConfig
    manifest: Manifest
    policy: UploaderPolicy
    tracker_url: str | None
    listen_interfaces: str
    _handle: Any
    _peer_id: str
    _ring: RingClient | None
    _status: SwarmStatus
    _feed: OwedPieceFeed

    if TYPE_CHECKING:

        def _refresh_totals(self) -> None: ...

    @property
    def ring_stats(self) -> RingClientStats | None:
        """What the `chord` policy's ring client did (None: no ring client)."""
        return self._ring.stats if self._ring is not None else None

    def _start_ring(self, port: int) -> None:
        # The `chord` policy asks the ring's supernodes who uploads what
        # (pressrun.peer.ring_client); the ring's address is the tracker's.
        if not isinstance(self.policy, ChordPolicy) or self.tracker_url is None:
            return
        base, address = ring_endpoint(self.tracker_url, self.listen_interfaces, port)
        self._ring = RingClient(
            tracker_base=base,
            info_hash=self.manifest.info_hash,
            num_pieces=self.manifest.num_pieces,
            peer_id=self._peer_id,
            address=address,
            policy=self.policy,
            have=lambda: self._status.have_bits,
            unheld=lambda: self._status.unheld,
            lonely=lambda: self._status.lonely,
            totals=self._totals,
            connect=self._connect_peer,
            brought=lambda: self._feed.pieces_fed,
            upload_bps=self._upload_bps,
            unused_upload_bps=lambda: self._status.upload_use.unused_bps(self._upload_bps()),
            download_bps=lambda: self.config.download_limit_bps or self._status.peak_download_bps,
            bring_bps=lambda: self._feed.fetch_bps,
            missing=lambda: self._status.missing,
            unchoked=lambda: self._status.tally.served_ids,
            # the ring's answers apply now, not at the next status poll
            on_answers=self._refresh_totals,
        )
        self._ring.start()

    def _upload_bps(self) -> int:
        # what it can upload: its limit, else the fastest it has uploaded so far
        return self.config.upload_limit_bps or self._status.peak_upload_bps

    def _nudge_ring(self) -> None:
        if self._ring is not None:
            self._ring.nudge()

    def _totals(self) -> tuple[int, int]:
        p = self._status.last_progress
        return (p.uploaded_bytes, p.downloaded_bytes) if p else (0, 0)

    def _connect_peer(self, host: str, port: int) -> None:
        if self._handle is not None:
            self._handle.connect_peer((host, port))
