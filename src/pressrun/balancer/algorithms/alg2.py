"""Algorithm 2 of Viëtor 2016 (000_9aae53f3113e9bd8.txt, section 4, Figure 2).

Score of a host, 0..3200::

    score  = cpuRate * 1000 + ramRate * 1000          (rates: share left, 0..1)
    score += 200 if the asset is already cached
    bwScore = max(0, 1000 - currentBandwidth * 1000 / availBandwidth)
    bwInfl  = bandwidthInflation * 1000 / availBandwidth
    if bwScore - bwInfl < 0: bwInfl = bwScore
    score += bwScore - bwInfl

After a host is chosen::

    toAdd = currentAverageBandwidth      (the asset's, else the host's, else 0.5 Mbit/s)
    toAdd = clamp(toAdd, 64 KiB/s, 1 MiB/s)        (0.5 .. 8 Mbit/s)
    bandwidthInflation += toAdd

Every data refresh (a new status from the host)::

    bandwidthInflation *= 0.9

The constants are parameters so that `mist` (MistServer's later defaults) can reuse
this class; the defaults are exactly the paper's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pressrun.balancer.algorithms.base import Params, ScoredAlgorithm, register_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus

KIB = 1024
#: the paper's default estimate and lower clamp: 64 KiB/s, "0.5 mbps"
MIN_ESTIMATE_BYTES_PER_S = 64 * KIB
#: the paper's upper clamp: 1 MiB/s, "8 mbps"
MAX_ESTIMATE_BYTES_PER_S = 1024 * KIB


def clamp_estimate(
    estimate_bytes_per_s: float | None,
    low: float = MIN_ESTIMATE_BYTES_PER_S,
    high: float = MAX_ESTIMATE_BYTES_PER_S,
) -> float:
    """The bandwidth a new session is assumed to use, clamped (Figure 2, lines 3-4)."""
    if estimate_bytes_per_s is None:
        return low
    return min(max(estimate_bytes_per_s, low), high)


def session_estimate(status: OriginStatus, issue_id: str) -> float | None:
    """The asset's mean bandwidth if known, else the host's mean, else None (section 4)."""
    by_issue = status.mean_transfer_bytes_per_s_by_issue.get(issue_id)
    if by_issue is not None and by_issue > 0:
        return by_issue
    if status.mean_transfer_bytes_per_s is not None and status.mean_transfer_bytes_per_s > 0:
        return status.mean_transfer_bytes_per_s
    return None


def bandwidth_points(
    out_bytes_per_s: float,
    capacity_bytes_per_s: float,
    inflation_bytes_per_s: float,
    full_points: float = 1000.0,
) -> float:
    """bwScore - bwInfl of Figure 2, lines 6-11: never below 0."""
    if capacity_bytes_per_s <= 0:
        return 0.0
    bw_score = full_points - out_bytes_per_s * full_points / capacity_bytes_per_s
    bw_score = max(bw_score, 0.0)
    bw_infl = inflation_bytes_per_s * full_points / capacity_bytes_per_s
    bw_infl = min(bw_infl, bw_score)
    return bw_score - bw_infl


def _rate_left(fraction_used: float) -> float:
    return 1.0 - min(max(fraction_used, 0.0), 1.0)


@register_algorithm
class Alg2(ScoredAlgorithm):
    """Viëtor's Algorithm 2: CPU+RAM+bandwidth points, cache bonus, predictive inflation."""

    name = "alg2"
    summary = "Viëtor 2016 Algorithm 2 (Figure 2): 0..3200 points, +200 cached, inflation x0.9"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.cpu_points = self.param("cpu_points", 1000.0)
        self.ram_points = self.param("ram_points", 1000.0)
        self.bw_points = self.param("bw_points", 1000.0)
        self.cache_bonus = self.param("cache_bonus", 200.0)
        self.decay = self.param("inflation_decay", 0.9)
        self.min_estimate = self.param("min_estimate_bytes_per_s", MIN_ESTIMATE_BYTES_PER_S)
        self.max_estimate = self.param("max_estimate_bytes_per_s", MAX_ESTIMATE_BYTES_PER_S)
        #: the predicted load not yet visible in statuses, per origin, bytes/s
        self.inflation: dict[str, float] = {}
        # name -> (status, inflation, score without the cache bonus). After a pick the
        # picked origin is re-scored for each issue ranked; only the cache bonus
        # depends on the issue, so the rest is computed once per (status, inflation).
        self._base: dict[str, tuple[OriginStatus, float, float]] = {}

    def base_score(self, name: str, status: OriginStatus) -> float:
        """Figure 2 without line 4 (the cache bonus): CPU, RAM and bandwidth points."""
        inflation = self.inflation.get(name, 0.0)
        memo = self._base.get(name)
        if memo is not None and memo[0] is status and memo[1] == inflation:
            return memo[2]
        score = (
            _rate_left(status.cpu_fraction) * self.cpu_points
            + _rate_left(status.ram_fraction) * self.ram_points
            + bandwidth_points(
                status.out_bytes_per_s, status.capacity_bytes_per_s, inflation, self.bw_points
            )
        )
        self._base[name] = (status, inflation, score)
        return score

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        score = self.base_score(name, status)
        if issue_id in status.cached_issues:
            score += self.cache_bonus
        return score

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        # Figure 2: "Every data refresh, perform: bandwidthInflation *= 0.9"
        if name in self.inflation:
            self.inflation[name] *= self.decay

    def on_pick(self, name: str, issue_id: str, *, now: float) -> None:
        status = self.statuses.get(name)
        estimate = session_estimate(status, issue_id) if status is not None else None
        to_add = clamp_estimate(estimate, self.min_estimate, self.max_estimate)
        self.inflation[name] = self.inflation.get(name, 0.0) + to_add
