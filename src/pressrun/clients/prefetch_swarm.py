"""The prefetchers' swarm: the ciphertext of an embargoed issue shared among the
subscribers who pre-position it, before its release (issue 35).

The torrent is over the ciphertext (its pieces are the manifest's pieces), so
prefetchers can trade pieces without the key. ``pressrun get --prefetch`` joins the
issue's swarm through the torrent's own trackers, with **no web seed**: what comes
from the origins before the release comes only through the balancer's paced grant
(`pressrun.clients.prefetch`), one piece at a time, and each such piece is handed to
libtorrent (``add_piece``), so the other prefetchers can take it from this one. The
origin fetches go to the pieces nobody in the swarm holds (`next_origin_piece`), so
each piece leaves the origins about once for the whole swarm; the rest comes from
peers, unpaced (the origins carry none of it). A prefetcher that has it all seeds
the ciphertext to the others until the release.

A swarm that cannot be joined (no tracker in the torrent, no torrent, libtorrent
refuses it) is only a note: the prefetch goes on from the origins alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from pressrun.content.codec import parse_torrent
from pressrun.content.manifest import Manifest

__all__ = ["PEER_PATIENCE_S", "PrefetchSwarm", "next_origin_piece", "swarm_trackers"]

log = logging.getLogger("pressrun.clients.prefetch")

#: with every missing piece held by some peer, the origins are asked only after the
#: peers brought nothing for this long (a choking or stalled swarm)
PEER_PATIENCE_S = 3.0
#: between pausing the torrent (its "stopped" announces leave) and ending the session
STOP_GRACE_S = 0.3


def swarm_trackers(torrent: bytes) -> list[str]:
    """The torrent's HTTP(S) trackers: where the prefetchers meet (ValueError for a
    torrent that does not parse)."""
    meta = parse_torrent(torrent)
    return [t for t in meta.trackers if t.startswith(("http://", "https://"))]


def next_origin_piece(
    missing: Sequence[int],
    availability: Sequence[int],
    *,
    peers_idle_s: float,
    rng: random.Random,
) -> int | None:
    """The piece to ask the origins for next, or None: let the peers bring it.

    A piece no connected peer holds first (chosen at random among them, so two
    prefetchers rarely pay the origins for the same piece); when every missing piece
    is held by a peer, None, unless the peers have brought nothing for
    ``PEER_PATIENCE_S``: then the least held. Pure: the caller passes the state.
    """
    if not missing:
        return None
    held = [availability[i] if i < len(availability) else 0 for i in missing]
    nobody = [i for i, n in zip(missing, held, strict=True) if n <= 0]
    if nobody:
        return rng.choice(nobody)
    if peers_idle_s < PEER_PATIENCE_S:
        return None
    least = min(held)
    return rng.choice([i for i, n in zip(missing, held, strict=True) if n == least])


class PrefetchSwarm:
    """One libtorrent session on the partial ciphertext file, without web seeds."""

    def __init__(
        self,
        *,
        torrent: bytes,
        manifest: Manifest,
        partial_dir: Path,
        profile: str = "desktop",
        listen_interfaces: str = "0.0.0.0:0",
    ) -> None:
        """``profile``: the peer profile of `pressrun.peer.config` (its upload cap)."""
        import libtorrent as lt

        self._lt = lt
        self.manifest = manifest
        self.partial_dir = partial_dir
        self.listen_interfaces = listen_interfaces
        self.profile = profile if profile in ("desktop", "mobile") else "desktop"
        trackers = parse_torrent(torrent).trackers
        self.websocket = any(t.startswith(("ws://", "wss://")) for t in trackers)
        decoded: Any = lt.bdecode(torrent)
        if isinstance(decoded, dict):
            # no web seed: the origins only through the paced grant (the url-list is
            # outside the info dictionary: the info-hash stays)
            decoded.pop(b"url-list", None)
            decoded.pop(b"httpseeds", None)
        self._info = lt.torrent_info(cast(bytes, decoded))
        if str(self._info.info_hashes().v1) != manifest.info_hash:
            raise ValueError("the torrent is not the manifest's (info-hash)")
        if self._info.num_pieces() != manifest.num_pieces:
            raise ValueError("the torrent's pieces are not the manifest's")
        self._alerts: Any = None
        self._handle: Any = None
        self._have: list[bool] = []
        # the pieces the partial file held when libtorrent checked it (set by start)
        self.on_disk: frozenset[int] = frozenset()
        #: payload sent to other prefetchers (libtorrent's count)
        self.bytes_to_peers = 0
        self.peers = 0

    async def start(self, *, timeout_s: float = 30.0) -> None:
        """Open the session, add the torrent over the partial file and wait until
        libtorrent has checked what the file holds."""
        from pressrun.peer.config import profile_config
        from pressrun.peer.session import AlertSession, new_peer_id, session_settings

        lt = self._lt
        settings = session_settings(
            # libtorrent's WebRTC (a ws:// tracker in the torrent): our STUN server or none
            profile_config(self.profile, stun_server=os.environ.get("PRESSRUN_STUN", "")),
            listen_interfaces=self.listen_interfaces,
            peer_id=new_peer_id(),
        )
        # a prefetcher that just got the last piece becomes upload-only, and libtorrent
        # closes "redundant" connections: the others dropped it as an uninteresting
        # upload-only peer before its HAVE of that last piece was counted, and that
        # piece never reached them (measured: 2 of 3 prefetchers lacked it 10 s later)
        settings["close_redundant_connections"] = False
        self._alerts = AlertSession(
            settings,
            loop=asyncio.get_running_loop(),
            on_alert=self._on_alert,
            after_alerts=lambda: None,
        )
        self._alerts.websocket = self.websocket  # its close then lets the handshake run
        atp = lt.add_torrent_params()
        atp.ti = self._info
        atp.save_path = str(self.partial_dir)
        # stopped once the check is done, before any peer can send a piece: what it
        # holds then is what the file held (a piece from a peer in the moment before
        # this loop's next look was counted as found on disk, as from nobody)
        atp.flags |= lt.torrent_flags.stop_when_ready
        self._handle = self._alerts.session.add_torrent(atp)
        async with asyncio.timeout(timeout_s):
            while True:
                st = self._handle.status()
                checking = st.state in (
                    lt.torrent_status.states.checking_files,
                    lt.torrent_status.states.checking_resume_data,
                )
                if not checking and st.flags & lt.torrent_flags.paused:
                    break
                await asyncio.sleep(0.05)
        self.refresh()
        self.on_disk = frozenset(self.have())
        self._handle.resume()

    def _on_alert(self, alert: Any) -> None:
        lt = self._lt
        if isinstance(alert, lt.hash_failed_alert | lt.file_error_alert | lt.torrent_error_alert):
            log.info("%s: prefetch swarm: %s", self.manifest.issue_id, alert.message())

    def refresh(self) -> None:
        """Read libtorrent's status: the pieces held and the payload counts."""
        if self._handle is None:
            return
        st = self._handle.status()
        self._have = list(st.pieces)
        self.bytes_to_peers = int(st.all_time_upload)
        self.peers = int(st.num_peers)

    def have(self) -> set[int]:
        """The pieces libtorrent holds, each checked against the torrent (as of the
        last `refresh`)."""
        return {i for i, h in enumerate(self._have) if h}

    def availability(self) -> list[int]:
        """How many connected peers hold each piece."""
        if self._handle is None:
            return []
        return list(self._handle.piece_availability())

    def add_piece(self, index: int, data: bytes) -> None:
        """A piece fetched (and verified) from an origin: libtorrent writes it, checks
        it and offers it to the others."""
        self._handle.add_piece(index, data, 0)

    async def close(self) -> dict[str, float]:
        """Leave the swarm (the partial file stays). Returns the seconds of its steps
        (empty when the session was not open): ``stopped``, the torrent paused and
        `STOP_GRACE_S` for its "stopped" announces; ``close``, the session's end
        (`AlertSession.close`: kept until a command-line process ends; destroyed in a
        library, its destructor waiting for the trackers' answers to those announces,
        ``stop_tracker_timeout`` at most: a tracker that never answers takes it all)."""
        steps: dict[str, float] = {}
        if self._alerts is not None:
            loop = asyncio.get_running_loop()
            began = loop.time()
            self.refresh()
            # the torrent paused first, with the loop running: libtorrent announces
            # "stopped" now, so the session's destructor (which holds the GIL) has no
            # tracker to wait for (a tracker in this process could not answer it)
            self._handle.pause()
            await asyncio.sleep(STOP_GRACE_S)
            paused = loop.time()
            alerts, self._alerts, self._handle = self._alerts, None, None
            await alerts.close()
            steps = {"stopped": round(paused - began, 3), "close": round(loop.time() - paused, 3)}
        return steps
