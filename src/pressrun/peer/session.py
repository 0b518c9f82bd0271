"""One libtorrent session for one peer, its alerts delivered on a pipe the loop watches.

The settings (FIELD-NOTES.md, libtorrent): DHT, LSD, UPnP and NAT-PMP off; several
connections per IP (every loopback peer is 127.0.0.1); TCP only; web-seed requests of
at most 256 KiB (the 16 MiB default makes the first request reserve most of the file
for a slow origin); a low ``min_announce_interval``; every address in libtorrent's
global peer class so the profile's rate limits apply on loopback and LAN as well;
libtorrent's eight unchoke slots, set explicitly; the rate limits' quota handed out
every 100 ms (docs/swarm.md).

Alerts come through ``session.set_alert_fd`` on a pipe watched with
``loop.add_reader`` (never ``set_alert_notify`` with a Python callback: it deadlocks
against calls that hold the GIL). A library's session is destroyed in a worker thread:
its destructor blocks while it announces ``stopped`` (a command-line peer's is kept,
below).

WebRTC peers (a ``ws://`` tracker in the torrent, libtorrent's WebTorrent) need
``announce_to_all_tiers``: ``publish`` writes every tracker in tier 0 and libtorrent
otherwise announces to the first that answers, never to the ``ws://`` one. The binding
runs the session's destructor *holding the GIL* (``make_session`` returns a plain
``std::shared_ptr``), and the destructor waits for every tracker connection to close;
a WebSocket closes with a handshake (Boost.Beast ``async_close``, no timeout) that waits
for the tracker's own close frame. A tracker served by this process's event loop
(tests, loopback swarms) can never answer it: the GIL is held, the loop is frozen, and
the process hung for good (docs/tracker.md). So `AlertSession.close` first pauses the
session (libtorrent then closes its tracker connections, WebSockets included) and lets
the loop run `WEBSOCKET_CLOSE_GRACE_S` before the destructor. A tracker that stops
answering mid-close (frozen, or its network gone) would still hold the destructor; the
command-line peers bound it with a watchdog that does not need the GIL
(`pressrun.peer.watchdog`), so ``pressrun get``/``seed`` always end.

That bound ends the process with status 1, download and all, and a session that had
WebRTC peers has held its destructor past it mid-download: in the emulated flash crowd
of 29 Nov (01:15, stripes, e982b92) a desktop left the swarm at 182 of 382 pieces, its
destructor ran past 8 s in ``_drop``, and the client was counted failed. A process that
ends itself (`pressrun.peer.watchdog.process_ends_itself`: the console script's
``os._exit``) therefore keeps such a session, paused and holding no torrent (the
peer's leave removed it after flushing its disk cache), until that end, instead of
destroying it (since issue 29 every session, below): at most `KEPT_SESSIONS_MAX`, the
rest destroyed as before. A kept
session's WebSocket closes when the process ends, so its close does not wait the grace.

**The close never runs the destructor in a command-line peer** (issue 29). In the
flash-crowd pair at 8059ace (29 Nov 14:00, load 112 on 2 cores) a `chord` desktop that
left its swarm for the carousel 13 s into its download (7 of 382 pieces, the fetch
cancelled, so no leave had removed the torrent) was ended by the 8 s watchdog: its
executor thread was in ``_drop`` (the destructor, holding the GIL) and the loop's thread,
in ``Thread.start`` of that very thread, waited for the GIL it held, not for a thread to
be started. Measured on 127.0.0.1 (docs/results/2026-11-29-leave.md), the destructor
holds the GIL while it joins the session's network thread, and that thread ends only
once every name lookup it has in flight returns (asio's resolver thread, in
``getaddrinfo`` for a web seed's or a tracker's host): with a DNS server that stopped
answering, 7.2 and 9.2 s (0.1-0.25 s on a CPU-starved host with none), and no removal
beforehand shortens it. So
`AlertSession.close` first removes what a leave did not (`_remove_torrents`, waiting at
most ``remove_wait_s`` on the loop, where a timer still runs), and a process that ends
itself keeps *every* session (paused, its torrents asked out, at most
`KEPT_SESSIONS_MAX`) instead of destroying it: no destructor, no thread, nothing held,
whatever the host's load. A library or a test (no close bound) still destroys it in a
thread, after the removal. The close says what it did (`SessionClose`, in the leave's
``session`` step) and logs what it waited for when its bound passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import libtorrent as lt

from pressrun.peer import timeline
from pressrun.peer.config import PeerConfig
from pressrun.peer.watchdog import bounded, note_kept, process_ends_itself

log = logging.getLogger(__name__)

_ALERT_MASK = (
    lt.alert.category_t.error_notification
    | lt.alert.category_t.status_notification
    | lt.alert.category_t.storage_notification
    | lt.alert.category_t.tracker_notification
    | lt.alert.category_t.piece_progress_notification
)
#: each block's source, for the timeline's pieces by source (`pressrun.peer.timeline`,
#: its only reader): two alerts a 16 KiB block, and the alert pipe written and the
#: event loop woken for each batch, so asked for only where the timeline's lines are
#: logged (`alert_mask`). No measurable CPU on a loopback trio of 50 MB; at N = 80 on
#: the bench, 20 peers a process, about 1,000 alerts a second a process, for lines
#: nobody logged (docs/results/2026-11-28-swarm-limit.md, section 24)
_BLOCK_ALERTS = lt.alert.category_t.block_progress_notification

PEER_ID_PREFIX = b"-PR0100-"
#: one web-seed HTTP request: short requests keep a slow, shared origin's pieces
#: in flight for less time, so other peers see them sooner (docs/swarm.md)
WEB_SEED_REQUEST_BYTES = 256 * 1024
#: how long the loop runs between pausing a session that had a WebSocket tracker and
#: destroying it: the tracker's close frame comes back in milliseconds on a LAN, and a
#: tracker in this process needs the loop to send it (module docstring)
WEBSOCKET_CLOSE_GRACE_S = 0.5
#: libtorrent's choker round (``unchoke_interval``), seconds: a downloading peer gives its
#: unchoke slots to the peers that sent it the most in the last round, and between
#: rounds a free slot goes only to a peer that *becomes* interested. libtorrent's 15 s is
#: most of an issue's download (20-25 s on the loopback bench), so the slots taken in a
#: swarm's first second were kept for most of it. At 3 s on the bench (N = 40, `chord`)
#: the end game downloaded 18-22 MB twice against 24-27 MB and the last copy came as
#: soon (1.17-1.19x against 1.18-1.19x; with the ring's fetch limit,
#: `pressrun.chord.aio.ORIGIN_FETCH_S` at 1 s, 1.17x against 1.19x at the median, but the
#: limit is off: origin copies at N = 80; docs/chord.md "Benches",
#: docs/results/2026-11-28-swarm-limit.md sections 17-18)
UNCHOKE_INTERVAL_S = 3
#: libtorrent's ``send_buffer_low_watermark``: a connection's requested blocks are read
#: into its send buffer up to the larger of this and half of what it sent in its last
#: second. libtorrent's 10 KiB holds one 16 KiB block at a time on a connection that
#: sent nothing yet, and under an upload limit each block waits for the rate limiter's
#: next quota (``tick_interval``): a fresh connection sent one block a tick, 160 kB/s,
#: until its second second, so a fresh piece's first hop took several times what the
#: limit allows (the loopback bench's ramp: docs/results/2026-11-28-swarm-limit.md,
#: section 20; tests/peer/test_session_send_buffer.py)
SEND_BUFFER_LOW_WATERMARK = 128 * 1024
#: sessions kept (paused, their torrents asked out) until the process ends itself
#: (module docstring)
KEPT_SESSIONS_MAX = 4
#: how long `AlertSession.close` waits for libtorrent to confirm the removal of the
#: torrents a leave did not remove (a cancelled fetch); a leave's close gets what is
#: left of its budget instead (`pressrun.peer.leave.LeaveSequence`)
REMOVE_WAIT_S = 2.0
#: the kept sessions with their alert pipes (libtorrent may still write to the pipe:
#: its descriptors stay open, so no other file can take their numbers)
_kept: list[tuple[Any, tuple[int, int]]] = []


def new_peer_id() -> bytes:
    """A 20-byte BitTorrent peer id: our client prefix and 12 random characters."""
    return PEER_ID_PREFIX + secrets.token_hex(6).encode()


def alert_mask() -> int:
    """The alerts a peer's session posts: `_BLOCK_ALERTS` only while the timeline's
    INFO lines are logged (a client's log; not a bench's or a library's quiet one)."""
    if timeline.log.isEnabledFor(logging.INFO):
        return int(_ALERT_MASK | _BLOCK_ALERTS)
    return int(_ALERT_MASK)


def session_settings(
    config: PeerConfig, *, listen_interfaces: str, peer_id: bytes = PEER_ID_PREFIX
) -> dict[str, Any]:
    """libtorrent settings for one peer (module docstring, FIELD-NOTES.md)."""
    return {
        "listen_interfaces": listen_interfaces,
        # a 20-character fingerprint is the whole peer id (libtorrent fills only what
        # is missing with random characters), so the peer knows its own id
        "peer_fingerprint": peer_id.decode("ascii"),
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "allow_multiple_connections_per_ip": True,
        # TCP only: uTP's delay-based congestion control held loopback swarms back
        "enable_outgoing_utp": False,
        "enable_incoming_utp": False,
        "urlseed_max_request_bytes": WEB_SEED_REQUEST_BYTES,
        "urlseed_wait_retry": 2,
        "min_announce_interval": 1,
        "stop_tracker_timeout": 2,
        # libtorrent's eight unchoke slots. Four were tried for every policy: on a quiet
        # machine (bench/swarm.py --policy stripes,chord --runs 3 [--lt
        # unchoke_slots_limit=8], load under 1.1, 24 November) `stripes`, the default,
        # was slower with four at both sizes (N = 20: 1.44x the bound against 1.39x;
        # N = 40: 1.57x against 1.47x); `chord` gained at N = 40 (1.63x against 1.98x)
        # and lost at N = 20 (1.83x against 1.42x). docs/swarm.md, docs/chord.md
        "unchoke_slots_limit": 8,
        "unchoke_interval": UNCHOKE_INTERVAL_S,
        # the rate limits' quota handed out every 100 ms, not libtorrent's 500 ms (its
        # reference: "around 100 means higher resolution bandwidth quota
        # distribution"): with 500 ms a connection that missed a tick waited half a
        # second with requests queued (bench/swarm_trace.py at N = 40: peers' upload
        # idle with requests queued 1.3 to 2.1 s of T in the middle, 1.0 s with 100;
        # docs/swarm.md, docs/chord.md "Benches")
        "tick_interval": 100,
        # a fresh connection's first piece at the upload limit, not a block a tick
        "send_buffer_low_watermark": SEND_BUFFER_LOW_WATERMARK,
        "aio_threads": 2,
        "hashing_threads": 1,
        "alert_mask": alert_mask(),
        "alert_queue_size": 10000,
        "upload_rate_limit": config.upload_limit_bps,
        "download_rate_limit": config.download_limit_bps,
        "user_agent": "pressrun-peer/0.1 libtorrent/2.1",
        # libtorrent's WebRTC (a ws:// tracker in a torrent): our STUN server or none,
        # never libtorrent's default (Google's)
        "webtorrent_stun_server": config.stun_server,
        # every tier: publish writes the http:// and ws:// trackers in tier 0, and
        # without this libtorrent announces only to the first (never opening the
        # WebSocket; announce_to_all_trackers alone did not either, FIELD-NOTES.md)
        "announce_to_all_tiers": True,
    }


def _global_class_filter() -> Any:
    # Every address (loopback and private ranges included) into the global peer class,
    # whose rate limits are the session's: libtorrent's default puts local addresses
    # in a class without limits.
    everyone = 1 << lt.session.global_peer_class_id
    f = lt.ip_filter()
    f.add_rule("0.0.0.0", "255.255.255.255", everyone)
    f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", everyone)
    return f


@dataclasses.dataclass(frozen=True, slots=True)
class SessionClose:
    """What `AlertSession.close` did, in seconds.

    removed / removal_s: the torrents still in the session that it asked libtorrent to
        remove, and how long it waited for their ``torrent_removed_alert``;
        ``unconfirmed``: of those, how many had not been confirmed when it stopped
        waiting (its bound passed).
    kept: the session was kept until the process ends (no destructor ran);
        destroy_s: otherwise the destructor's seconds in its thread (None: kept).
    """

    seconds: float
    removed: int = 0
    removal_s: float = 0.0
    unconfirmed: int = 0
    kept: bool = False
    destroy_s: float | None = None


def _drop(holder: list[Any]) -> None:
    # ``holder`` has the session's last reference, so the destructor runs here, in this
    # thread (a reference left in the caller's frame would run it later on the loop).
    # It holds the GIL (module docstring): only a watchdog that needs no GIL can end a
    # hang here, and it ends the process (pressrun.peer.watchdog).
    with bounded():
        holder.clear()


class AlertSession:
    """A libtorrent session whose alerts are handed, one by one, to ``on_alert``.

    ``on_alert`` gets each alert (an exception in it is logged, not raised: one odd
    alert must not kill the peer); ``after_alerts`` runs after each batch.
    """

    def __init__(
        self,
        settings: dict[str, Any],
        *,
        loop: asyncio.AbstractEventLoop,
        on_alert: Callable[[Any], None],
        after_alerts: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._on_alert = on_alert
        self._after_alerts = after_alerts
        # a plain dict is the settings pack the binding takes (its bundled type hints say otherwise)
        ses = lt.session(settings)  # type: ignore[call-overload]
        ses.set_peer_class_filter(_global_class_filter())
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._pipe: tuple[int, int] | None = (r, w)
        ses.set_alert_fd(w)
        loop.add_reader(r, self.drain)
        self.session: Any = ses
        #: the session while `close` waits for its torrents' removal (its alerts are
        #: still handled then); None otherwise
        self._closing: Any = None
        #: the torrents `close` asked out and libtorrent has not confirmed removed yet
        #: (their info-hashes), and the event set at each confirmation
        self._removing: set[str] = set()
        self._removal = asyncio.Event()
        #: a torrent of this session names a ws:// tracker (set by the peer): `close`
        #: then gives the WebSocket close handshake the loop (module docstring)
        self.websocket = False

    def drain(self) -> None:
        """Handle every queued alert (also called once after start: alerts posted early)."""
        if self._pipe is None:
            return
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self._pipe[0], 4096):
                pass
        ses = self.session if self.session is not None else self._closing
        if ses is None:
            return
        for alert in ses.pop_alerts():
            if isinstance(alert, lt.torrent_removed_alert) and self._removing:
                self._removing.discard(str(alert.info_hashes.get_best()))
                self._removal.set()
            try:
                self._on_alert(alert)
            except Exception:  # one odd alert must not kill the peer
                log.exception("peer: error handling %s", type(alert).__name__)
        self._after_alerts()

    async def close(self, *, remove_wait_s: float = REMOVE_WAIT_S) -> SessionClose:
        """Release the session (module docstring): pause it (its tracker connections
        close, a WebSocket's handshake with the loop running), ask libtorrent to remove
        the torrents still in it and wait for that at most ``remove_wait_s`` on the
        loop; then keep it until the process ends itself (`_keep`), or destroy it in a
        thread (its destructor announces ``stopped`` to HTTP trackers, at most
        ``stop_tracker_timeout``, holding the GIL). A removal not confirmed in time is
        logged with what it waited for; so is a destructor that took longer than that."""
        loop = self._loop
        began = loop.time()
        ses, self.session = self.session, None
        if ses is None:
            self._close_pipe()
            return SessionClose(seconds=0.0)
        self._closing = ses
        ses.pause()
        removed = await self._remove_torrents(ses, remove_wait_s)
        removal_s = loop.time() - began
        unconfirmed = len(self._removing)
        if unconfirmed:
            log.warning(
                "peer: session close: libtorrent had not confirmed the removal of %d of %d "
                "torrent(s) after %.1f s (its network thread answers the removal; the "
                "tracker's `stopped` and the disk jobs come after); the session is %s",
                unconfirmed,
                removed,
                removal_s,
                "kept until the process ends"
                if self._can_keep()
                else "destroyed now, its destructor waits for them",
            )
        self._removing.clear()
        if self._keep(ses):
            self._closing = None
            return SessionClose(
                seconds=round(loop.time() - began, 3),
                removed=removed,
                removal_s=round(removal_s, 3),
                unconfirmed=unconfirmed,
                kept=True,
            )
        if self.websocket:
            # (the alert pipe is still read meanwhile: it must not fill)
            await asyncio.sleep(WEBSOCKET_CLOSE_GRACE_S)
        self._closing = None
        if self._pipe is not None:
            self._loop.remove_reader(self._pipe[0])
        holder = [ses]
        del ses  # the holder has the last reference (`_drop`)
        dropping = loop.time()
        await asyncio.to_thread(_drop, holder)
        destroy_s = loop.time() - dropping
        if destroy_s > remove_wait_s:
            log.warning(
                "peer: session close: its destructor took %.1f s holding the GIL (it joins "
                "libtorrent's network thread: name lookups in flight, tracker `stopped` "
                "announces, disk jobs)",
                destroy_s,
            )
        self._close_pipe()
        return SessionClose(
            seconds=round(loop.time() - began, 3),
            removed=removed,
            removal_s=round(removal_s, 3),
            unconfirmed=unconfirmed,
            destroy_s=round(destroy_s, 3),
        )

    async def _remove_torrents(self, ses: Any, wait_s: float) -> int:
        """Ask libtorrent to remove every torrent still in ``ses`` (a leave removed its
        own; a cancelled fetch did not) and wait at most ``wait_s`` for the
        confirmations (`drain` takes them off `_removing`); how many were asked."""
        handles = [h for h in ses.get_torrents() if h.is_valid()]
        self._removing = {str(h.info_hashes().get_best()) for h in handles}
        for handle in handles:
            ses.remove_torrent(handle)
        ends = self._loop.time() + wait_s
        while self._removing and (left := ends - self._loop.time()) > 0:
            self._removal.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._removal.wait(), left)
        return len(handles)

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                self._loop.remove_reader(self._pipe[0])
            for fd in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pipe = None

    def _can_keep(self) -> bool:
        return process_ends_itself() and len(_kept) < KEPT_SESSIONS_MAX and self._pipe is not None

    def _keep(self, ses: Any) -> bool:
        """Keep ``ses`` (paused, its torrents asked out) until the process ends itself,
        instead of destroying it, when the process does (a command-line peer,
        `pressrun.peer.watchdog.process_ends_itself`) and fewer than
        `KEPT_SESSIONS_MAX` are kept (module docstring). A kept session's WebSocket
        closes at that end, so it is not given `WEBSOCKET_CLOSE_GRACE_S` (that is for
        the destructor): before, every swarm client of `make emulate SCENARIO=small`
        spent those 0.5 s after its leave, counted in its download time (0.49-0.59 s
        after the copy was verified)."""
        if not self._can_keep():
            return False
        assert self._pipe is not None
        self._loop.remove_reader(self._pipe[0])
        _kept.append((ses, self._pipe))
        self._pipe = None
        note_kept()
        log.debug("peer: session kept, paused, until the process ends")
        return True
