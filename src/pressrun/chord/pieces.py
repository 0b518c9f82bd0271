"""Pieces as keys: who answers for which piece, and who uploads it to a newcomer.

004_3e4b985b4cf14853.txt, III.A, with hosts and content swapped: every supernode of a
central Chord ring answers for pieces; a joining node gets every piece's key from the
central administration (the tracker), and the supernode that answers for a piece's key
decides which node uploads that piece to the newcomer. A node that has uploaded as
much as it downloaded may leave (the fair-exit rule of `pressrun.peer.core`).

**Balance: the tracker places the supernodes' ids.** Key k belongs to its Chord
successor, as always; what the central administration adds is *where* supernodes sit.
With few keys (an issue has tens to hundreds of pieces) and few supernodes, SHA-1 ids
leave some supernodes with several times their share (measured: docs/chord.md, and a
prototype had 2 to 15 of 80 pieces per node with 64 virtual nodes). The tracker knows
every key and every supernode of the issue, so `place_supernodes` puts the j-th of n
supernodes at the key that ends the j-th n-quantile of the sorted keys: each answers
for floor(K/n) or ceil(K/n) keys, lookups and the ring's invariants stay plain Chord.
A supernode that registers later is placed in the middle of the most loaded arc; one
that fails hands its arc to its successor (up to twice a share) until the tracker
places the next.

**The uploader choice** (`PieceDirectory.choose_uploader`): among the fresh holders of
the piece that have not left and are not the asker, first those that still owe upload
(downloaded - uploaded > 0, so they reach the fair-exit ratio and leave sooner), those
that can pay it back soonest first (what they owe over the upload rate they report:
who reaches the ratio soonest when given the work; `pressrun.sim.swarm_model`'s
order), then the least loaded (uploads assigned in the last ``load_window_s``), ties
at random. With
no holder, the asker itself is told to bring the piece in from the origins, and for the
next ``bring_in_s`` others asking for it are pointed at that bringer (it will hold the
piece before they could fetch it themselves): so each piece leaves the origins about
once. An asker brings in at most ``max_bringing_per_peer`` pieces at a time; beyond
that the answer is ``wait`` (ask again): the first newcomer would otherwise be told to
bring in every piece while the others waited on it, so the bringing is spread over the
newcomers. The asker may say how many pieces it brings in for the whole ring
(``bringing``): that count is held to the same cap, so five supernodes do not hand one
peer five times its share. **The cap follows the asker's origin rate**: an asker that
said how fast its last piece came from the origins (``bring_bps``) may bring in as
many as it fetches in ``bring_ahead_s`` (the time to its next round) at that rate, at
most `MAX_BRING_AHEAD`: where the origins are the bottleneck (the loopback bench: 40
fetches share 2 MB/s) that is one piece; where they are fast and the pieces large
(an emulated flash crowd: three origins of 100-200 Mbit/s, 1 MiB pieces, clients on
6-50 Mbit/s links) one piece a round left each bringer idle between its rounds, and
the swarm's clients took 82-175 s (median 120) where `stripes`' took 17-86 s (43;
docs/emulation.md).

**Bringers at a time** (``max_bringers``, None: no limit): a supernode hands its
pieces to at most that many peers at once; a bringer's report of a piece it brought
frees its slot, and the same report's questions take the next piece. How many, and
how much each: a peer holding one piece nobody else holds is an uploader, a second
such piece at the same peer adds no uploader, so the origins' first pieces go one to
a peer, to as many peers as ask (`pressrun.chord.aio`: `BRINGING_BYTES`,
`MAX_BRINGERS`). Measured on the loopback bench at N = 40 (docs/chord.md): two
bringers a supernode with six pieces each put the first pieces in a few peers' hands
and left the rest with nothing to upload; one piece a peer took the ring from
1.32-1.36x the bound to 1.26-1.29x. The bound keeps a crowd much larger than the
issue's pieces from splitting the origins' egress over every piece at once (each
first piece would arrive F / u_s after the start).

**Bringing is shared out** (``fair_bringing``): the askers say how many pieces they
have brought in from the origins so far (``brought``); an asker that has brought in two
or more pieces than another that asked in the last ``asked_window_s`` waits, so the
pieces leave the origins through many peers, each uploading its few on at once. One
peer that brought in a quarter of the pieces (measured: 21 of 80 at N = 40) held most
of them alone for 20 s, its upload shared among everything it had. Off by default
(`Supernode`): with one piece a bringer at a time the pieces are spread already, and
the rule left the origins idle whenever one recent asker lagged in bringing (at N =
20 on the loopback bench: 1.26-1.28x the bound without it, 1.29-1.31x with it;
docs/chord.md "Benches").

**The order of the askers** (``order_askers``, `asker_pass`): the simulation's passes
(`pressrun.sim.swarm_model._Swarm._passes`) over what this supernode sees (the fresh
holders reporting to it, `SwarmSample`): critical askers first, those that leave when
done and are ahead last, among the rest the most unused upload first. It decides who
is named a first receiver at once (`_goes_first`), keeps an asker that goes last from
bringing pieces in while others ask, and points a critical asker at the least loaded
holder.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pressrun.chord.ids import RING, distance, piece_key

#: a report's uploaded total checks its unused upload only over intervals this long
#: (shorter: too noisy; longer: an average over a time the rate changed in)
_RATE_CHECK_S = (1.0, 4.0)

#: the most pieces a bringer is handed at a time on its origin fetch rate
#: (`PieceDirectory._bring_allowance`), whatever rate it says
MAX_BRING_AHEAD = 8


def piece_keys(info_hash_hex: str, num_pieces: int) -> list[int]:
    """The keys of every piece of an issue, in piece order."""
    return [piece_key(info_hash_hex, k) for k in range(num_pieces)]


def successor_of(node_ids_sorted: Sequence[int], key: int) -> int:
    """The node (by sorted id list) that key belongs to in Chord."""
    i = bisect.bisect_left(node_ids_sorted, key)
    return node_ids_sorted[i % len(node_ids_sorted)]


def responsibility(node_ids: Iterable[int], keys: Iterable[int]) -> dict[int, int]:
    """How many of ``keys`` each node answers for (nodes with none included)."""
    ids = sorted(set(node_ids))
    counts = dict.fromkeys(ids, 0)
    for k in keys:
        counts[successor_of(ids, k)] += 1
    return counts


def place_supernodes(keys: Sequence[int], count: int) -> list[int]:
    """Ids for ``count`` supernodes so each answers for floor or ceil of K/count keys."""
    if count < 1:
        raise ValueError("at least one supernode")
    ks = sorted(set(keys))
    if not ks:
        return [(RING // count) * j for j in range(count)]
    ids: list[int] = []
    for j in range(count):
        end = ((j + 1) * len(ks)) // count  # keys [.., end) go to supernode j
        # (fewer keys than supernodes: the spare ones sit just before the first key)
        cand = ks[end - 1] if end > 0 else (ks[0] - (count - j)) % RING
        while cand in ids:
            cand = (cand - 1) % RING
        ids.append(cand)
    return ids


def place_one_more(existing: Sequence[int], keys: Sequence[int]) -> int:
    """An id for a newcomer: the middle key of the most loaded arc (splits it in two)."""
    ids = sorted(existing)
    if not ids:
        return place_supernodes(keys, 1)[0]
    arcs: dict[int, list[int]] = {i: [] for i in ids}
    for k in sorted(set(keys)):
        arcs[successor_of(ids, k)].append(k)
    owner = max(ids, key=lambda i: (len(arcs[i]), i))
    pred = ids[(ids.index(owner) - 1) % len(ids)]
    # from just after pred (a lone owner is its own pred: its own id sorts last)
    arc = sorted(arcs[owner], key=lambda k: (k - pred - 1) % RING)
    # (an arc of fewer than two keys: halfway between the predecessor and its owner)
    cand = arc[len(arc) // 2 - 1] if len(arc) >= 2 else (pred + distance(pred, owner) // 2) % RING
    while cand in ids:
        cand = (cand - 1) % RING
    return cand


def spread(counts: dict[int, int]) -> tuple[int, int, float]:
    """(min, max, max / mean) of per-node key counts."""
    vals = list(counts.values())
    mean = sum(vals) / len(vals) if vals else 0.0
    return min(vals, default=0), max(vals, default=0), (max(vals) / mean if mean else 0.0)


# --- the directory a supernode keeps for the pieces it answers for ------------------


@dataclass(slots=True)
class Holder:
    """What a supernode knows of one node that reported pieces."""

    peer_id: str
    address: str
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    reported_at: float = 0.0
    left: bool = False
    assigned_at: list[float] = field(default_factory=list)
    brought: int = 0  # pieces it says it brought in from the origins
    asked_at: float = float("-inf")  # when it last asked who uploads a piece
    upload_bps: int = 0  # what it says it can upload, bytes/s (0: not said)
    unchoked: frozenset[str] | None = None  # the peers it unchokes (None: not said)
    #: the upload it left unused lately, bytes/s, as far as it is credible
    #: (`PieceDirectory.handle_report`)
    unused_upload_bps: int = 0
    download_bps: int = 0  # what it says it can download, bytes/s (0: not said)
    missing: int | None = None  # pieces it lacks (None: not said)
    bring_bps: int = 0  # how fast its last piece came from the origins, bytes/s (0: not said)
    reports_at: float = float("-inf")  # its last report (reported_at: also its asking)

    @property
    def owes_bytes(self) -> int:
        return self.downloaded_bytes - self.uploaded_bytes

    @property
    def payback_s(self) -> float:
        """How soon it can pay back what it owes: owed bytes over its upload rate
        (0 for a holder that owes nothing, infinite for one whose rate is unknown)."""
        if self.owes_bytes <= 0:
            return 0.0
        return self.owes_bytes / self.upload_bps if self.upload_bps > 0 else float("inf")

    @property
    def finish_s(self) -> float:
        """Missing pieces over its download rate (0 when either is unknown): the
        directory compares it with the swarm's, the same unit, never as seconds."""
        if not self.missing or self.download_bps <= 0:
            return 0.0
        return self.missing / self.download_bps

    def load(self, now: float, window_s: float) -> int:
        cut = now - window_s
        self.assigned_at = [t for t in self.assigned_at if t > cut]
        return len(self.assigned_at)


