"""headroom with downloads of different deadlines on one origin (issue 33): a link
shared evenly makes a download of a short deadline wait for the bytes of those of a
long one too, so they are counted at what they cost it, not at their own need."""

from __future__ import annotations

import random

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.events import OriginSpec, OriginStatus

MB = 1e6
# issue 33's crowd-33-010: 228 MB due in 451 s beside 178 MB due in 696 s
SHORT = ("short", 228 * MB, 451.0)
LONG = ("long", 178 * MB, 696.0)


def status(
    active: dict[str, int], *, out: float, issues: frozenset[str] = frozenset({"short", "long"})
) -> OriginStatus:
    """Origin "o" of 100 MB/s running `active` transfers per issue, sending `out`."""
    n = sum(active.values())
    rate = out / n if n else 0.0
    return OriginStatus(
        "o",
        cpu_fraction=0.1,
        ram_fraction=0.2,
        out_bytes_per_s=out,
        capacity_bytes_per_s=100 * MB,
        active_transfers=n,
        issues=issues,
        mean_transfer_bytes_per_s=rate if n else None,
        mean_transfer_bytes_per_s_by_issue={i: rate for i, k in active.items() if k},
        active_transfers_by_issue=dict(active),
        transfers_total=n,
        transfers_total_by_issue=dict(active),
    )


def origin(active: dict[str, int], *, deadlines: bool) -> Headroom:
    alg = make_algorithm("headroom", [OriginSpec("o", "")], random.Random(1))
    assert isinstance(alg, Headroom)
    for name, size, deadline in (SHORT, LONG):
        alg.set_issue_need(name, size / deadline, deadline_s=deadline if deadlines else None)
    alg.handle_status(status({}, out=0.0), now=0.0)
    alg.handle_status(status(active, out=94 * MB), now=1.0)
    alg.handle_status(status(active, out=94 * MB), now=2.0)
    return alg


def test_a_short_deadline_beside_long_ones_counts_their_bytes_up_to_its_own() -> None:
    # 100 x 0.506 + 150 x 0.256 = 89 MB/s of needs in 95 MB/s of room: room for 11 more
    # by need. Shared evenly, a 228 MB download is done once every other has 228 MB
    # (the 178 MB ones: all of theirs): (100 x 228 + 150 x 178) MB in 451 s x 0.95 is
    # 115 MB/s: those already there are late, and no more fit.
    active = {"short": 100, "long": 150}
    by_need = origin(active, deadlines=False)
    assert by_need.free_slots("o", by_need.statuses["o"], "short") >= 11
    by_deadline = origin(active, deadlines=True)
    assert by_deadline.free_slots("o", by_deadline.statuses["o"], "short") < 0
    assert by_deadline.rank("short", now=2.0) == []
    # A long one beside them delays the short ones by 178 MB each: none fits either.
    assert by_deadline.rank("long", now=2.0) == []


def test_one_deadline_for_all_counts_as_before() -> None:
    # Every download due in the same time: shared evenly the biggest is done last, at
    # sum(needs) / room of its deadline: the committed rule, unchanged.
    active = {"long": 300}
    by_need = origin(active, deadlines=False)
    by_deadline = origin(active, deadlines=True)
    assert by_need.free_slots("o", by_need.statuses["o"], "long") == (
        by_deadline.free_slots("o", by_deadline.statuses["o"], "long")
    )
