"""What headroom dispatch keeps per origin: its learned costs, the picks on their way,
the transfers counted below their issue's need, and the signs that its link is full.

The algorithm and its formulas: `pressrun.balancer.algorithms.headroom`; what a client
tells and how it is counted: `pressrun.balancer.algorithms.headroom_clients`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pressrun.balancer.events import OriginStatus

#: an origin sending this share of its learned capacity is at it: elastic downloads
#: would take more if there were more, so the limit is not probed upwards
SATURATED = 0.99
#: an origin's elastic transfers must change by this share (and at least by
#: `FULL_LINK_MIN_CHANGE`) between two statuses for an unchanged `out` to show its link
#: full (`OriginModel.link_full`)
FULL_LINK_CHANGE = 0.1
FULL_LINK_MIN_CHANGE = 2

#: a pick on its way: (picked at, issue, need counted, relief: bytes/s less than the
#: issue's need, bytes the client lacks, its link's rate (inf: not told))
Pick = tuple[float, str, float, float, float, float]


@dataclass(slots=True)
class Relief:
    """A transfer started that needs `less` bytes/s than its issue's need (its client
    resumes: `headroom_clients.client_need`), or whose client's link carries `slow`
    bytes/s less than the need it is counted at (it told its `rate`), until the `left`
    bytes it lacks have come at the rate the origin's transfers of the issue get (at
    most its link's `rate`), or for `headroom_clients.MAX_RELIEF_S`. `less` lowers the
    origin's `committed`; `slow` only what the origin must send to show it is not held
    back (a transfer limited at the client's end teaches nothing of the origin's link)."""

    issue: str
    less: float
    left: float
    rate: float
    since: float
    seen: float
    slow: float = 0.0


@dataclass(slots=True)
class OriginModel:
    """What headroom dispatch has learned about one origin."""

    learned_bytes_per_s: float | None = None
    idle_cpu: float = 0.0
    idle_ram: float = 0.0
    idle_seen: bool = False
    cpu_per_byte: float | None = None
    cost_ram: float | None = None
    committed_bytes_per_s: float = 0.0
    #: picks whose transfer the origin has not reported started yet, oldest first
    #: (`Pick`); `pending` and `pending_bytes` are their count and the needs' sum
    picks: deque[Pick] = field(default_factory=deque)
    #: transfers started that need less than their issue's need (a client resuming:
    #: `ClientHint`), subtracted from `committed`, or whose clients' links are slower
    #: than their need (`headroom_clients.relief_total`)
    reliefs: list[Relief] = field(default_factory=list)
    #: bytes/s the transfers' own links hold them below `committed`, per issue (their
    #: clients told their `rate`): from the last status
    client_slow: dict[str, float] = field(default_factory=dict)
    pending: int = 0
    pending_bytes: float = 0.0
    #: picks since the last status: what the floor of `probe_transfers` counts
    picked_since_status: int = 0
    #: when the last status was taken in (``now``): picks after it are in
    #: `picked_since_status`
    status_at: float = -math.inf
    #: the origin's counters of transfers started (in all, per issue) at its last
    #: status; None before one that reports them
    started_total: int | None = None
    started_by_issue: dict[str, int] = field(default_factory=dict)
    #: the picks on their way by (need, paced): what the max-min level counts
    pending_loads: dict[tuple[float, bool], int] = field(default_factory=dict)
    under_served: bool = False
    #: the rate a starved transfer gets (max-min level), inf when none is starved
    level: float = math.inf
    #: (need, transfers, paced) of each issue on the origin, from the last status
    loads: tuple[tuple[float, int, bool], ...] = ()
    #: (transfers, out, committed) of the status `link_full` compares the next one with
    elastic_seen: tuple[int, float, float] = (0, 0.0, 0.0)

    def squeezed(self, rate: float) -> float:
        """Bytes/s the link must give its transfers (the status's and the picks since)
        for the max-min level to stay at `rate`: a paced transfer needing less takes its
        need, every other (a bigger stream, or an elastic download, which takes the
        level whatever its need) takes `rate`."""
        total = 0.0
        for need, k, paced in self.loads:
            total += k * (min(need, rate) if paced else rate)
        for (need, paced), k in self.pending_loads.items():
            total += k * (min(need, rate) if paced else rate)
        return total

    def paced_needs(self) -> set[float]:
        """The needs of the streams on the origin (and picked since the status)."""
        found = {need for need, _, paced in self.loads if paced}
        found.update(need for need, paced in self.pending_loads if paced)
        return found

    def streams_lead(self, share: float) -> bool:
        """Whether the streams there (and picked since the status) need at least
        `share` of what its downloads need (bytes/s, each at its issue's need)."""
        need_of = {True: 0.0, False: 0.0}
        for need, k, paced in self.loads:
            need_of[paced] += k * need
        for (need, paced), k in self.pending_loads.items():
            need_of[paced] += k * need
        return need_of[True] > 0 and need_of[True] >= share * need_of[False]

    def link_full(
        self, status: OriginStatus, elastic: bool, slack: float, committed: float
    ) -> bool:
        """Whether this status shows the origin's link full at what it sends: `out`
        stayed within `slack` while its transfers' number changed by `FULL_LINK_CHANGE`
        since the status compared with. With only elastic transfers (downloads, each
        taking what its client's link takes, at most the link's max-min level), were
        the link not the limit, `out` would follow their number, each adding or
        removing what its client takes; with streams there too, the change must also
        move what the transfers need (`committed`) by twice `slack` of `out` (a paced
        stream takes its bitrate: twenty of 64 kB/s added to a gigabit link move it by
        less than the slack). An unchanged `out` is the link's (or CPU's) limit,
        whatever it is told (a misconfigured origin: issue 10, gen-7-033, and
        gen-2026-021: streams and downloads on an origin told 10.4 GB/s with
        1.25 GB/s, its `out` at 1250 MB/s while its transfers went from 286 to 737)."""
        n, out = status.active_transfers, status.out_bytes_per_s
        if n <= 0 or out <= 0:
            self.elastic_seen = (0, 0.0, 0.0)
            return False
        seen_n, seen_out, seen_committed = self.elastic_seen
        changed = abs(n - seen_n)
        if seen_n > 0 and changed < max(FULL_LINK_MIN_CHANGE, FULL_LINK_CHANGE * max(n, seen_n)):
            return False  # too few changed to tell: compare the next with the same one
        if (
            seen_n > 0
            and not elastic
            and abs(committed - seen_committed) < 2.0 * slack * max(out, seen_out)
        ):
            return False  # their needs moved too little to tell: the same
        self.elastic_seen = (n, out, committed)
        return seen_n > 0 and abs(out - seen_out) <= slack * max(out, seen_out)

    def count_picks(self, is_paced: Callable[[str], bool]) -> None:
        """`pending`, `pending_bytes` and `pending_loads` from the picks on their way."""
        self.pending = len(self.picks)
        self.pending_bytes = sum(p[2] for p in self.picks)
        loads: dict[tuple[float, bool], int] = {}
        for _, issue, need, _, _, _ in self.picks:
            key = (need, is_paced(issue))
            loads[key] = loads.get(key, 0) + 1
        self.pending_loads = loads

    def add_pick(self, pick: Pick, paced: bool) -> None:
        """A pick on its way, counted at its need."""
        self.picks.append(pick)
        self.pending += 1
        self.picked_since_status += 1
        self.pending_bytes += pick[2]
        key = (pick[2], paced)
        self.pending_loads[key] = self.pending_loads.get(key, 0) + 1

    def take_back(self, pick: Pick, is_paced: Callable[[str], bool]) -> bool:
        """Remove this pick (the very tuple) if it is still on its way; whether it was."""
        picks = self.picks
        for k in range(len(picks) - 1, -1, -1):
            if picks[k] is pick:
                del picks[k]
                if pick[0] >= self.status_at:
                    self.picked_since_status = max(self.picked_since_status - 1, 0)
                self.count_picks(is_paced)
                return True
        return False

    def reconcile(self, status: OriginStatus, now: float, pick_timeout_s: float) -> None:
        """Forget the picks the status accounts for: per issue, as many of the oldest as
        the origin started transfers of it since its last status (they are in its
        active counts now, or already done), and any older than `pick_timeout_s` (the
        client went elsewhere or gave up). A pick whose client has not connected when
        the origin answers stays pending. From an agent that does not count the
        transfers it starts, a status is taken to account for every pick. A pick
        counted below its issue's need, or whose client's link is slower than that, becomes a
        `Relief` when it starts."""
        total = status.transfers_total
        picks = self.picks
        started: list[Pick] = []
        if total is None or self.started_total is None or total < self.started_total:
            # no counters, the first status, or counters that went back (a restart)
            if total is None:
                started.extend(picks)
                picks.clear()
        elif total > self.started_total and picks:
            before = self.started_by_issue
            arrived = {
                issue: n - before.get(issue, 0)
                for issue, n in status.transfers_total_by_issue.items()
                if n > before.get(issue, 0)
            }
            kept: deque[Pick] = deque()
            for pick in picks:
                left = arrived.get(pick[1], 0)
                if left > 0:
                    arrived[pick[1]] = left - 1
                    started.append(pick)
                else:
                    kept.append(pick)
            self.picks = picks = kept
        for _, issue, need, less, lack, rate in started:
            slow = max(need - rate, 0.0)
            if less > 0 or slow > 0:
                self.reliefs.append(Relief(issue, less, lack, rate, now, now, slow))
        self.started_total = total
        self.started_by_issue = dict(status.transfers_total_by_issue)
        horizon = now - pick_timeout_s
        while picks and picks[0][0] < horizon:
            picks.popleft()
