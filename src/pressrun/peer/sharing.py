"""A peer that uploads the pieces it is handed before it has the file, then seeds.

A carousel reader that may seed (`pressrun.clients.carousel_share`) joins the issue's
swarm while it still receives the carousel: a `SharingPeer` is a `SwarmPeer` whose
torrent is added with every piece at priority 0 but one (below) and no web seeds (it
downloads nothing: the carousel is its source) and which is handed each piece the
client has verified against the manifest (`offer`: libtorrent's ``add_piece``, which
writes the piece to the peer's own file and checks it against the torrent's hash, and
from then on offers it to the swarm). Once every piece is in, `seed` turns the same session and
torrent (its connections and its all-time upload) into the ordinary peer: the core
starts, the peer's final check reads the file against the manifest, and it seeds by
the fair-exit rules (`SwarmPeer.finished`).

Until `seed`, the peer's core does not run: no status polls, no stall rule, no web
seeds, no ring; libtorrent uploads to the peers that ask.

**One piece it lacks stays wanted** (`BAIT_PRIORITY`, the highest piece not held:
`_want_one`). With every piece at priority 0 the torrent is "finished", and libtorrent
says so in each connection's extension handshake (``upload_only``, whatever
``close_redundant_connections`` says); a downloading libtorrent peer closes a
connection to an upload-only peer it is not interested in ("uninteresting upload-only
peer"). The `chord` policy holds off each piece only one connected peer has until the
ring names it a first receiver (`pressrun.peer.chord_policy`), so the next reader
closed the connection 0.5 s after it opened, every time this one came back
(`RECONNECT_S`), and its hold started again with each connection: in
flash-crowd-50-desktops the second reader (fibre-50) took 0.4-0.7 MB of its 50 MB
from the first reader (origin mode, dsl-20) while that one held 19-40 MB
(docs/results/2026-11-29-origin-egress.md). Wanting a piece it lacks, it is not
upload-only, and its connections stay. The wanted piece is one no connected peer holds
(libtorrent asks nobody for it); should a peer get it, it comes from that peer, one
piece (its owner hands it over anyway), and the next one nobody holds is wanted.

**It may take pieces from its peers** (`take`, an origin reader's session:
`pressrun.clients.swarm_take`): those are wanted at libtorrent's default priority
and come from the connected peers that hold them (no web seed); each piece libtorrent
finishes is told to ``on_piece``, whose owner reads it back against the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import libtorrent as lt

from pressrun.peer.aio import SwarmPeer
from pressrun.peer.results import SwarmError, SwarmResult
from pressrun.peer.watchdog import note_webrtc

log = logging.getLogger(__name__)

__all__ = ["SharingPeer"]

#: how long `seed` waits for libtorrent to have written and checked the pieces handed
#: to it before it gives up on seeding (a 50 MB issue takes well under a second)
PIECES_IN_WAIT_S = 30.0
#: the states in which libtorrent drops a piece handed to ``add_piece``
CHECKING = (
    lt.torrent_status.states.checking_resume_data,
    lt.torrent_status.states.checking_files,
)
#: how often `share` looks whether the torrent's check has ended, seconds
CHECK_POLL_S = 0.01
#: libtorrent's default piece priority: every piece wanted
WANTED = 4
#: seconds before it connects again to a peer that closed its connection (libtorrent's
#: `min_reconnect_time`, 60 by default; `share`)
RECONNECT_S = 2
#: how long `seed` waits for the tracker to answer the "completed" announce
COMPLETED_WAIT_S = 5.0
#: the priority of the one piece a sharing peer keeps wanted (the module docstring):
#: libtorrent's lowest but 0
BAIT_PRIORITY = 1
#: connections named in a sharing line at most (`connections_line`), the busiest first
MAX_CONNECTIONS_NOTED = 4


def connections_line(peers: Sequence[Any], *, limit: int = MAX_CONNECTIONS_NOTED) -> str:
    """What each connected BitTorrent peer gets from this sharing session, from
    libtorrent's peer infos (``get_peer_info``): its peer id (the last 12 hex digits),
    whether this one unchokes it, whether it is interested, the requests it has queued
    here, what this one sends it (kB/s), the pieces it holds and the round trip; the
    busiest first, at most ``limit``, the others counted. Written for the second reader
    of flash-crowd-50-desktops, which got 43-157 of the 110-189 pieces the ring named it
    from the first reader's sharing session in five runs, the rest from the origins,
    while the clients' logs said nothing of that connection
    (docs/results/2026-11-29-origin-egress.md)."""
    shown = [
        pi
        for pi in peers
        if pi.connection_type == lt.peer_info.standard_bittorrent
        and not pi.flags & (lt.peer_info.handshake | lt.peer_info.connecting)
    ]
    shown.sort(key=lambda pi: (-int(pi.payload_up_speed), -int(pi.upload_queue_length)))
    parts = [
        f"{pi.pid.to_bytes().hex()[-12:]} "
        f"{'choked' if pi.flags & lt.peer_info.choked else 'unchoked'}, "
        f"{'interested' if pi.flags & lt.peer_info.remote_interested else 'not interested'}, "
        f"asks {int(pi.upload_queue_length)}, sends {int(pi.payload_up_speed) / 1e3:.0f} kB/s, "
        f"holds {int(pi.num_pieces)}, rtt {int(pi.rtt)} ms"
        for pi in shown[:limit]
    ]
    if len(shown) > limit:
        parts.append(f"and {len(shown) - limit} more")
    return "; ".join(parts) or "no peer connected"


class SharingPeer(SwarmPeer):
    """`SwarmPeer` that shares the pieces it is handed before it seeds (the module
    docstring). ``await share()``, then `offer` each verified piece, then ``await
    seed()`` (the `SwarmResult` once it left by a rule), ``await close()`` always."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: pieces handed to libtorrent (`offer`)
        self.offered: set[int] = set()
        self._sharing = False
        #: the tracker's answer to the announce after the last piece (`seed`)
        self._completed: asyncio.Future[None] | None = None
        #: the WebTorrent trackers it joins once it has a piece (`share`, `offer`)
        self._webrtc_pending: list[str] = []
        #: the one piece it lacks and keeps wanted while it shares (`_want_one`)
        self.bait: int | None = None
        #: told each piece libtorrent finished while it shares (handed over or taken)
        self.on_piece: Callable[[int], None] | None = None

    @property
    def sharing(self) -> bool:
        """The torrent is in the session and takes pieces (`share` ran, `seed` not yet)."""
        return self._sharing

    async def share(self) -> int:
        """Open the session and add the torrent, every piece at priority 0 but the last
        (`_want_one`) and no web seed: it announces and takes connections, uploads what
        it is handed and downloads nothing. The listening port."""
        port = await self.open()
        assert self._alerts is not None
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        atp = self._add_params()
        atp.url_seeds = []
        # every piece at 0 but the last, wanted (`_want_one`) from the first handshake on
        n = self.manifest.num_pieces
        atp.piece_priorities = [0] * (n - 1) + [BAIT_PRIORITY]
        self.bait = n - 1
        # WebRTC peers (the phones' browsers) only once it has a piece (`offer`): each
        # offer a WebTorrent tracker relays costs the browser that answers it an
        # RTCPeerConnection (7-11 ms of Chromium's CPU, docs/reader.md), for a peer
        # that would have nothing to give it
        self._webrtc_pending = self.websocket_trackers
        atp.trackers = (
            [self.tracker_url]
            if self.tracker_url is not None
            else [t for t in self._meta.trackers if t not in self._webrtc_pending]
        )
        atp.flags |= lt.torrent_flags.override_trackers
        # At priority 0 the torrent is "finished" and tells its peers it is upload-only.
        # A libtorrent peer that took every piece this one had closes the connection
        # ("uninteresting upload-only peer"), and this one would close it too
        # (`close_redundant_connections`); each side then waits `min_reconnect_time`
        # (60 s by default) before connecting again, long after this one has more (its
        # next pieces, or all of them as it seeds). So it keeps its connections, and
        # comes back to a peer that closed one after `RECONNECT_S`.
        self._alerts.session.apply_settings(
            {"close_redundant_connections": False, "min_reconnect_time": RECONNECT_S}
        )
        self._handle = self._alerts.session.add_torrent(atp)
        # the torrent's own web seeds come with it: nothing is asked of them at
        # priority 0, and none is wanted once it seeds (a seed has every piece)
        for url in self._handle.url_seeds():
            self._handle.remove_url_seed(url)
        await self._checked(self._handle)
        self._sharing = True
        self._alerts.drain()
        return port

    async def _checked(self, handle: Any) -> None:
        """Wait until libtorrent has checked the torrent just added: it drops a piece
        handed to ``add_piece`` while it checks (``checking_resume_data``,
        ``checking_files``; 2 of 20 pieces handed over at once on 127.0.0.1, 29 Nov),
        and `offer` hands each piece once. `SwarmError` after `PIECES_IN_WAIT_S`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PIECES_IN_WAIT_S
        while handle.status().state in CHECKING:
            if loop.time() >= deadline:
                raise SwarmError(
                    f"libtorrent still checked the torrent after {PIECES_IN_WAIT_S:.0f} s"
                )
            await asyncio.sleep(CHECK_POLL_S)

    def offer(self, index: int, data: bytes) -> None:
        """Hand libtorrent piece ``index`` (verified by the caller against the
        manifest): it writes and hashes it and offers it from then on."""
        if not self._sharing or index in self.offered or self._handle is None:
            return
        self._handle.add_piece(index, data, 0)
        self.offered.add(index)
        if index == self.bait:
            self._want_one()
        if self._webrtc_pending:
            self._join_webrtc()

    def take(self, indices: Iterable[int]) -> None:
        """Download these pieces (connected peers hold them) from its peers, at
        libtorrent's default priority (the wanted piece keeps its own)."""
        handle = self._handle
        if handle is None or not self._sharing:
            return
        for index in indices:
            if index != self.bait:
                handle.piece_priority(index, WANTED)

    def untake(self, indices: Iterable[int]) -> None:
        """No longer download these pieces (back to priority 0)."""
        handle = self._handle
        if handle is None or not self._sharing:
            return
        for index in indices:
            if index != self.bait and index not in self.offered:
                handle.piece_priority(index, 0)

    def availability(self) -> list[int]:
        """How many connected peers hold each piece (libtorrent's count); [] without a
        torrent."""
        handle = self._handle
        return [] if handle is None else [int(n) for n in handle.piece_availability()]

    def asked(self) -> set[int]:
        """The pieces libtorrent has asked a peer for a block of (its download queue)."""
        handle = self._handle
        return (
            set()
            if handle is None
            else {int(p["piece_index"]) for p in handle.get_download_queue()}
        )

    def _want_one(self) -> None:
        """Keep one piece wanted at `BAIT_PRIORITY` (the module docstring): the highest
        it was neither handed nor holds that no connected peer holds (libtorrent asks
        nobody for it then); none when every such piece is held by a peer (a piece
        wanted would be downloaded from it, and the next, one after the other), and
        none from then on. Its connections stay either way: libtorrent says
        upload-only only in a handshake (``close_redundant_connections`` off: no message
        later); only connections opened after that see it upload-only."""
        handle = self._handle
        if handle is None or not self._sharing:
            return
        # (two calls into libtorrent's thread, not one a piece)
        have = handle.status(lt.torrent_handle.query_pieces).pieces
        available = handle.piece_availability()
        for index in range(self.manifest.num_pieces - 1, -1, -1):
            if index in self.offered or (index < len(have) and have[index]):
                continue
            if index < len(available) and available[index] > 0:
                continue
            if index != self.bait:
                self._unbait(have)
                handle.piece_priority(index, BAIT_PRIORITY)
                self.bait = index
            return
        self._unbait(have)
        self.bait = None

    def _unbait(self, have: Any) -> None:
        # the piece wanted so far back to 0 if it still lacks it (a peer has it now)
        bait, handle = self.bait, self._handle
        held = bait is not None and (bait in self.offered or (bait < len(have) and have[bait]))
        if bait is not None and handle is not None and not held:
            handle.piece_priority(bait, 0)

    def _join_webrtc(self) -> None:
        """Announce to the WebTorrent trackers too (it has a piece to give now)."""
        assert self._handle is not None and self._alerts is not None
        for url in self._webrtc_pending:
            self._handle.add_tracker({"url": url, "tier": 0})
        self._webrtc_pending = []
        self._alerts.websocket = True
        note_webrtc()  # the command line's exit is bounded then
        self._handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)

    def note_connections(self, now_s: float) -> None:
        """Log what its connected peers get from it (`connections_line`), with the
        pieces offered and its upload so far; ``now_s``: seconds since the sharing
        began. Nothing while it has no torrent or no connection."""
        handle = self._handle
        if handle is None or not self._sharing:
            return
        peers = handle.get_peer_info()
        if not peers:
            return
        log.info(
            "%s: sharing +%.1f s: %d pieces offered, %.1f MB uploaded; %s",
            self.manifest.issue_id,
            now_s,
            len(self.offered),
            self.uploaded_bytes / 1e6,
            connections_line(peers),
        )

    @property
    def held(self) -> int:
        """Pieces libtorrent has written and checked."""
        return 0 if self._handle is None else int(self._handle.status().num_pieces)

    @property
    def uploaded_bytes(self) -> int:
        """Payload uploaded by this torrent so far."""
        return 0 if self._handle is None else int(self._handle.status().all_time_upload)

    async def seed(self) -> SwarmResult:
        """With every piece handed over: wait until libtorrent holds them all, want
        every piece (it is then a seed, and downloads nothing), start the core, check
        the copy against the manifest and seed by the fair-exit rules. Returns once
        a rule let it go; `SwarmError` when the pieces never all came in."""
        if not self._sharing or self._handle is None:
            raise SwarmError("the peer is not sharing")
        n = self.manifest.num_pieces
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PIECES_IN_WAIT_S
        while self.held < n:
            if loop.time() >= deadline:
                raise SwarmError(f"libtorrent took {self.held} of {n} pieces handed to it")
            await asyncio.sleep(0.05)
        # every piece wanted and held: a seed, which announces "completed". The
        # tracker has counted this peer as a leecher while it shared; counts read
        # before it knows better show no seed while this one seeds, which the core
        # takes for a tracker that lost its peers and holds `not_needed` back for
        # `not_needed_settle_s` (60 s): wait for the tracker's answer first
        self._completed = loop.create_future()
        self._handle.prioritize_pieces([WANTED] * n)
        self._alerts_session().apply_settings({"close_redundant_connections": True})
        # now, not after the back-off of a tracker that failed before
        self._handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._completed), COMPLETED_WAIT_S)
        self._sharing = False
        # start() finds the torrent in the session (the same handle: libtorrent returns
        # the torrent already there); its first status read sees a seed and runs the
        # final check
        await self.start()
        if not await self.downloaded():
            return await self.stop()
        return await self.finished()

    def _alerts_session(self) -> Any:
        assert self._alerts is not None
        return self._alerts.session

    def _on_alert(self, a: Any) -> None:
        done = self._completed
        if (
            done is not None
            and not done.done()
            and isinstance(a, lt.tracker_reply_alert | lt.tracker_error_alert)
            and str(a.tracker_url()).startswith(("http://", "https://"))
        ):
            done.set_result(None)  # answered, or it will not (the counts' rule copes)
        if self._sharing and isinstance(a, lt.piece_finished_alert):
            if a.piece_index == self.bait:
                # the wanted piece came from a peer: the next one is wanted
                self._want_one()
            if self.on_piece is not None:
                self.on_piece(int(a.piece_index))
        if self._sharing and isinstance(a, lt.hash_failed_alert):
            # a piece the manifest verified that the torrent's hash refuses (a torrent
            # not made from the manifest's file): not offered, and not handed again
            log.warning(
                "%s: piece %d handed over failed libtorrent's check",
                self.manifest.issue_id,
                a.piece_index,
            )
            return
        super()._on_alert(a)
