"""The Prometheus side of one origin: its metrics, in a registry of its own.

- `OriginMetrics`: the counters, gauges and the transfer-duration histogram of one
  origin (not the global registry: two origins in one process stay apart), its text
  exposition and its samples as plain data (a worker's snapshot).
- `families_exposition`: Prometheus text of families given as plain data (the merged
  samples of every worker, :mod:`pressrun.origin.shared`).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from pressrun.origin.config import OriginConfig

#: transfer durations (s) for the histogram: a 256 KiB web-seed piece on loopback to a
#: 100 MB issue over a slow link
DURATION_BUCKETS_S = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)


class OriginMetrics:
    """Prometheus metrics of one origin, in its own registry (not the global one)."""

    def __init__(self, config: OriginConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.bytes_sent = Counter(
            "pressrun_origin_sent_bytes",
            "Body bytes handed to the network, by issue",
            ["issue"],
            registry=r,
        )
        self.requests = Counter(
            "pressrun_origin_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "code"],
            registry=r,
        )
        self.active = Gauge(
            "pressrun_origin_active_transfers",
            "Transfers moving body bytes now (stalled ones not counted)",
            registry=r,
        )
        self.stalled = Gauge(
            "pressrun_origin_stalled_transfers",
            "Transfers open whose client took no byte for --stalled-after-s",
            registry=r,
        )
        self.timed_out = Counter(
            "pressrun_origin_transfers_timed_out",
            "Transfers cut because the client took no chunk for --send-timeout-s",
            registry=r,
        )
        self.duration = Histogram(
            "pressrun_origin_transfer_duration_seconds",
            "Time from the first to the last byte of a transfer (complete or not)",
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.out_rate = Gauge(
            "pressrun_origin_out_bytes_per_second",
            "Outbound body bytes per second over the last stats interval",
            registry=r,
        )
        capacity = Gauge(
            "pressrun_origin_capacity_bytes_per_second",
            "Link capacity the operator configured (--capacity-mbps)",
            registry=r,
        )
        capacity.set(config.capacity_bytes_per_s)
        cap = Gauge(
            "pressrun_origin_egress_cap_bytes_per_second",
            "Egress cap enforced on all transfers (0: no cap)",
            registry=r,
        )
        cap.set(config.egress_cap_bytes_per_s or 0.0)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def families(self) -> list[dict[str, Any]]:
        """Every sample of the registry as plain data (a worker's snapshot)."""
        return [
            {
                "name": metric.name,
                "type": metric.type,
                "documentation": metric.documentation,
                "samples": [[s.name, dict(s.labels), s.value] for s in metric.samples],
            }
            for metric in self.registry.collect()
        ]


class _Families:
    """A collector that yields families given as plain data (the merged workers')."""

    def __init__(self, families: list[dict[str, Any]]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        out = []
        for family in self._families:
            metric = Metric(family["name"], family["documentation"], family["type"])
            for name, labels, value in family["samples"]:
                metric.add_sample(name, labels, value)
            out.append(metric)
        return out


def families_exposition(families: list[dict[str, Any]]) -> bytes:
    """Prometheus text of families given as plain data."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
