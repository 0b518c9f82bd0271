"""One torrent's swarm: its peer records, its seeds and leechers indexed, and the
fair-exit rule. Pure.

The fair-exit rule of 004_3e4b985b4cf14853.txt (III.A): "once a node has uploaded as
much content as it has downloaded, it can leave the network". The peer decides; its
``stopped`` announce names the rule (``leave_rule=ratio|not_needed|max_seed_time|
user``), and ``ratio`` and ``not_needed`` count as leaving fairly. ``needs_seeds`` is
the tracker's half of "nobody needs me any more".

A ``stopped`` announce claiming a fair rule is checked against the swarm's own totals
(``supported_rule``): a peer cannot have uploaded more than the other peers could have
downloaded, ``ratio`` needs something downloaded and at least as much uploaded,
``not_needed`` needs the tracker to agree that seeds are not needed; a claim that
fails is recorded as ``claim_refused``, which is not fair.

Records that left are forgotten an hour after they left (`pressrun.tracker.core`), but
what fairness accounting needs of them stays, summed per swarm (`ForgottenTotals`):
bytes moved, completions, how many left by which rule. ``stats`` and the upload bound
of ``supported_rule`` count them, so forgetting a record changes no total.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pressrun.tracker.events import AddressFamily, LeaveRule, PeerRecord, SwarmStats

PeerKey = tuple[bytes, AddressFamily]


@dataclass(frozen=True, slots=True)
class ForgottenTotals:
    """What the forgotten records of one swarm add to its totals (fairness accounting).

    ``left_by_rule`` maps a `LeaveRule` value to how many forgotten records left by it.
    """

    peers: int = 0
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    completed: int = 0
    left_by_rule: tuple[tuple[str, int], ...] = ()

    def plus(self, record: PeerRecord) -> ForgottenTotals:
        """These totals with ``record`` folded in (it is being forgotten)."""
        rules = dict(self.left_by_rule)
        if record.leave_rule is not None:
            rule = record.leave_rule.value
            rules[rule] = rules.get(rule, 0) + 1
        return ForgottenTotals(
            peers=self.peers + 1,
            uploaded_bytes=self.uploaded_bytes + record.uploaded_total,
            downloaded_bytes=self.downloaded_bytes + record.downloaded_total,
            completed=self.completed + record.completed_count,
            left_by_rule=tuple(sorted(rules.items())),
        )

    def __add__(self, other: ForgottenTotals) -> ForgottenTotals:
        rules = dict(self.left_by_rule)
        for rule, n in other.left_by_rule:
            rules[rule] = rules.get(rule, 0) + n
        return ForgottenTotals(
            peers=self.peers + other.peers,
            uploaded_bytes=self.uploaded_bytes + other.uploaded_bytes,
            downloaded_bytes=self.downloaded_bytes + other.downloaded_bytes,
            completed=self.completed + other.completed,
            left_by_rule=tuple(sorted(rules.items())),
        )


class _IndexedKeys:
    """A set of peer keys that also supports O(1) random access (for sampling)."""

    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[PeerKey] = []
        self.pos: dict[PeerKey, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, key: PeerKey) -> None:
        if key not in self.pos:
            self.pos[key] = len(self.items)
            self.items.append(key)

    def discard(self, key: PeerKey) -> None:
        index = self.pos.pop(key, None)
        if index is None:
            return
        last = self.items.pop()
        if index < len(self.items):
            self.items[index] = last
            self.pos[last] = index


@dataclass(slots=True)
class Swarm:
    """One torrent's records, with its active seeds and leechers indexed."""

    info_hash: bytes
    records: dict[PeerKey, PeerRecord] = field(default_factory=dict)
    seeds: _IndexedKeys = field(default_factory=_IndexedKeys)
    leechers: _IndexedKeys = field(default_factory=_IndexedKeys)
    forgotten: ForgottenTotals = field(default_factory=ForgottenTotals)
    # keys of the records that left, in the order they left (the first is the one to
    # forget early when the swarm holds as many records as it may)
    left_order: dict[PeerKey, None] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Whether any peer is active (a swarm with none is dead and may be forgotten)."""
        return len(self.seeds) + len(self.leechers) > 0

    def put(self, record: PeerRecord) -> None:
        """File ``record``, moving its key between seeds, leechers and neither."""
        key = record.peer_key
        self.records[key] = record
        self.seeds.discard(key)
        self.leechers.discard(key)
        self.left_order.pop(key, None)
        if record.active:
            (self.seeds if record.left == 0 else self.leechers).add(key)
        else:
            self.left_order[key] = None

    def drop(self, key: PeerKey) -> None:
        """Forget a record (a shared store no longer has it)."""
        self.records.pop(key, None)
        self.seeds.discard(key)
        self.leechers.discard(key)
        self.left_order.pop(key, None)

    def stats(self) -> SwarmStats:
        """Counts and totals; bytes are summed per peer_id, the largest family's."""
        up: dict[bytes, int] = {}
        down: dict[bytes, int] = {}
        by_rule = {rule.value: 0 for rule in LeaveRule}
        for rule, n in self.forgotten.left_by_rule:
            by_rule[rule] = by_rule.get(rule, 0) + n
        completed = self.forgotten.completed
        for record in self.records.values():
            up[record.peer_id] = max(up.get(record.peer_id, 0), record.uploaded_total)
            down[record.peer_id] = max(down.get(record.peer_id, 0), record.downloaded_total)
            completed += record.completed_count
            if not record.active and record.leave_rule is not None:
                by_rule[record.leave_rule.value] += 1
        seeds, leechers = len(self.seeds), len(self.leechers)
        return SwarmStats(
            info_hash=self.info_hash,
            seeds=seeds,
            leechers=leechers,
            completed=completed,
            uploaded_bytes=sum(up.values()) + self.forgotten.uploaded_bytes,
            downloaded_bytes=sum(down.values()) + self.forgotten.downloaded_bytes,
            left_by_rule=by_rule,
            left_fairly=sum(n for rule, n in by_rule.items() if LeaveRule(rule).fair),
            needs_seeds=needs_seeds(seeds=seeds, leechers=leechers),
        )


