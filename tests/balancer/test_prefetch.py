"""Prefetch pacing (issue 35): the pure pacer with an explicit ``now``, its invariant
under Hypothesis, and the balancer's ``/prefetch`` route over real HTTP, counted
apart from the readers' directives."""

from __future__ import annotations

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.fake_origin import FakeOrigin, start_fake_origin
from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import OriginSpec
from pressrun.balancer.prefetch import (
    PrefetchConfig,
    PrefetchDeferred,
    PrefetchGrant,
    PrefetchPacer,
    client_id,
)

MB = 1_000_000.0
CAP = 100 * MB  # the origins' capacity, bytes/s


def ask(
    pacer: PrefetchPacer, client: str, *, issue: str = "w48", out: float = 0.0, now: float = 0.0
) -> PrefetchGrant | PrefetchDeferred:
    return pacer.handle_request(
        issue, client, capacity_bytes_per_s=CAP, out_bytes_per_s=out, now=now
    )


def test_one_prefetcher_gets_the_share_and_no_more() -> None:
    pacer = PrefetchPacer(PrefetchConfig(share=0.2))
    grant = ask(pacer, "a")
    assert isinstance(grant, PrefetchGrant)
    assert grant.rate_bytes_per_s == pytest.approx(20 * MB)
    assert pacer.prefetchers("w48") == 1


def test_prefetchers_share_the_budget_and_the_late_ones_wait() -> None:
    pacer = PrefetchPacer(PrefetchConfig(share=0.2, min_rate_bytes_per_s=4 * MB, renew_s=20))
    first = ask(pacer, "c0", now=0.0)
    assert isinstance(first, PrefetchGrant) and first.rate_bytes_per_s == pytest.approx(20 * MB)
    # the budget is taken: the second waits one renewal, and counts while it waits
    second = ask(pacer, "c1", out=pacer.granted_bytes_per_s(), now=1.0)
    assert isinstance(second, PrefetchDeferred) and second.retry_after_s == 20
    assert pacer.prefetchers("w48", waiting=True) == 1
    # the first renews: cut to its fair half; the second comes back and gets the other
    renewed = ask(pacer, "c0", out=pacer.granted_bytes_per_s(), now=20.0)
    assert isinstance(renewed, PrefetchGrant) and renewed.rate_bytes_per_s == pytest.approx(10 * MB)
    back = ask(pacer, "c1", out=pacer.granted_bytes_per_s(), now=21.0)
    assert isinstance(back, PrefetchGrant) and back.rate_bytes_per_s == pytest.approx(10 * MB)
    assert pacer.granted_bytes_per_s() == pytest.approx(20 * MB)
    # five more: 20/7 MB/s is below the 4 MB/s worth granting, so five fetch at 4 MB/s
    # and two wait (none starves for the fair rate being too small)
    now = 22.0
    for _ in range(3):
        for i in range(7):
            ask(pacer, f"c{i}", out=pacer.granted_bytes_per_s(), now=now)
            now += 1.0
            assert pacer.granted_bytes_per_s() <= 20 * MB + 1e-6
    assert pacer.prefetchers("w48") + pacer.prefetchers("w48", waiting=True) == 7
    assert pacer.prefetchers("w48") == 5
    assert pacer.granted_bytes_per_s() == pytest.approx(20 * MB)


def test_readers_come_first() -> None:
    """Readers waiting use 90 % of the links: the prefetch budget is what is left,
    and a grant made before they came is taken back when it is renewed."""
    pacer = PrefetchPacer(PrefetchConfig(share=0.2, min_rate_bytes_per_s=1 * MB))
    first = ask(pacer, "a", out=0.0, now=0.0)
    assert isinstance(first, PrefetchGrant) and first.rate_bytes_per_s == pytest.approx(20 * MB)
    # readers now send 90 MB/s (the origins' rate: readers + this grant)
    renewed = ask(pacer, "a", out=90 * MB + 20 * MB, now=30.0)
    assert isinstance(renewed, PrefetchGrant)
    assert renewed.rate_bytes_per_s == pytest.approx(10 * MB)
    # the links are full of readers: the prefetcher is deferred and its grant dropped
    full = ask(pacer, "a", out=100 * MB + 10 * MB, now=40.0)
    assert isinstance(full, PrefetchDeferred) and "readers" in full.reason
    assert pacer.prefetchers() == 0


def test_issues_share_the_budget_and_grants_expire() -> None:
    pacer = PrefetchPacer(PrefetchConfig(share=0.2, hold_s=10, renew_s=5))
    a = ask(pacer, "x", issue="w48")
    assert isinstance(a, PrefetchGrant)
    b = ask(pacer, "y", issue="m12", out=pacer.granted_bytes_per_s(), now=1.0)
    assert isinstance(b, PrefetchDeferred)  # w48 holds the budget until it renews
    a2 = ask(pacer, "x", issue="w48", out=pacer.granted_bytes_per_s(), now=2.0)
    assert isinstance(a2, PrefetchGrant) and a2.rate_bytes_per_s == pytest.approx(10 * MB)
    b2 = ask(pacer, "y", issue="m12", out=pacer.granted_bytes_per_s(), now=3.0)
    assert isinstance(b2, PrefetchGrant) and b2.rate_bytes_per_s == pytest.approx(10 * MB)
    assert pacer.next_deadline() == pytest.approx(12.0)
    pacer.handle_timer(now=12.0)
    assert pacer.prefetchers("w48") == 0 and pacer.prefetchers("m12") == 1
    pacer.handle_timer(now=13.0)
    assert pacer.prefetchers() == 0 and pacer.next_deadline() is None


