"""The origin's decisions, pure: names, byte ranges, validators, the egress token bucket
and the status agent's rolling window.

Nothing here reads a clock, opens a file or a socket: every time-dependent entry point
takes ``now`` (monotonic seconds), so the simulator and the tests drive it with stepped
time and the asyncio adapter (:mod:`pressrun.origin.aio`) feeds it ``loop.time()``.

- Names: issue ids and file names match ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``
  (docs/protocols.md). No name that passes can hold ``/``, start with ``.`` or be ``..``,
  so a path built from two valid names never leaves the content directory.
- Ranges (RFC 9110 §14): one ``bytes=a-b``, ``a-`` or ``-n`` range is a `ByteSpan`
  (206); a malformed or unsatisfiable range raises `RangeNotSatisfiable` (416); a
  request naming several ranges is answered with the whole file (200, which RFC 9110
  §14.2 allows: a server may ignore Range), unless one of them is malformed (416). A
  Range with a unit other than ``bytes`` is ignored (§14.2: "MUST ignore ... a range
  unit it does not understand").
- Validators (RFC 9110 §8.8, §13.1): a strong ETag from size, mtime and inode;
  If-None-Match uses the weak comparison, If-Range the strong one.
- `TokenBucket`: the one egress cap shared by every transfer of a process. A debt
  bucket: `take` always grants, and answers how long the caller must wait before it
  may send; callers that take in turn are released in turn, so concurrent transfers
  share the rate and the total released by time t never exceeds rate*t + burst.
  A transfer takes a *turn* of up to ``cap_turn_bytes`` at once and sends its paced
  writes inside it (`turn_write_release`): an answer of at most one turn finishes
  before one asked after it starts.
- `TrafficMeter`: the status agent of 000_9aae53f3113e9bd8.txt (sections 4-5): the
  outbound rate over the last interval, the mean rate per transfer active in it
  (overall and per issue: Algorithm 2's "average bandwidth used for that particular
  asset ... or an average of all sessions"), and which issues were served recently
  (the cache bonus). It is a timer core: ``next_deadline()`` says when the current
  interval closes, ``handle_timer(now=...)`` closes it and returns its `IntervalReport`.
  **What counts is bytes moving**: a transfer that has handed no byte to the network
  for ``stalled_after_s`` (a client that stopped reading) is *stalled*: it leaves
  ``active_transfers``, the per-issue counts and the per-transfer means until it
  moves again, so forty idle connections cannot make an origin look full (issue 25).
- `next_chunk_bytes`: how much the adapter hands to sendfile(2) next, so a slow client
  gets chunks of about `CHUNK_TARGET_S` and its progress shows within a second or so.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field

#: issue ids and bundle file names (docs/protocols.md, "Issue bundle on disk").
#: ``\Z``, not ``$``: ``$`` also matches before a trailing newline.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


def valid_name(name: str) -> bool:
    """True when `name` is a valid issue id or bundle file name."""
    return NAME_RE.match(name) is not None


# --------------------------------------------------------------------------- ranges


@dataclass(frozen=True, slots=True)
class ByteSpan:
    """The bytes ``first..last`` (both inclusive) of a file of `size_bytes` bytes."""

    first: int
    last: int
    size_bytes: int

    @property
    def length(self) -> int:
        """How many bytes the span holds."""
        return self.last - self.first + 1

    def content_range(self) -> str:
        """The ``Content-Range`` value of a 206 answer for this span."""
        return f"bytes {self.first}-{self.last}/{self.size_bytes}"


class RangeNotSatisfiable(ValueError):
    """The Range header is malformed or names no byte of the file: answer 416."""


_DIGITS = re.compile(r"^[0-9]{1,19}\Z")


def _parse_spec(spec: str, size: int) -> ByteSpan:
    """One range-spec (``a-b``, ``a-``, ``-n``) against a file of `size` bytes."""
    first_s, sep, last_s = spec.partition("-")
    first_s, last_s = first_s.strip(), last_s.strip()
    if not sep or (not first_s and not last_s):
        raise RangeNotSatisfiable(f"malformed range {spec!r}")
    if not first_s:
        # suffix range: the last n bytes
        if not _DIGITS.match(last_s):
            raise RangeNotSatisfiable(f"malformed suffix range {spec!r}")
        suffix = int(last_s)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(f"suffix range {spec!r} names no byte of {size}")
        return ByteSpan(max(0, size - suffix), size - 1, size)
    if not _DIGITS.match(first_s) or (last_s and not _DIGITS.match(last_s)):
        raise RangeNotSatisfiable(f"malformed range {spec!r}")
    first = int(first_s)
    if last_s and int(last_s) < first:
        raise RangeNotSatisfiable(f"malformed range {spec!r}: last byte before first")
    last = int(last_s) if last_s else size - 1
    if first >= size:
        raise RangeNotSatisfiable(f"range {spec!r} starts past the end ({size} bytes)")
    return ByteSpan(first, min(last, size - 1), size)


def parse_range(header: str | None, size_bytes: int) -> ByteSpan | None:
    """What a ``Range`` header asks of a file of `size_bytes` bytes.

    Returns the single `ByteSpan` to answer with 206, or None to answer the whole file
    with 200 (no header, a unit other than bytes, or several ranges). Raises
    `RangeNotSatisfiable` (416) for a malformed or unsatisfiable range.
    """
    if header is None:
        return None
    if header.startswith("bytes=") and header.isascii():
        # the web seeds' and readers' one form, ``bytes=a-b``, without the general
        # parse below (which answers the same for it: tests/origin/test_core.py)
        first_s, sep, last_s = header[6:].partition("-")
        if (
            sep
            and first_s.isdigit()
            and last_s.isdigit()
            and len(first_s) <= 19
            and len(last_s) <= 19
        ):
            first, last = int(first_s), int(last_s)
            if first <= last < size_bytes:
                return ByteSpan(first, last, size_bytes)
    unit, eq, ranges = header.strip().partition("=")
    if not eq:
        raise RangeNotSatisfiable(f"malformed Range header {header!r}")
    if unit.strip().lower() != "bytes":
        return None
    # RFC 9110 §5.6.1: a list may hold empty elements, which recipients skip.
    specs = [s for s in ranges.split(",") if s.strip()]
    if not specs:
        raise RangeNotSatisfiable(f"malformed Range header {header!r}")
    if len(specs) > 1:
        # Several ranges: every one must be well-formed, then the whole file is
        # answered (200). Unsatisfiable parts are fine: the whole file is the answer.
        for spec in specs:
            try:
                _parse_spec(spec, size_bytes)
            except RangeNotSatisfiable as err:
                if "malformed" in str(err):
                    raise
        return None
    return _parse_spec(specs[0], size_bytes)


# ----------------------------------------------------------------------- validators


def make_etag(size_bytes: int, mtime_ns: int, inode: int) -> str:
    """A strong entity tag for one version of a file (quotes included)."""
    return f'"{size_bytes:x}-{mtime_ns:x}-{inode:x}"'


def _entity_tags(header: str) -> list[str]:
    return [t.strip() for t in header.split(",") if t.strip()]


def none_match(header: str | None, etag: str) -> bool:
    """True when ``If-None-Match`` matches `etag` (weak comparison): answer 304."""
    if header is None:
        return False
    opaque = etag.removeprefix("W/")
    return any(tag == "*" or tag.removeprefix("W/") == opaque for tag in _entity_tags(header))


def if_range_holds(header: str | None, etag: str, last_modified: str) -> bool:
    """True when a Range may be honoured under ``If-Range`` (RFC 9110 §13.1.5).

    No header: yes. An entity tag: only a strong match. A date: only the exact
    ``Last-Modified`` value we send (our ETag is the stronger validator anyway).
    """
    if header is None:
        return True
    value = header.strip()
    if value.startswith('"') or value.startswith("W/"):
        return value == etag and not etag.startswith("W/")
    return value == last_modified


#: Content-Type by file extension; everything else is application/octet-stream.
CONTENT_TYPES: dict[str, str] = {
    "pdf": "application/pdf",
    "epub": "application/epub+zip",
    "torrent": "application/x-bittorrent",
    "json": "application/json",
    "txt": "text/plain; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "cbz": "application/vnd.comicbook+zip",
    "zip": "application/zip",
    "mobi": "application/x-mobipocket-ebook",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "png": "image/png",
    "mp4": "video/mp4",
    "bin": "application/octet-stream",
}


def content_type_for(name: str) -> str:
    """The Content-Type to answer for a bundle file named `name`."""
    _, dot, ext = name.rpartition(".")
    if not dot:
        return "application/octet-stream"
    return CONTENT_TYPES.get(ext.lower(), "application/octet-stream")


# ---------------------------------------------------------------------- token bucket


#: a file of at most this many bytes is a small object (a cover, a subscription wrap),
#: as are an issue's manifest and torrent whatever their size: the request class
#: ``small`` of docs/balancer.md; with an egress cap a small object goes out ahead of
#: the bulk transfers instead of waiting behind them (the issues themselves, and the
#: test files of the origin's own tests, are over 1 MB)
SMALL_OBJECT_BYTES = 256 * 1024


def is_small_object(name: str, size_bytes: int) -> bool:
    """Whether a file of the bundle is a small object: ``manifest.json``, a
    ``.torrent``, or any file of at most `SMALL_OBJECT_BYTES`."""
    return name == "manifest.json" or name.endswith(".torrent") or size_bytes <= SMALL_OBJECT_BYTES


class TokenBucket:
    """A token bucket of `rate_bytes_per_s` refill and `burst_bytes` depth, with debt.

    `take(n, now=...)` grants `n` bytes at once and answers how many seconds the caller
    must wait before sending them. Tokens may go negative: the debt is what callers
    already granted still wait for, so a caller who takes later is released later
    (release times are monotone in the order of `take`), and the bytes released by
    time t never exceed ``burst + rate * (t - t0)``. `n` may exceed `burst_bytes`.
    """

    def __init__(self, rate_bytes_per_s: float, burst_bytes: float, *, now: float = 0.0) -> None:
        if not (rate_bytes_per_s > 0 and math.isfinite(rate_bytes_per_s)):
            raise ValueError("rate_bytes_per_s must be a positive finite number")
        if not (burst_bytes >= 0 and math.isfinite(burst_bytes)):
            raise ValueError("burst_bytes must be a non-negative finite number")
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self.burst_bytes = float(burst_bytes)
        self._tokens = float(burst_bytes)
        self._last = now

    def _refill(self, now: float) -> None:
        self._tokens, self._last = refill_tokens(
            self._tokens, self._last, now, self.rate_bytes_per_s, self.burst_bytes
        )

    def take(self, n: int, *, now: float) -> float:
        """Grant `n` bytes; return the seconds to wait (from `now`) before sending them."""
        if n < 0:
            raise ValueError("cannot take a negative number of bytes")
        self._refill(now)
        self._tokens -= n
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate_bytes_per_s

    def tokens(self, *, now: float) -> float:
        """Tokens available at `now` (negative: debt still to be waited out)."""
        self._refill(now)
        return self._tokens


def refill_tokens(
    tokens: float, last: float, now: float, rate_bytes_per_s: float, burst_bytes: float
) -> tuple[float, float]:
    """A bucket's ``(tokens, last)`` after refilling from `last` to `now` (`TokenBucket`
    and the workers' shared bucket, `pressrun.origin.shared.SharedBucket`)."""
    # A clock that steps back (it should not) refills nothing.
    elapsed = max(0.0, now - last)
    return min(burst_bytes, tokens + elapsed * rate_bytes_per_s), max(last, now)


