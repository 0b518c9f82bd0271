"""Downloads of different deadlines on one origin (issue 33): how many more of an issue
it takes with every download there still on time, its link shared evenly.

A link shared evenly (TCP; processor sharing) gives every download on it the same
rate, so a download of S_k bytes is done once every other has received min(S_j, S_k):
all are on time while, for every issue k there (and the new one)::

    sum_j n_j * min(S_j, S_k) <= room * D_k * (1 - margin)

with S = need x deadline, every transfer counted whole (as if all had just started),
and the picks on their way counted with those running. With one deadline for all this
is ``sum_j n_j * need_j <= room``: the committed rule of
`pressrun.balancer.algorithms.headroom`, so the check applies only where the
deadlines there differ (`deadlines_differ`). With several, a download due soon waits
for the bytes of those due late too: crowd-33-010, 228 MB due in 451 s beside 178 MB
due in 696 s, counted at their needs (0.51 and 0.26 MB/s), got 0.46 MB/s each and all
127 of the first on the biggest server were late; crowd-33-014, 392 to 644 served
(bound 1045).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from pressrun.balancer.algorithms.headroom_model import Pick


def download_counts(
    active: Mapping[str, int], picks: Iterable[Pick], deadlines: Mapping[str, float]
) -> dict[str, int]:
    """Downloads with a stated deadline on the origin and on their way to it, per issue."""
    counts = {i: k for i, k in active.items() if i in deadlines}
    for pick in picks:
        if pick[1] in deadlines:
            counts[pick[1]] = counts.get(pick[1], 0) + 1
    return counts


def deadlines_differ(
    issue_id: str,
    active: Iterable[str],
    picks: Iterable[Pick],
    deadlines: Mapping[str, float],
    slack: float,
) -> bool:
    """Whether downloads of another deadline (beyond `slack` of its own) than
    `issue_id`'s are on the origin or on their way to it."""
    mine = deadlines[issue_id]
    for issue in active:
        d = deadlines.get(issue)
        if d is not None and abs(d - mine) > slack * mine:
            return True
    for pick in picks:
        d = deadlines.get(pick[1])
        if d is not None and abs(d - mine) > slack * mine:
            return True
    return False


def deadline_free(
    issue_id: str,
    active: Mapping[str, int],
    picks: Iterable[Pick],
    deadlines: Mapping[str, float],
    need: Callable[[str], float],
    room: float,
    margin: float,
) -> float:
    """Downloads of `issue_id` the origin can take with every download there on time
    (module docstring); transfers of issues without a deadline (streams, the default
    need) take their need throughout."""
    counts = download_counts(active, picks, deadlines)
    size = {i: need(i) * deadlines[i] for i in counts}
    size[issue_id] = mine = need(issue_id) * deadlines[issue_id]
    other = sum(k * need(i) for i, k in active.items() if i not in deadlines)
    free = math.inf
    for k_issue, s_k in size.items():
        d_k = deadlines[k_issue] * (1.0 - margin)
        load = sum(n * min(size[j], s_k) for j, n in counts.items()) / d_k + other
        free = min(free, (room - load) / (min(mine, s_k) / d_k))
    return free