def test_the_table_is_bounded() -> None:
    pacer = PrefetchPacer(PrefetchConfig(share=1.0, min_rate_bytes_per_s=1.0, max_clients=3))
    for i in range(3):
        ask(pacer, f"c{i}", now=float(i))
    refused = ask(pacer, "c3", now=3.0)
    assert isinstance(refused, PrefetchDeferred) and "too many" in refused.reason
    assert pacer.prefetchers() + pacer.prefetchers(waiting=True) == 3


def test_client_ids() -> None:
    assert client_id("10.0.0.1", "run-7f3a") == "10.0.0.1/run-7f3a"
    assert client_id(None, None) == "-/-"
    for bad in ("", "UPPER", "x" * 65, "a/b"):
        with pytest.raises(ValueError):
            client_id("10.0.0.1", bad)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["w48", "m12", "d01"]),
            st.integers(0, 30),
            st.floats(0, 1.5),  # readers' rate as a fraction of the capacity
            st.floats(0, 20),  # seconds since the last request
        ),
        max_size=60,
    )
)
def test_live_grants_never_pass_the_budget(
    requests: list[tuple[str, int, float, float]],
) -> None:
    """Whatever arrives in whatever order: right after each grant, the live grants sum
    to at most min(share x C, C - readers)."""
    cfg = PrefetchConfig(share=0.25, min_rate_bytes_per_s=0.5 * MB, hold_s=15, renew_s=5)
    pacer = PrefetchPacer(cfg)
    now = 0.0
    for issue, client, readers_fraction, dt in requests:
        now += dt
        readers = readers_fraction * CAP
        out = readers + pacer.granted_bytes_per_s()
        decision = pacer.handle_request(
            issue, f"c{client}", capacity_bytes_per_s=CAP, out_bytes_per_s=out, now=now
        )
        if isinstance(decision, PrefetchGrant):
            budget = max(0.0, min(cfg.share * CAP, CAP - readers))
            # the grant itself fits, and every live grant made at this budget or
            # above: the sum may exceed a budget that shrank only until renewals
            assert decision.rate_bytes_per_s <= budget + 1e-6
            assert decision.rate_bytes_per_s >= cfg.min_rate_bytes_per_s
        assert pacer.granted_bytes_per_s() <= cfg.share * CAP + 1e-6
        assert pacer.prefetchers() <= cfg.max_clients


async def test_prefetch_route_is_paced_and_not_counted_as_demand() -> None:
    issue = "weekly-2026-48"
    origins: list[FakeOrigin] = [
        await start_fake_origin(name, [issue], {issue: f"{issue}.pdf.enc"})
        for name in ("origin-a", "origin-b")
    ]
    for o in origins:
        o.stats["capacity_bytes_per_s"] = 50 * MB
    running = await start_balancer(
        BalancerServiceConfig(
            origins=tuple(OriginSpec(o.name, o.url) for o in origins),
            balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=0.7),
            prefetch=PrefetchConfig(share=0.1, min_rate_bytes_per_s=2.5 * MB),
        )
    )
    try:
        await running.wait_until_up(2, timeout_s=5.0)
        base = f"{running.url}/v1/issues/{issue}/prefetch"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}?client=run-1") as resp:
                assert resp.status == 200
                doc = await resp.json()
            # 10 % of 2 x 50 MB/s, from both origins holding it
            assert doc["rate_bytes_per_s"] == 10_000_000
            assert {o["name"] for o in doc["origins"]} == {"origin-a", "origin-b"}
            # the budget is taken: the next one waits one renewal
            async with http.get(f"{base}?client=run-2") as resp:
                assert resp.status == 429
                assert int(resp.headers["Retry-After"]) == 20
                assert (await resp.json())["code"] == "prefetch_deferred"
            # the first renews (cut to half), then the second fits
            for client, rate in (("run-1", 5_000_000), ("run-2", 5_000_000)):
                async with http.get(f"{base}?client={client}") as resp:
                    assert resp.status == 200
                    assert (await resp.json())["rate_bytes_per_s"] == rate
            async with http.get(f"{running.url}/v1/issues/other-issue/prefetch") as resp:
                assert resp.status == 404
            async with http.get(f"{base}?client=NOT/OK") as resp:
                assert resp.status == 400
            async with http.get(f"{running.url}/metrics") as resp:
                metrics = await resp.text()
            assert 'pressrun_balancer_prefetchers{state="granted"} 2.0' in metrics
            assert "pressrun_balancer_prefetch_granted_bytes_per_second 1e+07" in metrics
            assert "pressrun_balancer_prefetch_deferrals_total 1.0" in metrics
        # prefetch is not demand: no directive answered, no pick on any origin
        assert running.core.directives_answered == 0
        assert all(rec.picks == 0 for rec in running.core.origins.values())
        assert running.service.prefetch.prefetchers(issue) == 2
    finally:
        await running.stop()
        for o in origins:
            await o.stop()
