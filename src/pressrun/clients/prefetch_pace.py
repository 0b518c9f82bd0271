"""The pace of a prefetch (``pressrun get --prefetch``): pure, the caller passes the
monotonic ``now``. The prefetch's adapter is :mod:`pressrun.clients.prefetch`."""

from __future__ import annotations

__all__ = ["PrefetchPace"]


class PrefetchPace:
    """The pace of a prefetch (``pressrun get --prefetch``, issue 35): at most the
    balancer's grant, ``rate_bytes_per_s``, averaged over the download.

    Each piece may start once the pieces before it would have taken their bytes at the
    rate: ``start = max(now, free_at)``, then ``free_at = start + size / rate``. No
    burst builds up while idle (``max(now, ...)``). A rate of 0 means wait
    (``wait_s`` answers None). Pure: the caller passes ``now`` (monotonic seconds).
    """

    def __init__(self, rate_bytes_per_s: float, *, now: float) -> None:
        self.rate_bytes_per_s = max(0.0, rate_bytes_per_s)
        self.free_at = now

    def set_rate(self, rate_bytes_per_s: float) -> None:
        """A new grant (a renewal may cut or raise it; 0: wait for room)."""
        self.rate_bytes_per_s = max(0.0, rate_bytes_per_s)

    def wait_s(self, size_bytes: int, *, now: float) -> float | None:
        """Seconds to wait before fetching ``size_bytes`` (booked at once); None while
        the rate is 0 (nothing is booked)."""
        if self.rate_bytes_per_s <= 0:
            return None
        start = max(now, self.free_at)
        self.free_at = start + size_bytes / self.rate_bytes_per_s
        return start - now
