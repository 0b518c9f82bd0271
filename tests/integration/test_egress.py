"""The egress check of issue 10 (docs/demo.md, ``pressrun demo --egress``): the real
balancer over origins of different caps, two issues of different sizes, paced clients;
no origin above its cap for more than one poll interval."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pressrun.balancer.config import BalancerConfig
from pressrun.demo.egress import (
    SMALL_SCENARIO,
    EgressResult,
    EgressScenario,
    OriginEgress,
    run_egress_check,
)


def check_counts(result: EgressResult, scenario: EgressScenario) -> str:
    """The report; asserts what every run must show: each finished client's file went
    out of some origin (counted per issue), every origin's windows cover the run
    without a gap and add up to what it sent."""
    report = "\n".join(result.lines())
    sizes = {
        i: m * 1024 * 1024 for i, m in zip(scenario.issue_ids(), scenario.issue_mib, strict=True)
    }
    done = [c for c in result.clients if c.done_s is not None]
    for issue, size in sizes.items():
        finished = sum(1 for c in done if c.issue_id == issue)
        sent = sum(o.bytes_by_issue.get(issue, 0) for o in result.origins)
        started = sum(o.transfers_by_issue.get(issue, 0) for o in result.origins)
        assert sent >= finished * size and started >= finished, report
    for origin in result.origins:
        # the origin's own stats intervals, read from its recent_intervals: end to end
        assert len(origin.windows) >= 10, report
        for (_, end, _), (start, _, _) in zip(origin.windows, origin.windows[1:], strict=False):
            assert start == end, report
        assert sum(b for _, _, b in origin.windows) <= sum(origin.bytes_by_issue.values())
        assert max(origin.peak_active_by_issue.values(), default=0) >= 1, report
    return report


def test_spans_count_consecutive_windows_above_the_cap() -> None:
    o = OriginEgress("o", cap_bytes_per_s=1000.0)
    # windows of 0.5 s at 500, 1200 | 900 | 1100, 1500, 1002 | 1000 bytes/s (at the cap
    # is not above it)
    for k, sent in enumerate([250, 600, 450, 550, 750, 501, 500]):
        o.windows.append((k * 0.5, k * 0.5 + 0.5, sent))
    assert o.windows_above_cap() == 4
    seconds, windows = o.longest_span_above_cap()
    assert windows == 3 and seconds == pytest.approx(1.5)
    assert o.peak_ratio() == pytest.approx(1.5)
    result = EgressResult(SMALL_SCENARIO, "x", [o], [], 4.0)
    assert not result.holds()
    assert result.longest_span() == ("o", pytest.approx(1.5), 3)
    assert "DOES NOT HOLD" in result.lines()[-1]
    # one window above the cap, alone: the balancer may see it only at its next poll
    alone = OriginEgress("p", 1000.0, windows=[(0, 0.5, 400), (0.5, 1.0, 900), (1.0, 1.5, 10)])
    assert alone.longest_span_above_cap() == (pytest.approx(0.5), 1)
    assert EgressResult(SMALL_SCENARIO, "x", [alone], [], 1.5).holds()


@pytest.mark.slow
async def test_the_check_sees_an_origin_run_above_its_cap(tmp_path: Path) -> None:
    """Real origin and balancer processes on 127.0.0.1, the small scenario: caps of 4
    and 8 MB/s, issues of 3 and 6 MiB, 20 clients at 1 MB/s arriving within 2 s. For a
    few seconds they ask for more than both caps together, so an algorithm that never
    refuses (alg2, named here) must leave some origin above its cap for several poll
    intervals, and the check must say so."""
    scenario = replace(SMALL_SCENARIO, algorithm="alg2")
    result = await run_egress_check(scenario, keep=tmp_path / "egress")
    report = check_counts(result, scenario)
    assert result.algorithm == "alg2"
    assert not result.holds(), report
    _name, seconds, windows = result.longest_span()
    assert windows >= 2 and seconds > scenario.poll_interval_s, report
    assert "DOES NOT HOLD" in result.lines()[-1]
    done = [c for c in result.clients if c.done_s is not None]
    # alg2 refuses nobody: every client got its file
    assert len(done) == scenario.clients and not any(c.refusals for c in done), report


@pytest.mark.slow
async def test_the_default_algorithm_keeps_every_origin_within_its_cap(tmp_path: Path) -> None:
    """Issue 10's requirement: the real balancer with its default algorithm (none is
    named), the same crowd as above (origins of 4 and 8 MB/s, issues of 3 and 6 MiB, 20
    clients within 2 s): no origin above its cap for more than one poll interval, every
    client served, the crowd beyond the caps answered with refusals (Retry-After)."""
    result = await run_egress_check(SMALL_SCENARIO, keep=tmp_path / "egress")
    report = check_counts(result, SMALL_SCENARIO)
    assert result.algorithm == BalancerConfig().algorithm
    assert result.holds(), report
    assert "holds" in result.lines()[-1]
    done = [c for c in result.clients if c.done_s is not None]
    assert len(done) == SMALL_SCENARIO.clients, report
    # 20 clients asked for 20 MB/s of 12: the balancer had to refuse some for a while
    assert sum(c.refusals for c in result.clients) >= 1, report
    for origin in result.origins:
        assert sum(origin.bytes_by_issue.values()) > 0, report  # both origins used
