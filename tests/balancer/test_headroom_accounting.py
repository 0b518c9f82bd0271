"""headroom's accounting of what an origin carries: running transfers, picks on their way
(reconciled by the origin's counters of transfers started), and the told capacity as
the bound of the probe floor (issue 10: the loopback egress check, docs/balancer.md)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

import pytest

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.events import OriginSpec, OriginStatus

MB = 1e6


def status(
    active: Mapping[str, int],
    started: Mapping[str, int] | None,
    *,
    out: float,
    told: float = 4 * MB,
    name: str = "o",
) -> OriginStatus:
    """A status of an origin holding issues a and b, its transfers at 0.9 MB/s each."""
    n = sum(active.values())
    return OriginStatus(
        name,
        cpu_fraction=0.1,
        ram_fraction=0.2,
        out_bytes_per_s=out,
        capacity_bytes_per_s=told,
        active_transfers=n,
        issues=frozenset({"a", "b"}),
        mean_transfer_bytes_per_s=0.9 * MB if n else None,
        mean_transfer_bytes_per_s_by_issue={i: 0.9 * MB for i, k in active.items() if k},
        active_transfers_by_issue=dict(active),
        transfers_total=None if started is None else sum(started.values()),
        transfers_total_by_issue={} if started is None else dict(started),
    )


def headroom(*names: str) -> Headroom:
    alg = make_algorithm("headroom", [OriginSpec(n, "") for n in names], random.Random(1))
    assert isinstance(alg, Headroom)
    return alg


def test_a_pick_stays_pending_until_the_origin_counts_its_transfer_started() -> None:
    alg = headroom("o")
    alg.handle_status(status({}, {}, out=0.0), now=0.0)
    for _ in range(3):
        alg.handle_pick("o", "a", now=0.1)
    # The origin answered before any of the three clients connected: still on their way.
    alg.handle_status(status({}, {}, out=0.0), now=0.5)
    assert alg.models["o"].pending == 3
    assert alg.rank("a", now=0.5) == []  # 3 x 1 MB/s in 0.95 x 4 MB/s: no room for a 4th
    # Two have connected (one of each issue would not match: counted per issue).
    alg.handle_status(status({"a": 2}, {"a": 2}, out=0.5 * MB), now=1.0)
    m = alg.models["o"]
    assert (m.pending, m.pending_bytes) == (1, 1 * MB)
    assert alg.rank("b", now=1.0) == []  # 2 running + 1 on its way
    alg.handle_status(status({"a": 3}, {"a": 3}, out=2.4 * MB), now=1.5)
    assert alg.models["o"].pending == 0
    assert alg.rank("a", now=1.5) == []  # 3 running, each counted at its need


def test_picks_of_one_issue_are_not_settled_by_transfers_of_another() -> None:
    alg = headroom("o")
    alg.handle_status(status({}, {}, out=0.0), now=0.0)
    alg.handle_pick("o", "a", now=0.1)
    alg.handle_pick("o", "b", now=0.1)
    # Two transfers of b started (one picked here, one from elsewhere): a's pick stays.
    alg.handle_status(status({"b": 2}, {"b": 2}, out=1 * MB), now=0.5)
    assert [p[1] for p in alg.models["o"].picks] == ["a"]


def test_a_pick_whose_client_never_comes_is_forgotten_after_the_timeout() -> None:
    alg = headroom("o")
    alg.handle_status(status({}, {}, out=0.0), now=0.0)
    alg.handle_pick("o", "a", now=1.0)
    alg.handle_status(status({}, {}, out=0.0), now=5.9)
    assert alg.models["o"].pending == 1
    alg.handle_status(status({}, {}, out=0.0), now=6.1)  # pick_timeout_s 5 s
    assert alg.models["o"].pending == 0


def test_an_agent_without_counters_settles_every_pick_at_each_status() -> None:
    alg = headroom("o")
    alg.handle_status(status({}, None, out=0.0), now=0.0)
    alg.handle_pick("o", "a", now=0.1)
    alg.handle_status(status({}, None, out=0.0), now=0.5)
    assert alg.models["o"].pending == 0


def test_a_pick_sent_to_the_swarm_is_not_a_transfer_on_its_way() -> None:
    alg = headroom("o")
    alg.handle_status(status({}, {}, out=0.0), now=0.0)
    alg.handle_pick("o", "a", now=0.1)
    alg.handle_pick("o", "b", now=0.1)
    alg.handle_pick_not_sent("o", "a", now=0.1)
    m = alg.models["o"]
    assert [p[1] for p in m.picks] == ["b"] and (m.pending, m.pending_bytes) == (1, 1 * MB)


def test_an_origin_restarted_is_counted_from_its_new_counters() -> None:
    alg = headroom("o")
    alg.handle_status(status({"a": 1}, {"a": 40}, out=1 * MB), now=0.0)
    alg.handle_pick("o", "a", now=0.1)
    alg.handle_status(status({}, {}, out=0.0), now=0.5)  # counters went back: restarted
    assert alg.models["o"].pending == 1
    alg.handle_status(status({"a": 1}, {"a": 1}, out=0.2 * MB), now=1.0)
    assert alg.models["o"].pending == 0


def test_the_probe_floor_never_admits_beyond_the_told_capacity() -> None:
    # Measured in the loopback egress check (docs/balancer.md): a 4 MB/s origin with
    # three 1 MB/s downloads just started reports out below its told capacity (the rate
    # is the last interval's) and means a little under the need (so a capacity is
    # learned at what they took, where their need is stated: a deadline). The floor of
    # probe_transfers used to admit 10 - 3 more; the told capacity holds none.
    alg = headroom("o")
    alg.set_issue_need("a", 1 * MB, paced=False)
    alg.handle_status(status({}, {}, out=0.0), now=0.0)
    alg.handle_status(status({"a": 2}, {"a": 2}, out=1.8 * MB), now=0.5)
    alg.handle_status(status({"a": 3}, {"a": 3}, out=2.6 * MB), now=1.0)
    m = alg.models["o"]
    assert m.cpu_per_byte is not None and m.learned_bytes_per_s is not None
    assert alg.rank("a", now=1.0) == []
    # A bigger told capacity: the floor still lets it take more (up to its told room).
    alg.handle_status(status({"a": 3}, {"a": 3}, out=2.6 * MB, told=6 * MB), now=1.5)
    assert [n for n, _ in alg.rank("a", now=1.5)] == ["o"]
    alg.handle_pick("o", "a", now=1.5)
    alg.handle_pick("o", "a", now=1.5)
    assert alg.rank("a", now=1.5) == []  # 5 x 1 MB/s in 0.95 x 6 MB/s


def test_an_origin_not_measured_yet_counts_its_running_transfers_in_its_told_room() -> None:
    # Its transfers started but have not sent a byte it has counted yet (out 0): the
    # costs are not measured, and it is ranked by its told room, net of them.
    alg = headroom("small", "big")
    alg.handle_status(status({"a": 3}, {"a": 3}, out=0.0, name="small"), now=0.0)
    alg.handle_status(status({}, {}, out=0.0, told=2 * MB, name="big"), now=0.0)
    assert alg.models["small"].cpu_per_byte is None
    # small: 3.8 - 3 = 0.8 MB/s of room (not 3.8): not eligible; big: 1.9 MB/s
    assert [n for n, _ in alg.rank("a", now=0.1)] == ["big"]


def test_the_probe_is_a_rate_per_status_not_a_cap_on_picks_on_their_way() -> None:
    # The soak test's origins: told 125 MB/s, 65 kB transfers that end within an
    # interval (no status shows costs), clients that connect seconds after their
    # directive. probe_transfers per status, while the told room counts them all.
    alg = headroom("o")
    told = 125 * MB
    alg.handle_status(status({}, {}, out=0.0, told=told), now=0.0)
    for t in (0.0, 0.5, 1.0):
        for k in range(10):
            assert alg.rank("a", now=t + 0.1) != [], (t, k)
            alg.handle_pick("o", "a", now=t + 0.1)
        assert alg.rank("a", now=t + 0.1) == []  # 10 since the status
        alg.handle_status(status({}, {}, out=0.0, told=told), now=t + 0.5)
    m = alg.models["o"]
    assert m.pending == 30 and m.picked_since_status == 0


def test_a_link_sending_the_same_while_its_downloads_change_in_number_is_full() -> None:
    # Told 1 GB/s, it has 125 MB/s: 45 downloads get 2.78 MB/s each, more than their 1
    # MB/s need, so nothing looks held back and the told capacity is believed ...
    alg = headroom("o")
    alg.handle_status(status({}, {}, out=0.0, told=1000 * MB), now=0.0)
    alg.handle_status(status({"a": 45}, None, out=125 * MB, told=1000 * MB), now=1.0)
    assert alg.models["o"].learned_bytes_per_s is None
    assert alg.free_slots("o", alg.statuses["o"], "a") > 800
    # ... too few changed to tell (4 of 49, under a tenth) ...
    alg.handle_status(status({"a": 49}, None, out=125 * MB, told=1000 * MB), now=2.0)
    assert alg.models["o"].learned_bytes_per_s is None
    # ... then 57 send the same 125 MB/s as 45 did: the link is full at that (issue 10,
    # gen-7-033), 0.95 x 125 MB/s less the 57 MB/s committed leaves room for 61.
    alg.handle_status(status({"a": 57}, None, out=125 * MB, told=1000 * MB), now=3.0)
    assert alg.models["o"].learned_bytes_per_s == 125 * MB
    assert alg.free_slots("o", alg.statuses["o"], "a") == pytest.approx(118.75 - 57)


def test_downloads_whose_number_follows_what_they_send_do_not_fill_the_link() -> None:
    alg = headroom("o")
    alg.handle_status(status({}, {}, out=0.0, told=1000 * MB), now=0.0)
    for t, n in enumerate((45, 57, 40, 60), start=1):
        alg.handle_status(status({"a": n}, None, out=n * 2.5 * MB, told=1000 * MB), now=t)
    assert alg.models["o"].learned_bytes_per_s is None


def test_a_link_sending_the_same_while_streams_and_downloads_grow_in_number_is_full() -> None:
    # Told 1 GB/s with 100 MB/s: streams of a (0.5 MB/s) beside downloads of b (1 MB/s);
    # 40 then 60 transfers (15 MB/s more needed) send the same 100 MB/s: full at that
    # (issue 10, gen-2026-021: 286 to 737 transfers at the 1.25 GB/s link's rate).
    alg = headroom("o")
    alg.set_issue_need("a", 0.5 * MB, paced=True)
    alg.set_issue_need("b", 1 * MB, paced=False)
    alg.handle_status(status({}, {}, out=0.0, told=1000 * MB), now=0.0)
    alg.handle_status(status({"a": 20, "b": 20}, None, out=100 * MB, told=1000 * MB), now=1.0)
    assert alg.models["o"].learned_bytes_per_s is None
    alg.handle_status(status({"a": 30, "b": 30}, None, out=100 * MB, told=1000 * MB), now=2.0)
    assert alg.models["o"].learned_bytes_per_s == 100 * MB


def test_streams_whose_needs_move_less_than_the_slack_do_not_fill_the_link() -> None:
    # 20 more streams of 64 kB/s on an origin sending 100 MB/s move what its transfers
    # need by 1.28 MB/s, within the slack (2 % of 100 MB/s): no sign of a full link.
    alg = headroom("o")
    alg.set_issue_need("a", 64e3, paced=True)
    alg.set_issue_need("b", 1 * MB, paced=False)
    alg.handle_status(status({}, {}, out=0.0, told=1000 * MB), now=0.0)
    alg.handle_status(status({"a": 20, "b": 20}, None, out=100 * MB, told=1000 * MB), now=1.0)
    alg.handle_status(status({"a": 40, "b": 20}, None, out=100 * MB, told=1000 * MB), now=2.0)
    assert alg.models["o"].learned_bytes_per_s is None


def test_transfers_a_little_under_the_default_need_teach_no_capacity() -> None:
    # The egress demo on a loaded machine: ten 1 MB/s clients read at 0.9 MB/s from an
    # origin told 16 MB/s. The default need is what a transfer should get, not a
    # deadline: that is no sign the origin is at its limit (learned at 8.9 MB/s, it
    # refused 36 clients with 5 MB/s of its told room free); under half of it is.
    for rate, learned in ((0.9 * MB, None), (0.4 * MB, 4 * MB)):
        alg = headroom("o")
        alg.handle_status(status({}, {}, out=0.0, told=16 * MB), now=0.0)
        s = status({"a": 10}, {"a": 10}, out=10 * rate, told=16 * MB)
        means = {"a": rate}
        s = replace(s, mean_transfer_bytes_per_s=rate, mean_transfer_bytes_per_s_by_issue=means)
        alg.handle_status(s, now=1.0)
        m = alg.models["o"]
        assert m.learned_bytes_per_s == (None if learned is None else pytest.approx(learned))
