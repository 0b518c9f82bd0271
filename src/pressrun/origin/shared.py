"""What the worker processes of one origin share: the egress bucket and their figures.

``pressrun serve origin --workers N`` (:mod:`pressrun.origin.workers`) runs N worker
processes; the origin must still look like one to the balancer and enforce one cap.

- **The egress cap**: one `TokenBucket` state (tokens, last refill) in an anonymous
  shared mapping made before the fork, read and written under a POSIX record lock
  (``fcntl.lockf``) on a file of the state directory. A record lock dies with its
  process, so a worker killed inside the critical section (SIGKILL) cannot wedge the
  others; the section is a few microseconds, once per paced chunk.
- **The figures**: each worker publishes a snapshot of its `TrafficMeter` and its
  Prometheus samples as ``<state dir>/worker-<slot>.json`` (write, then rename: readers
  never see half a file) at every stats interval and at most every
  `PUBLISH_EVERY_S` while its figures move. The worker that answers ``/stats`` or
  ``/metrics`` merges its live snapshot with the others' files (`merge_stats`,
  `merge_samples`). Files, not a fixed shared-memory layout, because the figures
  carry per-issue maps of any size; the cost is a lag of at most `PUBLISH_EVERY_S`
  on the other workers' counters (rates are over closed intervals anyway).
- **A worker replaced** (killed, crashed) starts from the totals its slot's last file
  holds, so ``bytes_sent_total``, the per-issue totals and the counters never go back;
  the dead worker's open transfers are gone, and so is their share of
  ``active_transfers``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pressrun.origin.core import refill_tokens

#: a worker whose figures moved republishes them at most this often
PUBLISH_EVERY_S = 0.1
_BUCKET = struct.Struct("dd")  # tokens, last refill (monotonic s)

#: gauges of `OriginMetrics` that are per-worker and add up; the others (capacity,
#: cap) are the same in every worker and are reported once
SUMMED_GAUGES = frozenset(
    {
        "pressrun_origin_active_transfers",
        "pressrun_origin_stalled_transfers",
        "pressrun_origin_out_bytes_per_second",
    }
)


class SharedBucket:
    """A debt token bucket whose state lives in shared memory, for every worker.

    Same contract as `pressrun.origin.core.TokenBucket.take`: grants at once and
    answers the wait; takes are serialised by the lock, so the bytes released by time
    t over all workers never exceed ``burst + rate*t``.
    """

    def __init__(
        self, memory: mmap.mmap, lock_path: Path, rate_bytes_per_s: float, burst_bytes: float
    ) -> None:
        self._memory = memory
        self._lock_path = lock_path
        self._lock_fd: int | None = None
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes

    def _fd(self) -> int:
        # opened lazily, in the worker: a POSIX lock belongs to the process holding it
        if self._lock_fd is None:
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._lock_fd

    def take(self, n: int, *, now: float) -> float:
        """Grant `n` bytes; the seconds to wait (from `now`) before sending them."""
        if n < 0:
            raise ValueError("cannot take a negative number of bytes")
        fd = self._fd()
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            tokens, last = _BUCKET.unpack_from(self._memory, 0)
            tokens, last = refill_tokens(tokens, last, now, self.rate_bytes_per_s, self.burst_bytes)
            tokens -= n
            _BUCKET.pack_into(self._memory, 0, tokens, last)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        return 0.0 if tokens >= 0 else -tokens / self.rate_bytes_per_s

    def close(self) -> None:
        """Close this process's lock descriptor."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def new_bucket_memory(burst_bytes: float, now: float) -> mmap.mmap:
    """The shared mapping of a full bucket (made before the workers are forked)."""
    memory = mmap.mmap(-1, _BUCKET.size)  # anonymous, MAP_SHARED: children see it
    _BUCKET.pack_into(memory, 0, burst_bytes, now)
    return memory


