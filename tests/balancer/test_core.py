"""BalancerCore driven synchronously with a stepped `now` (what the simulator does)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.helpers import specs, status
from pressrun.balancer.algorithms import algorithm_names, make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import (
    BalancerCore,
    LocalProtocolError,
    ModeDecision,
    OriginState,
)
from pressrun.balancer.events import (
    DeliveryMode,
    Directive,
    DirectiveRequested,
    NoDirective,
    OriginCameBack,
    OriginWentDown,
    PollFailed,
    PollOrigin,
    RankedOrigin,
    Refusal,
    StatusReceived,
    SwarmInfo,
)

CONFIG = BalancerConfig(poll_interval_s=1.0, stale_after_s=3.5, directive_origins=2)


def make_core(
    algorithm: str = "alg2",
    names: tuple[str, ...] = ("a", "b", "c"),
    weights: tuple[float, ...] | None = None,
    config: BalancerConfig = CONFIG,
) -> BalancerCore:
    origins = specs(names, weights)
    return BalancerCore(
        config, origins, make_algorithm(algorithm, origins, random.Random(0)), now=0.0
    )


def up(core: BalancerCore, now: float = 0.0, **cpu: float) -> None:
    """Every origin answers its first poll (CPU fractions by name, default 0)."""
    core.handle_timer(now=now)
    for name in core.origins:
        core.handle_status_received(StatusReceived(status(name, cpu=cpu.get(name, 0.0))), now=now)


def ask(
    core: BalancerCore, issue: str = "i", *failed: str, now: float = 0.0
) -> Directive | NoDirective:
    return core.handle_directive_requested(DirectiveRequested(issue, frozenset(failed)), now=now)


def test_poll_schedule_via_next_deadline_and_handle_timer() -> None:
    core = make_core()
    # every origin is due at construction time
    assert core.next_deadline() == 0.0
    effects = core.handle_timer(now=0.0)
    assert effects == [PollOrigin(n, f"http://{n}:8000") for n in ("a", "b", "c")]
    # all three polls in flight, nobody up: nothing to wake for
    assert core.next_deadline() is None
    assert core.handle_timer(now=0.5) == []
    # a answers at 0.1: next poll of a at 1.1, staleness check at 3.6
    assert core.handle_status_received(StatusReceived(status("a")), now=0.1) == [
        OriginCameBack("a")
    ]
    assert core.next_deadline() == pytest.approx(1.1)
    # b answers at 0.3; c's poll fails at 0.2 (it never was up: no notification)
    core.handle_status_received(StatusReceived(status("b")), now=0.3)
    assert core.handle_poll_failed(PollFailed("c", "refused"), now=0.2) == []
    assert core.origin_states() == {
        "a": OriginState.UP,
        "b": OriginState.UP,
        "c": OriginState.DOWN,
    }
    assert core.next_deadline() == pytest.approx(1.1)
    assert core.handle_timer(now=1.0) == []  # too early for anyone
    assert core.handle_timer(now=1.1) == [PollOrigin("a", "http://a:8000")]
    assert core.next_deadline() == pytest.approx(1.2)  # c, 1 s after its failure
    assert core.handle_timer(now=1.3) == [
        PollOrigin("b", "http://b:8000"),
        PollOrigin("c", "http://c:8000"),
    ]


def test_origin_out_of_rotation_on_poll_failed_and_back_on_status() -> None:
    core = make_core()
    up(core, cpu=0.0)
    core.handle_timer(now=1.0)
    effects = core.handle_poll_failed(PollFailed("a", "connection refused"), now=1.0)
    assert effects == [OriginWentDown("a", "connection refused")]
    assert core.origins["a"].state is OriginState.DOWN
    assert core.origins["a"].down_reason == "connection refused"
    result = ask(core, now=1.0)
    assert isinstance(result, Directive)
    assert "a" not in [o.name for o in result.origins]
    # a second failure says nothing more
    core.handle_timer(now=2.0)
    assert core.handle_poll_failed(PollFailed("a", "connection refused"), now=2.0) == []
    # the next good status brings it back
    assert core.handle_status_received(StatusReceived(status("a")), now=2.5) == [
        OriginCameBack("a")
    ]
    result = ask(core, now=2.5)
    assert isinstance(result, Directive)
    assert "a" in [o.name for o in result.origins]


def test_origin_out_of_rotation_when_its_status_goes_stale() -> None:
    core = make_core()
    up(core)  # statuses at 0.0: stale at 3.5
    core.handle_timer(now=1.0)  # polls go out...
    for name in ("b", "c"):  # ... b and c answer, a's poll hangs
        core.handle_status_received(StatusReceived(status(name)), now=1.0)
    assert core.next_deadline() == pytest.approx(2.0)  # b and c's next polls
    core.handle_timer(now=2.0)
    core.handle_status_received(StatusReceived(status("b")), now=2.0)
    core.handle_status_received(StatusReceived(status("c")), now=2.0)
    core.handle_timer(now=3.0)
    core.handle_status_received(StatusReceived(status("b")), now=3.0)
    core.handle_status_received(StatusReceived(status("c")), now=3.0)
    assert core.next_deadline() == pytest.approx(3.5)  # a's staleness
    effects = core.handle_timer(now=3.5)
    assert effects == [OriginWentDown("a", "no status for 3.5 s")]
    assert core.origins["a"].state is OriginState.DOWN
    # a's late answer brings it back
    assert core.handle_status_received(StatusReceived(status("a")), now=3.7) == [
        OriginCameBack("a")
    ]


def test_directive_fields() -> None:
    core = make_core(config=BalancerConfig(directive_origins=2, expires_in_s=7.0))
    up(core, a=0.5, b=0.1, c=0.3)
    result = ask(core)
    # alg2: b 900+1000+1000 = 2900 > c 2700 > a 2500; two origins listed
    assert result == Directive(
        issue_id="i",
        mode=DeliveryMode.ORIGIN,
        origins=(
            RankedOrigin("b", "http://b:8000", pytest.approx(2900.0)),
            RankedOrigin("c", "http://c:8000", pytest.approx(2700.0)),
        ),
        swarm=None,
        fallbacks=(),
        expires_in_s=7.0,
        algorithm="alg2",
    )
    assert core.origins["b"].picks == 1
    assert core.directives_answered == 1


def test_failed_origins_are_left_out_of_the_answer() -> None:
    core = make_core()
    up(core, a=0.0, b=0.1, c=0.2)
    result = ask(core, "i", "a")
    assert isinstance(result, Directive)
    assert [o.name for o in result.origins] == ["b", "c"]
    result = ask(core, "i", "a", "b")
    assert isinstance(result, Directive)
    assert [o.name for o in result.origins] == ["c"]
    # an unknown name in failed= is harmless
    result = ask(core, "i", "zz")
    assert isinstance(result, Directive)
    assert result.origins[0].name == "a"


def test_refusal_unknown_issue() -> None:
    core = make_core()
    up(core)
    result = ask(core, "nobody-has-it")
    assert isinstance(result, NoDirective)
    assert result.reason is Refusal.UNKNOWN_ISSUE
    assert "nobody-has-it" in result.message
    assert core.refusals[Refusal.UNKNOWN_ISSUE] == 1


def test_refusal_when_every_holder_is_down() -> None:
    core = make_core(config=BalancerConfig(retry_after_s=3.0))
    up(core)
    core.handle_timer(now=1.0)
    for name in core.origins:
        core.handle_poll_failed(PollFailed(name, "timeout"), now=1.0)
    result = ask(core, now=1.0)
    assert isinstance(result, NoDirective)
    assert result.reason is Refusal.NO_ORIGIN_UP
    assert result.retry_after_s == 3.0
    # before any origin ever answered: also "none up", not "unknown issue"
    fresh = make_core()
    result = ask(fresh)
    assert isinstance(result, NoDirective)
    assert result.reason is Refusal.NO_ORIGIN_UP


def test_refusal_when_every_holder_is_excluded() -> None:
    core = make_core()
    up(core)
    result = ask(core, "i", "a", "b", "c")
    assert isinstance(result, NoDirective)
    assert result.reason is Refusal.NO_ORIGIN_UP
    assert "could not use: a, b, c" in result.message
    assert core.directives_answered == 0


def test_refusal_all_full_when_the_algorithm_finds_no_holder_eligible() -> None:
    # wlc: weight 0 origins are never eligible; both holders up but unusable
    core = make_core("wlc", names=("a", "b"), weights=(0.0, 0.0))
    up(core)
    result = ask(core)
    assert isinstance(result, NoDirective)
    assert result.reason is Refusal.ALL_FULL


def test_misuse_raises_local_protocol_error() -> None:
    core = make_core()
    with pytest.raises(LocalProtocolError):
        core.handle_status_received(StatusReceived(status("stranger")), now=0.0)
    with pytest.raises(LocalProtocolError):
        make_core(names=("a", "a"))
    with pytest.raises(LocalProtocolError):
        make_core(names=())


def test_mode_policy_sets_mode_swarm_and_origin_fallback() -> None:
    swarm = SwarmInfo("http://o/content/i/i.torrent", "http://t/announce", "ab" * 20)

    class Swarming:
        def decide(self, issue_id: str, *, now: float, address: str | None = None) -> ModeDecision:
            return ModeDecision(DeliveryMode.SWARM, swarm)

    origins = specs(("a",))
    core = BalancerCore(
        CONFIG, origins, make_algorithm("alg2", origins, random.Random(0)), Swarming()
    )
    up(core)
    result = ask(core)
    assert isinstance(result, Directive)
    assert result.mode is DeliveryMode.SWARM
    assert result.swarm == swarm
    assert result.fallbacks == (DeliveryMode.ORIGIN,)


def test_alg2_inflation_spreads_clients_through_the_core_between_polls() -> None:
    core = make_core()
    up(core, a=0.0, b=0.05, c=0.9)
    # a 3000, b 2950, c 2100; each pick costs 65.536 points of inflation
    picks = []
    for _ in range(4):
        result = ask(core, now=0.5)
        assert isinstance(result, Directive)
        picks.append(result.origins[0].name)
    assert picks == ["a", "b", "a", "b"]


# --- Hypothesis: whatever happens, a directive names only usable origins ------------

NAMES = ("a", "b", "c", "d")
core_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("status"),
            st.sampled_from(NAMES),
            st.floats(0, 1),
            st.frozensets(st.sampled_from(("i", "j")), min_size=1),
        ),
        st.tuples(st.just("fail"), st.sampled_from(NAMES)),
        st.tuples(st.just("wait"), st.floats(0.0, 2.0)),
        st.tuples(
            st.just("ask"), st.sampled_from(("i", "j", "k")), st.frozensets(st.sampled_from(NAMES))
        ),
    ),
    max_size=50,
)


@pytest.mark.parametrize("algorithm", algorithm_names())
@settings(max_examples=40, deadline=None)
@given(ops=core_ops)
def test_directives_name_only_up_holders_not_failed(
    algorithm: str, ops: list[tuple[object, ...]]
) -> None:
    core = make_core(algorithm, names=NAMES)
    now = 0.0
    for op in ops:
        if op[0] == "status":
            _, name, cpu, issues = op
            core.handle_status_received(
                StatusReceived(status(str(name), cpu=float(cpu), issues=issues)),  # type: ignore[arg-type]
                now=now,
            )
        elif op[0] == "fail":
            core.handle_poll_failed(PollFailed(str(op[1]), "refused"), now=now)
        elif op[0] == "wait":
            now += float(op[1])  # type: ignore[arg-type]
            core.handle_timer(now=now)
            # after the timer ran, no origin is UP on a status older than stale_after_s
            for rec in core.origins.values():
                if rec.state is OriginState.UP:
                    assert rec.last_status_at is not None
                    assert now < rec.last_status_at + CONFIG.stale_after_s
        else:
            _, issue, failed = op
            assert isinstance(issue, str) and isinstance(failed, frozenset)
            result = core.handle_directive_requested(DirectiveRequested(issue, failed), now=now)
            usable = {
                n
                for n, rec in core.origins.items()
                if rec.state is OriginState.UP
                and rec.status is not None
                and issue in rec.status.issues
                and n not in failed
            }
            if isinstance(result, Directive):
                names = [o.name for o in result.origins]
                assert len(names) == len(set(names))
                assert set(names) <= usable
                assert len(names) == min(CONFIG.directive_origins, len(usable))
            elif result.reason is Refusal.ALL_FULL:
                # An algorithm with admission (headroom, mist) may say every usable
                # origin is full; then there is one (issue 10: refuse, do not degrade).
                assert usable
            else:
                assert not usable
                ever_held = any(
                    rec.status is not None and issue in rec.status.issues
                    for rec in core.origins.values()
                )
                if result.reason is Refusal.UNKNOWN_ISSUE:
                    assert not ever_held