def turn_write_release(turn_released_at: float, left_after_write: int, rate: float) -> float:
    """When a paced write inside a turn may go: the turn (one `TokenBucket.take` of all
    its bytes, released at `turn_released_at`, its last byte's time) pays for its bytes
    in order, so a write that leaves `left_after_write` bytes of the turn to send is
    paid for that many bytes' time at `rate` before the turn's end. The writes go as
    each would had it been taken alone right after the one before: the bytes released
    by time t stay within ``burst + rate*t``, and takes after the turn's wait behind
    all of it (tests/origin/test_bucket_core.py simulates both)."""
    return turn_released_at - left_after_write / rate


# ------------------------------------------------------------------ chunk sizing

#: a sendfile chunk should take about this long: long enough that a fast client gets
#: the largest chunks (few calls), short enough that a slow one shows progress often
CHUNK_TARGET_S = 0.5
#: the smallest chunk handed to sendfile(2)
MIN_CHUNK_BYTES = 64 * 1024


def next_chunk_bytes(
    sent: int, elapsed_s: float, current: int, *, max_bytes: int, min_bytes: int = MIN_CHUNK_BYTES
) -> int:
    """The size of the next chunk after one of `current` bytes took `elapsed_s` to send
    `sent`: doubled (up to `max_bytes`) while chunks go out faster than
    `CHUNK_TARGET_S`, else what the last one's rate sends in `CHUNK_TARGET_S` (at
    least `min_bytes`). A stalled client thus meets the send timeout on a small chunk,
    and a slow one is not cut for a chunk sized for a fast one."""
    low = min(min_bytes, max_bytes)
    if elapsed_s <= CHUNK_TARGET_S:
        return max(low, min(max_bytes, 2 * current))
    rate = sent / elapsed_s
    return max(low, min(max_bytes, int(rate * CHUNK_TARGET_S)))


