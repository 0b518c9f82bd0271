"""Weighted dispatch of Peng 2005 (003_fb4a16d3be88866e.txt, section 3.1.4).

"Best" dispatch sends every session of a measuring period to the same best path and
congests it ("self-congested condition", Eq. 3). Weighted dispatch spreads them in
proportion to weights derived from the measurements::

    pick  argmin_i  SD_i / W_i                                      Eq. (4)
    W_i = max(W_max * Ratio(M_i, Best(M_path)), W_min)              Eq. (5)

SD_i is the number of sessions dispatched to origin i in the current measuring period
(since its last status). M_i is its available bandwidth measured by subtracting
traffic from the link's capacity, the last-mile form of Eq. (6):
``AB_i = FB_i - CL_i / (t_r - t_l)``, the configured capacity minus the measured
outbound rate; Best(M) is the largest AB and Ratio(M_i, Best) = M_i / Best.
W_max = 10 and W_min = 1 by default (parameters ``w_max``, ``w_min``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pressrun.balancer.algorithms.base import Params, ScoredAlgorithm, register_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus


def available_bandwidth(status: OriginStatus) -> float:
    """Eq. (6) at the last mile: capacity minus the measured outbound rate, >= 0."""
    return max(status.capacity_bytes_per_s - status.out_bytes_per_s, 0.0)


def dispatch_weight(available: float, best: float, w_max: float, w_min: float) -> float:
    """Eq. (5): W_i = max(W_max * M_i / Best(M), W_min)."""
    if best <= 0:
        return w_min
    return max(w_max * available / best, w_min)


@register_algorithm
class WeightedDispatch(ScoredAlgorithm):
    """Peng's weighted dispatch on available bandwidth (Eq. 4-6 of 003)."""

    name = "weighted"
    summary = "Peng 2005 weighted dispatch, Eq. (4)-(6): argmin sessions/weight"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.w_max = self.param("w_max", 10.0)
        self.w_min = self.param("w_min", 1.0)
        self.dispatched: dict[str, int] = {}
        self._best = 0.0

    def weight(self, status: OriginStatus) -> float:
        """W_i of Eq. (5) for one origin against the current best."""
        return dispatch_weight(available_bandwidth(status), self._best, self.w_max, self.w_min)

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        return -self.dispatched.get(name, 0) / self.weight(status)

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        # A new measuring period for this origin: its dispatch count starts again.
        self.dispatched[name] = 0
        best = max((available_bandwidth(s) for s in self.statuses.values()), default=0.0)
        if best != self._best:
            self._best = best
            self.touch_all()  # every W_i is relative to Best(M)

    def handle_origin_down(self, name: str, *, now: float) -> None:
        super().handle_origin_down(name, now=now)
        self._best = max((available_bandwidth(s) for s in self.statuses.values()), default=0.0)
        self.touch_all()

    def on_pick(self, name: str, issue_id: str, *, now: float) -> None:
        self.dispatched[name] = self.dispatched.get(name, 0) + 1
