"""The peer's asyncio adapter: one libtorrent session per peer, driven by alerts.

`fetch_via_swarm` is what a client calls when the balancer's directive says ``swarm``
(docs/swarm.md has the whole story, this is the reference):

    result = await fetch_via_swarm(
        torrent=torrent_bytes,          # the issue's .torrent (bytes or a path)
        manifest=manifest,              # the *verified* content.manifest.Manifest
        partial_dir=library / ".partial" / issue_id,
        tracker_url=directive.swarm.tracker_url,   # None: the torrent's own trackers
        web_seeds=[origin_web_seed_url, ...],      # added to the torrent's own
        config=profile_config("desktop"),
        on_progress=callback,           # SwarmProgress, every status poll
    )
    if result.completed: result.path is the verified issue (same path as the
        origin downloader's partial file: partial_dir / manifest.file_name)
    elif result.stalled: fetch result.missing_spans from origins into result.path;
        result.have_pieces were checked against the manifest and are kept.

`SwarmPeer` drives the core (`pressrun.peer.core`) and the uploader policy from the
session's alerts and its status; the parts around it have a module each:

- `pressrun.peer.session`: the libtorrent session, its settings and the alert pipe;
- `pressrun.peer.status`: each status read: the policy's plan, the missing pieces'
  sources, the progress for the core;
- `pressrun.peer.scrape`: the BEP 48 scrape when the core asks for the swarm's counts;
- `pressrun.peer.feed`: the owed pieces the peer fetches from the origins itself;
- `pressrun.peer.verify`: the final manifest check and the pieces kept after a stall;
- `pressrun.peer.outcome`: the `SwarmResult` and each poll's `SwarmProgress`, built
  from the peer's state;
- `pressrun.peer.torrent_params`: the trackers, web seeds and resume data the torrent
  is added with;
- `pressrun.peer.leave`: the leave sequence (ring, tracker, resume data, handover) and
  its seconds;
- `pressrun.peer.ring_link`: the `chord` policy's ring client, started and fed;
- `pressrun.peer.resume`: the resume data next to the file.

Status and peer info are read on the core's timer (``torrent_handle.status``,
``get_peer_info``: ``post_torrent_updates`` reports only torrents whose status changed,
which left a peer with a stale view of the swarm).

Resume: libtorrent's resume data (pieces held, all-time upload/download) is saved
next to the file as ``<file>.swarm-resume`` while pieces arrive and at exit; a peer
killed before any save, or started on a partial file another downloader wrote,
rechecks the file instead. When a stalled peer hands its file over to the origin
downloader, the resume file is removed (the file is about to change under it), so a
later join rechecks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import libtorrent as lt

from pressrun.content.codec import Manifest, parse_torrent
from pressrun.peer import watchdog
from pressrun.peer.config import PeerConfig
from pressrun.peer.core import PeerCore
from pressrun.peer.events import (
    AskSwarmCounts,
    DropWebSeeds,
    Effect,
    Leave,
    PeerPhase,
    PollStatus,
    RestoreWebSeeds,
    SaveResumeData,
    Stalled,
    SwarmCounts,
)
from pressrun.peer.feed import OwedPieceFeed
from pressrun.peer.leave import LeaveSequence
from pressrun.peer.outcome import swarm_progress, swarm_result
from pressrun.peer.results import SwarmError, SwarmProgress, SwarmResult
from pressrun.peer.resume import resume_path_for
from pressrun.peer.ring_client import RingClient
from pressrun.peer.ring_link import RingLink
from pressrun.peer.scrape import TrackerScrape
from pressrun.peer.session import AlertSession, new_peer_id, session_settings
from pressrun.peer.status import SwarmStatus
from pressrun.peer.timeline import SwarmTimeline
from pressrun.peer.torrent_params import add_torrent_params, websocket_trackers
from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY, make_uploader_policy
from pressrun.peer.verify import FinalVerification

__all__ = [
    "SwarmError",
    "SwarmPeer",
    "SwarmProgress",
    "SwarmResult",
    "fetch_via_swarm",
    "resume_path_for",
]

log = logging.getLogger(__name__)


class SwarmPeer(RingLink):
    """One peer in one issue's swarm: a libtorrent session, its core, its alerts.

    ``await peer.start()`` (listens, adds the torrent), ``await peer.downloaded()``
    (True once the copy is verified, False on a stall), ``await peer.finished()``
    (the `SwarmResult` once it left by a rule), ``await peer.stop()`` (leave now by
    `LeaveRule.USER`, or hand the file over after a stall), ``await peer.close()``.
    """

    def __init__(
        self,
        *,
        torrent: bytes | Path,
        manifest: Manifest,
        partial_dir: Path,
        config: PeerConfig,
        tracker_url: str | None = None,
        web_seeds: Sequence[str] = (),
        listen_interfaces: str = "0.0.0.0:0",
        uploader_policy: str = DEFAULT_UPLOADER_POLICY,
        on_progress: Callable[[SwarmProgress], None] | None = None,
    ) -> None:
        data = torrent if isinstance(torrent, bytes) else Path(torrent).read_bytes()
        self._info = lt.torrent_info(cast(bytes, lt.bdecode(data)))
        self._meta = parse_torrent(data)
        info_hash = str(self._info.info_hashes().v1)
        if info_hash != manifest.info_hash:
            raise SwarmError(
                f"the torrent's info-hash {info_hash} is not the manifest's "
                f"{manifest.info_hash}; refusing to join that swarm"
            )
        if self._info.num_pieces() != manifest.num_pieces:
            raise SwarmError("the torrent's pieces do not match the manifest's")
        self.manifest = manifest
        self.config = config
        self.partial_dir = partial_dir
        self.path = partial_dir / manifest.file_name
        self.resume_path = resume_path_for(partial_dir, manifest.file_name)
        self.tracker_url = tracker_url
        self.web_seeds = list(dict.fromkeys([*self._info_web_seeds(), *web_seeds]))
        self.listen_interfaces = listen_interfaces
        self.policy = make_uploader_policy(uploader_policy)
        self.on_progress = on_progress
        self.listen_port: int | None = None
        self.core: PeerCore | None = None
        self._alerts: AlertSession | None = None
        self._handle: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False  # close() began: no timer is armed again
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listening: asyncio.Future[int] | None = None
        self._downloaded: asyncio.Future[bool] | None = None
        self._left: asyncio.Future[Leave] | None = None
        self._started_at = 0.0
        self._verified_at: float | None = None
        self._stalled = False
        self._scrape = TrackerScrape(manifest.info_hash, self._on_counts)
        self._feed = OwedPieceFeed(
            manifest=manifest,
            web_seeds=self.web_seeds,
            retry_s=config.web_seed_retry_s,
            handle=lambda: self._handle,
            running=lambda: self.core is not None and self.core.phase is PeerPhase.DOWNLOADING,
        )
        self._peer_id = ""
        self._ring: RingClient | None = None  # the `chord` policy's link to the ring
        self._timeline = SwarmTimeline(manifest.issue_id, lambda i: manifest.piece_span(i)[1])
        self._policy_name = uploader_policy
        self._status = SwarmStatus(
            manifest=manifest,
            policy=self.policy,
            feed=self._feed,
            handle=lambda: self._handle,
            peer_id=lambda: self._peer_id,
            on_pieces_changed=self._nudge_ring,
            upload_limit_bps=config.upload_limit_bps,
        )
        self._verification = FinalVerification(
            manifest,
            self.path,
            handle=lambda: self._handle,
            on_verified=self._verified,
            on_failed=self._verify_failed,
        )
        self._leave = LeaveSequence(
            manifest=manifest,
            path=self.path,
            resume_path=self.resume_path,
            handle=lambda: self._handle,
            alerts=lambda: self._alerts,
            ring=lambda: self._ring,
            clock=self._now,
            refresh=self._refresh_totals,
            handing_over=lambda: self._stalled and self._verified_at is None,
            fed_bytes=lambda: self._feed.fed_bytes,
        )

    @property
    def bytes_from_web_seeds(self) -> int:
        """Payload from the origins this session: web-seed connections and the feed."""
        return self._status.tally.web_bytes + self._feed.session_bytes

    def pieces_held(self) -> tuple[int, ...]:
        """The pieces libtorrent holds and passed its hash check, by its latest status
        read and the piece-finished alerts since (none before the first read); still
        readable after `close`. Their bytes may still be on their way to the file: a
        caller that hands them on reads them back against the manifest."""
        bits = self._status.have_bits
        return () if bits is None else tuple(i for i, held in enumerate(bits) if held)

    def _info_web_seeds(self) -> list[str]:
        return list(self._meta.web_seeds)

    @property
    def websocket_trackers(self) -> list[str]:
        """The torrent's WebSocket trackers, or the directive's tracker's twin
        (`pressrun.peer.torrent_params.websocket_trackers`)."""
        return websocket_trackers(self._meta, self.tracker_url)

    # --- lifecycle ----------------------------------------------------------

    async def open(self) -> int:
        """Make the libtorrent session and listen; the listen port. Nothing is downloaded
        yet and the download's clock has not started: `start` calls it if need be, and a
        caller with many peers opens them all first (`pressrun.peer.loopback`), so that
        making the sessions one after the other is not counted as the first ones'
        download time."""
        if self._listening is not None:
            return await asyncio.wait_for(asyncio.shield(self._listening), timeout=10)
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._listening = loop.create_future()
        peer_id = new_peer_id()
        self._peer_id = peer_id.hex()
        settings = session_settings(
            self.config, listen_interfaces=self.listen_interfaces, peer_id=peer_id
        )
        self._alerts = AlertSession(
            settings, loop=loop, on_alert=self._on_alert, after_alerts=self._rearm
        )
        self._status.session_slots = int(settings.get("unchoke_slots_limit", 8))
        self._alerts.drain()  # alerts posted before the reader was attached
        return await asyncio.wait_for(asyncio.shield(self._listening), timeout=10)

    async def start(self) -> int:
        """Open the session if not yet (`open`), add the torrent (with resume data if
        any): the download starts, and its clock (`SwarmResult.download_s`); the port."""
        port = await self.open()
        loop = asyncio.get_running_loop()
        assert self._alerts is not None
        self._downloaded = loop.create_future()
        self._left = loop.create_future()
        self._started_at = loop.time()
        self._timeline.start(
            self._started_at,
            policy=self._policy_name,
            web_seeds=len(self.web_seeds),
            peer_id=bytes.fromhex(self._peer_id),
        )
        self.core = PeerCore(
            self.config,
            now=self._started_at,
            fetches_owed=self.policy.fetches_owed_pieces,
        )
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        self._alerts.websocket = bool(self.websocket_trackers)
        if self._alerts.websocket:
            watchdog.note_webrtc()  # the command line's exit is bounded then
        self._handle = self._alerts.session.add_torrent(self._add_params())
        # Resume data carries the web seeds of the moment it was saved (maybe dropped),
        # and libtorrent lets them replace the torrent's: start with every origin.
        present = set(self._handle.url_seeds())
        for url in self.web_seeds:
            if url not in present:
                self._handle.add_url_seed(url)
        if not self.core.web_seeds_on:
            self._apply([DropWebSeeds()])
        if self.policy.fetches_owed_pieces and self.web_seeds:
            self._feed.start()
        self._rearm()
        self._alerts.drain()
        self._start_ring(port)
        return port

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _add_params(self) -> Any:
        atp, self._feed.fed_bytes = add_torrent_params(
            info=self._info,
            meta=self._meta,
            partial_dir=self.partial_dir,
            resume_path=self.resume_path,
            tracker_url=self.tracker_url,
            web_seeds=self.web_seeds,
        )
        return atp

    async def downloaded(self) -> bool:
        """True once the copy is verified against the manifest, False on a stall."""
        assert self._downloaded is not None, "start() first"
        return await asyncio.shield(self._downloaded)

    async def finished(self) -> SwarmResult:
        """Wait until a rule lets the peer go, leave the swarm, and say how it went."""
        assert self._left is not None, "start() first"
        leave = await asyncio.shield(self._left)
        await self._leave.leave(leave.rule)
        return self.result()

    async def stop(self) -> SwarmResult:
        """Leave now: by `LeaveRule.USER` (or hand the file over if it stalled)."""
        assert self.core is not None and self._loop is not None
        if self._left is not None and not self._left.done():
            self._apply(self.core.handle_user_stop(now=self._loop.time()))
        assert self._left is not None
        leave = await asyncio.shield(self._left)
        await self._leave.leave(leave.rule)
        return self.result()

    async def close(self) -> None:
        """Close the ring's and the scrape's links, then the session: the torrents a
        leave did not remove are asked out, and the session is kept until a
        command-line process ends or destroyed in a thread (`AlertSession.close`); the
        seconds of both are the leave's ``links`` and ``session`` steps."""
        # (the alerts are handled until the session goes: they must not arm the timer
        # again, whose polls would start scrapes and ring reports while it closes)
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._verification.cancel()
        self._feed.cancel()
        began = self._now() if self._loop is not None else 0.0
        await self._scrape.close()
        if self._ring is not None:
            await self._ring.close()
        alerts, self._alerts = self._alerts, None
        self._handle = None
        if alerts is not None:
            links_done = self._now()
            closed = await alerts.close(remove_wait_s=self._leave.remove_wait_s())
            self._leave.closed(links_s=links_done - began, session=closed)

    def left(self, result: SwarmResult) -> SwarmResult:
        """``result`` (`finished`'s or `stop`'s) with the leave's seconds, once `close`
        ended (`pressrun.peer.leave.LeaveSequence.report`)."""
        return result if self._loop is None else self._leave.report(result)

    def result(self) -> SwarmResult:
        """The outcome so far (final after `finished` / `stop`)."""
        assert self.core is not None
        return swarm_result(
            self.manifest,
            self.path,
            self.core,
            self._status.last_progress,
            stalled=self._stalled,
            started_at=self._started_at,
            verified_at=self._verified_at,
            handover_pieces=self._leave.handover_pieces,
            bytes_from_web_seeds=self.bytes_from_web_seeds,
            seeding_s=self._leave.seeding_s(self._verified_at) if self._loop is not None else None,
            listen_port=self.listen_port,
        )

    # --- the core's effects -------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, PollStatus):
                # A synchronous read, not post_torrent_updates: that reports only
                # torrents whose status changed, so a peer whose connections changed
                # while no payload arrived kept a stale view of the swarm.
                self._refresh_totals()
            elif isinstance(effect, AskSwarmCounts):
                self._ask_counts()
            elif isinstance(effect, DropWebSeeds):
                p = self._status.last_progress
                log.debug(
                    "%s: dropping web seeds with %s pieces, %d bytes from them",
                    self.manifest.issue_id,
                    p.pieces_have if p else "?",
                    self.bytes_from_web_seeds,
                )
                if self._handle is not None:
                    for url in self.web_seeds:
                        self._handle.remove_url_seed(url)
            elif isinstance(effect, RestoreWebSeeds):
                if self._handle is not None:
                    for url in self.web_seeds:
                        # remove first: re-adding is how a disabled web seed comes back
                        self._handle.remove_url_seed(url)
                        self._handle.add_url_seed(url)
            elif isinstance(effect, SaveResumeData):
                if self._handle is not None:
                    self._handle.save_resume_data(lt.save_resume_flags_t.flush_disk_cache)
            elif isinstance(effect, Stalled):
                log.info(
                    "%s: no swarm progress for %.1f s with %d pieces",
                    self.manifest.issue_id,
                    effect.idle_s,
                    effect.pieces_have,
                )
                self._stalled = True
                if self._downloaded is not None and not self._downloaded.done():
                    self._downloaded.set_result(False)
            elif isinstance(effect, Leave) and self._left is not None and not self._left.done():
                self._left.set_result(effect)

    def _ask_counts(self) -> None:
        if self._handle is not None:
            self._scrape.ask([str(t["url"]) for t in self._handle.trackers()])

    def _on_counts(self, counts: SwarmCounts) -> None:
        if self.core is not None and self._loop is not None:
            self._apply(self.core.handle_swarm_counts(counts, now=self._loop.time()))
            self._rearm()

    def _rearm(self) -> None:
        # (after every batch of alerts: the timer armed for the same deadline is kept,
        # not cancelled and made again, a timer handle and two heap operations a batch)
        deadline = None
        if self.core is not None and self._loop is not None and not self._closing:
            deadline = self.core.next_deadline()
        if self._timer is not None:
            if deadline is not None and self._timer.when() == deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            assert self._loop is not None
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        assert self.core is not None and self._loop is not None
        self._apply(self.core.handle_timer(now=self._loop.time()))
        self._rearm()

    # --- alerts -------------------------------------------------------------

    def _on_alert(self, a: Any) -> None:
        assert self._loop is not None
        if isinstance(a, lt.listen_succeeded_alert):
            tcp = a.socket_type == lt.socket_type_t.tcp
            if tcp and self._listening is not None and not self._listening.done():
                self.listen_port = int(a.port)
                self._listening.set_result(self.listen_port)
            return
        if isinstance(a, lt.listen_failed_alert):
            if self._listening is not None and not self._listening.done():
                self._listening.set_exception(SwarmError(f"cannot listen: {a.message()}"))
            return
        if self.core is None:  # opened, not started: nothing else is ours yet
            return
        now = self._loop.time()
        # (the most frequent alerts first: a block written or asked for, the timeline's)
        if isinstance(a, lt.block_finished_alert | lt.block_downloading_alert):
            self._timeline.block(a, now, asked=isinstance(a, lt.block_downloading_alert))
            return
        if isinstance(a, lt.piece_finished_alert):
            self._timeline.piece_done(now, a.piece_index)
            self._status.piece_finished(int(a.piece_index))  # (the ring hears it now)
        elif isinstance(a, lt.torrent_checked_alert):
            self._timeline.checked()
        elif isinstance(a, lt.torrent_finished_alert):
            if self._status.lift_holds():
                # "finished" with pieces on hold (priority 0; a piece completed between
                # two plans): those are wanted again, the download goes on
                return
            self._apply(self.core.handle_download_finished(now=now))
            self._verification.start()
        elif isinstance(a, lt.tracker_reply_alert | lt.tracker_error_alert):
            self._leave.tracker_replied(str(a.tracker_url()))
            error = a.message() if isinstance(a, lt.tracker_error_alert) else None
            self._timeline.tracker_reply(now, peers=getattr(a, "num_peers", None), error=error)
        elif isinstance(a, lt.url_seed_alert):
            log.info("web seed %s failed: %s", a.server_url(), a.error_message())
            self._apply(self.core.handle_web_seed_failed(now=now))
        elif isinstance(a, lt.cache_flushed_alert):
            self._verification.cache_flushed()
        elif isinstance(a, lt.save_resume_data_alert):
            self._leave.resume_data(a.params)
        elif isinstance(a, lt.save_resume_data_failed_alert):
            self._leave.resume_failed()
        elif isinstance(a, lt.torrent_removed_alert):
            self._leave.removed()
        elif isinstance(a, lt.hash_failed_alert):
            log.info("piece %d failed libtorrent's hash check", a.piece_index)
            self._timeline.piece_failed(a.piece_index)

    def _on_status(self, st: Any, now: float) -> None:
        assert self.core is not None
        downloading = self.core.phase is PeerPhase.DOWNLOADING
        progress = self._status.read(st, now=now, planning=downloading)
        if downloading:
            self._timeline.status(
                now, progress, feed=self._feed, status=self._status, ring=lambda: self.ring_stats
            )
        self._apply(self.core.handle_progress(progress, now=now))
        if st.is_seeding and self.core.phase is PeerPhase.DOWNLOADING:
            # A complete file found at start (resume data or recheck): no finished alert.
            self._apply(self.core.handle_download_finished(now=now))
            self._verification.start()
        if self.on_progress is not None:
            self.on_progress(swarm_progress(self.core.phase, progress, self.bytes_from_web_seeds))

    def _refresh_totals(self) -> None:
        # A synchronous status read (a download can finish between two polls).
        if self._handle is None or self.core is None or self._loop is None:
            return
        st = self._handle.status()
        self._on_status(st, self._loop.time())

    # --- verification -------------------------------------------------------

    def _verified(self) -> None:
        assert self.core is not None and self._loop is not None
        now = self._loop.time()
        self._verified_at = now
        if self._downloaded is not None and not self._downloaded.done():
            self._downloaded.set_result(True)
        self._refresh_totals()  # the rules must see the totals of now, not of the last poll
        self._timeline.verified(now, feed=self._feed, status=self._status)  # (totals of now)
        self._apply(self.core.handle_verified(now=now))
        self._rearm()

    def _verify_failed(self, err: SwarmError) -> None:
        for fut in (self._downloaded, self._left):
            if fut is not None and not fut.done():
                fut.set_exception(err)
                # whoever awaits first reports it; the other future must not be
                # logged as "exception never retrieved"
                fut.add_done_callback(lambda f: f.exception())


