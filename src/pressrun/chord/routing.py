"""One Chord node's view of the ring, pure: predecessor, successor list, fingers.

Stoica et al. (SIGCOMM 2001; ToN 2003) IV.C and IV.E.3: a successor list of r nodes
(the first is *the* successor), a predecessor, and 160 fingers,
finger[i] = successor(id + 2^i). The node's protocol (`pressrun.chord.core`) decides
when these change; this module keeps them consistent: the distinct fingers and
successors sorted by clockwise distance (cached until a table changes), the closest
preceding nodes of a key, forgetting a dead node everywhere at once, and the
membership filter (`restrict_to`: nodes outside the tracker's list are never trusted).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from pressrun.chord.ids import ID_BITS, RING, NodeRef, distance, in_half_open


class RoutingTable:
    """Predecessor, successor list and fingers of the node ``me``."""

    def __init__(self, me: NodeRef, successor_list_size: int) -> None:
        self.me = me
        self.successor_list_size = successor_list_size
        self.predecessor: NodeRef | None = None
        self._successors: list[NodeRef] = []
        self._fingers: list[NodeRef | None] = [None] * ID_BITS
        self._sorted: list[NodeRef] | None = None  # distinct fingers + successors, cached
        self._sorted_dists: list[int] = []
        self.members: frozenset[int] | None = None

    # --- the tables (a change drops the sorted cache) -------------------------------

    @property
    def successors(self) -> list[NodeRef]:
        return self._successors

    @successors.setter
    def successors(self, nodes: list[NodeRef]) -> None:
        self._successors = nodes
        self._sorted = None

    @property
    def fingers(self) -> list[NodeRef | None]:
        return self._fingers

    @fingers.setter
    def fingers(self, nodes: list[NodeRef | None]) -> None:
        self._fingers = nodes
        self._sorted = None

    @property
    def successor(self) -> NodeRef:
        return self._successors[0] if self._successors else self.me

    def adopt(
        self,
        predecessor: NodeRef | None,
        successors: Sequence[NodeRef],
        fingers: Sequence[NodeRef | None],
    ) -> None:
        """Take a whole state as is (a simulator starting from a converged ring)."""
        self.predecessor = predecessor
        self.successors = list(successors)[: self.successor_list_size] or [self.me]
        self.fingers = list(fingers)

    # --- membership ------------------------------------------------------------------

    def restrict_to(self, member_ids: Iterable[int] | None) -> None:
        """Trust only these node ids (None: anyone); forget known nodes outside them."""
        self.members = None if member_ids is None else frozenset(member_ids) | {self.me.id}
        if self.members is None:
            return
        keep = self.members
        self.successors = [s for s in self._successors if s.id in keep]
        if self.predecessor is not None and self.predecessor.id not in keep:
            self.predecessor = None
        self.fingers = [f if f is not None and f.id in keep else None for f in self._fingers]

    def trusted(self, node: NodeRef) -> bool:
        return self.members is None or node.id in self.members

    def filter(self, nodes: Iterable[NodeRef]) -> list[NodeRef]:
        return [n for n in nodes if self.trusted(n)]

    # --- routing ---------------------------------------------------------------------

    def by_distance(self) -> tuple[list[NodeRef], list[int]]:
        """Distinct fingers and successors sorted by clockwise distance from us."""
        if self._sorted is None:
            seen: dict[int, NodeRef] = {}
            for n in self._fingers:
                if n is not None and n.id != self.me.id:
                    seen[n.id] = n
            for n in self._successors:
                if n.id != self.me.id:
                    seen[n.id] = n
            nodes = sorted(seen.values(), key=lambda n: distance(self.me.id, n.id))
            self._sorted = nodes
            self._sorted_dists = [distance(self.me.id, n.id) for n in nodes]
        return self._sorted, self._sorted_dists

    def closest_preceding(self, key: int, limit: int) -> list[NodeRef]:
        """Known nodes in (self, key), closest to ``key`` first (at most ``limit``)."""
        nodes, dists = self.by_distance()
        # (key == our own id: every other node precedes it)
        cut = bisect.bisect_left(dists, distance(self.me.id, key) or RING)
        return nodes[max(0, cut - limit) : cut][::-1]

    def forget(self, node: NodeRef) -> None:
        """A dead or departed node out of every table."""
        if node.id == self.me.id:
            return
        self.successors = [s for s in self._successors if s.id != node.id]
        if not self._successors:
            # nothing left in the list: the closest finger, else alone
            known, _ = self.by_distance()
            alive = [n for n in known if n.id != node.id]
            self.successors = [alive[0]] if alive else [self.me]
        if self.predecessor is not None and self.predecessor.id == node.id:
            self.predecessor = None
        self.fingers = [None if f is not None and f.id == node.id else f for f in self._fingers]

    def learn_successors(self, first: NodeRef, rest: Iterable[NodeRef]) -> None:
        """The successor list becomes ``first`` and the trusted ``rest`` up to ourselves."""
        lst = [first]
        for n in self.filter(rest):
            if n.id == self.me.id:
                break  # wrapped around the ring
            if all(n.id != m.id for m in lst):
                lst.append(n)
        self.successors = lst[: self.successor_list_size]

    # --- fingers ---------------------------------------------------------------------

    def finger_start(self, i: int) -> int:
        return (self.me.id + (1 << i)) % RING

    def set_fingers_from(self, i: int, succ: NodeRef) -> int:
        """finger[i] = succ, and every following finger whose start precedes succ too;
        returns the next finger to look up."""
        j = i
        while j < ID_BITS and (
            succ.id == self.me.id or in_half_open(self.finger_start(j), self.me.id, succ.id)
        ):
            self._fingers[j] = succ
            j += 1
            if succ.id == self.me.id:
                break
        self._sorted = None
        return j % ID_BITS if j > i else (i + 1) % ID_BITS
