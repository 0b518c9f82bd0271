"""The scoring-algorithm interface, its registry, and a ranked index.

An algorithm sees origin statuses as they are refreshed, ranks the origins holding an
issue, and is told which origin was picked. It is pure: no clock (every entry point
takes `now`), no I/O, randomness only from the `random.Random` it is given. The
service and the simulator drive the same classes.

Most algorithms are "score the origins, pick the best". For those, `ScoredAlgorithm`
keeps, per issue, a max-heap of scores with lazy invalidation, so a decision costs
O(k log n) instead of scoring every origin: a pick changes only the picked origin's
score and a refresh only the refreshed origin's, so only that entry is re-pushed.
"""

from __future__ import annotations

import heapq
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence, Set
from typing import ClassVar

from pressrun.balancer.events import ClientHint, OriginSpec, OriginStatus

Params = Mapping[str, float]


class ScoringAlgorithm(ABC):
    """A balancing algorithm: feeds on statuses, ranks origins, learns from picks."""

    name: ClassVar[str]
    #: one line for `--help` and /v1/origins: what it is and where it comes from
    summary: ClassVar[str]

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        self.specs: dict[str, OriginSpec] = {o.name: o for o in origins}
        self.rng = rng
        self.params: dict[str, float] = dict(params or {})
        # Latest status of each origin in rotation; an origin out of rotation is absent.
        self.statuses: dict[str, OriginStatus] = {}
        # What one transfer of an issue needs, bytes/s, where known (set_issue_need).
        self.issue_needs: dict[str, float] = {}
        self.paced_issues: set[str] = set()
        # A download's deadline (s from its request), where stated (set_issue_need).
        self.issue_deadlines: dict[str, float] = {}

    def param(self, key: str, default: float) -> float:
        """An algorithm parameter from config, or its documented default."""
        return float(self.params.get(key, default))

    def handle_status(self, status: OriginStatus, *, now: float) -> None:
        """A fresh status of one origin (a "data refresh" in the paper's pseudocode)."""
        self.statuses[status.name] = status

    def handle_origin_down(self, name: str, *, now: float) -> None:
        """The origin left the rotation; forget its status until it comes back."""
        self.statuses.pop(name, None)

    def set_issue_need(
        self,
        issue_id: str,
        need_bytes_per_s: float,
        *,
        paced: bool = False,
        deadline_s: float | None = None,
    ) -> None:
        """What one transfer of an issue needs to succeed, in bytes/s.

        A stream's bitrate (`paced`: it fails as soon as it gets less), or a download's
        size over the time it should take (elastic: it needs that on average), that
        time being `deadline_s` where known (a download's size is then need x deadline).
        Only algorithms that reason per byte (`headroom`) read it; the others ignore it.
        """
        if not need_bytes_per_s > 0:
            raise ValueError(f"need of {issue_id!r} must be positive, got {need_bytes_per_s!r}")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline of {issue_id!r} must be positive, got {deadline_s!r}")
        self.issue_needs[issue_id] = need_bytes_per_s
        if deadline_s is None or paced:
            self.issue_deadlines.pop(issue_id, None)
        else:
            self.issue_deadlines[issue_id] = deadline_s
        if paced:
            self.paced_issues.add(issue_id)
        else:
            self.paced_issues.discard(issue_id)

    @abstractmethod
    def rank(
        self, issue_id: str, *, exclude: Set[str] = frozenset(), k: int = 3, now: float
    ) -> list[tuple[str, float]]:
        """Up to `k` origins holding `issue_id`, best first, with their scores.

        Empty when none is eligible. Ranking does not change state; `handle_pick` does.
        """

    @abstractmethod
    def handle_pick(self, name: str, issue_id: str, *, now: float) -> None:
        """The balancer sent a client to `name` for `issue_id`."""

    def rank_for(
        self,
        issue_id: str,
        client: ClientHint | None,
        *,
        exclude: Set[str] = frozenset(),
        k: int = 3,
        now: float,
    ) -> list[tuple[str, float]]:
        """`rank` for a client that told the balancer of itself (`ClientHint`: the bytes
        it has, its link's rate). Algorithms that count each transfer's need
        (`headroom`) rank by what this one needs; the others rank as for anyone."""
        return self.rank(issue_id, exclude=exclude, k=k, now=now)

    def handle_client_asks(self, issue_id: str, client_key: str, *, now: float) -> None:
        """A client (`client_key`: its address, an IPv6 /64) asks for the issue again,
        before it is ranked: the directive it may have had is replaced by this one.
        Algorithms that count picks as transfers on their way (`headroom`) take its
        pick back; the others ignore it."""
        return None

    def handle_pick_for(
        self,
        name: str,
        issue_id: str,
        client: ClientHint | None,
        *,
        now: float,
        client_key: str | None = None,
    ) -> None:
        """`handle_pick` for a client that told the balancer of itself (`rank_for`);
        `client_key`: who asked (`handle_client_asks`), None where each pick counts."""
        self.handle_pick(name, issue_id, now=now)

    def reserved_start(self, *, now: float) -> tuple[str, float] | None:
        """After `rank_for` answered no origin: a later start reserved instead (made
        now), as (token, start), when the client is to come back then (`headroom`'s
        reserved starts, docs/balancer.md); None: a plain refusal. The others never
        reserve."""
        return None

    def claim_reservation(
        self, issue_id: str, token: str, *, exclude: Set[str] = frozenset(), now: float
    ) -> list[tuple[str, float]] | float | None:
        """A client came back with a reservation (`reserved_start`'s token): its
        origin ranked alone when its start has come (the pick is then told as usual),
        the start (a float) when it came too early, None when the reservation is not
        held (unknown, expired, its origin failed for the client): it is placed anew."""
        return None

    def handle_pick_not_sent(self, name: str, issue_id: str, *, now: float) -> None:
        """The client of the last pick of `name` is told to use the swarm or the
        carousel first (a directive whose mode is not `origin`): it opens no transfer
        there now. Algorithms that count picks as transfers on their way (`headroom`)
        take it back; the others ignore it."""
        return None

    def score(self, name: str, issue_id: str | None) -> float | None:
        """The origin's current score for an issue (None if not scored), for display."""
        return None

    def explain(self, name: str, issue_id: str) -> dict[str, float]:
        """What the algorithm sees of one origin for an issue, for the decision log
        (``pressrun.balancer.decisions`` at DEBUG): its score, and what it is made of
        where the algorithm says more."""
        score = self.score(name, issue_id)
        return {} if score is None else {"score": score}

    def forget_issue(self, issue_id: str) -> None:
        """No origin in rotation holds the issue: drop any per-issue state (the core
        calls this so that what the algorithm keeps stays bounded)."""
        return None

    def holders(self, issue_id: str) -> list[str]:
        """Origins in rotation that hold the issue, in a stable order."""
        return sorted(n for n, s in self.statuses.items() if issue_id in s.issues)


