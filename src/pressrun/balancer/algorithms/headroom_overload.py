"""Under overload, the room goes to the downloads that cost the others least (issue 33).

When the clients asking for downloads want more bytes per second than the origins can
send, every byte given to one client is taken from another. The count of clients
served on time is then largest when the room goes to those whose download costs the
fewest bytes: a fractional knapsack over the demand, cheapest first (the crowd of a
30 MB issue beside one of a 230 MB issue: each client of the second costs the link
what seven of the first do).

Per issue with a stated size (its need x its deadline, `set_issue_need`), `IssueDemand`
keeps the rate at which new clients ask for it (a client's first request: ``elapsed=``
under `FIRST_ASK_S`; an exponentially decayed count over `window_s`, O(1) state per
issue). A download that still lacks ``L`` bytes (the issue's size for a new client,
what it lacks for one resuming: its sunk bytes cost nothing more) is *priced out*
when the new clients of the issues cheaper than it, alone, ask for at least the room
of every origin in rotation::

    sum over issues j with size S_j < L of  rate_j * S_j  >=  capacity  (bytes/s)

It is only a refusal while the balancer is refusing clients for want of room anyway
(`Headroom.overload_memory_s`): below capacity every client that fits is admitted as
before, and an issue's clients are never priced out by clients of its own size.
Refusing by price sets no overload: when the cheap demand falls below capacity, the
room is left free, the refusals for want of room stop and the dear issues are admitted
again within `overload_memory_s`.

Why the demand's rate and not the clients refused: a crowd's clients retry for a while
and give up; the rate of first asks is the demand whatever the balancer answered them,
and it follows a crowd's ebb within `window_s`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from pressrun.balancer.algorithms.headroom_clients import finishes_in_time
from pressrun.balancer.events import ClientHint

#: a request whose client says it has been at it less than this long is its first ask
FIRST_ASK_S = 1.0


class IssueDemand:
    """New clients per second asking for each issue, each issue's asks decayed over
    its own window (its deadline: the demand on the time scale it must be served in)."""

    def __init__(self) -> None:
        #: issue -> (decayed count of first asks, when it was last decayed, window s)
        self._counts: dict[str, tuple[float, float, float]] = {}

    def record(self, issue_id: str, window_s: float, *, now: float) -> None:
        """A new client asked for the issue, whose asks are counted over `window_s`."""
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self._counts[issue_id] = (self._count(issue_id, now) + 1.0, now, window_s)

    def rate(self, issue_id: str, *, now: float) -> float:
        """New clients per second asking for the issue lately."""
        entry = self._counts.get(issue_id)
        return 0.0 if entry is None else self._count(issue_id, now) / entry[2]

    def _count(self, issue_id: str, now: float) -> float:
        entry = self._counts.get(issue_id)
        if entry is None:
            return 0.0
        count, at, window = entry
        return count * math.exp(-max(now - at, 0.0) / window)

    def forget(self, issue_id: str) -> None:
        """The issue is gone: forget its demand."""
        self._counts.pop(issue_id, None)

    def issues(self) -> int:
        """How many issues have a demand remembered (one entry per issue known)."""
        return len(self._counts)

    def demand(self, sizes: Mapping[str, float], *, now: float) -> float:
        """Bytes/s the new clients of every issue in `sizes` (issue -> bytes) ask for."""
        return sum(self.rate(issue, now=now) * size for issue, size in sizes.items())

    def cheaper_demand(self, lack_bytes: float, sizes: Mapping[str, float], *, now: float) -> float:
        """Bytes/s the new clients of the issues smaller than `lack_bytes` ask for."""
        total = 0.0
        for issue, size in sizes.items():
            if size < lack_bytes:
                total += self.rate(issue, now=now) * size
        return total

    def priced_out(
        self,
        lack_bytes: float,
        sizes: Mapping[str, float],
        capacity_bytes_per_s: float,
        *,
        now: float,
    ) -> bool:
        """Whether a download lacking `lack_bytes` is priced out (module docstring)."""
        if capacity_bytes_per_s <= 0:
            return False
        return self.cheaper_demand(lack_bytes, sizes, now=now) >= capacity_bytes_per_s


class Overload:
    """The demand of the downloads whose sizes are stated against the origins' room:
    `sizes()` gives issue -> bytes, `capacity()` the bytes/s every origin in rotation
    sends (both from `Headroom`)."""

    def __init__(
        self,
        sizes: Callable[[], Mapping[str, float]],
        capacity: Callable[[], float],
        price_window_s: float = 30.0,
    ) -> None:
        if not price_window_s > 0:
            raise ValueError(f"price_window_s must be positive, got {price_window_s!r}")
        #: the asks of each issue over its deadline: is the demand over capacity
        self.demand = IssueDemand()
        #: the asks of each issue over `price_window_s`: who is priced out
        self.recent = IssueDemand()
        self.price_window_s = price_window_s
        self.sizes = sizes
        self.capacity = capacity

    def asked(
        self, issue_id: str, client: ClientHint, need: float, deadline_s: float, *, now: float
    ) -> None:
        """A client asked for a download of the issue (needing `need` bytes/s, due
        `deadline_s` after its request): its first ask counts in the demand if its own
        link can bring the file in time (one that cannot is no use for the room)."""
        rate = client.rate_bytes_per_s
        if client.elapsed_s is None or client.elapsed_s >= FIRST_ASK_S:
            return
        if rate is None or finishes_in_time(client, need, rate):
            self.demand.record(issue_id, deadline_s, now=now)
            self.recent.record(issue_id, self.price_window_s, now=now)

    def exceeds_capacity(self, *, now: float) -> bool:
        """Whether the new clients ask for more bytes/s than the origins send."""
        capacity = self.capacity()
        return capacity > 0 and self.demand.demand(self.sizes(), now=now) >= capacity

    def priced_out(self, client: ClientHint, size_bytes: float, *, now: float) -> bool:
        """Whether the client's download (of `size_bytes` where it does not say) is
        priced out: the new clients of cheaper issues ask for all the room."""
        lack = float(max((client.size_bytes or size_bytes) - client.have_bytes, 0))
        return self.recent.priced_out(lack, self.sizes(), self.capacity(), now=now)
