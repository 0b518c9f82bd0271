"""The burst term of the demand estimate (issue 28): the counted requests of the last
few seconds, so D follows a crowd's start sooner than the 10 s EWMA does.

The EWMA (`pressrun.balancer.demand`) needs a time constant to believe a new rate:
from wave 2's D of about 11, flash-crowd-50-desktops' peak (4 clients a second from
60 s) read 45 only at 65-66 s, and the 20-22 readers who asked meanwhile were told
``swarm``, then left it for the carousel (29.7 s against the twin's 26.0 at c0fe53d:
docs/results/2026-11-29-demand-burst.md). The same Little's law over a short window
answers sooner: n requests counted in the last ``window_s`` seconds are an arrival rate
of n / window_s, so n x typical_download_s / window_s downloaders once it holds a
typical download. A handful of requests says little about a rate (a Poisson count of
n has a standard deviation of sqrt(n)), so the term counts the rate's lower bound,
n - z sqrt(n): `burst_downloaders`. It is never the estimate alone: D is the larger of
it and the EWMA's (`DemandPolicy`), so D is never under the EWMA's: a step up comes
no later, and D falls under a level no sooner (the dwell, which counts from each
change, ends sooner after a sooner step up).

`RecentRequests` keeps the counts in a ring of `BUCKETS` buckets of window_s / BUCKETS
seconds: constant memory per issue, whatever the request rate. A count older than the
ring is dropped; a clock that goes back (``now`` only grows in the policy) is counted
in the newest bucket.
"""

from __future__ import annotations

import math

#: the ring's buckets: the window ends between window_s x (1 - 1 / BUCKETS) and
#: window_s back
BUCKETS = 12


def burst_downloaders(
    count: float, *, window_s: float, z: float, typical_download_s: float
) -> float:
    """The downloaders ``count`` requests in ``window_s`` seconds stand for by Little's
    law, at the lower bound of their rate: max(0, n - z sqrt(n)) / window_s x
    typical_download_s. With 3 s, 1.5 and 30 s: 9 requests read 45, 5 read 4.2 (the
    EWMA reads about 12 for those 5), 30 read 217."""
    if count <= 0.0:
        return 0.0
    sure = count - z * math.sqrt(count)
    return max(0.0, sure) / window_s * typical_download_s


class RecentRequests:
    """Requests counted in the last ``window_s`` seconds, in `BUCKETS` buckets."""

    __slots__ = ("_counts", "_newest", "_width")

    def __init__(self, window_s: float) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError("window_s must be a positive number")
        self._width = window_s / BUCKETS
        self._counts = [0.0] * BUCKETS
        #: the newest bucket's number (time // width); None before the first count
        self._newest: int | None = None

    def _bucket(self, now: float) -> int:
        return math.floor(now / self._width)

    def _advance(self, bucket: int) -> None:
        """Make ``bucket`` the newest, emptying the buckets it passes over."""
        newest = self._newest
        if newest is None or bucket - newest >= BUCKETS:
            self._counts = [0.0] * BUCKETS
        elif bucket > newest:
            for b in range(newest + 1, bucket + 1):
                self._counts[b % BUCKETS] = 0.0
        else:
            return
        self._newest = bucket

    def add(self, now: float, count: float = 1.0) -> None:
        """Count ``count`` requests at ``now``."""
        if not (count > 0.0 and math.isfinite(count)):
            return
        bucket = self._bucket(now)
        self._advance(bucket)
        newest = self._newest
        assert newest is not None
        self._counts[min(bucket, newest) % BUCKETS] += count

    def count(self, now: float) -> float:
        """The requests counted in the window ending at ``now``."""
        newest = self._newest
        if newest is None:
            return 0.0
        bucket = self._bucket(now)
        oldest = max(bucket, newest) - BUCKETS + 1
        return sum(self._counts[b % BUCKETS] for b in range(oldest, newest + 1))