@dataclass(slots=True)
class WorkerShare:
    """One worker's place among the origin's workers (handed to `start_origin`)."""

    slot: int
    workers: int
    state_dir: Path
    bucket: SharedBucket | None = None
    #: the supervisor's pid: a worker whose parent is no longer it (the supervisor was
    #: killed) stops instead of serving on, unsupervised
    parent_pid: int = 0

    def path(self, slot: int) -> Path:
        """The snapshot file of worker `slot`."""
        return self.state_dir / f"worker-{slot}.json"

    def publish(self, snapshot: dict[str, Any]) -> None:
        """Write this worker's snapshot (atomically: a rename; plain strings and
        descriptors, no pathlib: up to ten times a second on a busy worker's loop)."""
        final = f"{self.state_dir}/worker-{self.slot}.json"
        tmp = f"{final}.{os.getpid()}.tmp"
        data = json.dumps(snapshot, separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, final)

    def read_all(self) -> dict[int, dict[str, Any]]:
        """Every worker's last snapshot by slot (a missing or unreadable one left out)."""
        found: dict[int, dict[str, Any]] = {}
        for slot in range(self.workers):
            with contextlib.suppress(OSError, ValueError):
                found[slot] = json.loads(self.path(slot).read_bytes())
        return found

    def carried(self) -> dict[str, Any] | None:
        """The last snapshot of this slot (a worker that ran here before), or None."""
        with contextlib.suppress(OSError, ValueError):
            doc: dict[str, Any] = json.loads(self.path(self.slot).read_bytes())
            return doc
        return None


# ------------------------------------------------------------------ merging, pure


