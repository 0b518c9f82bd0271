"""Directive requests alone refused readers (issue 25's class: a stranger can neither
starve nor steer it): each pick of headroom is counted as a transfer on its way until
the origin reports it started, so eleven back-to-back requests from one address made a
1 Gbit/s origin "full" without one byte downloaded. Now the picks on their way from one
client address (IPv4, IPv6 /64) for one issue count once within their pending window:
a repeat request replaces its pick. Pure core, explicit ``now``."""

from __future__ import annotations

import random

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    OriginSpec,
    OriginStatus,
    StatusReceived,
)

ISSUE = "weekly-1"
GIGABIT = 125e6
STRANGER = "203.0.113.9"


def idle_status(name: str = "o-1") -> OriginStatus:
    """An idle 1 Gbit/s origin holding the issue, with counters of transfers started."""
    return OriginStatus(
        name,
        cpu_fraction=0.05,
        ram_fraction=0.2,
        out_bytes_per_s=0.0,
        capacity_bytes_per_s=GIGABIT,
        active_transfers=0,
        issues=frozenset({ISSUE}),
        transfers_total=0,
        transfers_total_by_issue={},
    )


def core_with_origin(
    count_every_pick_from: tuple[str, ...] | None = None,
) -> tuple[BalancerCore, Headroom]:
    alg = make_algorithm("headroom", [OriginSpec("o-1", "http://o-1")], random.Random(1))
    assert isinstance(alg, Headroom)
    core = BalancerCore(
        BalancerConfig(),
        [OriginSpec("o-1", "http://o-1")],
        alg,
        now=0.0,
        count_every_pick_from=count_every_pick_from,
    )
    core.handle_status_received(StatusReceived(idle_status()), now=0.0)
    return core, alg


def ask(core: BalancerCore, address: str | None, now: float) -> bool:
    """Whether a directive request from `address` is answered with an origin."""
    answer = core.handle_directive_requested(DirectiveRequested(ISSUE, address=address), now=now)
    return isinstance(answer, Directive)


def test_one_address_asking_again_and_again_refuses_no_reader() -> None:
    core, alg = core_with_origin()
    # 50 requests a second from one address for 2 s, no download
    for i in range(100):
        assert ask(core, STRANGER, now=0.1 + i * 0.02)
    assert alg.models["o-1"].pending == 1  # one client on its way, not 100
    # readers from other addresses: all served
    assert all(ask(core, f"198.51.100.{i}", now=2.2) for i in range(9))


def test_ipv6_addresses_of_one_64_are_one_client() -> None:
    core, alg = core_with_origin()
    for i in range(40):
        assert ask(core, f"2001:db8:1:2::{i + 1:x}", now=0.1 + i * 0.01)
    assert alg.models["o-1"].pending == 1
    for i in range(9):  # other /64s are other clients
        assert ask(core, f"2001:db8:{i + 1:x}::1", now=0.6)
    assert alg.models["o-1"].pending == 10


def test_loopback_counts_every_pick_as_demand_does() -> None:
    # the operator's host (the demo's clients share 127.0.0.1): every pick counts, and
    # the origin not measured yet takes `probe_transfers` (10) per status, as before
    core, alg = core_with_origin()
    answered = [ask(core, "127.0.0.1", now=0.1 + i * 0.01) for i in range(11)]
    assert answered == [True] * 10 + [False]
    # behind a same-host proxy the operator takes loopback out: one client again
    strict, alg = core_with_origin(count_every_pick_from=())
    assert all(ask(strict, "127.0.0.1", now=0.1 + i * 0.01) for i in range(30))
    assert alg.models["o-1"].pending == 1


def test_without_an_address_every_pick_counts() -> None:
    # the simulator's requests carry no address: the old rule, results unchanged
    core, _ = core_with_origin()
    answered = [ask(core, None, now=0.1 + i * 0.01) for i in range(11)]
    assert answered == [True] * 10 + [False]


def test_what_is_remembered_is_bounded_and_forgotten() -> None:
    core, alg = core_with_origin()
    for i in range(5):
        ask(core, f"198.51.100.{i}", now=0.1)
    assert alg.clients_with_picks() == 5
    # past the pick's pending window (pick_timeout_s, 5 s) nothing is kept for them
    core.handle_status_received(StatusReceived(idle_status()), now=6.0)
    ask(core, STRANGER, now=6.1)
    assert alg.clients_with_picks() == 1
    assert alg.models["o-1"].pending == 1
    # and however many addresses ask, at most `max_clients_tracked` are remembered
    small = make_algorithm(
        "headroom",
        [OriginSpec("o-1", "")],
        random.Random(1),
        {"max_clients_tracked": 100.0, "probe_transfers": 1e6},
    )
    assert isinstance(small, Headroom)
    small.handle_status(idle_status(), now=0.0)
    for i in range(1000):
        key = f"10.0.{i >> 8}.{i & 255}"
        small.handle_client_asks(ISSUE, key, now=0.1)
        small.handle_pick_for("o-1", ISSUE, None, now=0.1, client_key=key)
    assert small.clients_with_picks() == 100
