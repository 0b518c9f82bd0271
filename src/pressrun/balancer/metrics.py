"""The balancer's Prometheus collector: counts the core and the service already keep,
read when Prometheus scrapes, so answering a directive costs no metric update.

Families (``GET /metrics`` of the balancer, docs/balancer.md):
``pressrun_balancer_directives_total{mode,algorithm}``,
``pressrun_balancer_refusals_total{reason}``, ``pressrun_balancer_picks_total{origin}``,
``pressrun_balancer_origin_up{origin}``, ``pressrun_balancer_origin_score{origin,issue}``.
The poll histogram and failure counter are the poller's (`pressrun.balancer.poller`).
"""

from __future__ import annotations

import math
from collections import Counter as TallyCounter
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pressrun.balancer.core import BalancerCore, OriginState


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