class ScoredAlgorithm(ScoringAlgorithm):
    """An algorithm that is an argmax of a per-origin score ("best" dispatch, 003)."""

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self._index: dict[str, _RankedIndex] = {}
        self._versions: dict[str, int] = {}

    @abstractmethod
    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        """The score of one origin for one issue; higher is better."""

    def eligible(self, name: str, status: OriginStatus, issue_id: str) -> bool:
        """Whether the origin may be picked at all (default: it holds the issue)."""
        return issue_id in status.issues

    def score(self, name: str, issue_id: str | None) -> float | None:
        status = self.statuses.get(name)
        if status is None:
            return None
        if issue_id is None:
            issue_id = ""
        return self.compute_score(name, status, issue_id)

    def touch(self, name: str) -> None:
        """The origin's score changed for every issue: re-index it where next ranked.

        Lazy: the origin's version moves and each issue's index re-scores it when that
        issue is next ranked, so a refresh or a pick costs O(1) however many issues
        there are, and a ranking O(origins) version checks.
        """
        self._versions[name] = self._versions.get(name, 0) + 1

    def touch_all(self) -> None:
        """Every score may have changed (e.g. shared weights moved): rebuild lazily."""
        self._index.clear()

    def eligible_score(self, name: str, status: OriginStatus, issue_id: str) -> float | None:
        """The score if the origin is eligible for the issue, else None (one call for both,
        for algorithms whose eligibility and score share the work)."""
        if not self.eligible(name, status, issue_id):
            return None
        return self.compute_score(name, status, issue_id)

    def _reindex(self, index: _RankedIndex, name: str, issue_id: str) -> None:
        index.versions[name] = self._versions.get(name, 0)
        status = self.statuses.get(name)
        score = None if status is None else self.eligible_score(name, status, issue_id)
        if score is None:
            index.remove(name)
        else:
            index.put(name, score)

    def handle_status(self, status: OriginStatus, *, now: float) -> None:
        super().handle_status(status, now=now)
        self.on_refresh(status.name, status, now=now)
        self.touch(status.name)

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        """Hook run on each refresh of one origin, before it is re-indexed."""

    def set_issue_need(
        self,
        issue_id: str,
        need_bytes_per_s: float,
        *,
        paced: bool = False,
        deadline_s: float | None = None,
    ) -> None:
        super().set_issue_need(issue_id, need_bytes_per_s, paced=paced, deadline_s=deadline_s)
        self.touch_all()  # scores may count in needs

    def handle_origin_down(self, name: str, *, now: float) -> None:
        super().handle_origin_down(name, now=now)
        self.touch(name)

    def forget_issue(self, issue_id: str) -> None:
        self._index.pop(issue_id, None)

    def rank(
        self, issue_id: str, *, exclude: Set[str] = frozenset(), k: int = 3, now: float
    ) -> list[tuple[str, float]]:
        index = self._index.get(issue_id)
        if index is None:
            index = self._index[issue_id] = _RankedIndex()
        seen = index.versions
        for name, version in self._versions.items():
            if seen.get(name) != version:
                self._reindex(index, name, issue_id)
        return index.top(k, exclude)

    def handle_pick(self, name: str, issue_id: str, *, now: float) -> None:
        self.on_pick(name, issue_id, now=now)
        self.touch(name)

    def on_pick(self, name: str, issue_id: str, *, now: float) -> None:
        """Hook run after a pick, before the picked origin is re-indexed."""


