"""The tracker as the ring's central administration (004_3e4b985b4cf14853.txt, III.A).

Per issue (info-hash): the piece count, hence every piece key (`pressrun.chord.pieces`),
and the list of supernodes with the ring id the tracker placed each at (balanced: the first
``expected_supernodes`` at the equal-share positions of `place_supernodes`, later
ones by `place_one_more`). A supernode registers, and registers again
every ``ttl_s / 3`` as a heartbeat; one not heard from for ``ttl_s`` leaves the list
(the others then drop its messages). Pure: ``now`` is passed in. The adapter keeps
the lists in the tracker's store (`pressrun.tracker.ring_store`) and hands them back
with `restore`: two tracker instances on one Redis share them, and a restarted one
gives the supernodes their ids back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pressrun.chord.ids import NodeRef
from pressrun.chord.pieces import piece_keys, place_one_more, place_supernodes

_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}$")
MAX_PIECES = 1 << 20
MAX_SUPERNODES = 1024


class RingError(ValueError):
    """A registration the tracker refuses; the message says why."""


@dataclass(slots=True)
class _Issue:
    num_pieces: int
    keys: list[int]
    supernodes: dict[str, tuple[int, float]] = field(default_factory=dict)  # address -> (id, seen)


@dataclass(frozen=True, slots=True)
class RingView:
    """What a joining node gets: the piece keys and the supernodes (bootstrap first)."""

    info_hash: str
    num_pieces: int
    piece_keys: tuple[int, ...]
    supernodes: tuple[NodeRef, ...]


class RingAdmin:
    def __init__(self, *, ttl_s: float = 30.0, expected_supernodes: int = 0) -> None:
        self.ttl_s = ttl_s
        self.expected_supernodes = expected_supernodes
        self._issues: dict[str, _Issue] = {}

    def register(self, info_hash: str, address: str, num_pieces: int, *, now: float) -> NodeRef:
        """Add (or refresh) a supernode; its placed id."""
        if not re.fullmatch(r"[0-9a-f]{40}", info_hash):
            raise RingError("info_hash must be 40 lowercase hex digits")
        if not _HOSTPORT.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise RingError("address must be host:port")
        if not 0 < num_pieces <= MAX_PIECES:
            raise RingError(f"num_pieces must be 1..{MAX_PIECES}")
        issue = self._issues.get(info_hash)
        if issue is None:
            issue = self._issues[info_hash] = _Issue(num_pieces, piece_keys(info_hash, num_pieces))
        elif issue.num_pieces != num_pieces:
            raise RingError(
                f"this issue has {issue.num_pieces} pieces, not {num_pieces}: wrong torrent?"
            )
        self._expire(issue, now)
        known = issue.supernodes.get(address)
        if known is not None:
            issue.supernodes[address] = (known[0], now)
            return NodeRef(known[0], address)
        if len(issue.supernodes) >= MAX_SUPERNODES:
            raise RingError("this issue has as many supernodes as it can take")
        taken = [i for i, _ in issue.supernodes.values()]
        slots = (
            [s for s in place_supernodes(issue.keys, self.expected_supernodes) if s not in taken]
            if len(taken) < self.expected_supernodes
            else []
        )
        # an equal-share slot while there are some free (spread out: every other one
        # first), else split the most loaded arc
        node_id = slots[::2][0] if slots else place_one_more(taken, issue.keys)
        issue.supernodes[address] = (node_id, now)
        return NodeRef(node_id, address)

    def members(self, info_hash: str) -> tuple[int, dict[str, tuple[int, float]]] | None:
        """(num_pieces, address -> (id, last seen)) of one issue, for the store."""
        issue = self._issues.get(info_hash)
        return None if issue is None else (issue.num_pieces, dict(issue.supernodes))

    def restore(
        self, info_hash: str, num_pieces: int, members: dict[str, tuple[int, float]]
    ) -> None:
        """Replace one issue's list with what the store holds (another instance's too)."""
        issue = self._issues.get(info_hash)
        if issue is None or issue.num_pieces != num_pieces:
            issue = self._issues[info_hash] = _Issue(num_pieces, piece_keys(info_hash, num_pieces))
        issue.supernodes = dict(members)

    def leave(self, info_hash: str, address: str) -> bool:
        """A supernode that leaves gracefully is off the list at once."""
        issue = self._issues.get(info_hash)
        return issue is not None and issue.supernodes.pop(address, None) is not None

    def view(self, info_hash: str, *, now: float) -> RingView | None:
        """The issue's keys and live supernodes, longest-known first (None: no ring)."""
        issue = self._issues.get(info_hash)
        if issue is None:
            return None
        self._expire(issue, now)
        if not issue.supernodes:
            return None
        nodes = tuple(NodeRef(i, a) for a, (i, _) in issue.supernodes.items())
        return RingView(info_hash, issue.num_pieces, tuple(issue.keys), nodes)

    def _expire(self, issue: _Issue, now: float) -> None:
        for addr, (_, seen) in list(issue.supernodes.items()):
            if now - seen > self.ttl_s:
                del issue.supernodes[addr]
