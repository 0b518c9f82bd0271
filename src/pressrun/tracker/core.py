"""The tracker's decisions: announces, peer lists, expiry, fairness accounting. Pure.

A swarm is the set of peers of one torrent (one issue), filed by (peer_id, address
family) as FIELD-NOTES.md advises: a dual-stack client announces once per family.
Each peer has a ``PeerRecord`` that outlives its presence, so the tracker can say how
much every peer uploaded and downloaded in total and by which rule it left.

Life of a record (BEP 3 events):

    (none) --announce--> active --stopped--> left (leave_rule from the peer)
                           |  ^                |
                           |  +---announce-----+   (a later session: totals go on)
                           +--no announce for peer_ttl_s--> left (rule ``expired``)

The fair-exit rule (``ratio`` and ``not_needed``, checked by ``supported_rule``) and
the swarm's index of seeds and leechers are in `pressrun.tracker.swarm`.

Accounting (``accumulate``, one announce's bytes added to its peer's totals across
client sessions) is in `pressrun.tracker.accounting`.

Hardening (docs/security.md): with an allowlist (``allowed``) the core serves only
the info-hashes of published issues, and the adapter refuses any other before it
reaches ``handle_announce``; a made-up info-hash creates nothing. A record that left
is forgotten ``record_ttl_s`` after it left (a second lazy heap, like expiry): its
bytes, completions and leave rule are folded into the swarm's `ForgottenTotals`, and
the adapter is told (``drain_forgotten``) so the store deletes it too. A swarm whose
last record is forgotten goes with it. ``max_swarms`` bounds the swarms held, but only
live ones (an active peer) can fill it: a new swarm beyond it evicts the swarm that
died first, and only a tracker full of live swarms refuses (``tracker_full``). A
``stopped`` announce claiming a fair rule is checked against the swarm's own totals
(``supported_rule``).

Time: ``now`` is monotonic seconds, the same clock for every call, and every record
time (``first_seen``, ``last_seen``, ``left_at``) is in it. Wall time never enters the
core: a step of the host's clock (NTP, an operator) must not expire every peer at once
(issue 24). What the stores keep across restarts and processes is converted to and
from wall time by the adapter (`pressrun.tracker.store.stored_record` and
``live_record``), and a record read back is treated as heard at the time it was read.
"""

from __future__ import annotations

import heapq
import ipaddress
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace

from pressrun.tracker.accounting import accumulate, family_of, straggles
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.events import (
    AddressFamily,
    AnnounceEvent,
    AnnounceReply,
    AnnounceRequest,
    LeaveRule,
    PeerContact,
    PeerRecord,
    SwarmStats,
    TrackerEvent,
)
from pressrun.tracker.swarm import ForgottenTotals, PeerKey, Swarm, supported_rule


class LocalProtocolError(Exception):
    """The caller misused the core (a bug in the adapter, not a peer's fault)."""


@dataclass(frozen=True, slots=True)
class AnnounceHandled:
    """What one announce produced: the answer, the record to persist, a log entry."""

    reply: AnnounceReply
    record: PeerRecord
    logged: TrackerEvent | None


@dataclass(frozen=True, slots=True)
class PeerExpired:
    """A peer stopped announcing for longer than the TTL; its record is now inactive."""

    record: PeerRecord
    logged: TrackerEvent


def effective_address(request_ip: str | None, remote: str) -> str:
    """The address a peer is reachable at.

    The request's remote address, except that a loopback remote may name another
    address with ``ip=`` (tests and the emulation run many peers behind 127.0.0.1 or a
    local relay). An IPv4-mapped IPv6 remote is reported as IPv4.
    """
    try:
        addr = ipaddress.ip_address(remote)
    except ValueError:
        raise LocalProtocolError(f"remote address {remote!r} is not an IP address") from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if request_ip is not None and addr.is_loopback:
        return str(ipaddress.ip_address(request_ip))
    return str(addr)