@dataclass(slots=True)
class SwarmSample:
    """What one supernode sees of the swarm: the fresh holders reporting to it (a
    sample where the swarm is large; at N = 40 with five supernodes, nearly every
    peer reports to each), plus the origins' upload it was told of."""

    missing: int  # pieces the fresh holders lack, together
    upload_bps: int  # their upload rates together, and the origins'
    median_downloaded: int  # of the recent askers
    median_unused_bps: int  # of the recent askers
    #: recent askers (asked within ``asked_window_s``) not in the last pass
    askers_not_last: int = 0


@dataclass(frozen=True, slots=True)
class Uploader:
    """The directory's answer for one piece: who uploads it (``bring_in``: the asker
    itself fetches it from the origins; ``wait``: nobody yet, ask again)."""

    piece: int
    peer_id: str
    address: str
    bring_in: bool
    wait: bool = False
    #: the asker is one of the piece's first receivers: it takes the piece from its
    #: only source at top priority and passes it on (the others hold off meanwhile)
    first: bool = False


class PieceDirectory:
    """Holders of the pieces one supernode answers for, and the uploader choice.

    Pure: reports and questions come with ``now``; a `random.Random` breaks ties.
    """

    def __init__(
        self,
        *,
        rng: random.Random,
        holder_ttl_s: float = 30.0,
        load_window_s: float = 10.0,
        bring_in_s: float = 10.0,
        max_bringing_per_peer: int = 2,
        max_bringers: int | None = None,
        fair_bringing: bool = False,
        asked_window_s: float = 3.0,
        first_receivers: int | None = None,
        first_s: float = 4.0,
        order_askers: bool = False,
        num_pieces: int = 0,
        file_bytes: int = 0,
        origin_bps: int = 0,
        bring_ahead_s: float = 2.0,
    ) -> None:
        self.rng = rng
        self.holder_ttl_s = holder_ttl_s
        self.load_window_s = load_window_s
        self.bring_in_s = bring_in_s
        self.max_bringing_per_peer = max_bringing_per_peer
        self.max_bringers = max_bringers
        self.fair_bringing = fair_bringing
        self.asked_window_s = asked_window_s
        self.first_receivers = first_receivers
        self.first_s = first_s
        self.order_askers = order_askers
        self.num_pieces = num_pieces
        self.file_bytes = file_bytes
        self.origin_bps = origin_bps
        self.bring_ahead_s = bring_ahead_s
        self._sample: tuple[float, SwarmSample] | None = None
        self.holders: dict[str, Holder] = {}
        self.pieces: dict[int, set[str]] = {}
        self._bringing: dict[int, tuple[str, float]] = {}
        #: piece -> its first receivers named while it had one source: peer -> when
        self._named: dict[int, dict[str, float]] = {}
        #: piece -> when it last had a receiver named (or first had one source)
        self._single_since: dict[int, float] = {}

    def handle_report(
        self,
        *,
        peer_id: str,
        address: str,
        have: Iterable[int],
        uploaded_bytes: int,
        downloaded_bytes: int,
        now: float,
        left: bool = False,
        upload_bps: int = 0,
        unchoked: Iterable[str] | None = None,
        unused_upload_bps: int | None = None,
        download_bps: int = 0,
        missing: int | None = None,
        bring_bps: int = 0,
    ) -> None:
        """A node's holdings (of the pieces this supernode answers for), totals,
        upload rate (``upload_bps``: 0 keeps what it said before), the peers it
        unchokes now (``unchoked``; None keeps what it said before), the upload it
        left unused lately (``unused_upload_bps``, None: keeps the last), its download
        rate (``download_bps``, 0: keeps the last) and how many pieces it lacks
        (``missing``, None: keeps the last).

        Nothing here is taken blindly (a report may be forged or absurd): totals only
        grow; ``missing`` is held to the issue's pieces; the unused upload counts only
        up to the upload the node says it has (none while it has said none), and,
        when its last report here was 1 to 4 s before this one, up to that upload
        less what its uploaded total grew by meanwhile (a node that uploaded at full
        rate has no upload to spare, whatever it says)."""
        h = self.holders.get(peer_id)
        if h is None:
            h = self.holders[peer_id] = Holder(peer_id, address)
        before_at, before_up = h.reports_at, h.uploaded_bytes
        self._sample = None
        h.address = address
        h.uploaded_bytes = max(h.uploaded_bytes, uploaded_bytes)
        h.downloaded_bytes = max(h.downloaded_bytes, downloaded_bytes)
        h.upload_bps = upload_bps or h.upload_bps
        h.download_bps = download_bps or h.download_bps
        h.bring_bps = bring_bps or h.bring_bps
        if missing is not None:
            h.missing = min(missing, self.num_pieces) if self.num_pieces > 0 else missing
        if unused_upload_bps is not None:
            unused = min(unused_upload_bps, h.upload_bps)
            if _RATE_CHECK_S[0] <= now - before_at <= _RATE_CHECK_S[1]:
                seen = (h.uploaded_bytes - before_up) / (now - before_at)
                unused = min(unused, max(0, int(h.upload_bps - seen)))
            h.unused_upload_bps = unused
        if unchoked is not None:
            h.unchoked = frozenset(unchoked)
        h.reported_at = h.reports_at = now
        h.left = h.left or left
        if h.left:
            self._drop_bringing(peer_id)
        for piece in have:
            self.pieces.setdefault(piece, set()).add(peer_id)
            bringer = self._bringing.get(piece)
            if bringer is not None and bringer[0] == peer_id:
                del self._bringing[piece]

    def handle_left(self, peer_id: str) -> None:
        """The node left the swarm: never chosen again."""
        h = self.holders.get(peer_id)
        if h is not None:
            h.left = True
            self._sample = None
        self._drop_bringing(peer_id)

    def _drop_bringing(self, peer_id: str) -> None:
        # a leaving peer's pieces to bring in go to the next asker
        self._bringing = {p: b for p, b in self._bringing.items() if b[0] != peer_id}

    def choose_uploader(
        self,
        piece: int,
        *,
        peer_id: str,
        address: str,
        now: float,
        bringing: int = 0,
        brought: int = 0,
    ) -> Uploader:
        """Who uploads ``piece`` to ``peer_id`` (module docstring); ``bringing``: the
        pieces the asker says it brings in for the whole ring now, ``brought``: those it
        brought in so far."""
        asker = self.holders.get(peer_id)
        if asker is None:
            asker = self.holders[peer_id] = Holder(peer_id, address, reported_at=now)
        if asker.asked_at != now:
            asker.asked_at = now
            self._sample = None  # (one more recent asker)
        asker.brought = max(asker.brought, brought)
        cands = [
            h
            for pid in self.pieces.get(piece, ())
            if (h := self.holders[pid]).peer_id != peer_id
            and not h.left
            and now - h.reported_at <= self.holder_ttl_s
        ]
        if len(cands) == 1 and self.first_receivers is not None:
            return self._one_source(piece, cands[0], peer_id, now, fetching=False)
        if cands:
            self._named.pop(piece, None)
            self._single_since.pop(piece, None)
            self.rng.shuffle(cands)
            if self.asker_pass(asker, now) == 0:
                # a critical asker: the least loaded holder first
                best = min(cands, key=lambda h: h.load(now, self.load_window_s))
            else:
                best = min(
                    cands,
                    key=lambda h: (
                        h.owes_bytes <= 0,
                        h.payback_s,
                        h.load(now, self.load_window_s),
                    ),
                )
            best.assigned_at.append(now)
            return Uploader(piece, best.peer_id, best.address, bring_in=False)
        bringer = self._bringing.get(piece)
        if bringer is not None and now - bringer[1] <= self.bring_in_s:
            b = self.holders.get(bringer[0])
            if b is not None and not b.left and b.peer_id != peer_id:
                if self.first_receivers is not None:
                    return self._one_source(piece, b, peer_id, now, fetching=True)
                return Uploader(piece, b.peer_id, b.address, bring_in=False)
        bringers = {pid for pid, t in self._bringing.values() if now - t <= self.bring_in_s}
        here = sum(
            1 for pid, t in self._bringing.values() if pid == peer_id and now - t <= self.bring_in_s
        )
        busy = self.max_bringers is not None and (
            peer_id not in bringers and len(bringers) >= self.max_bringers
        )
        if (
            busy
            or max(here, bringing) >= self._bring_allowance(asker)
            or self._brought_more(asker, now)
            or self._goes_last(asker, now)
        ):
            # this asker brings enough in already, or enough others do: the next asker
            # (or this one, once it reported a piece it brought) gets this one
            return Uploader(piece, "", "", bring_in=False, wait=True)
        self._bringing[piece] = (peer_id, now)
        return Uploader(piece, peer_id, address, bring_in=True)

    def _bring_allowance(self, asker: Holder) -> int:
        # ``max_bringing_per_peer`` pieces at a time, or as many as the asker fetched
        # from the origins in ``bring_ahead_s`` at the rate of its last one (at most
        # ``MAX_BRING_AHEAD``): where the origins are fast and the pieces large, one
        # piece a hand-out left a bringer idle between two rounds
        if self.num_pieces < 1 or self.file_bytes < 1 or asker.bring_bps <= 0:
            return self.max_bringing_per_peer
        piece_bytes = self.file_bytes / self.num_pieces
        ahead = int(asker.bring_bps * self.bring_ahead_s / piece_bytes)
        return max(self.max_bringing_per_peer, min(ahead, MAX_BRING_AHEAD))

    def _one_source(
        self, piece: int, source: Holder, peer_id: str, now: float, *, fetching: bool
    ) -> Uploader:
        # A tree, not a star: while a piece has one source (its bringer, before or
        # after it reported the piece), at most ``first_receivers`` askers are named to
        # take it from there; the others wait until it has a second holder. A naming
        # lapses ``first_s`` after the source holds the piece (a receiver its source
        # does not serve, or gone); while the bringer still fetches it, namings stand.
        # The source serves the peers it unchokes (libtorrent's eight slots, rotated
        # every 15 s): an asker it chokes would wait for a slot, so the receivers are
        # named among those it unchokes, while it said which and one of them asked
        # within ``first_s`` (pieces of a source that said nothing go to any asker).
        assert self.first_receivers is not None
        named = {
            p: (now if fetching else t)
            for p, t in self._named.get(piece, {}).items()
            if (fetching or now - t <= self.first_s)
            and p in self.holders
            and not self.holders[p].left
        }
        served = source.unchoked is None or peer_id in source.unchoked
        # (with ``order_askers``: and among those that go first, `_goes_first`; a
        # better asker, critical or with more upload to spare, is asking too)
        served = served and self._goes_first(self.holders[peer_id], now)
        if not served:
            since = self._single_since.setdefault(piece, now)
            served = now - since > self.first_s and not named
        if peer_id not in named and len(named) < self.first_receivers and served:
            named[peer_id] = now
            source.assigned_at.append(now)
            self._single_since[piece] = now
        self._named[piece] = named
        if peer_id in named:
            return Uploader(piece, source.peer_id, source.address, bring_in=False, first=True)
        return Uploader(piece, "", "", bring_in=False, wait=True)

    # --- the order of the askers (`pressrun.sim.swarm_model._Swarm._passes`) ---------

    def sample(self, now: float) -> SwarmSample:
        """What this supernode sees of the swarm at ``now`` (kept until a report or a
        new asker changes it)."""
        if self._sample is not None and self._sample[0] == now:
            return self._sample[1]
        fresh = [
            h
            for h in self.holders.values()
            if not h.left and now - h.reported_at <= self.holder_ttl_s
        ]
        recent = [h for h in fresh if now - h.asked_at <= self.asked_window_s]
        downs = sorted(h.downloaded_bytes for h in recent)
        unused = sorted(h.unused_upload_bps for h in recent)
        sample = SwarmSample(
            missing=sum(h.missing or 0 for h in fresh),
            upload_bps=sum(h.upload_bps for h in fresh) + self.origin_bps,
            median_downloaded=downs[len(downs) // 2] if downs else 0,
            median_unused_bps=unused[len(unused) // 2] if unused else 0,
        )
        sample.askers_not_last = sum(1 for h in recent if self._tier(h, sample) < 2)
        self._sample = (now, sample)
        return sample

    def asker_pass(self, h: Holder, now: float) -> int:
        """0: critical (its own download rate would finish it no sooner than the
        upload this supernode sees would finish everyone it sees: every piece it does
        not get delays the end); 2: it will have uploaded the file's size by the time
        it finishes at its download rate (it leaves by the ratio rule with its last
        piece, and its upload with it) and has downloaded at least the median recent
        asker's bytes; 1: the rest. Always 1 unless ``order_askers``."""
        return self._tier(h, self.sample(now)) if self.order_askers else 1

    def _tier(self, h: Holder, s: SwarmSample) -> int:
        if h.finish_s > 0 and s.upload_bps > 0 and h.finish_s >= s.missing / s.upload_bps:
            return 0
        return 2 if self._leaves_when_done(h) and h.downloaded_bytes >= s.median_downloaded else 1

    def _leaves_when_done(self, h: Holder) -> bool:
        if self.file_bytes <= 0 or self.num_pieces <= 0 or h.missing is None:
            return False
        if h.download_bps <= 0:
            return False
        used = max(0, h.upload_bps - h.unused_upload_bps)
        to_finish_s = h.missing * self.file_bytes / self.num_pieces / h.download_bps
        return h.uploaded_bytes + used * to_finish_s >= self.file_bytes

    def _goes_first(self, h: Holder, now: float) -> bool:
        # may this asker be named a first receiver at once: critical, or not one that
        # goes last, with at least the median recent asker's upload to spare
        if not self.order_askers:
            return True
        tier = self.asker_pass(h, now)
        if tier == 0:
            return True
        if tier == 2:
            return self.sample(now).askers_not_last == 0
        return h.unused_upload_bps >= self.sample(now).median_unused_bps

    def _goes_last(self, asker: Holder, now: float) -> bool:
        # an asker that leaves when done and is ahead brings nothing in while others ask
        return self.asker_pass(asker, now) == 2 and self.sample(now).askers_not_last > 0

    def _brought_more(self, asker: Holder, now: float) -> bool:
        # another recent asker has brought in two pieces fewer: it gets this one
        if not self.fair_bringing:
            return False
        since = now - self.asked_window_s
        fewest = min(
            (
                h.brought
                for h in self.holders.values()
                if h is not asker and not h.left and h.asked_at >= since
            ),
            default=None,
        )
        return fewest is not None and asker.brought >= fewest + 2

    def export(self, pieces: Iterable[int]) -> dict[str, object]:
        """What this directory knows of ``pieces`` (a graceful leave's handoff)."""
        wanted = set(pieces)
        out_pieces = {str(p): sorted(self.pieces[p]) for p in wanted if p in self.pieces}
        ids = {pid for pids in out_pieces.values() for pid in pids}
        return {
            "pieces": out_pieces,
            "holders": {
                pid: [h.address, h.uploaded_bytes, h.downloaded_bytes, h.reported_at, h.left]
                for pid, h in self.holders.items()
                if pid in ids
            },
        }

    def adopt(self, handoff: object) -> int:
        """Merge a handoff from `export` (ignores what it cannot read); pieces merged."""
        if not isinstance(handoff, dict):
            return 0
        holders, pieces = handoff.get("holders"), handoff.get("pieces")
        if not isinstance(holders, dict) or not isinstance(pieces, dict):
            return 0
        for pid, row in holders.items():
            if not isinstance(pid, str) or not isinstance(row, list) or len(row) != 5:
                continue
            addr, up, down, at, left = row
            if not (isinstance(addr, str) and isinstance(up, int) and isinstance(down, int)):
                continue
            h = self.holders.setdefault(pid, Holder(pid, addr))
            h.uploaded_bytes = max(h.uploaded_bytes, up)
            h.downloaded_bytes = max(h.downloaded_bytes, down)
            h.reported_at = (
                max(h.reported_at, float(at)) if isinstance(at, int | float) else h.reported_at
            )
            h.left = h.left or bool(left)
        merged = 0
        for key, pids in pieces.items():
            if not (isinstance(key, str) and key.isdigit() and isinstance(pids, list)):
                continue
            known = {p for p in pids if isinstance(p, str) and p in self.holders}
            if known:
                self.pieces.setdefault(int(key), set()).update(known)
                merged += 1
        return merged
