"""The directory a supernode keeps for the pieces it answers for: who holds them, and
who uploads each to a newcomer (004_3e4b985b4cf14853.txt, III.A; placement and keys:
`pressrun.chord.pieces`). The records it keeps and answers with (`Holder`,
`SwarmSample`, `Uploader`) are in `pressrun.chord.holders`.

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

**Fetches at a time** (``max_fetching``, None: no limit): the pieces handed out to be
brought in and not reported yet. The origins' egress is shared by every fetch at once,
and a piece is of use to the swarm only once whole: forty fetches of 128 KiB sharing
2 MB/s (the loopback bench at N = 40) each completed 1.5 to 2.9 s after the start, and
nobody had anything to upload until then; `pressrun.chord.aio.fetches_at_once` holds
them to what the origins complete in ``origin_fetch_s`` where told the origins' rate
(off by default: origin copies at N = 80, docs/chord.md). While that
limit binds, the origins' egress is the ring's, and every answer says so
(`origins_held`): with ten fetches at once or fewer each fetch came fast, and the
peers' feeds took that for the origins' room and fetched pieces of their own, origin
copies 1.08-1.76 (docs/chord.md).

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

**What a report may claim** (docs/chord.md, "Strangers"). The adapter binds a holder
to the address its reports come from (`pressrun.chord.aio`); here, `admit` refuses a
report for a peer id that a fresh holder at another host holds, and a new holder
beyond ``max_holders_per_host`` holders at one host or ``max_holders`` in all. A
holder silent for ``holder_ttl_s`` is forgotten (swept every quarter of the TTL), so
what a report and a question cost depends on the holders of the last ``holder_ttl_s``,
never on every peer ever seen (issue 24: 1.1 ms at 1,000 holders ever seen, 137 ms at
50,000, before). A claimed upload rate counts, in the uploader choice and the asker
order, only up to the larger of the rate the holder's own uploaded totals showed
between two of its reports and the lower median of the rates its fellow holders claim
(`pressrun.chord.holders.credited_bps`): a holder saying 10^10 bytes/s was named in
480 of 480 answers.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from pressrun.chord.handoff import adopt_handoff, export_directory
from pressrun.chord.holders import Holder, SwarmSample, Uploader, credited_bps, lower_median
from pressrun.chord.ids import host_of

#: the most pieces a bringer is handed at a time on its origin fetch rate
#: (`PieceDirectory._bring_allowance`), whatever rate it says
MAX_BRING_AHEAD = 8

#: a report's uploaded total checks its unused upload only over intervals this long
#: (shorter: too noisy; longer: an average over a time the rate changed in)
_RATE_CHECK_S = (1.0, 4.0)

#: a holder's uploaded total shows its upload rate over intervals at least this long
_MEASURE_MIN_S = 1.0

#: how long the fetch limit holds the origins for the ring after it last bound
#: (`PieceDirectory.origins_held`): a peer's regular round, so a peer that asks every
#: round hears it again before it lapses
ORIGINS_HELD_S = 2.0

#: holders one supernode keeps at most, and at most from one host (a NAT's readers
#: share an address; the loopback benches run up to 80 peers on 127.0.0.1)
MAX_HOLDERS = 4096
MAX_HOLDERS_PER_HOST = 128


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
        max_fetching: int | None = None,
        fair_bringing: bool = False,
        asked_window_s: float = 3.0,
        first_receivers: int | None = None,
        first_s: float = 4.0,
        order_askers: bool = False,
        num_pieces: int = 0,
        file_bytes: int = 0,
        origin_bps: int = 0,
        bring_ahead_s: float = 2.0,
        max_holders: int = MAX_HOLDERS,
        max_holders_per_host: int = MAX_HOLDERS_PER_HOST,
    ) -> None:
        self.rng = rng
        self.holder_ttl_s = holder_ttl_s
        self.load_window_s = load_window_s
        self.bring_in_s = bring_in_s
        self.max_bringing_per_peer = max_bringing_per_peer
        self.max_bringers = max_bringers
        #: pieces handed out to be brought in and not reported yet, at most (None: no
        #: limit; `pressrun.chord.aio.fetches_at_once`)
        self.max_fetching = max_fetching
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
        self.max_holders = max_holders
        self.max_holders_per_host = max_holders_per_host
        self._per_host: dict[str, int] = {}
        #: when the next sweep of silent holders is due, and when one may be forced
        #: (a new holder at the bounds: at most one a second)
        self._sweep_at = float("-inf")
        self._forced_at = float("-inf")
        #: when the fetch limit last kept an asker from a piece (`origins_held`)
        self._limit_bound_at = float("-inf")

    # --- who may report, and forgetting (module docstring) -------------------------

    def admit(self, peer_id: str, address: str, now: float) -> str | None:
        """None if a report or question of ``peer_id`` from ``address`` (its host: where
        the request came from) may go on, else why not (the adapter answers 403 for a
        peer id held elsewhere, 429 at the bounds)."""
        self._sweep(now)
        host = host_of(address)
        h = self.holders.get(peer_id)
        if h is not None:
            if h.host == host:
                return None
            if now - h.reported_at <= self.holder_ttl_s:
                return f"peer id {peer_id!r} reports from {h.host}, not from {host}"
            self._forget({peer_id})  # silent for the TTL: the peer id is anyone's
        if self._full(host):
            if now - self._forced_at >= 1.0:
                self._forced_at = now
                self._sweep(now, force=True)
            if self._full(host):
                return f"too many holders report from {host} (or in all): try again later"
        return None

    def _full(self, host: str) -> bool:
        return (
            len(self.holders) >= self.max_holders
            or self._per_host.get(host, 0) >= self.max_holders_per_host
        )

    def _new_holder(self, peer_id: str, address: str, now: float) -> Holder:
        h = self.holders[peer_id] = Holder(peer_id, address, reported_at=now)
        self._per_host[h.host] = self._per_host.get(h.host, 0) + 1
        return h

    def _sweep(self, now: float, *, force: bool = False) -> None:
        # forget holders silent for the TTL; every quarter of the TTL (cost: the live
        # holders, at most ``max_holders``)
        if not force and now < self._sweep_at:
            return
        self._sweep_at = now + max(1.0, self.holder_ttl_s / 4)
        cut = now - self.holder_ttl_s
        stale = {pid for pid, h in self.holders.items() if h.reported_at < cut}
        if stale:
            self._forget(stale)

    def _forget(self, pids: set[str]) -> None:
        for pid in pids:
            h = self.holders.pop(pid, None)
            if h is None:
                continue
            left = self._per_host.get(h.host, 1) - 1
            if left > 0:
                self._per_host[h.host] = left
            else:
                self._per_host.pop(h.host, None)
        for piece in list(self.pieces):
            held = self.pieces[piece]
            held -= pids
            if not held:
                del self.pieces[piece]
        self._bringing = {p: b for p, b in self._bringing.items() if b[0] not in pids}
        self._sample = None

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
        self._sweep(now)
        h = self.holders.get(peer_id)
        if h is None:
            h = self._new_holder(peer_id, address, now)
        before_at, before_up = h.reports_at, h.uploaded_bytes
        self._sample = None
        if host_of(address) == h.host:  # (`admit` refuses another host's reports)
            h.address = address
        h.uploaded_bytes = max(h.uploaded_bytes, uploaded_bytes)
        if now - before_at >= _MEASURE_MIN_S:
            shown = (h.uploaded_bytes - before_up) / (now - before_at)
            h.measured_bps = max(h.measured_bps, int(shown))
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
        self._sweep(now)
        asker = self.holders.get(peer_id)
        if asker is None:
            asker = self._new_holder(peer_id, address, now)
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
        if len(cands) == 1 and self.first_receivers is not None and cands[0].missing != 0:
            # (a seed, one that said it lacks nothing, is the plain choice below: the
            # tree is for a piece new to the swarm, `_one_source`)
            return self._one_source(piece, cands[0], peer_id, now, fetching=False)
        if cands:
            self._named.pop(piece, None)
            self._single_since.pop(piece, None)
            self.rng.shuffle(cands)
            if self.asker_pass(asker, now) == 0:
                # a critical asker: the least loaded holder first
                best = min(cands, key=lambda h: h.load(now, self.load_window_s))
            else:
                median = lower_median(h.upload_bps for h in cands)
                best = min(
                    cands,
                    key=lambda h: (
                        h.owes_bytes <= 0,
                        h.payback_with(credited_bps(h, median)),
                        h.load(now, self.load_window_s),
                    ),
                )
            best.assigned_at.append(now)
            return Uploader(piece, best.peer_id, best.address, bring_in=False)
        bringer = self._bringing.get(piece)
        if bringer is not None and now - bringer[1] <= self.bring_in_s:
            if bringer[0] == peer_id:
                # its own piece, asked about again: still its to bring in (the answer
                # that handed it out may never have reached it, a request timed out on
                # a loaded host; with its allowance full of such pieces it was told
                # `wait`, and nobody brought them in for ``bring_in_s`` while every
                # other asker was pointed at it). The reservation keeps its time.
                return Uploader(piece, peer_id, address, bring_in=True)
            b = self.holders.get(bringer[0])
            if b is not None and not b.left:
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
        if self.max_fetching is not None:
            fetching = sum(1 for _, t in self._bringing.values() if now - t <= self.bring_in_s)
            if fetching >= self.max_fetching:
                busy = True
                self._limit_bound_at = now  # (`origins_held`)
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

    def origins_held(self, now: float) -> bool:
        """The origins' egress is the ring's now: this supernode holds its pieces to
        be brought in to what the origins complete at once (``max_fetching``), and
        that limit kept an asker from a piece within the last `ORIGINS_HELD_S`. Every
        answer says it (``origins_held``), and a peer told so counts no room at the
        origins for fetches of its own (`pressrun.peer.status`): with ten fetches at
        once, each fetch came fast, the peers' feeds took that for room and fetched
        pieces nobody had handed them, 1.08-1.76 origin copies (docs/chord.md)."""
        return self.max_fetching is not None and now - self._limit_bound_at <= ORIGINS_HELD_S

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
        # take it from there; the others wait until it has a second holder. Not when
        # that source is a seed (`choose_uploader`): a seed's upload goes to whichever
        # of its pieces its askers lack, none of them new, and a small swarm's last
        # reader, with the first receivers of every piece named already among the
        # others, was told `wait` for each piece only the seed held and held them all
        # off (`make emulate SCENARIO=small`: its third swarm client, 0 first, 10
        # `wait`, 3.86 s against the origin client's 1.69 s). A naming
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
        if served and not fetching and source.unchoked is not None and peer_id not in named:
            # the source holds the piece and chokes a receiver named before (while it
            # fetched, or by the fallback): an asker it serves takes that one's place
            # (the one replaced keeps the piece at the top priority; it was choked
            # and would wait for the source's next rechoke, every 15 s)
            choked = [p for p in named if p not in source.unchoked]
            if len(named) >= self.first_receivers and choked:
                del named[choked[0]]
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
        median = lower_median(h.upload_bps for h in fresh)
        sample = SwarmSample(
            missing=sum(h.missing or 0 for h in fresh),
            upload_bps=sum(credited_bps(h, median) for h in fresh) + self.origin_bps,
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

    def export(self, pieces: Iterable[int], *, now: float) -> dict[str, object]:
        """What this directory knows of ``pieces`` (a graceful leave's handoff:
        `pressrun.chord.handoff.export_directory`)."""
        return export_directory(self, pieces, now=now)

    def adopt(self, handoff: object, *, now: float) -> int:
        """Merge a handoff from `export` (`pressrun.chord.handoff.adopt_handoff`);
        pieces merged."""
        return adopt_handoff(self, handoff, now=now)
