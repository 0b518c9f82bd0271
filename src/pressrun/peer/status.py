"""What the peer makes of each status read: the uploader policy's plan, the sources of
the pieces it lacks, its `Progress` for the core.

`SwarmStatus.read` takes libtorrent's ``torrent_status`` (read on the core's timer by
`pressrun.peer.aio.SwarmPeer`) and the torrent's peer infos: it tallies the web-seed
bytes and the leechers (`PeerInfoTally`), asks the policy for its plan while the peer
downloads, sorts the missing pieces by who could give them (`classify_missing`), hands
the owed ones to the feed (`pressrun.peer.feed`) and says what the core should hear.
It keeps what the ring client (`pressrun.peer.ring_client`) reads between polls: the
pieces held and the pieces no connected peer holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from pressrun.content.codec import Manifest
from pressrun.peer.chord_policy import ChordPolicy
from pressrun.peer.download_queue import stranded
from pressrun.peer.events import Progress
from pressrun.peer.feed import PARALLEL_WITH_ROOM, OwedPieceFeed
from pressrun.peer.sources import (
    ROOM_SHARE,
    BestRecent,
    CounterRate,
    MissingPieces,
    PeerInfoTally,
    classify_missing,
    origin_fill,
    origins_have_room,
    origins_share_bps,
    peers_slow,
    peers_window_s,
    probing,
    shared_out,
    unheld_room,
)
from pressrun.peer.uploader import (
    HOLD_PRIORITY,
    MIN_PRIORITY,
    SwarmView,
    UploaderPolicy,
)

#: the unused upload is measured over the last this many seconds (the ring client's
#: round: what a supernode hears in each report)
UNUSED_WINDOW_S = 2.0


class UploadUse:
    """The payload upload over the last ``window_s``, from a counter read now and then,
    and what that leaves unused of a capacity (the ring's report field
    ``unused_upload_bps``). Pure: reads come with ``now``."""

    def __init__(self, window_s: float = UNUSED_WINDOW_S) -> None:
        self.window_s = window_s
        self._reads: deque[tuple[float, int]] = deque()

    def add(self, now: float, uploaded_bytes: int) -> None:
        """A read of the payload upload counter."""
        self._reads.append((now, uploaded_bytes))
        # (keep one read at or before the window's start: the rate spans the window)
        while len(self._reads) > 2 and self._reads[1][0] <= now - self.window_s:
            self._reads.popleft()

    def rate_bps(self) -> int | None:
        """The upload rate over the window; None until two reads at least half a
        window apart exist."""
        if len(self._reads) < 2:
            return None
        (t0, u0), (t1, u1) = self._reads[0], self._reads[-1]
        if t1 - t0 < self.window_s / 2:
            return None
        return int((u1 - u0) / (t1 - t0))

    def unused_bps(self, capacity_bps: int) -> int:
        """``capacity_bps`` less the upload rate over the window; all of it until two
        reads at least half a window apart exist (a newcomer has uploaded nothing)."""
        rate = self.rate_bps()
        if rate is None:
            return capacity_bps
        return max(0, capacity_bps - rate)


class SwarmStatus:
    """The peer's view of its swarm, updated at each status read.

    ``handle()`` is the torrent handle (None before the start and once it is gone),
    ``peer_id()`` this peer's id (hex); ``on_pieces_changed()`` is called when the
    pieces held change or more pieces lose their last connected holder (the ring
    client should hear now, not at its next round).
    """

    def __init__(
        self,
        *,
        manifest: Manifest,
        policy: UploaderPolicy,
        feed: OwedPieceFeed,
        handle: Callable[[], Any],
        peer_id: Callable[[], str],
        on_pieces_changed: Callable[[], None],
        upload_limit_bps: int = 0,
    ) -> None:
        self.manifest = manifest
        self.policy = policy
        self._feed = feed
        self._handle = handle
        self._peer_id = peer_id
        self._on_pieces_changed = on_pieces_changed
        #: the peer's upload limit (0: none; its fastest upload stands in)
        self.upload_limit_bps = upload_limit_bps
        self.tally = PeerInfoTally()
        self.last_progress: Progress | None = None
        self.last_plan: tuple[int, ...] | None = None
        self.have_bits: tuple[bool, ...] | None = None
        #: pieces this peer lacks that no connected BitTorrent peer holds (the ones
        #: worth asking the ring about: libtorrent fetches the others by itself)
        self.unheld: frozenset[int] = frozenset()
        #: pieces this peer lacks that exactly one connected peer holds (the ring
        #: names who takes such a piece first: a tree, not a star)
        self.lonely: frozenset[int] = frozenset()
        self._upload_slots: int | None = None  # the torrent's unchoke slots (None: session's)
        #: the session's unchoke slots (``unchoke_slots_limit``; None: unknown)
        self.session_slots: int | None = None
        #: the fastest payload upload and download libtorrent reported (bytes/s)
        self.peak_upload_bps = 0
        self.peak_download_bps = 0
        self.download_bps = 0  # the payload download rate now (from peers)
        #: the downloading peers of the swarm as the tracker last counted them (its
        #: announce answer's ``incomplete``; -1: not known yet)
        self.tracker_leechers = -1
        #: the payload upload lately (the ring's report: the upload left unused)
        self.upload_use = UploadUse()
        #: pieces this peer lacks
        self.missing = manifest.num_pieces
        #: the origins have room and give more than its peers now (`_fill`)
        self._beyond_peers = False
        #: the origins have room: the rate a connection's queued piece is judged
        #: against (`OwedPieceFeed.late_bps`; 0: none)
        self._late_bps = 0
        #: the bytes from peers (not web seeds), read at each status read: their rate
        #: over a window, not their best burst (`sources.peers_window_s`)
        self.peers_bytes = CounterRate()
        #: the origins' rate as the feed measured it lately (`sources.ORIGINS_MEMORY_S`)
        self.origins_rate = BestRecent()
        self._now: float | None = None  # the last status read's

    def read(self, st: Any, *, now: float, planning: bool) -> Progress:
        """Take a status read (``planning``: ask the policy for its plan, the peer is
        downloading); the progress for the core, kept as ``last_progress``."""
        handle = self._handle()
        # (each libtorrent read once a status read: every one is a synchronous call
        # answered by the session's network thread, and the peer infos and the
        # availability are converted to Python objects one connection or piece at a
        # time; read twice each, they and the feed's own reads were a third of a bench
        # worker's event loop at N = 80: docs/results/2026-11-28-swarm-limit.md, s. 24)
        peers: list[Any] | None = None
        if handle is not None:
            # (peer_info_alert cannot be read from Python in the 2.1.1 binding: it has
            # no converter for its vector; the synchronous call is fine without
            # set_alert_notify, FIELD-NOTES.md)
            slots = self._upload_slots or self.session_slots
            peers = handle.get_peer_info()
            self.tally.update(
                peers,
                count_sole=bool(st.is_seeding),
                upload_slots=slots,
            )
        self.peak_upload_bps = max(self.peak_upload_bps, int(st.upload_payload_rate))
        self.download_bps = int(st.download_payload_rate)
        self.peak_download_bps = max(self.peak_download_bps, self.download_bps)
        self.tracker_leechers = int(st.num_incomplete)
        self.upload_use.add(now, int(st.total_payload_upload))
        # (libtorrent's payload counter counts its own web-seed connections too)
        self.peers_bytes.add(now, max(0, int(st.total_payload_download) - self.tally.web_bytes))
        self.origins_rate.add(now, self._feed.fetch_bps)
        self._now = now
        self.missing = max(0, self.manifest.num_pieces - int(st.num_pieces))
        have_bits = tuple(bool(b) for b in st.pieces)
        if have_bits != self.have_bits:
            self._on_pieces_changed()  # report new pieces now (a brought-in one frees a slot)
        self.have_bits = have_bits
        # (the plan's and the sources' availability: the same read for both)
        wanted = handle is not None and (planning or not st.is_seeding)
        availability = handle.piece_availability() if wanted else None
        if planning:
            # (the owed pieces below are the plan's of now)
            self._plan(st, now, have=have_bits, availability=availability)
        unheld, lonely = self.unheld, self.lonely
        tradable, owed, coming = self._sources(
            st, have=have_bits, availability=availability, peers=peers
        )
        if not self.unheld <= unheld or not self.lonely <= lonely:
            # pieces no connected peer holds any more, or a new piece with one holder:
            # ask the ring
            self._on_pieces_changed()
        progress = Progress(
            done_bytes=int(st.total_wanted_done),
            wanted_bytes=int(st.total_wanted),
            pieces_have=int(st.num_pieces),
            pieces_total=self.manifest.num_pieces,
            # all_time_* carry earlier sessions (resume data) but lag the session's
            # own counters by up to a second tick
            uploaded_bytes=max(int(st.all_time_upload), int(st.total_payload_upload)),
            # (plus what the feed fetched: libtorrent counts pieces given to add_piece as
            # neither downloaded nor announced; not kept across restarts)
            downloaded_bytes=max(int(st.all_time_download), int(st.total_payload_download))
            + self._feed.fed_bytes,
            connected_peers=max(0, int(st.num_peers) - self.tally.web_connections),
            # (the feed's bytes as they arrive: a piece still on its way is progress)
            web_seed_bytes=self.tally.web_bytes + self._feed.received_bytes,
            tradable_pieces=tradable,
            owed_pieces=owed,
            coming_pieces=coming,
            sole_pieces=self.tally.sole_pieces if st.is_seeding else 0,
            # (what the core's "a seed in use is needed" reads)
            upload_bps=self.upload_use.rate_bps() or 0,
            upload_capacity_bps=self.upload_limit_bps or self.peak_upload_bps,
        )
        self.last_progress = progress
        return progress

    def piece_finished(self, piece: int) -> None:
        """libtorrent has ``piece`` now (its finished alert): held at once for the ring
        client, not at the next status read (up to ``status_interval_s`` later: a piece
        brought in frees its bringer's place among the supernode's fetches only once
        reported, and the origins' fetches at once waited on it)."""
        bits = self.have_bits
        if bits is None or not 0 <= piece < len(bits) or bits[piece]:
            return
        self.have_bits = (*bits[:piece], True, *bits[piece + 1 :])
        self._on_pieces_changed()

    def _sources(
        self,
        st: Any,
        *,
        have: tuple[bool, ...] | None = None,
        availability: Any = None,
        peers: list[Any] | None = None,
    ) -> tuple[int | None, int, int]:
        # (tradable, owed, coming): pieces this peer lacks that some connected
        # BitTorrent peer holds; pieces of top priority in the policy's plan that it
        # lacks and no connected peer holds (`classify_missing`), with those the ring
        # said other peers bring; and those alone. ``have``, ``availability`` and
        # ``peers``: the status read's pieces held, piece availability and peer infos
        # (None: read here)
        handle = self._handle()
        if handle is None or st.is_seeding:
            self._feed.parallel = 1
            self._feed.set_owed(())
            self.unheld = self.lonely = frozenset()
            return None, 0, 0
        plan = self.last_plan
        if have is None:
            have = tuple(bool(b) for b in st.pieces)
        if availability is None:
            availability = handle.piece_availability()
        web = self.tally.web_connections
        missing = classify_missing(have, availability, web, plan)
        tradable, owed, absent = missing.tradable, missing.owed, missing.absent
        self.unheld = frozenset((*owed, *absent))
        self.lonely = frozenset(missing.lonely)
        # pieces the ring said another peer brings in or holds: coming, not starving
        coming = self.policy.waiting_on(absent) if isinstance(self.policy, ChordPolicy) else []
        fill = self._fill(missing, plan, have)
        # (two requests at a time only while the origins have room, one while it is not
        # known yet: `feed`, `sources.probing`)
        measured = not probing(self._feed.fetch_bps)
        self._feed.parallel = PARALLEL_WITH_ROOM if fill and measured else 1
        self._feed.take_busy = measured and self._beyond_peers
        self._feed.late_bps = self._late_bps if measured else 0
        if fill:
            # the origins have room: what no peer can give it yet comes from them now
            owed = (*owed, *fill)
            coming = [p for p in coming if p not in set(fill)]
        elif (
            self.policy.fetches_owed_pieces
            and plan is not None
            and tradable == 0
            and not owed
            and not coming
        ):
            # starved among peers: none can give anything, so whatever it lacks is owed
            # (a peer alone, with no plan, is starved and uses libtorrent's web seeds),
            # from its own place among them: the others starve on the same pieces
            owed = shared_out(absent, self._peer_id(), self.tally.leecher_ids)
        self._feed.set_owed(owed, peers=peers, have=have)
        return tradable, len(owed) + len(coming), len(coming)

    def _fill(
        self, missing: MissingPieces, plan: tuple[int, ...] | None, have: Any
    ) -> tuple[int, ...]:
        # (`sources.origin_fill`; the rate it takes pieces at otherwise: the fastest
        # it downloaded from peers, or its upload, its limit else its fastest; also
        # with no plan: `stripes` alone among seeds has none, and a reader whose one
        # peer was a slow seed took every piece from it)
        self._beyond_peers = False
        self._late_bps = 0
        if not self.policy.fetches_owed_pieces:
            return ()
        reference = max(self.peak_download_bps, self.upload_limit_bps or self.peak_upload_bps)
        fetch_bps = self.origins_bps()
        # the pieces its peers hold too, while its peers are slow against the origins
        # (or nobody knows yet): a slow peer is an addition, not a wait; where its
        # peers have been about as fast (the loopback bench, a flash crowd) they give
        # them, and the origins send no second copy. (Their best, not their rate now:
        # the rate now dips between pieces, and with it a twenty-peer loopback swarm
        # took 2.0 origin copies against 1.3.)
        # Slow against the origins' rate shared among the swarm's downloading peers,
        # not against the rate its own fetch got: a fetch alone on the origins while
        # 40 peers share them measured more than twice its peers' best, and the
        # forty-peer loopback swarm took 1.33-1.51 origin copies against 1.00.
        # And nothing from its peers yet is not "slow", it is not known: at a swarm's
        # start every peer has had nothing (the origins' probe answers for a reader
        # whose one peer is slow: `probing`).
        # What its peers give it over a recent window, not the best they ever gave it:
        # a swarm client of the small emulation had its link filled by its peers for
        # its first second, then 80-170 kB/s from them; against that burst they were
        # never slow, and it waited 5 s on one peer for its last 4 pieces while the
        # origins had room (7.64 s against the origin client's 1.74 s). And the
        # origins' best lately, not their last piece's rate: that piece came while its
        # peers filled its link (253 kB/s against 1.9 MB/s a second before), and
        # nothing measures them again while nothing is owed.
        leechers = self.swarm_leechers()
        best_peers = self.peers_bps(fetch_bps, leechers)
        beyond = probing(fetch_bps) or peers_slow(fetch_bps, best_peers, leechers=leechers)
        room = origins_have_room(
            fetch_bps, reference, self.download_bps, best_peers_bps=best_peers, leechers=leechers
        )
        # ... and none while the ring holds the origins' egress for the pieces it hands
        # out (its fetch limit binds): each of its few fetches at once comes fast, and
        # taken for room, the peers' feeds fetched pieces of their own in it (1.08-1.76
        # origin copies on the bench; `ChordPolicy.origins_held`)
        # (what no connected peer holds: while a request to them gives what a connection
        # to a peer gives, `sources.unheld_room`)
        unheld = unheld_room(fetch_bps, self.tally.connection_bps, self.upload_limit_bps)
        if self._ring_holds_origins():
            room = unheld = False
        self._beyond_peers = beyond and room
        handle = self._handle()
        if room:
            self._late_bps = int(ROOM_SHARE * origins_share_bps(fetch_bps, leechers))
        return origin_fill(
            missing,
            plan,
            room=room,
            peer_id=self._peer_id(),
            leecher_ids=self.tally.leecher_ids,
            have=[bool(b) for b in have] if beyond else (),
            # (read only while the origins have room: nothing is owed otherwise)
            stranded=stranded(handle.get_download_queue()) if (room or unheld) and handle else (),
            unheld=unheld,
            named=self.policy.first | self.policy.given
            if isinstance(self.policy, ChordPolicy)
            else (),
            # (the unheld pieces once due: `sources.unheld_due`)
            peers_bps=best_peers,
            fetch_bps=fetch_bps,
        )

    def _ring_holds_origins(self) -> bool:
        return (
            isinstance(self.policy, ChordPolicy)
            and self._now is not None
            and self.policy.origins_held(self._now)
        )

    def origins_bps(self) -> int:
        """The origins' rate for this peer: the best the feed measured over the last
        `sources.ORIGINS_MEMORY_S` (its last measure before any status read)."""
        if self._now is None:
            return self._feed.fetch_bps
        return self.origins_rate.best(self._now, self._feed.fetch_bps)

    def peers_bps(self, fetch_bps: int, leechers: int) -> int | None:
        """What its peers give it: their rate over `sources.peers_window_s` (two
        pieces at the origins' share); until such a window is known, the best rate
        libtorrent reported; None while nothing came from them (not known, not slow)."""
        if not self.peak_download_bps:
            return None
        rate = None
        if self._now is not None:  # (no status read yet: no window either)
            window = peers_window_s(self.manifest.piece_size_bytes, fetch_bps, leechers)
            rate = self.peers_bytes.rate_over(window)
        return self.peak_download_bps if rate is None else rate

    def swarm_leechers(self) -> int:
        """The swarm's downloading peers, this one included: the tracker's last count,
        at least the connected ones and itself (the count is an announce old: the first
        peers of a burst heard 1 or 2 while dozens were on their way)."""
        return max(1, self.tracker_leechers, len(self.tally.leecher_ids) + 1)

    def lift_holds(self) -> bool:
        """libtorrent says the torrent finished: True if this peer still lacks pieces
        (they were on hold, priority 0 in a plan, `PiecePlan.checked`, when the last
        wanted one arrived; a later plan may have raised them already); those pieces
        get the lowest priority at least, so the download goes on."""
        handle = self._handle()
        if handle is None or all(handle.status().pieces):
            return False
        plan = self.last_plan
        if plan is not None and HOLD_PRIORITY in plan:
            lifted = tuple(max(p, MIN_PRIORITY) for p in plan)
            self.last_plan = lifted
            handle.prioritize_pieces(list(lifted))
        return True

    def _plan(
        self,
        st: Any,
        now: float,
        *,
        have: tuple[bool, ...] | None = None,
        availability: Any = None,
    ) -> None:
        # (``have``, ``availability``: the status read's; None: read here)
        handle = self._handle()
        if handle is None:
            return
        if availability is None:
            availability = handle.piece_availability()
        # (libtorrent's availability counts the web seeds too: they hold every piece)
        web = self.tally.web_connections
        view = SwarmView(
            peer_id=self._peer_id(),
            info_hash=self.manifest.info_hash,
            have=have if have is not None else tuple(bool(b) for b in st.pieces),
            connected_peers=int(st.num_peers),
            leecher_ids=self.tally.leecher_ids,
            holders=tuple(max(0, int(n) - web) for n in availability),
        )
        plan = self.policy.plan(view, now=now)
        if plan is not None and plan.piece_priorities != self.last_plan:
            self.last_plan = plan.piece_priorities
            handle.prioritize_pieces(list(plan.piece_priorities))
        if plan is not None and plan.upload_slots != self._upload_slots:
            self._upload_slots = plan.upload_slots
            handle.set_max_uploads(plan.upload_slots or -1)  # (-1: the session's)
