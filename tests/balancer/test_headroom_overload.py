"""The demand of a crowd per issue and the price rule (`headroom_overload`), pure."""

from __future__ import annotations

import math

import pytest

from pressrun.balancer.algorithms.headroom_overload import IssueDemand, Overload
from pressrun.balancer.events import ClientHint

MB = 1e6


def test_the_rate_of_first_asks_decays_over_each_issues_window() -> None:
    d = IssueDemand()
    for k in range(60):
        d.record("a", 30.0, now=k / 2)  # 2 a second for 30 s, counted over 30 s
        d.record("b", 300.0, now=k / 2)  # the same, counted over 300 s
    assert d.rate("a", now=29.5) == pytest.approx(
        sum(math.exp(-(29.5 - k / 2) / 30) for k in range(60)) / 30
    )
    assert d.rate("b", now=29.5) == pytest.approx(
        sum(math.exp(-(29.5 - k / 2) / 300) for k in range(60)) / 300
    )
    # a crowd that stopped is forgotten within a few windows
    assert d.rate("a", now=29.5 + 150) < 0.01 * d.rate("a", now=29.5)
    assert d.rate("never", now=10.0) == 0.0
    with pytest.raises(ValueError):
        d.record("a", 0.0, now=30.0)


def test_only_cheaper_issues_price_a_download_out() -> None:
    d = IssueDemand()
    for k in range(100):
        d.record("small", 10.0, now=k / 10)
        d.record("big", 10.0, now=k / 10)
    sizes = {"small": 30 * MB, "big": 230 * MB}
    cheap = d.cheaper_demand(230 * MB, sizes, now=10.0)
    assert cheap == pytest.approx(d.rate("small", now=10.0) * 30 * MB)
    assert d.demand(sizes, now=10.0) == pytest.approx(cheap + d.rate("big", now=10.0) * 230 * MB)
    assert d.priced_out(230 * MB, sizes, cheap * 0.99, now=10.0)
    assert not d.priced_out(230 * MB, sizes, cheap * 1.01, now=10.0)
    # never by clients of its own size, nor with no room known
    assert not d.priced_out(30 * MB, sizes, 1.0, now=10.0)
    assert not d.priced_out(230 * MB, sizes, 0.0, now=10.0)
    d.forget("small")
    assert d.issues() == 1
    assert not d.priced_out(230 * MB, sizes, 1.0, now=10.0)


def test_only_first_asks_of_clients_that_can_finish_count() -> None:
    sizes = {"i": 100 * MB}
    o = Overload(lambda: sizes, lambda: 10 * MB)
    fast = ClientHint(size_bytes=int(100 * MB), rate_bytes_per_s=10 * MB, elapsed_s=0.0)
    retry = ClientHint(size_bytes=int(100 * MB), rate_bytes_per_s=10 * MB, elapsed_s=4.0)
    slow = ClientHint(size_bytes=int(100 * MB), rate_bytes_per_s=0.1 * MB, elapsed_s=0.0)
    for k in range(10):
        # 100 MB due in 100 s (1 MB/s): a 0.1 MB/s link cannot bring it in time
        o.asked("i", retry, 1 * MB, 100.0, now=float(k))
        o.asked("i", slow, 1 * MB, 100.0, now=float(k))
    assert o.demand.rate("i", now=10.0) == 0.0
    assert not o.exceeds_capacity(now=10.0)
    for k in range(20):
        o.asked("i", fast, 1 * MB, 100.0, now=10.0 + k / 10)
    # about 20 asks over a 100 s deadline: 0.2 a second x 100 MB = 20 MB/s > 10 MB/s
    assert o.exceeds_capacity(now=12.0)
    with pytest.raises(ValueError):
        Overload(lambda: sizes, lambda: 1.0, 0.0)
