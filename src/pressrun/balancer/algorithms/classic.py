"""The classic LVS / HAProxy schedulers, as references (002_ac8183302b4db82b.txt).

- ``rr``  round robin: the origins holding the issue in turn.
- ``wrr`` weighted round robin, nginx's smooth variant: each pick adds every origin's
  weight to its running credit, the origin with the most credit wins and pays back the
  sum of weights; over sum(w) picks origin i is chosen w_i times, interleaved.
- ``lc``  least connections: fewest active transfers, counting the picks made since
  its last status (the status lags the picks).
- ``wlc`` weighted least connections (LVS): fewest (active + picks) / weight.

Weights are the operator's (`OriginSpec.weight`); 002 argues they should come from a
benchmark of each server rather than a guess.
"""

from __future__ import annotations

import random
from collections.abc import Sequence, Set

from pressrun.balancer.algorithms.base import (
    Params,
    ScoredAlgorithm,
    ScoringAlgorithm,
    register_algorithm,
)
from pressrun.balancer.events import OriginSpec, OriginStatus


@register_algorithm
class RoundRobin(ScoringAlgorithm):
    """Plain round robin over the origins in rotation that hold the issue."""

    name = "rr"
    summary = "round robin (LVS rr)"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self._order: list[str] = sorted(self.specs)
        self._next = 0

    def _ensure(self, name: str) -> None:
        if name not in self.specs:
            self.specs[name] = OriginSpec(name, "")
        if name not in self._order:
            self._order.append(name)
            self._order.sort()

    def handle_status(self, status: OriginStatus, *, now: float) -> None:
        super().handle_status(status, now=now)
        self._ensure(status.name)

    def rank(
        self, issue_id: str, *, exclude: Set[str] = frozenset(), k: int = 3, now: float
    ) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        n = len(self._order)
        for step in range(n):
            name = self._order[(self._next + step) % n]
            status = self.statuses.get(name)
            if status is None or name in exclude or issue_id not in status.issues:
                continue
            found.append((name, float(n - step)))
            if len(found) == k:
                break
        return found

    def handle_pick(self, name: str, issue_id: str, *, now: float) -> None:
        if name in self._order:
            self._next = (self._order.index(name) + 1) % len(self._order)


@register_algorithm
class WeightedRoundRobin(ScoringAlgorithm):
    """Smooth weighted round robin (nginx): interleaved, proportional to weights."""

    name = "wrr"
    summary = "smooth weighted round robin (nginx / LVS wrr), operator weights"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.credit: dict[str, float] = {}

    def _weight(self, name: str) -> float:
        spec = self.specs.get(name)
        return spec.weight if spec is not None else 1.0

    def rank(
        self, issue_id: str, *, exclude: Set[str] = frozenset(), k: int = 3, now: float
    ) -> list[tuple[str, float]]:
        scored = [
            (self.credit.get(name, 0.0) + self._weight(name), name)
            for name, status in self.statuses.items()
            if name not in exclude and issue_id in status.issues and self._weight(name) > 0
        ]
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [(name, score) for score, name in scored[:k]]

    def handle_pick(self, name: str, issue_id: str, *, now: float) -> None:
        holders = [n for n, s in self.statuses.items() if issue_id in s.issues]
        total = 0.0
        for holder in holders:
            w = self._weight(holder)
            self.credit[holder] = self.credit.get(holder, 0.0) + w
            total += w
        self.credit[name] = self.credit.get(name, 0.0) - total

    def score(self, name: str, issue_id: str | None) -> float | None:
        if name not in self.statuses:
            return None
        return self.credit.get(name, 0.0) + self._weight(name)


class _ConnectionCounting(ScoredAlgorithm):
    """Shared by lc and wlc: active transfers plus picks not yet seen in a status."""

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.picks_since_status: dict[str, int] = {}

    def connections(self, name: str, status: OriginStatus) -> float:
        return float(status.active_transfers + self.picks_since_status.get(name, 0))

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        self.picks_since_status[name] = 0

    def on_pick(self, name: str, issue_id: str, *, now: float) -> None:
        self.picks_since_status[name] = self.picks_since_status.get(name, 0) + 1


@register_algorithm
class LeastConnections(_ConnectionCounting):
    """Fewest active transfers wins (LVS lc)."""

    name = "lc"
    summary = "least connections (LVS lc)"

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        return -self.connections(name, status)


@register_algorithm
class WeightedLeastConnections(_ConnectionCounting):
    """Fewest active transfers per unit of weight wins (LVS wlc)."""

    name = "wlc"
    summary = "weighted least connections (LVS wlc), operator weights"

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        spec = self.specs.get(name)
        weight = spec.weight if spec is not None else 1.0
        if weight <= 0:
            return float("-inf")
        return -self.connections(name, status) / weight

    def eligible(self, name: str, status: OriginStatus, issue_id: str) -> bool:
        spec = self.specs.get(name)
        return issue_id in status.issues and (spec is None or spec.weight > 0)