def add_counts(into: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Add the per-key counts of `more` into `into`; returns `into`."""
    for key, value in more.items():
        into[key] = into.get(key, 0) + value
    return into


def merge_samples(
    families: list[list[dict[str, Any]]], *, counters_only: bool = False
) -> list[dict[str, Any]]:
    """Prometheus families of several workers as one.

    Each family is ``{"name", "type", "documentation", "samples": [[name, labels,
    value]]}``. Counter and histogram samples with the same name and labels add up
    (``*_created`` takes the earliest); gauges in `SUMMED_GAUGES` add up, the others
    are the same everywhere and the first is kept. `counters_only` drops gauges (what
    a replaced worker carries over from its slot's last file).
    """
    order: list[str] = []
    merged: dict[str, dict[str, Any]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for worker in families:
        for family in worker:
            name, kind = family["name"], family["type"]
            if counters_only and kind == "gauge":
                continue
            if name not in merged:
                order.append(name)
                merged[name] = {k: family[k] for k in ("name", "type", "documentation")}
                values[name] = {}
            summed = kind != "gauge" or name in SUMMED_GAUGES
            table = values[name]
            for sample_name, labels, value in family["samples"]:
                key = (sample_name, tuple(sorted(labels.items())))
                if key not in table:
                    table[key] = float(value)
                elif sample_name.endswith("_created"):
                    table[key] = min(table[key], float(value))
                elif summed:
                    table[key] += float(value)
    out = []
    for name in order:
        family = dict(merged[name])
        family["samples"] = [
            [sample_name, dict(labels), value]
            for (sample_name, labels), value in values[name].items()
        ]
        out.append(family)
    return out


def _spread(frame: list[list[float]], windows: list[list[float]]) -> None:
    """Add each window's bytes to the frame's windows in proportion to their overlap
    (a worker's stats intervals need not line up with another's to the millisecond)."""
    for start, end, count in windows:
        length = end - start
        if length <= 0 or count == 0:
            continue
        for target in frame:
            overlap = min(end, target[1]) - max(start, target[0])
            if overlap > 0:
                target[2] += count * overlap / length


def _closed_everywhere(
    frame: list[list[float]], others: list[dict[str, Any]], interval_s: float
) -> list[list[float]]:
    """The frame's windows every other worker has closed and published too.

    Workers close their intervals within milliseconds of each other, but a window the
    answering worker just closed may not be in another's file yet: reported now, it
    would lack that worker's bytes for good (readers take each window once, e.g. the
    demo's egress check). It is left for the next answer. A worker with no window yet
    (just started) or none within three intervals (stuck, dying) does not hold the
    others back."""
    if not frame:
        return frame
    newest = frame[-1][1]
    ends = [
        d["recent"][-1][1]
        for d in others
        if d["recent"] and d["recent"][-1][1] >= newest - 3 * interval_s
    ]
    if not ends:
        return frame
    limit = min(ends) + interval_s / 2  # boundaries agree to a timer's lateness
    return [w for w in frame if w[1] <= limit]


def merge_stats(
    own: dict[str, Any], others: list[dict[str, Any]], *, interval_s: float = 1.0
) -> dict[str, Any]:
    """The ``/stats`` figures of the whole origin from the answering worker's live
    snapshot `own` and the other workers' last ones (see `snapshot` in aio).

    Counts and totals add up; the interval rate is the sum of each worker's last
    interval rate; the per-transfer means are weighted by the transfers each is over;
    ``recent_intervals`` keeps `own`'s windows, each other worker's bytes spread over
    them by overlap, and only those every worker has published (`_closed_everywhere`).
    `interval_s` is the stats interval.
    """
    docs = [own, *others]
    seen = sum(d["transfers_seen"] for d in docs)
    weighted_sum = sum(d["mean_transfer_bytes_per_s"] * d["transfers_seen"] for d in docs)
    mean = weighted_sum / seen if seen else None
    seen_by_issue: dict[str, int] = {}
    weighted: dict[str, float] = {}
    for d in docs:
        for issue, n in d["transfers_seen_by_issue"].items():
            seen_by_issue[issue] = seen_by_issue.get(issue, 0) + n
            weighted[issue] = weighted.get(issue, 0.0) + n * d["mean_by_issue"][issue]
    frame = [list(w) for w in own["recent"]]
    for d in others:
        _spread(frame, d["recent"])
    frame = _closed_everywhere(frame, others, interval_s)
    active_by_issue: dict[str, int] = {}
    transfers_by_issue: dict[str, int] = {}
    bytes_by_issue: dict[str, int] = {}
    for d in docs:
        add_counts(active_by_issue, d["active_by_issue"])
        add_counts(transfers_by_issue, d["transfers_by_issue"])
        add_counts(bytes_by_issue, d["bytes_by_issue"])
    return {
        "out_bytes_per_s": sum(d["out_bytes_per_s"] for d in docs),
        "active_transfers": sum(d["active"] for d in docs),
        "stalled_transfers": sum(d["stalled"] for d in docs),
        "cached_issues": sorted({i for d in docs for i in d["cached_issues"]}),
        "mean_transfer_bytes_per_s": mean,
        "mean_transfer_bytes_per_s_by_issue": {
            issue: weighted[issue] / n for issue, n in sorted(seen_by_issue.items())
        },
        "bytes_sent_total": sum(d["bytes_sent_total"] for d in docs),
        "transfers_total": sum(d["transfers_total"] for d in docs),
        "active_transfers_by_issue": {i: n for i, n in sorted(active_by_issue.items()) if n},
        "transfers_total_by_issue": dict(sorted(transfers_by_issue.items())),
        "bytes_sent_by_issue": dict(sorted(bytes_by_issue.items())),
        "recent_intervals": [
            {"start_s": start, "end_s": end, "bytes": round(count)} for start, end, count in frame
        ],
        "workers": [
            {
                "slot": d["slot"],
                "pid": d["pid"],
                "active_transfers": d["active"],
                "stalled_transfers": d["stalled"],
                "out_bytes_per_s": d["out_bytes_per_s"],
                "bytes_sent_total": d["bytes_sent_total"],
            }
            for d in sorted(docs, key=lambda d: int(d["slot"]))
        ],
    }