# ---------------------------------------------------------------- the status agent

#: A transfer active for less than this in an interval counts as active this long,
#: so one that sent a chunk in its first microsecond does not report a rate of TB/s.
MIN_ACTIVE_S = 0.01
#: how many closed intervals `TrafficMeter.recent_reports` keeps (``/stats``
#: ``recent_intervals``): a reader polling that many intervals late misses none
RECENT_REPORTS = 16


@dataclass(frozen=True, slots=True)
class IntervalReport:
    """What the origin sent in one closed interval ``(start, end]``.

    out_bytes_per_s: bytes sent by every transfer / interval length.
    mean_transfer_bytes_per_s: the mean, over the transfers active at any time in the
        interval, of (bytes it sent in the interval / time it was active in it); None
        when no transfer was active.
    mean_transfer_bytes_per_s_by_issue: the same mean per issue.
    """

    start: float
    end: float
    out_bytes: int
    transfers_seen: int
    mean_transfer_bytes_per_s: float | None
    mean_transfer_bytes_per_s_by_issue: dict[str, float]
    #: issue -> how many transfers its mean is over (what merging workers' means needs)
    transfers_seen_by_issue: dict[str, int] = field(default_factory=dict)

    @property
    def interval_s(self) -> float:
        """The interval's length in seconds."""
        return self.end - self.start

    @property
    def out_bytes_per_s(self) -> float:
        """Outbound bytes per second over the interval."""
        length = self.interval_s
        return self.out_bytes / length if length > 0 else 0.0


