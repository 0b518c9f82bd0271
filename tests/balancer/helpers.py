"""Builders shared by the balancer tests."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

from pressrun.balancer.algorithms import ScoringAlgorithm, make_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus

MB = 1_000_000.0


def status(
    name: str,
    *,
    cpu: float = 0.0,
    ram: float = 0.0,
    out: float = 0.0,
    cap: float = MB,
    issues: Iterable[str] = ("i",),
    cached: Iterable[str] = (),
    mean: float | None = None,
    by_issue: Mapping[str, float] | None = None,
    active: int = 0,
) -> OriginStatus:
    """An `OriginStatus` with fractions, bytes/s; everything idle unless said."""
    return OriginStatus(
        name=name,
        cpu_fraction=cpu,
        ram_fraction=ram,
        out_bytes_per_s=out,
        capacity_bytes_per_s=cap,
        active_transfers=active,
        issues=frozenset(issues),
        cached_issues=frozenset(cached),
        mean_transfer_bytes_per_s=mean,
        mean_transfer_bytes_per_s_by_issue=dict(by_issue or {}),
    )


def specs(names: Sequence[str], weights: Sequence[float] | None = None) -> list[OriginSpec]:
    """Origin specs named `names`, URLs http://<name>:8000."""
    ws = list(weights) if weights is not None else [1.0] * len(names)
    return [OriginSpec(n, f"http://{n}:8000", w) for n, w in zip(names, ws, strict=True)]


def algorithm(
    name: str,
    names: Sequence[str] = ("a", "b", "c"),
    weights: Sequence[float] | None = None,
    params: Mapping[str, float] | None = None,
) -> ScoringAlgorithm:
    """A fresh algorithm instance over origins `names`."""
    return make_algorithm(name, specs(names, weights), random.Random(0), params)


def pick(alg: ScoringAlgorithm, issue: str = "i", *, now: float = 0.0) -> str:
    """What the core does per directive: rank, then tell the algorithm its pick."""
    ranked = alg.rank(issue, k=3, now=now)
    assert ranked, "nothing eligible"
    name = ranked[0][0]
    alg.handle_pick(name, issue, now=now)
    return name
