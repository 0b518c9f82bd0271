"""The status agent of one origin: what ``/stats`` says and a worker publishes.

- `IssueCatalog`: the issues on disk (rescanned when the content directory changes).
- `SystemCpu`: system-wide CPU use between two samples.
- `StatusMixin`: the part of `pressrun.origin.aio.OriginService` that assembles the
  figures: the gauges set when read, the host sample, a worker's snapshot
  (`StatusMixin.snapshot`) and the ``/stats`` document (`StatusMixin.stats_document`,
  with workers merged with the others' last published snapshots).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import psutil

from pressrun.origin.config import OriginConfig
from pressrun.origin.core import TrafficMeter, valid_name
from pressrun.origin.metrics import OriginMetrics
from pressrun.origin.shared import WorkerShare, add_counts, merge_samples, merge_stats

#: a busy worker's published snapshot carries Prometheus samples at most this old
METRICS_EVERY_S = 1.0


class IssueCatalog:
    """The issues on disk: every directory in CONTENT whose name is a valid issue id.

    ``pressrun publish`` builds a bundle in a hidden folder (``.<id>.publishing-*``,
    not a valid id) and renames it into place, so a valid folder is a whole bundle.
    A rename into or out of CONTENT changes its mtime: the list is rescanned then.
    """

    def __init__(self, content_dir: Path) -> None:
        self.content_dir = content_dir
        self._stamp: int | None = None
        self.issues: list[str] = []

    def refresh(self) -> list[str]:
        """Rescan when the content directory changed; return the sorted issue ids."""
        try:
            stamp = os.stat(self.content_dir).st_mtime_ns
        except OSError:
            self._stamp, self.issues = None, []
            return self.issues
        if stamp != self._stamp:
            found: list[str] = []
            with contextlib.suppress(OSError), os.scandir(self.content_dir) as entries:
                for entry in entries:
                    if valid_name(entry.name) and entry.is_dir():
                        found.append(entry.name)
            self._stamp, self.issues = stamp, sorted(found)
        return self.issues


class SystemCpu:
    """System-wide CPU use between two samples, in percent of all CPUs.

    psutil's own ``cpu_percent(interval=None)`` keeps one baseline per process, so two
    origins in one process (the demo, the tests) would each reset the other's; this
    keeps its own. Busy time is psutil's: everything but idle and iowait.
    """

    def __init__(self) -> None:
        self._last = psutil.cpu_times()

    @staticmethod
    def _busy_total(times: Any) -> tuple[float, float]:
        # Linux counts guest time inside user/nice too (psutil subtracts it likewise).
        guest = float(getattr(times, "guest", 0.0)) + float(getattr(times, "guest_nice", 0.0))
        total = float(sum(times)) - guest
        idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
        return total - idle, total

    def sample(self) -> float:
        """CPU use since the previous sample (or since construction), 0..100."""
        now = psutil.cpu_times()
        busy0, total0 = self._busy_total(self._last)
        busy1, total1 = self._busy_total(now)
        self._last = now
        if total1 <= total0:
            return 0.0
        return round(min(100.0, max(0.0, 100.0 * (busy1 - busy0) / (total1 - total0))), 1)


class StatusMixin:
    """The figures of `pressrun.origin.aio.OriginService` (which sets these attributes)."""

    config: OriginConfig
    name: str
    catalog: IssueCatalog
    metrics: OriginMetrics
    meter: TrafficMeter
    share: WorkerShare | None
    transfers_cut: int
    cpu_percent: float
    ram_percent: float
    _loop: asyncio.AbstractEventLoop
    _cpu: SystemCpu
    _carried: dict[str, Any]
    _carried_families: list[dict[str, Any]]
    #: the samples of the last fresh snapshot and when they were taken (loop time)
    _metrics_samples: list[dict[str, Any]] | None = None
    _metrics_at: float = 0.0

    def _count_active(self) -> None:
        # set when read (/metrics, the timer), not per transfer: two gauge writes a
        # transfer were measurable per-request work
        self.metrics.active.set(self.meter.active_transfers)
        self.metrics.stalled.set(self.meter.stalled_transfers)

    def _sample_host(self) -> None:
        # System-wide figures, like the paper's agent: the machine is what runs out.
        self.cpu_percent = self._cpu.sample()
        self.ram_percent = float(psutil.virtual_memory().percent)

    def snapshot(self, *, fresh_metrics: bool = True) -> dict[str, Any]:
        """This worker's figures as plain data (totals include its slot's carried ones).

        `fresh_metrics` False: the Prometheus samples of the last fresh snapshot are
        reused when they are younger than `METRICS_EVERY_S` (collecting and merging
        every family, histograms included, was 2-3% of a busy worker's CPU at ten
        snapshots a second; ``/metrics`` is scraped every few seconds at most)."""
        meter = self.meter
        now = self._loop.time()
        samples = self._metrics_samples
        if fresh_metrics or samples is None or now - self._metrics_at >= METRICS_EVERY_S:
            samples = self._metrics_samples = merge_samples(
                [self.metrics.families(), self._carried_families]
            )
            self._metrics_at = now
        report = meter.last_report
        carried = self._carried
        self._count_active()
        return {
            "slot": self.share.slot if self.share is not None else 0,
            "pid": os.getpid(),
            "out_bytes_per_s": report.out_bytes_per_s,
            "transfers_seen": report.transfers_seen,
            "mean_transfer_bytes_per_s": report.mean_transfer_bytes_per_s or 0.0,
            "mean_by_issue": report.mean_transfer_bytes_per_s_by_issue,
            "transfers_seen_by_issue": report.transfers_seen_by_issue,
            "recent": [[r.start, r.end, r.out_bytes] for r in meter.recent_reports],
            "active": meter.active_transfers,
            "stalled": meter.stalled_transfers,
            "cached_issues": meter.cached_issues(now=self._loop.time()),
            "active_by_issue": meter.active_transfers_by_issue(),
            "transfers_by_issue": add_counts(
                dict(carried.get("transfers_by_issue", {})), meter.transfers_by_issue
            ),
            "bytes_by_issue": add_counts(
                dict(carried.get("bytes_by_issue", {})), meter.bytes_sent_by_issue
            ),
            "bytes_sent_total": carried.get("bytes_sent_total", 0) + meter.bytes_sent_total,
            "transfers_total": carried.get("transfers_total", 0) + meter.transfers_total,
            "transfers_cut": carried.get("transfers_cut", 0) + self.transfers_cut,
            "metrics": samples,
        }

    def _merged(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """This worker's live snapshot (published) and the other workers' last ones."""
        assert self.share is not None
        own = self.snapshot()
        with contextlib.suppress(OSError):
            self.share.publish(own)
        others = [d for slot, d in self.share.read_all().items() if slot != self.share.slot]
        return own, others

    def stats_document(self) -> dict[str, Any]:
        """The ``/stats`` JSON of docs/protocols.md (of the whole origin: with workers,
        this worker's live figures merged with the others' last published ones)."""
        report = self.meter.last_report
        issues = self.catalog.refresh()
        on_disk = set(issues)
        now = self._loop.time()
        if self.share is not None:
            own, others = self._merged()
            merged = merge_stats(own, others, interval_s=self.config.stats_interval_s)
            return {
                "name": self.name,
                "cpu_percent": self.cpu_percent,
                "ram_percent": self.ram_percent,
                "out_bytes_per_s": merged["out_bytes_per_s"],
                "interval_s": round(report.interval_s, 6),
                "capacity_bytes_per_s": self.config.capacity_bytes_per_s,
                "egress_cap_bytes_per_s": self.config.egress_cap_bytes_per_s,
                "active_transfers": merged["active_transfers"],
                "stalled_transfers": merged["stalled_transfers"],
                "issues": issues,
                "cached_issues": [i for i in merged["cached_issues"] if i in on_disk],
                "mean_transfer_bytes_per_s": merged["mean_transfer_bytes_per_s"],
                "mean_transfer_bytes_per_s_by_issue": {
                    issue: rate
                    for issue, rate in merged["mean_transfer_bytes_per_s_by_issue"].items()
                    if issue in on_disk
                },
                "bytes_sent_total": merged["bytes_sent_total"],
                "transfers_total": merged["transfers_total"],
                "active_transfers_by_issue": merged["active_transfers_by_issue"],
                "transfers_total_by_issue": merged["transfers_total_by_issue"],
                "bytes_sent_by_issue": merged["bytes_sent_by_issue"],
                "recent_intervals": merged["recent_intervals"],
                "workers": merged["workers"],
            }
        return {
            "name": self.name,
            "cpu_percent": self.cpu_percent,
            "ram_percent": self.ram_percent,
            "out_bytes_per_s": report.out_bytes_per_s,
            "interval_s": round(report.interval_s, 6),
            "capacity_bytes_per_s": self.config.capacity_bytes_per_s,
            "egress_cap_bytes_per_s": self.config.egress_cap_bytes_per_s,
            "active_transfers": self.meter.active_transfers,
            "stalled_transfers": self.meter.stalled_transfers,
            "issues": issues,
            "cached_issues": [i for i in self.meter.cached_issues(now=now) if i in on_disk],
            "mean_transfer_bytes_per_s": report.mean_transfer_bytes_per_s,
            "mean_transfer_bytes_per_s_by_issue": {
                issue: rate
                for issue, rate in report.mean_transfer_bytes_per_s_by_issue.items()
                if issue in on_disk
            },
            "bytes_sent_total": self.meter.bytes_sent_total,
            "transfers_total": self.meter.transfers_total,
            "active_transfers_by_issue": self.meter.active_transfers_by_issue(),
            "transfers_total_by_issue": dict(sorted(self.meter.transfers_by_issue.items())),
            "bytes_sent_by_issue": dict(sorted(self.meter.bytes_sent_by_issue.items())),
            "recent_intervals": [
                {"start_s": r.start, "end_s": r.end, "bytes": r.out_bytes}
                for r in self.meter.recent_reports
            ],
        }