@dataclass(slots=True)
class _Transfer:
    issue: str
    started_at: float
    last_moved_at: float
    ended_at: float | None = None
    bytes_in_interval: int = 0
    bytes_total: int = 0
    #: no byte for `TrafficMeter.stalled_after_s`: not counted as load
    stalled: bool = False


@dataclass(slots=True)
class _IssueState:
    last_served: float
    active: int = 0
    bytes_total: int = 0


@dataclass(slots=True)
class TrafficMeter:
    """Byte counters of every transfer, closed into an `IntervalReport` each interval.

    Feed it `transfer_started` / `bytes_sent` / `transfer_ended` with ``now``; call
    `handle_timer` when `next_deadline` has come. Transfers that ended are kept until
    the interval they ended in is closed, so a short transfer still counts.

    A transfer that sent nothing for `stalled_after_s` is found stalled when an
    interval closes: it leaves `active_transfers` (and the per-issue counts) and is
    left out of the interval means until its next byte, which counts it again.
    """

    interval_s: float
    cache_window_s: float
    now: float
    stalled_after_s: float = 5.0
    _interval_start: float = field(init=False)
    _next_id: int = field(init=False, default=1)
    _transfers: dict[int, _Transfer] = field(init=False, default_factory=dict)
    _issues: dict[str, _IssueState] = field(init=False, default_factory=dict)
    _bytes_in_interval: int = field(init=False, default=0)
    bytes_sent_total: int = field(init=False, default=0)
    transfers_total: int = field(init=False, default=0)
    #: transfers moving bytes now (started, not ended, not stalled)
    active_transfers: int = field(init=False, default=0)
    #: transfers open but stalled (their client stopped reading)
    stalled_transfers: int = field(init=False, default=0)
    #: issue -> bytes sent for it since start (never forgotten, unlike the cache view)
    bytes_sent_by_issue: dict[str, int] = field(init=False, default_factory=dict)
    #: issue -> transfers started for it since start
    transfers_by_issue: dict[str, int] = field(init=False, default_factory=dict)
    last_report: IntervalReport = field(init=False)
    #: the last `RECENT_REPORTS` closed intervals, oldest first
    recent_reports: deque[IntervalReport] = field(
        init=False, default_factory=lambda: deque(maxlen=RECENT_REPORTS)
    )

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError("interval_s must be positive")
        if self.cache_window_s < 0:
            raise ValueError("cache_window_s must not be negative")
        if not self.stalled_after_s > 0:
            raise ValueError("stalled_after_s must be positive")
        self._interval_start = self.now
        # Before the first interval closes: nothing sent, no transfer seen.
        self.last_report = IntervalReport(
            start=self.now - self.interval_s,
            end=self.now,
            out_bytes=0,
            transfers_seen=0,
            mean_transfer_bytes_per_s=None,
            mean_transfer_bytes_per_s_by_issue={},
        )

    # -- events in

    def transfer_started(self, issue: str, *, now: float) -> int:
        """A transfer of a file of `issue` starts; returns its id for the other calls."""
        tid = self._next_id
        self._next_id += 1
        self._transfers[tid] = _Transfer(issue=issue, started_at=now, last_moved_at=now)
        state = self._issues.get(issue)
        if state is None:
            state = self._issues[issue] = _IssueState(last_served=now)
        state.active += 1
        state.last_served = max(state.last_served, now)
        self.transfers_total += 1
        self.active_transfers += 1
        self.transfers_by_issue[issue] = self.transfers_by_issue.get(issue, 0) + 1
        return tid

    def bytes_sent(self, transfer_id: int, n: int, *, now: float) -> None:
        """The transfer `transfer_id` has handed `n` more bytes to the network."""
        transfer = self._transfers[transfer_id]
        transfer.bytes_in_interval += n
        transfer.bytes_total += n
        self._bytes_in_interval += n
        self.bytes_sent_total += n
        if n > 0:
            transfer.last_moved_at = max(transfer.last_moved_at, now)
            if transfer.stalled and transfer.ended_at is None:
                self._set_stalled(transfer, False)
        state = self._issues[transfer.issue]
        state.bytes_total += n
        state.last_served = max(state.last_served, now)
        issue = transfer.issue
        self.bytes_sent_by_issue[issue] = self.bytes_sent_by_issue.get(issue, 0) + n

    def transfer_paced(self, transfer_id: int, *, now: float) -> None:
        """The transfer waits for the egress cap until `now` (our pacing, not its
        client; the adapter says so as the wait starts): it counts as moving until then
        (a long queue on a small cap is load, not a stall)."""
        transfer = self._transfers[transfer_id]
        transfer.last_moved_at = max(transfer.last_moved_at, now)
        if transfer.stalled and transfer.ended_at is None:
            self._set_stalled(transfer, False)

    def transfer_ended(self, transfer_id: int, *, now: float) -> int:
        """The transfer ended (complete, cut or failed); returns the bytes it sent."""
        transfer = self._transfers[transfer_id]
        if transfer.ended_at is not None:
            return transfer.bytes_total
        transfer.ended_at = now
        state = self._issues[transfer.issue]
        if transfer.stalled:
            self.stalled_transfers -= 1
        else:
            self.active_transfers -= 1
            state.active -= 1
        state.last_served = max(state.last_served, now)
        return transfer.bytes_total

    def _set_stalled(self, transfer: _Transfer, stalled: bool) -> None:
        """Move an open transfer between the moving and the stalled counts."""
        if transfer.stalled == stalled:
            return
        transfer.stalled = stalled
        step = -1 if stalled else 1
        self.active_transfers += step
        self.stalled_transfers -= step
        self._issues[transfer.issue].active += step

    # -- timer

    def next_deadline(self) -> float:
        """When the current interval closes."""
        return self._interval_start + self.interval_s

    def handle_timer(self, *, now: float) -> IntervalReport:
        """Close the interval ``(start, now]`` and return its report.

        Called at or after `next_deadline`; a late call (a busy loop) closes a longer
        interval and the rates are over its real length.
        """
        start = self._interval_start
        end = max(now, start)
        rates: list[float] = []
        by_issue: dict[str, list[float]] = {}
        for tid in list(self._transfers):
            transfer = self._transfers[tid]
            if transfer.ended_at is None and end - transfer.last_moved_at >= self.stalled_after_s:
                self._set_stalled(transfer, True)
            if transfer.stalled and transfer.bytes_in_interval == 0:
                # a client that stopped reading is no load: no rate of 0 in the means
                if transfer.ended_at is not None:
                    del self._transfers[tid]
                continue
            active_from = max(transfer.started_at, start)
            active_to = end if transfer.ended_at is None else min(transfer.ended_at, end)
            active_s = max(active_to - active_from, MIN_ACTIVE_S)
            rate = transfer.bytes_in_interval / active_s
            rates.append(rate)
            by_issue.setdefault(transfer.issue, []).append(rate)
            transfer.bytes_in_interval = 0
            if transfer.ended_at is not None:
                del self._transfers[tid]
        report = IntervalReport(
            start=start,
            end=end,
            out_bytes=self._bytes_in_interval,
            transfers_seen=len(rates),
            mean_transfer_bytes_per_s=sum(rates) / len(rates) if rates else None,
            mean_transfer_bytes_per_s_by_issue={
                issue: sum(values) / len(values) for issue, values in sorted(by_issue.items())
            },
            transfers_seen_by_issue={
                issue: len(values) for issue, values in sorted(by_issue.items())
            },
        )
        self._bytes_in_interval = 0
        self._interval_start = end
        self.last_report = report
        self.recent_reports.append(report)
        # Forget issues neither active nor served within the cache window.
        horizon = end - self.cache_window_s
        # (an issue whose only open transfers are stalled has active 0 but is kept)
        open_issues = {t.issue for t in self._transfers.values() if t.ended_at is None}
        for issue in [i for i, s in self._issues.items() if s.active == 0 and i not in open_issues]:
            if self._issues[issue].last_served < horizon:
                del self._issues[issue]
        return report

    # -- queries

    def cached_issues(self, *, now: float) -> list[str]:
        """Issues being served now or served within the cache window, sorted."""
        horizon = now - self.cache_window_s
        return sorted(
            issue
            for issue, state in self._issues.items()
            if state.active > 0 or state.last_served >= horizon
        )

    def active_transfers_by_issue(self) -> dict[str, int]:
        """Issue -> transfers of it active now (issues with none left out), sorted."""
        return {issue: s.active for issue, s in sorted(self._issues.items()) if s.active > 0}

    def transfer_bytes(self, transfer_id: int) -> int:
        """Bytes the transfer has sent so far."""
        return self._transfers[transfer_id].bytes_total