class TrackerCore:
    """Announce handling, peer selection, expiry and accounting over all swarms.

    Holds every record in memory. With the SQLite store the core is the truth and the
    store its write-behind copy; with Redis the adapter reloads a swarm from the store
    before each announce (``load_swarm``) so several processes share one view.
    """

    def __init__(
        self,
        config: TrackerConfig,
        rng: random.Random,
        *,
        allowed: Iterable[bytes] | None = None,
    ) -> None:
        self.config = config
        self._rng = rng
        self._swarms: dict[bytes, Swarm] = {}
        # None: any info-hash (tests, a private tracker); else only these.
        self._allowed: set[bytes] | None = set(allowed) if allowed is not None else None
        # (forget_at, info_hash, peer_id, family number) of records that left; like
        # _expiry, entries made stale by a later announce are skipped lazily.
        self._forget: list[tuple[float, bytes, bytes, int]] = []
        # (deadline, info_hash, peer_id, family number) of active peers; entries made
        # stale by a later announce are skipped lazily. Plain comparable items only.
        self._expiry: list[tuple[float, bytes, bytes, int]] = []
        # After a restart every peer restored as active gets a full TTL to announce
        # again, however long the tracker was down (see restore).
        self._grace_until = float("-inf")
        # Swarms with no active peer, in the order they died: the first is evicted when
        # a new swarm needs room (max_swarms counts live swarms only).
        self._dead: dict[bytes, None] = {}
        # What the store must forget too, until the adapter drains it.
        self._forgotten_records: list[PeerRecord] = []
        self._forgotten_swarms: list[bytes] = []

    # -- state in and out -------------------------------------------------------

    def restore(
        self,
        records: Iterable[PeerRecord],
        *,
        now: float | None = None,
        totals: dict[bytes, ForgottenTotals] | None = None,
    ) -> None:
        """Adopt records read from a store at start-up, and the totals of the records
        it forgot before (``totals``, by info-hash).

        With ``now``, no restored peer expires before ``now + ttl``: the tracker was
        not there to hear the announces they made while it was down.
        """
        if now is not None:
            self._grace_until = max(self._grace_until, now + self.config.ttl_s)
        for record in records:
            self._file(record)
        for info_hash, forgotten in (totals or {}).items():
            swarm = self._swarms.get(info_hash)
            if swarm is not None:  # totals of a swarm with no record left: gone
                swarm.forgotten = swarm.forgotten + forgotten

    def merge_swarm(self, info_hash: bytes, records: Iterable[PeerRecord]) -> None:
        """Adopt the records of one swarm that changed in a shared store, keeping the
        others (an incremental `load_swarm`). A record that is the very object the
        core holds is skipped (the adapter hands back the core's own copy of a record
        that did not change, with its times); any other wins, an older version too:
        the store's copy is the current one (a record forgotten and made again starts
        over at version 1)."""
        swarm = self._swarms.get(info_hash)
        for record in records:
            if swarm is None:
                swarm = self._swarms[info_hash] = Swarm(info_hash)
            previous = swarm.records.get(record.peer_key)
            if previous is record:
                continue
            swarm.put(record)
            if record.active:
                self._arm(record)
            else:
                self._arm_forget(record)
        if swarm is not None:
            self._note(swarm)

    def load_swarm(self, info_hash: bytes, records: Iterable[PeerRecord]) -> None:
        """Replace one swarm's records with a fresher view from a shared store.

        Records identical (the same object) to what the swarm holds are skipped, so a
        store that reuses unchanged records makes this cheap for a large swarm.
        """
        swarm = self._swarms.get(info_hash)
        if swarm is None:
            records = list(records)
            if not records:
                return  # nothing known: a lookup of a made-up swarm creates nothing
            swarm = self._swarms[info_hash] = Swarm(info_hash)
        seen: set[PeerKey] = set()
        for record in records:
            key = record.peer_key
            seen.add(key)
            previous = swarm.records.get(key)
            if previous is record:
                continue
            swarm.put(record)
            # Arm unless the entry armed for the same record is still in the heap.
            if record.active and (
                previous is None or not previous.active or previous.last_seen != record.last_seen
            ):
                self._arm(record)
            elif not record.active:
                self._arm_forget(record)
        if len(seen) != len(swarm.records):
            for key in [k for k in swarm.records if k not in seen]:
                swarm.drop(key)
        self._note(swarm)

    def _note(self, swarm: Swarm) -> None:
        """Keep the index of dead swarms right after ``swarm`` changed; a swarm with
        no record left is dropped (its store copy is the adapter's business)."""
        info_hash = swarm.info_hash
        if not swarm.records:
            self._swarms.pop(info_hash, None)
            self._dead.pop(info_hash, None)
        elif swarm.live:
            self._dead.pop(info_hash, None)
        elif info_hash not in self._dead:
            self._dead[info_hash] = None

    def _file(self, record: PeerRecord) -> None:
        swarm = self._swarms.get(record.info_hash)
        if swarm is None:
            swarm = self._swarms[record.info_hash] = Swarm(record.info_hash)
        self._put(swarm, record)

    def _put(self, swarm: Swarm, record: PeerRecord) -> None:
        """File ``record`` in ``swarm``, arm its expiry (active) or its forgetting (it
        left), and keep the index of dead swarms right."""
        swarm.put(record)
        if record.active:
            self._arm(record)
        else:
            self._arm_forget(record)
        self._note(swarm)

    def _evict_dead(self) -> None:
        """Forget the swarm that died first, records and totals (room for a new one)."""
        info_hash = next(iter(self._dead))
        del self._dead[info_hash]
        del self._swarms[info_hash]  # heap entries of its records go stale
        self._forgotten_swarms.append(info_hash)

    def _forget_first_left(self, swarm: Swarm) -> None:
        """Forget the record of ``swarm`` that left first, now (the swarm is full)."""
        if not swarm.left_order:
            return  # every record is an active peer: they expire by the TTL
        key = next(iter(swarm.left_order))
        gone = swarm.records[key]
        swarm.drop(key)  # its forget-heap entry goes stale
        swarm.forgotten = swarm.forgotten.plus(gone)
        self._forgotten_records.append(gone)

    def drain_forgotten(self) -> tuple[list[PeerRecord], list[bytes]]:
        """The records forgotten (``record_ttl_s`` after they left) and the swarms
        forgotten whole (last record gone, or evicted) since the last call: the store
        deletes them, folding the records into its totals."""
        records, self._forgotten_records = self._forgotten_records, []
        swarms, self._forgotten_swarms = self._forgotten_swarms, []
        return records, swarms

    def _deadline(self, record: PeerRecord) -> float:
        return max(record.last_seen + self.config.ttl_s, self._grace_until)

    def _arm(self, record: PeerRecord) -> None:
        deadline = self._deadline(record)
        entry = (deadline, record.info_hash, record.peer_id, record.family.value)
        heapq.heappush(self._expiry, entry)

    def _forget_at(self, record: PeerRecord) -> float:
        left_at = record.left_at if record.left_at is not None else record.last_seen
        return left_at + self.config.record_ttl_s

    def _arm_forget(self, record: PeerRecord) -> None:
        entry = (self._forget_at(record), record.info_hash, record.peer_id, record.family.value)
        heapq.heappush(self._forget, entry)

    # -- the allowlist ------------------------------------------------------------

    def allow(self, info_hashes: Iterable[bytes]) -> int:
        """Add published info-hashes to the allowlist; answers how many were new.
        (On an open core, one built without ``allowed``, this starts an allowlist.)"""
        if self._allowed is None:
            self._allowed = set()
        before = len(self._allowed)
        self._allowed.update(info_hashes)
        return len(self._allowed) - before

    def is_allowed(self, info_hash: bytes) -> bool:
        """Whether the tracker serves this info-hash."""
        return self._allowed is None or info_hash in self._allowed

    @property
    def allowlist(self) -> frozenset[bytes] | None:
        """The allowed info-hashes, or None for an open tracker."""
        return None if self._allowed is None else frozenset(self._allowed)

    def refusal(self, info_hash: bytes) -> str | None:
        """Why an announce for ``info_hash`` must be refused, or None to handle it."""
        if not self.is_allowed(info_hash):
            return "unpublished"
        if (
            info_hash not in self._swarms
            and len(self._swarms) >= self.config.max_swarms
            and not self._dead
        ):
            return "tracker_full"  # every swarm held has an active peer
        return None

    @property
    def live_swarms(self) -> int:
        """How many swarms have an active peer."""
        return len(self._swarms) - len(self._dead)

    def record(self, info_hash: bytes, key: PeerKey) -> PeerRecord | None:
        """The record of one peer, if the tracker has seen it."""
        swarm = self._swarms.get(info_hash)
        return swarm.records.get(key) if swarm is not None else None

    def records(self, info_hash: bytes) -> list[PeerRecord]:
        """Every record of one swarm, active or not."""
        swarm = self._swarms.get(info_hash)
        return list(swarm.records.values()) if swarm is not None else []

    def info_hashes(self) -> list[bytes]:
        """Every swarm the tracker knows, sorted."""
        return sorted(self._swarms)

    def stats(self, info_hash: bytes) -> SwarmStats | None:
        """One swarm's counts and totals, or None for an unknown swarm."""
        swarm = self._swarms.get(info_hash)
        return swarm.stats() if swarm is not None else None

    def counts(self, info_hash: bytes) -> tuple[int, int, int]:
        """(seeds, leechers, completed) cheaply, for scrape; zeros for an unknown swarm."""
        swarm = self._swarms.get(info_hash)
        if swarm is None:
            return (0, 0, 0)
        completed = sum(r.completed_count for r in swarm.records.values())
        return (len(swarm.seeds), len(swarm.leechers), completed)

    # -- inputs -----------------------------------------------------------------

    def handle_announce(self, req: AnnounceRequest, *, remote: str, now: float) -> AnnounceHandled:
        """Account for one announce and choose the peers to hand back.

        The adapter asks `refusal` first: an announce it refuses must not get here
        (`LocalProtocolError`)."""
        refused = self.refusal(req.info_hash)
        if refused is not None:
            raise LocalProtocolError(f"announce for a refused info-hash ({refused})")
        ip = effective_address(req.ip, remote)
        family = family_of(ip)
        swarm = self._swarms.get(req.info_hash)
        if swarm is None:
            if len(self._swarms) >= self.config.max_swarms:
                self._evict_dead()  # refusal() said there is a dead one
            swarm = self._swarms[req.info_hash] = Swarm(req.info_hash)
        prev = swarm.records.get((req.peer_id, family))
        if prev is not None and straggles(prev, req):
            # (answered like any announce of a peer that has left: counts, no peers)
            straggler = AnnounceReply(
                interval_s=self.config.interval_s,
                min_interval_s=self.config.min_interval_s,
                complete=len(swarm.seeds),
                incomplete=len(swarm.leechers),
                peers=(),
                compact=req.compact,
            )
            return AnnounceHandled(reply=straggler, record=prev, logged=None)
        if prev is None and len(swarm.records) >= self.config.max_records_per_swarm:
            self._forget_first_left(swarm)
        record = accumulate(prev, req, ip=ip, now=now)
        if record.leave_rule is not None and record.leave_rule.fair:
            checked = supported_rule(swarm, record, record.leave_rule)
            if checked is not record.leave_rule:
                record = replace(record, leave_rule=checked)
        self._put(swarm, record)
        logged = None
        if req.event is not AnnounceEvent.NONE:
            logged = TrackerEvent(
                at=now,
                info_hash=req.info_hash,
                peer_id=req.peer_id,
                family=family,
                event=req.event.value,
                uploaded_total=record.uploaded_total,
                downloaded_total=record.downloaded_total,
                left=record.left,
                leave_rule=record.leave_rule,
            )
        peers: tuple[PeerContact, ...] = ()
        if record.active:
            peers = self._select_peers(swarm, record, self._numwant(req.numwant))
        reply = AnnounceReply(
            interval_s=self.config.interval_s,
            min_interval_s=self.config.min_interval_s,
            complete=len(swarm.seeds),
            incomplete=len(swarm.leechers),
            peers=peers,
            compact=req.compact,
        )
        return AnnounceHandled(reply=reply, record=record, logged=logged)

    def _numwant(self, asked: int | None) -> int:
        if asked is None:
            return min(self.config.default_numwant, self.config.max_numwant)
        return min(asked, self.config.max_numwant)

    def _select_peers(
        self, swarm: Swarm, requester: PeerRecord, numwant: int
    ) -> tuple[PeerContact, ...]:
        """A uniform random sample of other active peers; a seed gets only leechers.

        Never the requester itself: not its peer_id (in any family) nor its address.
        """
        if numwant <= 0:
            return ()
        pools = (
            [swarm.leechers.items]
            if requester.left == 0
            else [
                swarm.leechers.items,
                swarm.seeds.items,
            ]
        )
        total = sum(len(pool) for pool in pools)
        # Draw a few extra so that dropping the requester (and its other family)
        # still leaves numwant when the swarm has that many.
        picks = self._rng.sample(range(total), min(total, numwant + 2))
        chosen: list[PeerContact] = []
        for index in picks:
            pool = pools[0]
            if index >= len(pool):
                index -= len(pool)
                pool = pools[1]
            record = swarm.records[pool[index]]
            if record.peer_id == requester.peer_id or (
                record.ip == requester.ip and record.port == requester.port
            ):
                continue
            if record.port == 0:
                continue  # a WebRTC-only peer (tracker/websocket.py): no address to hand out
            chosen.append(PeerContact(record.peer_id, record.ip, record.port, record.family))
            if len(chosen) == numwant:
                break
        return tuple(chosen)

    # -- timers -----------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When the next active peer would expire or the next record that left is to
        be forgotten; None when neither can happen."""
        expiry = self._next_expiry()
        forget = self._next_forget()
        if expiry is None:
            return forget
        return expiry if forget is None else min(expiry, forget)

    def _next_forget(self) -> float | None:
        while self._forget:
            deadline, info_hash, peer_id, family = self._forget[0]
            record = self.record(info_hash, (peer_id, AddressFamily(family)))
            if record is not None and not record.active and self._forget_at(record) == deadline:
                return deadline
            heapq.heappop(self._forget)  # stale: came back, or already forgotten
        return None

    def _next_expiry(self) -> float | None:
        while self._expiry:
            deadline, info_hash, peer_id, family = self._expiry[0]
            record = self.record(info_hash, (peer_id, AddressFamily(family)))
            if record is not None and record.active:
                current = self._deadline(record)
                if current == deadline:
                    return deadline
                if current < deadline:
                    # A fresher view moved last_seen back (shared store): re-arm.
                    fresher = (current, info_hash, peer_id, family)
                    heapq.heapreplace(self._expiry, fresher)
                    continue
            heapq.heappop(self._expiry)  # stale: the peer announced again or left
        return None

    def handle_timer(self, *, now: float) -> list[PeerExpired]:
        """Expire every active peer silent for the TTL or longer, and forget records
        that left ``record_ttl_s`` ago (with their swarm once it is empty)."""
        while (deadline := self._next_forget()) is not None and deadline <= now:
            _, info_hash, peer_id, family = heapq.heappop(self._forget)
            swarm = self._swarms[info_hash]
            key = (peer_id, AddressFamily(family))
            gone = swarm.records[key]
            swarm.drop(key)
            swarm.forgotten = swarm.forgotten.plus(gone)
            self._forgotten_records.append(gone)
            self._note(swarm)
            if info_hash not in self._swarms:
                self._forgotten_swarms.append(info_hash)
        expired: list[PeerExpired] = []
        while True:
            deadline = self._next_expiry()
            if deadline is None or deadline > now:
                return expired
            _, info_hash, peer_id, family = heapq.heappop(self._expiry)
            swarm = self._swarms[info_hash]
            old = swarm.records[(peer_id, AddressFamily(family))]
            record = replace(
                old,
                active=False,
                leave_rule=LeaveRule.EXPIRED,
                left_at=now,
                version=old.version + 1,
            )
            self._put(swarm, record)  # inactive: armed to be forgotten
            expired.append(
                PeerExpired(
                    record=record,
                    logged=TrackerEvent(
                        at=now,
                        info_hash=info_hash,
                        peer_id=record.peer_id,
                        family=record.family,
                        event="expired",
                        uploaded_total=record.uploaded_total,
                        downloaded_total=record.downloaded_total,
                        left=record.left,
                        leave_rule=LeaveRule.EXPIRED,
                    ),
                )
            )
