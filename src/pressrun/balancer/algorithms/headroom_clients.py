"""What a client tells headroom dispatch, and how a download is counted for it.

A pressrun client says in each directive request (`ClientHint`: ``have=``, ``size=``,
``rate=``, ``elapsed=``; `pressrun get` sends all but ``rate=``, docs/balancer.md) how
much of the file it has, the file's size, its link's rate and how long it has been at
it. `Headroom.rank_for` and `Headroom.handle_pick_for` use it, for downloads only:

- a client resuming lacks part of the file and has used part of its time: its transfer
  counts ``lack / (T - elapsed)`` (T = size / need(i), the issue's target time), at most
  need(i), at least `MIN_NEED_SHARE` x need(i) (`client_need`), in the picks on their
  way and, once started, in the origin's `committed` (a `Relief` of the difference,
  until its bytes have come at the rate the origin's transfers of the issue get:
  `relief_total`). Counted at the full need, the clients a failed origin dropped were
  refused "full" by the survivors (issue 10, gen-7-033); counted at ``lack / T``
  (without the time used) too many were admitted and finished late together;
- an origin where the client would get all its link carries (`Headroom.share`: its
  room shared evenly among its transfers, the picks on their way and this one) ranks
  before one where it would not, most room first among each (an idle small origin
  takes a slow client a busy big one would slow down: gen-7-059, gen-7-056);
- a client whose link cannot carry what it needs (``rate`` below (1 - slack) of it, and
  the origins give their transfers over `SLOWER_THAN_ORIGINS` times its rate) is
  refused while another client was refused for want of room in the last
  `overload_memory_s`: the room goes to those it can serve well (gen-7-036: 80 such
  clients took 20 of the 75 GB sent). Counting it at its link's rate instead admitted
  more of them (measured worse: docs/tournament.md). Only for an issue whose need is
  stated (`set_issue_need`: its size over a deadline): the default need is what a
  transfer should get, not a deadline a slower client cannot meet (the security soak
  test's clients read 65 kB at 0.4 MB/s in one busy process, the egress demo's 1 MB/s
  links measure a little under the 1 MB/s need: `pressrun get` sends ``rate=`` and
  neither is refused on it);
- a client that cannot finish by its deadline at the rate it would get on the origin
  it would go to (`finishes_in_time`: that origin's room shared evenly among its
  transfers, the picks on their way and it, at most its link) is refused while another
  was refused for want of room in the last `doomed_window_s` (4 s), for an issue whose
  need is stated: when the survivors of a failure cannot carry everyone, the bytes go
  to clients that can still finish (gen-13-039: 656 -> 684 served; gen-7-036 251 ->
  258). Deferring bigger downloads while smaller ones were refused (SRPT-like) was
  measured worse (gen-7-033: 317 -> 280; docs/tournament.md);
- a started transfer whose client's link is slower than its need (``rate``) is
  remembered (`Relief.slow`) until its bytes have come: the shortfall it explains is
  the client's, and teaches nothing of the origin's link (gen-17-099: a 5 GB/s origin
  learned at 440 MB/s, then 80, from its 10-50 Mbit/s clients; 674 -> 732 served).

Lying buys nothing beyond what an honest client could get: a claimed ``have`` is
counted as an honest client holding that much (and never below a tenth of the need), a
lower ``rate`` or a longer ``elapsed`` only counts the client at more or refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pressrun.balancer.algorithms.headroom_model import Relief
from pressrun.balancer.events import ClientHint

#: a download a client tells the balancer about (`ClientHint`) is counted at no less
#: than this share of its issue's need, whatever it says it has or its link carries
MIN_NEED_SHARE = 0.1
#: a client whose link cannot carry its need is told apart from one held back by
#: busy origins when the origins give their transfers this many times its rate
SLOWER_THAN_ORIGINS = 2.0
#: the longest a transfer counted below its issue's need is remembered as such (s)
MAX_RELIEF_S = 3600.0


def client_need(need: float, client: ClientHint | None) -> float | None:
    """What a download needing `need` bytes/s (its size over its target time `T`)
    needs for this client, where what it told makes that less, else None.

    A client resuming lacks only part of the file, and has used part of its time: it
    needs what it lacks over what is left of `T` (``lack / (T - elapsed)``; without
    ``elapsed``, ``lack / T``), never more than `need` (a client past its target is
    counted as a new one). Never below `MIN_NEED_SHARE` of `need` either: a client
    saying it has all but one byte is counted as one that truly has 90 % of the file,
    so lying buys no more than that, and saying it waited longer only counts it at
    more. It needs the file's size.
    """
    if client is None or not client.size_bytes:
        return None
    lack = max(client.size_bytes - client.have_bytes, 0)
    time_left = client.size_bytes / need - (client.elapsed_s or 0.0)
    counted = need if time_left <= 0 else min(need, lack / time_left)
    counted = max(counted, MIN_NEED_SHARE * need)
    return counted if counted < need else None


def finishes_in_time(client: ClientHint, need: float, rate: float) -> bool:
    """Whether the client gets what it lacks before its deadline (its issue's target
    time, size / `need`, less the time it has been at it) at `rate` bytes/s."""
    size = client.size_bytes or 0
    lack = max(size - client.have_bytes, 0)
    return lack <= rate * (size / need - (client.elapsed_s or 0.0))


def relief_total(
    reliefs: list[Relief],
    counts: Mapping[str, int],
    means: Mapping[str, float],
    need: Callable[[str], float],
    now: float,
) -> tuple[list[Relief], float, dict[str, float]]:
    """(the reliefs still on, bytes/s they take off the origin's `committed`, bytes/s
    per issue the clients' own links hold its transfers below what they are counted
    at): each transfer counted below its issue's need, or whose link is slower than
    that, lasts until its bytes should have come (`Relief`); all of an issue's end when
    the origin has no transfer of it left, and they never bring an issue's transfers
    below `MIN_NEED_SHARE` of their need."""
    kept: list[Relief] = []
    by_issue: dict[str, float] = {}
    slow_by_issue: dict[str, float] = {}
    for r in reliefs:
        # The transfer gets what the origin's transfers of its issue get on average,
        # at most its link's rate: when that has brought the bytes it lacked, it is
        # done (or nearly), and its relief ends with it.
        got = min(means.get(r.issue, need(r.issue)), r.rate)
        r.left -= got * (now - r.seen)
        r.seen = now
        if r.left > 0 and now - r.since < MAX_RELIEF_S and counts.get(r.issue, 0) > 0:
            kept.append(r)
            by_issue[r.issue] = by_issue.get(r.issue, 0.0) + r.less
            slow_by_issue[r.issue] = slow_by_issue.get(r.issue, 0.0) + r.slow
    total = sum(
        min(less, counts[issue] * need(issue) * (1.0 - MIN_NEED_SHARE))
        for issue, less in by_issue.items()
    )
    slow = {
        issue: min(less, counts[issue] * need(issue) * (1.0 - MIN_NEED_SHARE))
        for issue, less in slow_by_issue.items()
        if less > 0
    }
    return kept, total, slow
