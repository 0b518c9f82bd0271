"""Power of two choices, sampled in proportion to capacity (HAProxy `random(2)`, IPVS `twos`).

For each request, draw two distinct origins holding the issue, each with probability
proportional to its configured capacity ``capacity_bytes_per_s`` (without
replacement), and send the client to the less loaded of the two::

    load_i = (out_bytes_per_s_i + picks_since_status_i * est_i) / capacity_i

where ``est_i`` is the origin's mean transfer rate (or 64 KiB/s when unknown) and
``picks_since_status_i`` counts the clients sent there since its last status, so the
load estimate moves between refreshes. Random sampling is what protects p2c against
herding on stale numbers (Mitzenmacher 2001); the draws come from the `random.Random`
the algorithm is given. The ranking lists the winner, the other sampled origin, then
the rest by load.
"""

from __future__ import annotations

import random
from collections.abc import Sequence, Set

from pressrun.balancer.algorithms.alg2 import MIN_ESTIMATE_BYTES_PER_S
from pressrun.balancer.algorithms.base import Params, ScoringAlgorithm, register_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus


@register_algorithm
class PowerOfTwoChoices(ScoringAlgorithm):
    """Two origins drawn in proportion to capacity; the less loaded one wins."""

    name = "p2c"
    summary = "power of two choices, capacity-proportional sampling (HAProxy random(2), IPVS twos)"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.picks_since_status: dict[str, int] = {}

    def handle_status(self, status: OriginStatus, *, now: float) -> None:
        super().handle_status(status, now=now)
        self.picks_since_status[status.name] = 0

    def load(self, name: str, status: OriginStatus) -> float:
        """Outbound rate plus what the picks since the status will add, over capacity."""
        est = status.mean_transfer_bytes_per_s or MIN_ESTIMATE_BYTES_PER_S
        used = status.out_bytes_per_s + self.picks_since_status.get(name, 0) * est
        cap = status.capacity_bytes_per_s
        return used / cap if cap > 0 else float("inf")

    def score(self, name: str, issue_id: str | None) -> float | None:
        status = self.statuses.get(name)
        return None if status is None else -self.load(name, status)

    def rank(
        self, issue_id: str, *, exclude: Set[str] = frozenset(), k: int = 3, now: float
    ) -> list[tuple[str, float]]:
        candidates = [
            (name, status)
            for name, status in self.statuses.items()
            if name not in exclude and issue_id in status.issues
        ]
        if not candidates:
            return []
        candidates.sort(key=lambda item: item[0])  # a stable order for the draws
        sampled: list[tuple[str, OriginStatus]] = []
        pool = list(candidates)
        for _ in range(min(2, len(pool))):
            total = sum(max(s.capacity_bytes_per_s, 0.0) for _, s in pool)
            if total <= 0:
                index = self.rng.randrange(len(pool))
            else:
                x = self.rng.random() * total
                index = len(pool) - 1
                for i, (_, s) in enumerate(pool):
                    x -= max(s.capacity_bytes_per_s, 0.0)
                    if x < 0:
                        index = i
                        break
            sampled.append(pool.pop(index))
        sampled.sort(key=lambda item: (self.load(*item), item[0]))
        rest = sorted(pool, key=lambda item: (self.load(*item), item[0]))
        ranked = sampled + rest
        return [(name, -self.load(name, status)) for name, status in ranked[:k]]

    def handle_pick(self, name: str, issue_id: str, *, now: float) -> None:
        self.picks_since_status[name] = self.picks_since_status.get(name, 0) + 1
