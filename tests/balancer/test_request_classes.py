"""Request classes in the balancer core (issue 33; docs/balancer.md, "Request
classes"): each class placed by its policy, LVS-CAD's grouped weighted round robin
among them, small objects never refused "full", the back catalogue only on holders."""

from __future__ import annotations

import random

import pytest

from balancer.helpers import MB, specs, status
from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.algorithms.headroom import Headroom
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    NoDirective,
    Refusal,
    RequestClass,
    StatusReceived,
)


def core(
    config: BalancerConfig,
    weights: tuple[float, ...] = (1.0, 1.0, 1.0),
    algorithm: str = "headroom",
) -> BalancerCore:
    origins = specs(("a", "b", "c"), weights)
    return BalancerCore(config, origins, make_algorithm(algorithm, origins, random.Random(0)))


def ask(c: BalancerCore, issue: str, klass: RequestClass | None, now: float = 1.0) -> Directive:
    answer = c.handle_directive_requested(DirectiveRequested(issue, request_class=klass), now=now)
    assert isinstance(answer, Directive), answer
    return answer


def feed(c: BalancerCore, now: float = 0.0, **kwargs: object) -> None:
    c.handle_timer(now=now)
    for name in c.origins:
        held = ("new", "back") if name in ("a", "b") else ("new",)
        c.handle_status_received(
            StatusReceived(status(name, issues=held, **kwargs)),  # type: ignore[arg-type]
            now=now,
        )


def test_a_small_object_is_placed_while_the_crowd_is_refused_full() -> None:
    # Every origin sends its whole told link: headroom has no room for a transfer of
    # the new issue (its need is 1 MB/s); a manifest is placed all the same, on the
    # least loaded holder, and is not a pick of the crowd's algorithm.
    c = core(BalancerConfig())
    feed(c, out=1 * MB, cap=1 * MB, active=3, mean=MB / 3, cpu=0.5)
    feed(c, now=1.0, out=1 * MB, cap=1 * MB, active=5, mean=MB / 5, cpu=0.5)
    crowd = c.handle_directive_requested(DirectiveRequested("new"), now=1.0)
    assert isinstance(crowd, NoDirective) and crowd.reason is Refusal.ALL_FULL
    small = ask(c, "new", RequestClass.SMALL)
    assert small.request_class is RequestClass.SMALL and small.algorithm == "least-loaded"
    assert isinstance(c.algorithm, Headroom)
    assert all(m.pending == 0 for m in c.algorithm.models.values())
    # least loaded: the one picked has one more pick since its status, so the next goes
    # elsewhere
    assert ask(c, "new", RequestClass.SMALL).origins[0].name != small.origins[0].name
    assert c.directives_by_class[RequestClass.SMALL] == 2


def test_the_back_catalogue_goes_round_robin_by_weight_over_its_holders() -> None:
    # c does not hold 'back'; a has weight 2, b 1: smooth WRR gives a b a a b a.
    c = core(BalancerConfig(), weights=(2.0, 1.0, 5.0))
    feed(c)
    picks = [ask(c, "back", RequestClass.CATALOGUE).origins[0].name for _ in range(6)]
    assert picks == ["a", "b", "a", "a", "b", "a"]
    assert isinstance(c.algorithm, Headroom)
    assert all(m.pending == 0 for m in c.algorithm.models.values())
    # a named failed: b alone
    answer = c.handle_directive_requested(
        DirectiveRequested("back", frozenset({"a"}), request_class=RequestClass.CATALOGUE),
        now=1.0,
    )
    assert isinstance(answer, Directive) and [o.name for o in answer.origins] == ["b"]


def test_a_class_group_restricts_its_origins_unless_it_holds_no_copy() -> None:
    config = BalancerConfig(
        class_groups={"catalogue": frozenset({"b", "c"}), "small": frozenset({"c"})}
    )
    c = core(config)
    feed(c)
    assert {ask(c, "back", RequestClass.CATALOGUE).origins[0].name for _ in range(4)} == {"b"}
    assert {ask(c, "new", RequestClass.SMALL).origins[0].name for _ in range(3)} == {"c"}
    # 'back' is on a and b only; a group of c alone holds no copy: any holder
    only_c = core(BalancerConfig(class_groups={"catalogue": frozenset({"c"})}))
    feed(only_c)
    assert ask(only_c, "back", RequestClass.CATALOGUE).origins[0].name in {"a", "b"}


def test_a_request_without_a_class_is_the_algorithms_as_before() -> None:
    c = core(BalancerConfig(), algorithm="alg2")
    feed(c)
    d = ask(c, "back", None)
    assert d.request_class is RequestClass.CROWD and d.algorithm == "alg2"
    # classified by holders when configured so: 'back' is not on c
    by_holders = core(BalancerConfig(catalogue_by_holders=True), algorithm="alg2")
    feed(by_holders)
    assert ask(by_holders, "back", None).request_class is RequestClass.CATALOGUE
    assert ask(by_holders, "new", None).request_class is RequestClass.CROWD
    # every class may be the algorithm's
    same = core(BalancerConfig(class_policies={"catalogue": "algorithm"}), algorithm="alg2")
    feed(same)
    assert ask(same, "back", RequestClass.CATALOGUE).algorithm == "alg2"


def test_class_policies_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        BalancerConfig(class_policies={"small": "fastest"})
    with pytest.raises(ValueError, match="unknown request class 'huge'"):
        BalancerConfig(class_policies={"huge": "gwrr"})
    with pytest.raises(ValueError, match="unknown request class 'huge'"):
        BalancerConfig(class_groups={"huge": frozenset({"a"})})