async def fetch_via_swarm(
    *,
    torrent: bytes | Path,
    manifest: Manifest,
    partial_dir: Path,
    config: PeerConfig,
    tracker_url: str | None = None,
    web_seeds: Sequence[str] = (),
    listen_interfaces: str = "0.0.0.0:0",
    uploader_policy: str = DEFAULT_UPLOADER_POLICY,
    on_progress: Callable[[SwarmProgress], None] | None = None,
    on_verified: Callable[[Path], None] | None = None,
    on_peer: Callable[[SwarmPeer], None] | None = None,
) -> SwarmResult:
    """Download an issue from its swarm, seed it by the fair-exit rules, leave.

    Returns when the peer has left: after a verified download and seeding until a
    rule let it go (``result.completed``), or after a stall (``result.stalled``:
    fetch ``result.missing_spans`` from origins into ``result.path``). ``on_verified``
    is called with the path as soon as the copy is verified (the reader may open it
    while the peer seeds). ``on_peer`` is given the peer before it starts (its
    `SwarmPeer.ring_stats` stay readable after a cancelled fetch). Raises `SwarmError`
    for a torrent that is not the manifest's or a copy that fails the manifest.
    """
    peer = SwarmPeer(
        torrent=torrent,
        manifest=manifest,
        partial_dir=partial_dir,
        config=config,
        tracker_url=tracker_url,
        web_seeds=web_seeds,
        listen_interfaces=listen_interfaces,
        uploader_policy=uploader_policy,
        on_progress=on_progress,
    )
    if on_peer is not None:
        on_peer(peer)
    try:
        await peer.start()
        ok = await peer.downloaded()
        if not ok:
            result = await peer.stop()
        else:
            if on_verified is not None:
                on_verified(peer.path)
            result = await peer.finished()
    finally:
        await peer.close()
    return peer.left(result)
