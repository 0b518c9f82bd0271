"""The tracker's Prometheus metrics: ``TrackerMetrics``, the counters the handlers bump,
and the swarm sizes read from the core when Prometheus scrapes, in a registry of the
tracker's own (served on ``GET /metrics`` by `pressrun.tracker.announce_http`).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pressrun.tracker.core import TrackerCore

#: /metrics names at most this many swarms (the largest); the rest only in the totals
MAX_METRIC_SWARMS = 50


class _SwarmCollector(Collector):
    """Swarm sizes, read from the core when Prometheus scrapes."""

    def __init__(self, core: TrackerCore) -> None:
        self.core = core

    def collect(self) -> Iterable[GaugeMetricFamily]:
        peers = GaugeMetricFamily(
            "pressrun_tracker_swarm_peers", "Active peers per swarm", labels=["info_hash", "role"]
        )
        swarms = GaugeMetricFamily("pressrun_tracker_swarms", "Swarms the tracker knows")
        total = GaugeMetricFamily(
            "pressrun_tracker_peers", "Active peers over all swarms", labels=["role"]
        )
        hashes = self.core.info_hashes()
        counted = [(self.core.counts(h)[:2], h) for h in hashes]
        # Bounded labels: only the largest swarms get a series of their own.
        largest = sorted(counted, key=lambda c: (-(c[0][0] + c[0][1]), c[1]))
        for (seeds, leechers), info_hash in largest[:MAX_METRIC_SWARMS]:
            peers.add_metric([info_hash.hex(), "seed"], seeds)
            peers.add_metric([info_hash.hex(), "leecher"], leechers)
        total.add_metric(["seed"], sum(c[0][0] for c in counted))
        total.add_metric(["leecher"], sum(c[0][1] for c in counted))
        swarms.add_metric([], len(hashes))
        return [peers, total, swarms]


class TrackerMetrics:
    """The tracker's Prometheus metrics, in a registry of its own."""

    def __init__(self, core: TrackerCore) -> None:
        self.registry = CollectorRegistry()
        self.announces = Counter(
            "pressrun_tracker_announces",
            "Announces answered, by event",
            ["event"],
            registry=self.registry,
        )
        self.failures = Counter(
            "pressrun_tracker_failures",
            "Requests answered with a failure reason, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.scrapes = Counter(
            "pressrun_tracker_scrapes", "Scrapes answered", registry=self.registry
        )
        self.expired = Counter(
            "pressrun_tracker_expired_peers", "Peers expired after the TTL", registry=self.registry
        )
        self.left = Counter(
            "pressrun_tracker_left_peers",
            "Peers that left (stopped or expired), by rule",
            ["rule"],
            registry=self.registry,
        )
        self.registry.register(_SwarmCollector(core))
