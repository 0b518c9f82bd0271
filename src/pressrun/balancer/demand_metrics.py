"""The demand policy on ``/metrics`` (issue 28): what the policy saw and decided, per
issue, so an operator (and the emulation's report) can tell why a mode came or did not.

Families (read when Prometheus scrapes; the policy is not touched per request):

- ``pressrun_balancer_demand_downloaders{issue}``: D, the estimated concurrent
  downloaders the thresholds are compared with (this balancer's and the others'; the
  EWMA's or the burst term's, the larger);
- ``pressrun_balancer_demand_recent_requests{issue}``: the requests counted in the
  burst window (here, and at the others from their rate's rise), what the burst term
  reads;
- ``pressrun_balancer_demand_requests_per_second{issue,source}``: the request rate,
  ``source`` = ``local`` (counted here) or ``others`` (heard from the other balancers);
- ``pressrun_balancer_demand_mode{issue,mode}``: 1 for the issue's current mode, 0 for
  the other two (``origin``, ``swarm``, ``multicast``);
- ``pressrun_balancer_demand_mode_since_seconds{issue}``: how long the mode has held;
- ``pressrun_balancer_demand_mode_changes_total{issue}``;
- ``pressrun_balancer_carousel_answered{issue}``: 1 while the issue's carousel runs by
  the sender's list and ``multicast`` is answered for it;
- ``pressrun_balancer_carousel_leader``: 1 while this balancer orders the carousels
  (several balancers; 1 when alone);
- ``pressrun_balancer_demand_threshold{threshold}``: the policy's settings
  (``swarm_enter``, ``swarm_leave``, ``multicast_enter``, ``multicast_leave``,
  ``min_dwell_s``, ``tau_s``, ``typical_download_s``, ``client_window_s``,
  ``burst_window_s``, ``burst_z``);
- ``pressrun_balancer_demand_requests_not_counted_total``: requests answered but not
  counted (the same client within its window).

The series per issue are bounded by the issues the policy keeps state for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pressrun.balancer.demand import DemandPolicy
from pressrun.balancer.events import DeliveryMode, MulticastInfo


class DemandCollector(Collector):
    """Reads the demand policy, the carousels answered and the lease at each scrape.

    policy: the balancer's `DemandPolicy`.
    carousels: issue -> its carousel, the issues answered ``multicast``.
    now: the policy's clock (the service's loop time).
    is_leader: whether this balancer orders carousels (None: it is alone, so it does).
    """

    def __init__(
        self,
        policy: DemandPolicy,
        carousels: Mapping[str, MulticastInfo],
        now: Callable[[], float],
        is_leader: Callable[[], bool | None],
    ) -> None:
        self._policy = policy
        self._carousels = carousels
        self._now = now
        self._is_leader = is_leader

    def collect(self) -> Iterable[Metric]:
        """The metric families, from the policy's state now."""
        policy = self._policy
        now = self._now()
        downloaders = GaugeMetricFamily(
            "pressrun_balancer_demand_downloaders",
            "Estimated concurrent downloaders of the issue (this balancer's and the others')",
            labels=["issue"],
        )
        recent = GaugeMetricFamily(
            "pressrun_balancer_demand_recent_requests",
            "Requests counted in the burst window (here and at the other balancers)",
            labels=["issue"],
        )
        rate = GaugeMetricFamily(
            "pressrun_balancer_demand_requests_per_second",
            "The issue's counted request rate: local (here) or others (other balancers)",
            labels=["issue", "source"],
        )
        mode = GaugeMetricFamily(
            "pressrun_balancer_demand_mode",
            "1 for the issue's current mode by the demand policy",
            labels=["issue", "mode"],
        )
        since = GaugeMetricFamily(
            "pressrun_balancer_demand_mode_since_seconds",
            "How long the issue's mode has held",
            labels=["issue"],
        )
        changes = CounterMetricFamily(
            "pressrun_balancer_demand_mode_changes",
            "The issue's mode changes",
            labels=["issue"],
        )
        answered = GaugeMetricFamily(
            "pressrun_balancer_carousel_answered",
            "1 while the issue's carousel runs and multicast is answered for it",
            labels=["issue"],
        )
        for view in policy.demand_view(now=now):
            issue = view.issue_id
            downloaders.add_metric([issue], view.downloaders)
            recent.add_metric([issue], view.recent_requests)
            rate.add_metric([issue, "local"], view.local_rate_per_s)
            rate.add_metric([issue, "others"], view.remote_rate_per_s)
            for m in DeliveryMode:
                mode.add_metric([issue, m.value], 1.0 if view.mode is m else 0.0)
            if view.mode_since is not None:
                since.add_metric([issue], max(0.0, now - view.mode_since))
            changes.add_metric([issue], view.changes)
            answered.add_metric([issue], 1.0 if issue in self._carousels else 0.0)
        leader = GaugeMetricFamily(
            "pressrun_balancer_carousel_leader", "1 while this balancer orders the carousels"
        )
        is_leader = self._is_leader()
        leader.add_metric([], 1.0 if is_leader is None or is_leader else 0.0)
        cfg = policy.config
        threshold = GaugeMetricFamily(
            "pressrun_balancer_demand_threshold",
            "The demand policy's thresholds (downloaders) and times (seconds)",
            labels=["threshold"],
        )
        settings: dict[str, float | None] = {
            "swarm_enter": cfg.enter_downloaders,
            "swarm_leave": cfg.leave_downloaders,
            "multicast_enter": cfg.multicast_enter_downloaders,
            "multicast_leave": (
                cfg.multicast_leave_downloaders
                if cfg.multicast_enter_downloaders is not None
                else None
            ),
            "min_dwell_s": cfg.min_dwell_s,
            "tau_s": cfg.tau_s,
            "typical_download_s": cfg.typical_download_s,
            "client_window_s": cfg.client_window_s,
            "burst_window_s": cfg.burst_window_s,
            "burst_z": cfg.burst_z,
        }
        for name, value in settings.items():
            if value is not None:
                threshold.add_metric([name], value)
        not_counted = CounterMetricFamily(
            "pressrun_balancer_demand_requests_not_counted",
            "Directive requests answered but not counted (the same client in its window)",
        )
        not_counted.add_metric([], policy.requests_not_counted)
        return [
            downloaders,
            recent,
            rate,
            mode,
            since,
            changes,
            answered,
            leader,
            threshold,
            not_counted,
        ]