class _RankedIndex:
    """Max-heap of (score, name) with lazy deletion; ties go to the smaller name."""

    __slots__ = ("_heap", "_live", "versions")

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._live: dict[str, float] = {}
        # the owner's version of each origin when it was last scored here
        self.versions: dict[str, int] = {}

    def put(self, name: str, score: float) -> None:
        if self._live.get(name) == score:
            return
        self._live[name] = score
        heapq.heappush(self._heap, (-score, name))
        if len(self._heap) > 4 * len(self._live) + 64:
            self._heap = [(-s, n) for n, s in self._live.items()]
            heapq.heapify(self._heap)

    def remove(self, name: str) -> None:
        self._live.pop(name, None)

    def top(self, k: int, exclude: Set[str]) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        popped: list[tuple[float, str]] = []
        seen: set[str] = set()
        heap = self._heap
        live = self._live
        while heap and len(found) < k:
            entry = heapq.heappop(heap)
            neg, name = entry
            if live.get(name) != -neg or name in seen:
                # Stale (re-scored or removed since), or a second live copy: an origin
                # removed and put back with its old score, or re-scored a -> b -> a,
                # has two entries that both match `_live`. Drop it either way.
                continue
            seen.add(name)
            popped.append(entry)
            if name not in exclude:
                found.append((name, -neg))
        for entry in popped:
            heapq.heappush(heap, entry)
        return found


AlgorithmFactory = Callable[[Sequence[OriginSpec], random.Random, Params | None], ScoringAlgorithm]
_REGISTRY: dict[str, type[ScoringAlgorithm]] = {}


def register_algorithm(cls: type[ScoringAlgorithm]) -> type[ScoringAlgorithm]:
    """Class decorator: make an algorithm available by its `name`."""
    if cls.name in _REGISTRY:
        raise ValueError(f"algorithm {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    """Every registered algorithm's name, sorted."""
    return sorted(_REGISTRY)


def algorithm_class(name: str) -> type[ScoringAlgorithm]:
    """The class registered under `name`; KeyError names the choices."""
    try:
        return _REGISTRY[name]
    except KeyError:
        choices = ", ".join(algorithm_names())
        raise KeyError(f"unknown algorithm {name!r}; choose one of: {choices}") from None


def make_algorithm(
    name: str,
    origins: Sequence[OriginSpec],
    rng: random.Random,
    params: Params | None = None,
) -> ScoringAlgorithm:
    """A new instance of the algorithm registered under `name`."""
    return algorithm_class(name)(origins, rng, params)
