"""The balancer's Prometheus collector: counts the core and the service already keep,
read when Prometheus scrapes, so answering a directive costs no metric update.

Families (``GET /metrics`` of the balancer, docs/balancer.md):
``pressrun_balancer_directives_total{mode,algorithm}``,
``pressrun_balancer_refusals_total{reason}``, ``pressrun_balancer_picks_total{origin}``,
``pressrun_balancer_origin_up{origin}``, ``pressrun_balancer_origin_score{origin,issue}``;
and the prefetch pacing's, apart from the readers' (`PrefetchCollector`).
The poll histogram and failure counter are the poller's (`pressrun.balancer.poller`).
"""

from __future__ import annotations

import math
from collections import Counter as TallyCounter
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pressrun.balancer.core import BalancerCore, OriginState
from pressrun.balancer.prefetch import PrefetchPacer


class BalancerCollector(Collector):
    """Reads the core (``core()``, once started) and the directives answered by mode."""

    def __init__(
        self, core: Callable[[], BalancerCore], directives_by_mode: TallyCounter[str]
    ) -> None:
        self._core = core
        self._directives_by_mode = directives_by_mode

    def collect(self) -> Iterable[Metric]:
        """The metric families, from the current counts."""
        core = self._core()
        algorithm = core.algorithm
        directives = CounterMetricFamily(
            "pressrun_balancer_directives",
            "Directives answered, by delivery mode and scoring algorithm",
            labels=["mode", "algorithm"],
        )
        for mode, count in sorted(self._directives_by_mode.items()):
            directives.add_metric([mode, algorithm.name], count)
        refusals = CounterMetricFamily(
            "pressrun_balancer_refusals",
            "Directive requests refused, by reason",
            labels=["reason"],
        )
        for reason, count in core.refusals.items():
            refusals.add_metric([reason.value], count)
        picks = CounterMetricFamily(
            "pressrun_balancer_picks",
            "Clients sent to each origin (first origin of a directive)",
            labels=["origin"],
        )
        up = GaugeMetricFamily(
            "pressrun_balancer_origin_up", "1 if the origin is in rotation", labels=["origin"]
        )
        score = GaugeMetricFamily(
            "pressrun_balancer_origin_score",
            "The origin's current score for each issue it holds (algorithms with scores)",
            labels=["origin", "issue"],
        )
        for name, rec in core.origins.items():
            picks.add_metric([name], rec.picks)
            is_up = rec.state is OriginState.UP
            up.add_metric([name], 1.0 if is_up else 0.0)
            if is_up and rec.status is not None:
                for issue in sorted(rec.status.issues):
                    value = algorithm.score(name, issue)
                    if value is not None and math.isfinite(value):
                        score.add_metric([name, issue], value)
        return [directives, refusals, picks, up, score]


class PrefetchCollector(Collector):
    """The prefetch pacing (`pressrun.balancer.prefetch`, issue 35), counted apart from
    the readers: ``pressrun_balancer_prefetchers{state}`` (granted, waiting),
    ``pressrun_balancer_prefetch_granted_bytes_per_second`` (the live grants' sum),
    ``pressrun_balancer_prefetch_grants_total`` and ``..._deferrals_total``."""

    def __init__(self, pacer: Callable[[], PrefetchPacer]) -> None:
        self._pacer = pacer

    def collect(self) -> Iterable[Metric]:
        """The metric families, from the pacer's counts."""
        pacer = self._pacer()
        prefetchers = GaugeMetricFamily(
            "pressrun_balancer_prefetchers",
            "Clients pre-positioning embargoed issues, granted a rate or waiting for room",
            labels=["state"],
        )
        prefetchers.add_metric(["granted"], pacer.prefetchers())
        prefetchers.add_metric(["waiting"], pacer.prefetchers(waiting=True))
        granted = GaugeMetricFamily(
            "pressrun_balancer_prefetch_granted_bytes_per_second",
            "The sum of the live prefetch grants",
        )
        granted.add_metric([], pacer.granted_bytes_per_s())
        grants = CounterMetricFamily(
            "pressrun_balancer_prefetch_grants", "Prefetch grants made (renewals included)"
        )
        grants.add_metric([], pacer.granted_total)
        deferrals = CounterMetricFamily(
            "pressrun_balancer_prefetch_deferrals", "Prefetch requests told to wait for room"
        )
        deferrals.add_metric([], pacer.deferred_total)
        return [prefetchers, granted, grants, deferrals]
