"""The multicast sender's Prometheus metrics (`SenderMetrics`, served on ``/metrics``
by `pressrun.multicast.sender`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SenderMetrics:
    """The sender's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("issue", "channel")
        self.packets = Counter(
            "pressrun_multicast_packets_sent",
            "ALC/LCT packets sent, per carousel channel",
            labels,
            registry=self.registry,
        )
        self.bytes = Counter(
            "pressrun_multicast_bytes_sent",
            "UDP payload bytes sent, per carousel channel",
            labels,
            registry=self.registry,
        )
        self.slipped = Counter(
            "pressrun_multicast_packets_slipped",
            "packets not sent because the send thread woke late (the rate is a ceiling)",
            labels,
            registry=self.registry,
        )
        self.cycles = Gauge(
            "pressrun_multicast_cycles",
            "cycles each channel has sent since its carousel started",
            labels,
            registry=self.registry,
        )
        self.carousels = Gauge(
            "pressrun_multicast_carousels", "carousels running", registry=self.registry
        )
        self.prepared = Gauge(
            "pressrun_multicast_issues_prepared",
            "issues encoded ahead of their carousels, held in memory",
            registry=self.registry,
        )
        self.encodes = Counter(
            "pressrun_multicast_encodes",
            "passes encoded (at publish time, or at a carousel start that found none)",
            registry=self.registry,
        )
        self.encode_seconds = Counter(
            "pressrun_multicast_encode_seconds",
            "seconds spent encoding passes",
            registry=self.registry,
        )
        self.starts = Counter(
            "pressrun_multicast_carousel_starts",
            "carousels started through the control API",
            registry=self.registry,
        )
        self.stops = Counter(
            "pressrun_multicast_carousel_stops",
            "carousels stopped through the control API",
            registry=self.registry,
        )
        self.announcements = Counter(
            "pressrun_multicast_announcements_sent",
            "signed announcements sent on the control group",
            registry=self.registry,
        )
        self.send_errors = Counter(
            "pressrun_multicast_send_errors", "sendto failures", registry=self.registry
        )
