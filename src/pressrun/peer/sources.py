"""Where a peer's pieces and bytes come from, read off libtorrent's view.

`PeerInfoTally` counts, from ``get_peer_info``, the bytes that came from web seeds
(per connection), which connected peers are leechers and (for a seed) the pieces only
it holds among them; `classify_missing` sorts the
pieces a peer lacks by who could give them: a connected BitTorrent peer, nobody but the
origins (owed, in the uploader policy's plan), or nobody at all yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import libtorrent as lt

from pressrun.peer.uploader import HOLD_PRIORITY, MAX_PRIORITY

#: the origins have room for this peer when its last piece from them came at least
#: this share of the rate it can take pieces at (`origins_have_room`)
ROOM_SHARE = 0.5

#: the peers' rate (`peers_slow`) is what they gave over the last this long at least:
#: the rate now dips between two pieces, and their best rate ever may be a one-off
#: burst (a peer's first second, when its peers' uploads were free). Written against
#: `make emulate SCENARIO=small`, whose swarm client had its link filled for a second,
#: then 80-170 kB/s from its peers, and waited 5 s on one peer (7.64 s against 1.74 s):
#: that fall was the emulation's bridge flooding the carousel down every client link
#: (fixed in 2f4756f, docs/results/2026-11-29-small-scenario-querier.md). The rule stays
#: for what it says: a burst is not a rate, and it only adds the origins while they
#: have room
PEERS_WINDOW_S = 2.0
#: ... and at most this long (the counter reads kept: `CounterRate`)
PEERS_WINDOW_MAX_S = 10.0
#: the origins' rate is the best their fetches got over the last this long (the
#: feed's measure of one piece is low while the reader's own link is full of its
#: peers' pieces, and it is not measured again while nothing is owed)
ORIGINS_MEMORY_S = 5.0
#: the pieces no connected peer holds are due from the origins (`unheld_due`) once the
#: pieces its peers can give would last at most this many times the origins' time for
#: them
UNHELD_LEAD = 2.0

_NOT_YET = lt.peer_info.handshake | lt.peer_info.connecting


class PeerInfoTally:
    """What the peer infos say, kept across status polls."""

    def __init__(self) -> None:
        self.web_bytes = 0  # bytes from web-seed connections (per peer info)
        self.web_connections = 0
        self.leecher_ids: tuple[str, ...] = ()
        #: the peer ids (hex, sorted) of the connected peers this one unchokes now
        self.unchoked_ids: tuple[str, ...] = ()
        #: those it would serve if they asked now (the ring names the first receivers
        #: of its pieces among them): those it unchokes, and, while it unchokes fewer
        #: than its upload slots, the connected downloading peers not interested in it
        #: (libtorrent unchokes a *newly* interested peer at once while a slot is free,
        #: `preemptive_unchoke` in its session_impl.cpp). A peer holds a piece only its
        #: source holds off until it is named, so it is not interested, so not
        #: unchoked: named only among the unchoked, the first pieces of a swarm waited
        #: for the supernode's 4 s fallback. A peer interested already and choked is
        #: not served at a free slot: it was passed over by the last rechoke and waits
        #: for the next (every 15 s). Counted as served while a slot was free (seven
        #: unchoked of eight slots in 62% of the middle's status samples at N = 40),
        #: named receivers of pieces first held after 3 s waited 4.3-8.0 s at the
        #: median, a free slot or not (docs/results/2026-11-28-swarm-limit.md, s. 15)
        self.served_ids: tuple[str, ...] = ()
        #: pieces no connected BitTorrent peer holds while one of them downloads (only
        #: counted with ``count_sole``: a seed's last-holder rule, `PeerCore`)
        self.sole_pieces = 0
        #: what one connection to a peer gives it now (bytes/s): the payload rate of the
        #: connected peers sending to it, over how many send (libtorrent's per-peer
        #: rates); 0 while none sends (`unheld_room`)
        self.connection_bps = 0
        self._per_connection: dict[tuple[str, int], int] = {}

    @property
    def web_endpoints(self) -> frozenset[tuple[str, int]]:
        """The (address, port) of every web-seed connection seen (the origins')."""
        return frozenset(self._per_connection)

    def update(
        self,
        peers: Sequence[Any],
        *,
        count_sole: bool = False,
        upload_slots: int | None = None,
    ) -> None:
        """Bytes from web seeds, per connection: a connection's total only grows, so a
        total below the last one seen is a new connection to the same origin.
        ``count_sole``: also count `sole_pieces` from the peers' bitfields (a seed's
        piece availability is not kept by libtorrent). ``upload_slots``: the peers it
        unchokes at most (negative: any number; None: unknown, `served_ids` is then
        `unchoked_ids`)."""
        web = 0
        leechers: list[str] = []
        unchoked: list[str] = []
        uninterested: list[str] = []
        held: list[bool] | None = None
        sending: list[int] = []
        for pi in peers:
            if pi.connection_type == lt.peer_info.standard_bittorrent:
                # (a connection still in its handshake has no peer id yet)
                if pi.flags & _NOT_YET:
                    continue
                if int(pi.payload_down_speed) > 0:
                    sending.append(int(pi.payload_down_speed))
                if not pi.flags & lt.peer_info.seed:
                    leechers.append(pi.pid.to_bytes().hex())
                    if not pi.flags & lt.peer_info.choked:
                        unchoked.append(leechers[-1])
                    elif not pi.flags & lt.peer_info.remote_interested:
                        uninterested.append(leechers[-1])
                if count_sole:
                    bits = pi.pieces
                    if held is None:
                        held = [bool(b) for b in bits]
                    else:
                        held = [h or bool(b) for h, b in zip(held, bits, strict=False)]
                continue
            web += 1
            key = (str(pi.ip[0]), int(pi.ip[1]))
            total = int(pi.total_download)
            last = self._per_connection.get(key, 0)
            self.web_bytes += total - last if total >= last else total
            self._per_connection[key] = total
        self.web_connections = web
        self.leecher_ids = tuple(sorted(leechers))
        self.unchoked_ids = tuple(sorted(unchoked))
        if upload_slots is not None and upload_slots < 0:
            self.served_ids = self.leecher_ids  # (no slot limit: anyone interested)
        elif upload_slots is not None and len(unchoked) < upload_slots:
            self.served_ids = tuple(sorted(unchoked + uninterested))
        else:
            self.served_ids = self.unchoked_ids
        self.sole_pieces = held.count(False) if leechers and held is not None else 0
        self.connection_bps = sum(sending) // len(sending) if sending else 0


@dataclass(frozen=True, slots=True)
class MissingPieces:
    """The pieces a peer lacks, by who could give them."""

    tradable: int  # how many a connected BitTorrent peer holds
    lonely: tuple[int, ...]  # of those, the ones exactly one connected peer holds
    owed: tuple[int, ...]  # top priority in the plan, and no connected peer holds them
    absent: tuple[int, ...]  # no connected peer holds them, not owed


def classify_missing(
    have: Sequence[bool],
    availability: Sequence[int],
    web_connections: int,
    plan: Sequence[int] | None,
) -> MissingPieces:
    """libtorrent's availability counts web seeds too (they hold everything), so a
    piece some BitTorrent peer holds is one seen more than ``web_connections`` times."""
    tradable = 0
    lonely: list[int] = []
    owed: list[int] = []
    absent: list[int] = []
    for index, (held, n) in enumerate(zip(have, availability, strict=False)):
        if held:
            continue
        if n > web_connections:
            tradable += 1
            if n == web_connections + 1:
                lonely.append(index)
        elif plan is not None and plan[index] == MAX_PRIORITY:
            owed.append(index)
        else:
            absent.append(index)
    return MissingPieces(tradable, tuple(lonely), tuple(owed), tuple(absent))


def shared_out(pieces: Sequence[int], peer_id: str, leecher_ids: Sequence[str]) -> tuple[int, ...]:
    """Pieces every starved peer owes alike (no connected peer holds them), in this
    peer's order: from its own place among the downloading peers (sorted by id, as
    `stripes` ranks them) round to the start, so that the peers that fetch them at
    the same moment start on different pieces (measured: 40 peers each fetching the
    same piece first sent 4.1 copies of the file; docs/chord.md "Benches")."""
    if not pieces:
        return ()
    members = sorted({peer_id, *leecher_ids})
    at = members.index(peer_id) * len(pieces) // len(members)
    return (*pieces[at:], *pieces[:at])


def origins_have_room(
    fetch_bps: int,
    reference_bps: int,
    download_bps: int = 0,
    best_peers_bps: int | None = None,
    leechers: int = 1,
) -> bool:
    """Whether the origins have room for this peer, and it for them: its last piece
    from them (``fetch_bps``, the feed's measure) came at least `ROOM_SHARE` of
    ``reference_bps``, the rate it takes pieces at otherwise (the fastest it downloaded
    from peers, or what it uploads: a peer of this swarm gives at most that), while its
    peers give it less than that share now (``download_bps``: a peer whose download
    is full needs nothing more), nor what the origins would give it shared among the
    swarm's ``leechers`` (`origins_share_bps`; nothing from its peers yet,
    ``best_peers_bps`` None, is not known: then that share must itself be at least
    `ROOM_SHARE` of ``reference_bps``), or its peers are slow
    (`peers_slow`: what they give it, ``best_peers_bps``, is under `ROOM_SHARE` of
    the origins' rate shared among the swarm's ``leechers``; a slow peer is an
    addition, not a wait;
    before, a reader whose one peer was a slow seed counted it as full and took
    everything from it, tests/peer/test_origin_room.py).
    With no measure yet (``fetch_bps`` 0: no piece from them so far) and no reference
    either (a peer that has had nothing from its peers yet and has no upload limit),
    yes: it finds out by fetching one (`probing`); with a reference and no measure,
    no: where every peer knows its rate (the loopback bench's upload limit) a probe by
    each would cost the origins a piece a peer while the ring's bringers wait on them.
    A busy origin shares its egress among every fetch (the loopback bench: 2 MB/s over
    up to 40 fetches, 50 kB/s each against 1 MB/s a peer): no room. But an origin that
    serves the fetches asked together one after another (`pressrun.origin`'s turns,
    575475a) gives the k-th of a round its rate over k, so one fetch's measure says
    room to the first few: judged against a dip in its peers' download alone, the
    bringers of the first four pieces of an eighty-peer bench fetched 7 pieces more at
    0.6-0.9 s, and a peer of forty read its last fetch, 6.5 s old and made while the
    origins idled, as room (1.34 and 1.07 origin copies; results sections 20-22): a
    dip is judged against the origins' share, as `peers_slow` judges the peers'
    window. An origin with room sends at the reader's own link rate (the emulated
    small scenario: its origin client took 2.2 s for 4 MB, the ring's swarm clients 13.9-14.9 s)."""
    if probing(fetch_bps):
        return reference_bps <= 0
    # (a peer that never traded with a peer, nor has an upload limit, has no
    # reference: any rate the origins give it is room, its peers give it nothing)
    share = ROOM_SHARE * reference_bps
    if fetch_bps < share:
        return False
    # a dip: its peers give it less than that share now and than the origins' share
    # among the swarm's leechers; nothing from them yet is a dip only where that
    # share is room by itself (a reader alone with its seeds)
    own_share = origins_share_bps(fetch_bps, leechers)
    dip = download_bps < min(share, own_share) and (
        best_peers_bps is not None or own_share >= share
    )
    return dip or share == 0 or peers_slow(fetch_bps, best_peers_bps, leechers=leechers)


def unheld_room(fetch_bps: int, connection_bps: int, upload_limit_bps: int = 0) -> bool:
    """Whether the origins have room for the pieces no connected peer holds (and the
    partial pieces libtorrent asks nobody for): a request to them (``fetch_bps``, the
    feed's measure) gives at least `ROOM_SHARE` of what one connection to a peer gives
    it now (``connection_bps``: `PeerInfoTally.connection_bps`). Not while the origins
    were never measured (`probing`: `origins_have_room` says whether to probe), nor for
    a peer whose upload is capped (``upload_limit_bps``: it knows what a peer of its
    swarm gives, and `origins_have_room` judges the origins against that, as it judges
    whether to probe: the loopback bench's peers, 1 MB/s each, whose origins' 2 MB/s
    shared by 20 to 40 fetches is no room). Judged against one connection with the
    cap as the floor, the bench's forty peers took 1.05 and 1.07 origin copies at
    1a1701a (29 Nov 12:11-12:13, `bench/swarm.py --policy chord --n 40 --runs 2`, load
    1.8) against 1.00-1.01 before: a fetch that came fast while few others fetched
    stood as room for pieces the ring's bringers were bringing.

    Like for like: the feed's measure is one or two requests, while `origins_have_room`
    judges it against every connection of its peers together. Where the reader's own
    link is the bottleneck (the emulated flash crowd: readers on 6-50 Mbit/s, origins
    of 500 Mbit/s in all, 20-45% used while the swarm ran) one request shares that link
    with 15-30 peer connections and gets about what one of them gets (80-130 kB/s
    against 1.7 MB/s from 21 peers), so the origins had no room once its peers gave
    anything. And nothing measured them again: a `chord` reader the ring handed
    nothing to bring in owes nothing, so the first piece it fetched, on a new
    connection, decided for the whole download; at 2241ab3 (29 November, session 23's
    pair) 7 of 24 such readers stopped fetching within 6 s with under 0.5 MB from the
    origins, their one measure 44-290 kB/s, while a `stripes` reader's own stripe kept
    its feed measuring (2.8-12 MB from the origins in the same seconds; the `chord`
    readers that started at 70-72 s were 53-115 pieces of 382 in at 10 s, the `stripes`
    ones 131-148). Pieces a connected peer holds stay the ones `origins_have_room`
    judges (its peers give them; the `chord` policy's hold on a piece one connected peer
    holds is the ring's tree): fetched for every reader that lacks them, the origins
    would send the swarm a copy each.
    """
    if probing(fetch_bps) or upload_limit_bps > 0:
        return False
    return fetch_bps >= ROOM_SHARE * connection_bps


def unheld_due(tradable: int, unheld: int, peers_bps: int | None, fetch_bps: int) -> bool:
    """Whether the ``unheld`` pieces (no connected peer holds them, `unheld_room`) are
    due from the origins now: the ``tradable`` ones (a connected peer holds them) would
    last it, at what its peers give (``peers_bps``, `peers_slow`'s measure), at most
    `UNHELD_LEAD` times what the origins take for the unheld ones at ``fetch_bps``, so
    that they come before its peers' pieces run out (the piece size cancels out).
    Until then a connected peer may get them and give them, and a request to the
    origins only shares the reader's link with its peers' connections (`unheld_room`
    judges one request against one connection: where its link is the bottleneck they
    get about the same). Due while nothing from its peers is known (None or 0) or the
    origins' rate is not.

    In flash-crowd-50-desktops the rule without this (1a1701a) took 26-28 MB from the
    origins in three runs (a23629d, 0753977, 3627a2a) after each swarm client's first
    3 s, against 5.8 MB at 32718c0 before it: 1.5-4.3 MB for each lossy-10 and dsl-20
    reader, 1 to 8 pieces owed at every progress line for 30 s, while its peers filled
    its link (about 1.0 of 1.25 MB/s, 2.2 of 2.5) and held 100-300 pieces it lacked;
    about half of those bytes were partial pieces finished from the origins. Their
    downloads took no less for it (lossy-10 45.0-49.1 s against 44.8-50.2 s,
    docs/results/2026-11-29-origin-egress.md). In the flash crowd it was written for
    (a reader whose peers held few pieces it lacked and many nobody connected held) the
    unheld pieces are due at once."""
    if unheld <= 0:
        return False
    if not peers_bps or fetch_bps <= 0:
        return True
    return tradable * fetch_bps <= UNHELD_LEAD * unheld * peers_bps


def peers_slow(fetch_bps: int, best_peers_bps: int | None, *, leechers: int = 1) -> bool:
    """What its peers give it (``best_peers_bps``, their rate over a recent window,
    `peers_window_s`: `SwarmStatus` passes it, or the best they gave it so far until
    such a window is known; None: nothing from them yet, not known) is under
    `ROOM_SHARE` of the origins' rate as shared (`origins_share_bps`: what they give it
    now, divided among the swarm's ``leechers``): the origins' room rule turned round.
    (Merely faster than the peers was not enough: in a twenty-peer loopback swarm whose
    two origins give a lone fetch 1 MB/s each, that held for most peers near the end,
    and the origins sent 1.8 copies against 1.3, in the same time. Against the rate a
    fetch gets alone, not shared, a peer of a forty-peer swarm whose fetch had the
    origins' 2 MB/s to itself took the pieces its peers held from them: 1.33-1.51
    origin copies on `bench/swarm.py` at N = 40 against 1.00.)"""
    if best_peers_bps is None:
        return False
    return best_peers_bps < ROOM_SHARE * origins_share_bps(fetch_bps, leechers)


def origins_share_bps(fetch_bps: int, leechers: int) -> float:
    """What the origins would give this peer if every downloading peer of its swarm
    (``leechers``, itself included: the tracker's count, at least those connected)
    fetched from them as it does: ``fetch_bps``, the rate its own fetches got, shared
    among them. A lone fetch measures the origins' egress, or the reader's link, not
    the share each of a crowd gets: a rule every peer follows alike is judged as if
    all of them followed it. (Conservative where the origins are much faster than a
    reader's link: the share is then larger than this; the origins' spare egress is
    not known to the peer, the balancer sends a crowd to the swarm because the
    origins are busy.)"""
    return fetch_bps / max(1, leechers)


def peers_window_s(piece_bytes: int, fetch_bps: int, leechers: int) -> float:
    """How long the peers' rate is judged over: the time the origins' share at
    `ROOM_SHARE` (`origins_share_bps`) takes for two pieces, between `PEERS_WINDOW_S`
    and `PEERS_WINDOW_MAX_S`. Peers slow over that window have not delivered in the
    time the origins would have: a deadline, not a dip between two pieces (at the
    loopback bench's 40 peers sharing a 2 MB/s origin, 10 s: two 128 KiB pieces at
    25 kB/s)."""
    threshold = ROOM_SHARE * origins_share_bps(fetch_bps, leechers)
    if threshold <= 0:
        return PEERS_WINDOW_MAX_S
    return min(PEERS_WINDOW_MAX_S, max(PEERS_WINDOW_S, 2 * piece_bytes / threshold))


class CounterRate:
    """A byte counter read now and then (the bytes from peers), and its rate over a
    recent window. Pure: reads come with ``now``; kept for ``keep_s`` (one read at or
    before that span's start stays, so a window of ``keep_s`` is covered)."""

    def __init__(self, keep_s: float = PEERS_WINDOW_MAX_S) -> None:
        self.keep_s = keep_s
        self._reads: deque[tuple[float, int]] = deque()

    def add(self, now: float, total: int) -> None:
        """A read of the counter (a total below the last one: the counter started
        again, a new session; what came before is forgotten)."""
        if self._reads and total < self._reads[-1][1]:
            self._reads.clear()
        self._reads.append((now, total))
        while len(self._reads) > 2 and self._reads[1][0] <= now - self.keep_s:
            self._reads.popleft()

    def rate_over(self, window_s: float) -> int | None:
        """Bytes/s from the last read at or before ``window_s`` before the last read,
        to the last read. None while not known: no read that old, or the counter was
        still 0 then (the first byte came less than a window ago: at a swarm's start
        nothing from peers yet is not slow, and a first piece is no rate)."""
        if len(self._reads) < 2:
            return None
        t1, b1 = self._reads[-1]
        start = None
        for t, b in self._reads:
            if t > t1 - window_s:
                break
            start = (t, b)
        if start is None or start[1] <= 0 or t1 <= start[0]:
            return None
        return int((b1 - start[1]) / (t1 - start[0]))


class BestRecent:
    """The best of a measure over the last ``memory_s`` (the origins' rate as the
    feed measured it, piece by piece). Pure: values come with ``now``."""

    def __init__(self, memory_s: float = ORIGINS_MEMORY_S) -> None:
        self.memory_s = memory_s
        self._values: deque[tuple[float, int]] = deque()

    def add(self, now: float, value: int) -> None:
        """A value seen now (repeats of the last one are not kept again)."""
        if not self._values or self._values[-1][1] != value:
            self._values.append((now, value))
        while self._values and self._values[0][0] < now - self.memory_s:
            self._values.popleft()

    def best(self, now: float, current: int) -> int:
        """The best value seen within the memory, and ``current`` at least."""
        return max([current, *(v for t, v in self._values if t >= now - self.memory_s)])


def probing(fetch_bps: int) -> bool:
    """No piece has come from the origins yet (``fetch_bps`` 0), so whether they have
    room is not known: the peer fetches one piece at a time from them until it is
    (a peer whose peers hold everything never got a piece to bring in, so never
    measured the origins, and took every piece from its peers however slow)."""
    return fetch_bps <= 0


def origin_fill(
    missing: MissingPieces,
    plan: Sequence[int] | None,
    *,
    room: bool,
    peer_id: str,
    leecher_ids: Sequence[str],
    have: Sequence[bool] = (),
    stranded: Collection[int] = (),
    unheld: bool = False,
    named: Collection[int] = (),
    peers_bps: int | None = None,
    fetch_bps: int = 0,
) -> tuple[int, ...]:
    """Whatever the policy, a peer takes from the origins what its peers cannot give
    it yet, while the origins have room (``room``: `origins_have_room`; with
    ``unheld`` alone, `unheld_room`: the pieces no connected peer holds and the
    ``stranded`` ones, but those the policy named a source for, ``named``: the ring's
    first receivers' and given pieces, on their way from a bringer or a holder it
    connects to; nothing else, and those only once due, `unheld_due`, judged with
    what its peers give, ``peers_bps``, and the origins' rate, ``fetch_bps``): first
    the pieces no connected peer holds that are not already owed and the partial
    pieces libtorrent asks nobody for (``stranded``, `download_queue.stranded`), then those it
    holds off (the `chord` policy's hold on a piece one connected peer holds, priority
    0 in the ``plan``, until the ring names this peer a first receiver: its holder
    gives it then, and from the origins it is a second copy in the swarm, so the
    origins bring what nobody connected holds first), then (with ``have``, the pieces it
    holds: the caller passes it while the origins give it more than its peers ever did)
    every other piece it lacks: those its peers hold, which the feed skips while
    libtorrent is fetching them from a peer (its download queue), so a slow peer is an
    addition to the origins, not a wait. Each part in this peer's own order
    (`shared_out`: the peers doing the same start on different pieces). None while the
    origins have no room: then a piece enters the swarm once, from the peer the policy
    gave it to."""
    owed = set(missing.owed)
    if not room:
        if not unheld:
            return ()
        unheld_pieces = sorted({*missing.absent, *stranded} - owed - set(named))
        if not unheld_due(missing.tradable, len(unheld_pieces), peers_bps, fetch_bps):
            return ()
        return shared_out(unheld_pieces, peer_id, leecher_ids)
    first = sorted({*missing.absent, *stranded} - owed)
    held_off = sorted(
        {
            i
            for i in missing.lonely
            if plan is not None and i < len(plan) and plan[i] == HOLD_PRIORITY
        }
        - owed
        - set(first)
    )
    taken = {*first, *held_off}
    rest = sorted({i for i, held in enumerate(have) if not held} - owed - taken)
    return (
        *shared_out(first, peer_id, leecher_ids),
        *shared_out(held_off, peer_id, leecher_ids),
        *shared_out(rest, peer_id, leecher_ids),
    )