def others_download_bound(swarm: Swarm, peer_id: bytes) -> int:
    """The most the other peers of ``swarm`` can have downloaded: their reported totals
    plus, for an active leecher, what it still has ``left`` (it may have received that
    much since its last announce), and what forgotten records downloaded. Everything a
    peer uploaded was downloaded by one of them, so this bounds any one peer's credible
    upload."""
    total = swarm.forgotten.downloaded_bytes
    for record in swarm.records.values():
        if record.peer_id == peer_id:
            continue
        total += record.downloaded_total
        if record.active and record.left > 0:
            total += record.left
    return total


def supported_rule(swarm: Swarm, record: PeerRecord, claimed: LeaveRule) -> LeaveRule:
    """``claimed`` if the swarm's totals support it, else ``CLAIM_REFUSED``.

    ``record`` is the leaving peer's record after its ``stopped`` announce; ``swarm``
    still files it as before the announce (so the seed counts include it)."""
    if claimed is LeaveRule.RATIO:
        credible_up = min(record.uploaded_total, others_download_bound(swarm, record.peer_id))
        # Nothing credible uploaded is never a reason; a first seed that downloaded
        # nothing and uploaded what the others did download qualifies.
        if credible_up <= 0 or credible_up < record.downloaded_total:
            return LeaveRule.CLAIM_REFUSED
    elif claimed is LeaveRule.NOT_NEEDED and needs_seeds(
        seeds=len(swarm.seeds), leechers=len(swarm.leechers)
    ):
        return LeaveRule.CLAIM_REFUSED
    return claimed


def needs_seeds(*, seeds: int, leechers: int) -> bool:
    """Whether the swarm still wants its seeds: someone is downloading and the seeds
    do not outnumber the leechers (so one seed leaving would leave fewer seeds than
    leechers). A seed for which this is false may leave by ``not_needed``.
    """
    return leechers > 0 and seeds <= leechers
