"""Algorithm 1 of Viëtor 2016 (000_9aae53f3113e9bd8.txt, section 3, Figure 1), after
X. Jiang et al. 2013: dynamic resource weights.

Score of a host, 0..1 (rates are the share of each resource left)::

    score = cpuRate * cpuModif + ramRate * ramModif + bwRate * bwModif

Every data refresh, when the numbers changed::

    xModif = a1 * xModif + a2 * (xPrev - xCurr) / (totPrev - totCurr)    for x in cpu, ram, bw
    renormalise so that cpuModif + ramModif + bwModif == 1

with a1 = 0.9, a2 = 0.1, and "bw" the used share of the available bandwidth T
(section 3: T is the maximum bandwidth, IO the bandwidth in use). `tot` is the sum of
the three used shares. The weights start equal (1/3 each).

Where the paper is silent we choose, and say so: a weight that the update drives below
0 is clamped to 0 before renormalising (JLY13's weights must sum to 1 and a server
weight is "scaled from 0 to 1", which negative weights would break), and if all three
reach 0 they restart equal. There is no inflation: between refreshes the argmax does
not move, which is why the paper sees Algorithm 1 herd clients onto one host.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pressrun.balancer.algorithms.base import Params, ScoredAlgorithm, register_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus


@dataclass(slots=True)
class Alg1Weights:
    """One host's dynamic weights and the used shares seen at its previous refresh."""

    cpu: float = 1.0 / 3.0
    ram: float = 1.0 / 3.0
    bw: float = 1.0 / 3.0
    prev: tuple[float, float, float] | None = None


def used_shares(status: OriginStatus) -> tuple[float, float, float]:
    """CPU, RAM and bandwidth in use, each 0..1."""
    if status.capacity_bytes_per_s > 0:
        bw = status.out_bytes_per_s / status.capacity_bytes_per_s
    else:
        bw = 1.0
    return (
        min(max(status.cpu_fraction, 0.0), 1.0),
        min(max(status.ram_fraction, 0.0), 1.0),
        min(max(bw, 0.0), 1.0),
    )


def update_weights(
    w: Alg1Weights, current: tuple[float, float, float], a1: float = 0.9, a2: float = 0.1
) -> None:
    """Figure 1's per-refresh update of one host's weights, in place."""
    prev = w.prev
    w.prev = current
    if prev is None:
        return
    tot_delta = sum(prev) - sum(current)
    if tot_delta == 0:  # "if (numbersChanged)": nothing moved in total, keep the weights
        return
    cpu = a1 * w.cpu + a2 * (prev[0] - current[0]) / tot_delta
    ram = a1 * w.ram + a2 * (prev[1] - current[1]) / tot_delta
    bw = a1 * w.bw + a2 * (prev[2] - current[2]) / tot_delta
    cpu, ram, bw = max(cpu, 0.0), max(ram, 0.0), max(bw, 0.0)
    tot = cpu + ram + bw
    if tot <= 0:
        w.cpu = w.ram = w.bw = 1.0 / 3.0
        return
    w.cpu, w.ram, w.bw = cpu / tot, ram / tot, bw / tot


@register_algorithm
class Alg1(ScoredAlgorithm):
    """Jiang et al. 2013 as Viëtor's Algorithm 1: dynamically weighted resource score."""

    name = "alg1"
    summary = "Viëtor 2016 Algorithm 1 (Figure 1, after Jiang 2013): dynamic weights a1=0.9 a2=0.1"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.a1 = self.param("a1", 0.9)
        self.a2 = self.param("a2", 0.1)
        self.weights: dict[str, Alg1Weights] = {}

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        w = self.weights.setdefault(name, Alg1Weights())
        update_weights(w, used_shares(status), self.a1, self.a2)

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        w = self.weights.get(name) or Alg1Weights()
        cpu, ram, bw = used_shares(status)
        score = (1.0 - cpu) * w.cpu + (1.0 - ram) * w.ram + (1.0 - bw) * w.bw
        # Renormalised weights can sum to 1 + 2e-16; the paper's scale is 0..1.
        return min(score, 1.0)
