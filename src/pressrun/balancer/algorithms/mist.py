"""MistServer's shipped balancer (`MistUtilLoad`, src/utils/util_load.cpp), after the paper.

Algorithm 2 of 000_9aae53f3113e9bd8.txt (see alg2.py) with the constants MistServer
moved to soon after (FIELD-NOTES.md, "MistServer's shipped load balancer")::

    score  = cpuRate * 500 + ramRate * 500
    score += 50 if the asset is already cached
    score += max(0, 1000 - bw * 1000 / limit) - min(inflation * 1000 / limit, that)
    inflation *= 0.75 on every refresh

and a host is skipped while ``bw + inflation >= limit``: when no host is left the
answer is "FULL" (an empty ranking, which the balancer core turns into a refusal).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pressrun.balancer.algorithms.alg2 import Alg2
from pressrun.balancer.algorithms.base import Params, register_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus

MIST_DEFAULTS: dict[str, float] = {
    "cpu_points": 500.0,
    "ram_points": 500.0,
    "bw_points": 1000.0,
    "cache_bonus": 50.0,
    "inflation_decay": 0.75,
}


@register_algorithm
class Mist(Alg2):
    """Algorithm 2 with MistServer's later weights, x0.75 decay and the FULL rule."""

    name = "mist"
    summary = "MistServer MistUtilLoad: Alg2 with CPU/RAM 500, BW 1000, +50 cached, x0.75, FULL"

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        merged = dict(MIST_DEFAULTS)
        merged.update(params or {})
        super().__init__(origins, rng, merged)

    def eligible(self, name: str, status: OriginStatus, issue_id: str) -> bool:
        if issue_id not in status.issues:
            return False
        # util_load.cpp: skip a host whose bandwidth plus inflation reaches its limit.
        inflation = self.inflation.get(name, 0.0)
        return status.out_bytes_per_s + inflation < status.capacity_bytes_per_s
