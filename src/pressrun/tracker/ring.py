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

**Made-up ring state** (docs/chord.md, "Strangers"; issue 25, finding 4):

- *the piece count is the published torrent's* (``published_pieces``: the tracker reads
  it from the signed bundles it allows); a registration naming another count is refused
  and leaves nothing behind. For an issue the tracker has no torrent of (an open
  tracker, or an info-hash allowed by hand) the first registration fixes the count, at
  most `MAX_PIECES`, but only while a supernode that named it is alive: once they are
  all silent past the TTL, a registration may name another;
- *one host takes at most ``max_per_host`` places on a ring* (`RingFull`, 429): 1,024
  registrations from one address on different ports filled the ring before;
- *a supernode keeps its id*: one that leaves the list by silence (a busy host, the
  tracker down) is given the same id when it registers again within
  ``forget_ids_s``, if nobody took it meanwhile (issue 24, item 3: it came back at a
  new id and, never adopting it, stayed a ring of its own);
- *nothing is kept for rings that are gone*: an issue without a live supernode and
  without an id to give back is forgotten (swept every ``ttl_s``), and the tracker
  keeps at most ``max_issues`` rings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pressrun.chord.ids import NodeRef, host_of
from pressrun.chord.pieces import piece_keys, place_one_more, place_supernodes

_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}$")
#: the most pieces the tracker believes of an issue it has no torrent of (65,536
#: pieces of the publisher's default 128 KiB: 8 GiB); a published torrent's own count
#: is taken as it is
MAX_PIECES = 1 << 16
MAX_SUPERNODES = 1024
#: places on one ring for one host (an origin runs one supernode per issue; the
#: loopback benches and tests run up to eight on 127.0.0.1)
MAX_PER_HOST = 8
#: rings the tracker keeps at once (each live, or with ids to give back)
MAX_ISSUES = 4096


class RingError(ValueError):
    """A registration the tracker refuses; the message says why."""


class RingFull(RingError):
    """A registration refused for a limit (the host's places, the ring's, the
    tracker's rings): it may succeed later (HTTP 429)."""


@dataclass(slots=True)
class _Issue:
    num_pieces: int
    keys: list[int]
    supernodes: dict[str, tuple[int, float]] = field(default_factory=dict)  # address -> (id, seen)
    #: supernodes that left the list by silence: address -> (id, last seen)
    gone: dict[str, tuple[int, float]] = field(default_factory=dict)
    keys_hex: tuple[str, ...] = ()

    def hex_keys(self) -> tuple[str, ...]:
        # (encoded once: an issue of many pieces is asked for by every peer)
        if len(self.keys_hex) != len(self.keys):
            self.keys_hex = tuple(f"{k:040x}" for k in self.keys)
        return self.keys_hex


@dataclass(frozen=True, slots=True)
class RingView:
    """What a joining node gets: the piece keys and the supernodes (bootstrap first)."""

    info_hash: str
    num_pieces: int
    piece_keys: tuple[int, ...]
    supernodes: tuple[NodeRef, ...]
    #: the piece keys as 40 hex digits each (what the HTTP answer carries)
    piece_keys_hex: tuple[str, ...] = ()


def _never_published(info_hash: str) -> int | None:
    return None


class RingAdmin:
    def __init__(
        self,
        *,
        ttl_s: float = 30.0,
        expected_supernodes: int = 0,
        published_pieces: Callable[[str], int | None] = _never_published,
        max_per_host: int = MAX_PER_HOST,
        forget_ids_s: float = 3600.0,
        max_issues: int = MAX_ISSUES,
    ) -> None:
        """``published_pieces``: the piece count of an issue's published torrent by
        info-hash (40 lowercase hex), None when the tracker has none."""
        self.ttl_s = ttl_s
        self.expected_supernodes = expected_supernodes
        self.published_pieces = published_pieces
        self.max_per_host = max_per_host
        self.forget_ids_s = forget_ids_s
        self.max_issues = max_issues
        self._issues: dict[str, _Issue] = {}
        self._sweep_at = float("-inf")
        #: rings forgotten since `take_forgotten` (their rows leave the store)
        self._forgotten: list[str] = []

    def register(self, info_hash: str, address: str, num_pieces: int, *, now: float) -> NodeRef:
        """Add (or refresh) a supernode; its placed id."""
        if not re.fullmatch(r"[0-9a-f]{40}", info_hash):
            raise RingError("info_hash must be 40 lowercase hex digits")
        if not _HOSTPORT.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise RingError("address must be host:port")
        published = self.published_pieces(info_hash)
        if published is not None and num_pieces != published:
            raise RingError(
                f"this issue's torrent has {published} pieces, not {num_pieces}: wrong torrent?"
            )
        if published is None and not 0 < num_pieces <= MAX_PIECES:
            raise RingError(f"num_pieces must be 1..{MAX_PIECES}")
        self._sweep(now)
        issue = self._issues.get(info_hash)
        if issue is not None:
            self._expire(issue, now)
            if issue.num_pieces != num_pieces:
                # a count nobody published stands only while a supernode that named
                # it lives (a published count replaces whatever was fixed before)
                if issue.supernodes and published is None:
                    raise RingError(
                        f"this issue has {issue.num_pieces} pieces, not {num_pieces}: "
                        "wrong torrent?"
                    )
                issue = None
        if issue is None:
            if info_hash not in self._issues and len(self._issues) >= self.max_issues:
                self._sweep(now, force=True)
                if len(self._issues) >= self.max_issues:
                    raise RingFull("the tracker keeps as many rings as it can; try again later")
            issue = self._issues[info_hash] = _Issue(num_pieces, piece_keys(info_hash, num_pieces))
        known = issue.supernodes.get(address)
        if known is not None:
            issue.supernodes[address] = (known[0], now)
            return NodeRef(known[0], address)
        host = host_of(address)
        here = sum(1 for a in issue.supernodes if host_of(a) == host)
        if here >= self.max_per_host:
            raise RingFull(f"{host} has {here} supernodes on this ring already (at most)")
        if len(issue.supernodes) >= MAX_SUPERNODES:
            raise RingFull("this issue has as many supernodes as it can take")
        taken = [i for i, _ in issue.supernodes.values()]
        node_id = self._id_back(issue, address, taken, now)
        if node_id is None:
            placed = (
                place_supernodes(issue.keys, self.expected_supernodes)
                if len(taken) < self.expected_supernodes
                else []
            )
            slots = [s for s in placed if s not in taken]
            # an equal-share slot while there are some free (spread out: every other
            # one first), else split the most loaded arc
            node_id = slots[::2][0] if slots else place_one_more(taken, issue.keys)
        issue.supernodes[address] = (node_id, now)
        return NodeRef(node_id, address)

    def _id_back(self, issue: _Issue, address: str, taken: list[int], now: float) -> int | None:
        # the id a supernode had before it went silent, if it is nobody else's now
        was = issue.gone.pop(address, None)
        if was is None or now - was[1] > self.forget_ids_s or was[0] in taken:
            return None
        return was[0]

    def members(self, info_hash: str) -> tuple[int, dict[str, tuple[int, float]]] | None:
        """(num_pieces, address -> (id, last seen)) of one issue, for the store."""
        issue = self._issues.get(info_hash)
        return None if issue is None else (issue.num_pieces, dict(issue.supernodes))

    def restore(
        self, info_hash: str, num_pieces: int, members: dict[str, tuple[int, float]]
    ) -> None:
        """Replace one issue's list with what the store holds (another instance's too);
        a list whose piece count is not the published torrent's is not taken."""
        published = self.published_pieces(info_hash)
        if published is not None and published != num_pieces:
            return
        issue = self._issues.get(info_hash)
        if issue is None or issue.num_pieces != num_pieces:
            if issue is None and not members:
                return
            issue = self._issues[info_hash] = _Issue(num_pieces, piece_keys(info_hash, num_pieces))
        issue.supernodes = dict(members)
        for address in members:
            issue.gone.pop(address, None)

    def leave(self, info_hash: str, address: str) -> bool:
        """A supernode that leaves gracefully is off the list at once (its id is not
        kept for it)."""
        issue = self._issues.get(info_hash)
        return issue is not None and issue.supernodes.pop(address, None) is not None

    def view(self, info_hash: str, *, now: float) -> RingView | None:
        """The issue's keys and live supernodes, longest-known first (None: no ring)."""
        self._sweep(now)
        issue = self._issues.get(info_hash)
        if issue is None:
            return None
        self._expire(issue, now)
        if not issue.supernodes:
            return None
        nodes = tuple(NodeRef(i, a) for a, (i, _) in issue.supernodes.items())
        return RingView(info_hash, issue.num_pieces, tuple(issue.keys), nodes, issue.hex_keys())

    def issues(self) -> list[str]:
        """The info-hashes of the rings the tracker keeps (live, or with ids to give
        back)."""
        return list(self._issues)

    def _expire(self, issue: _Issue, now: float) -> None:
        for addr, (node_id, seen) in list(issue.supernodes.items()):
            if now - seen > self.ttl_s:
                del issue.supernodes[addr]
                issue.gone[addr] = (node_id, seen)
        for addr, (_, seen) in list(issue.gone.items()):
            if now - seen > self.forget_ids_s:
                del issue.gone[addr]
        while len(issue.gone) > MAX_SUPERNODES:  # (the longest gone first)
            del issue.gone[next(iter(issue.gone))]

    def _sweep(self, now: float, *, force: bool = False) -> None:
        # every ttl_s: expire every ring, forget those with nothing left
        if not force and now < self._sweep_at:
            return
        self._sweep_at = now + self.ttl_s
        for info_hash, issue in list(self._issues.items()):
            self._expire(issue, now)
            if not issue.supernodes and not issue.gone:
                del self._issues[info_hash]
                self._forgotten.append(info_hash)

    def take_forgotten(self) -> list[str]:
        """The rings forgotten since the last call (the adapter drops their rows)."""
        out, self._forgotten = self._forgotten, []
        return out
