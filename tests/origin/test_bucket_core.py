"""The origin's egress cap in its pure core, driven with explicit `now`: the token
bucket and the turns an answer takes its bytes in (`pressrun.origin.core`)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pressrun.origin.core import TokenBucket, turn_write_release

# ------------------------------------------------------------------ token bucket


def test_bucket_grants_the_burst_at_once_then_paces() -> None:
    bucket = TokenBucket(1000.0, 500.0, now=0.0)
    assert bucket.take(500, now=0.0) == 0.0
    assert bucket.take(100, now=0.0) == pytest.approx(0.1)
    # a second taker at the same instant queues behind the first
    assert bucket.take(100, now=0.0) == pytest.approx(0.2)
    # time pays the debt back: at t=0.2 the debt is gone, nothing more is free
    assert bucket.tokens(now=0.2) == pytest.approx(0.0)
    assert bucket.take(1000, now=0.2) == pytest.approx(1.0)


def test_bucket_refill_stops_at_the_burst() -> None:
    bucket = TokenBucket(1000.0, 500.0, now=0.0)
    assert bucket.tokens(now=100.0) == pytest.approx(500.0)
    assert bucket.take(600, now=100.0) == pytest.approx(0.1)


def test_bucket_takes_larger_than_the_burst() -> None:
    bucket = TokenBucket(100.0, 10.0, now=0.0)
    assert bucket.take(1010, now=0.0) == pytest.approx(10.0)


def test_bucket_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0.0, 10.0)
    with pytest.raises(ValueError):
        TokenBucket(float("inf"), 10.0)
    with pytest.raises(ValueError):
        TokenBucket(10.0, -1.0)
    with pytest.raises(ValueError):
        TokenBucket(10.0, 1.0).take(-1, now=0.0)


@settings(max_examples=300)
@given(
    rate=st.floats(1.0, 1e9),
    burst=st.floats(0.0, 1e7),
    takes=st.lists(
        st.tuples(st.floats(0.0, 5.0), st.integers(0, 2_000_000)), min_size=1, max_size=60
    ),
)
def test_bucket_never_releases_more_than_rate_t_plus_burst(
    rate: float, burst: float, takes: list[tuple[float, int]]
) -> None:
    """Released bytes by time T never exceed burst + rate * (T - t0), for every T."""
    t0 = 0.0
    bucket = TokenBucket(rate, burst, now=t0)
    now = t0
    releases: list[tuple[float, int]] = []
    for gap, n in takes:
        now += gap
        wait = bucket.take(n, now=now)
        assert wait >= 0.0
        releases.append((now + wait, n))
    # release times are monotone in the order of take (first come, first served)
    times = [t for t, _ in releases]
    assert all(a <= b + 1e-9 * max(1.0, b) for a, b in itertools.pairwise(times))
    released = 0
    for t, n in sorted(releases):
        released += n
        allowed = burst + rate * (t - t0)
        assert released <= allowed * (1 + 1e-9) + 1e-6


@given(rate=st.floats(1.0, 1e8), n=st.integers(1, 10_000_000), burst=st.floats(0.0, 1e6))
def test_bucket_long_run_rate_is_the_rate(rate: float, n: int, burst: float) -> None:
    """A steady taker of `n`-byte chunks is released at the rate, within one burst."""
    bucket = TokenBucket(rate, burst, now=0.0)
    now = 0.0
    total = 0
    for _ in range(20):
        now += bucket.take(n, now=now)
        total += n
    # the 20th chunk is released when total - burst bytes have been paid for
    assert now == pytest.approx(max(0.0, (total - burst) / rate), rel=1e-6, abs=1e-9)


def _paced_transfers(
    rate: float, burst: float, turn: int, chunk: int, answers: list[tuple[float, int]]
) -> tuple[list[tuple[float, int, int]], list[float]]:
    """The transfer loop of `pressrun.origin.transfer` on one bucket, clients that take
    every byte at once: each answer ``(asked at, bytes)`` takes a turn of up to `turn`
    bytes when it reaches one and sends writes of up to `chunk` when the turn has paid
    for them. Returns every write ``(released at, bytes, answer)`` and each answer's end."""
    bucket = TokenBucket(rate, burst, now=0.0)
    # (time of the next step, answer index): the answers step in time order, ties in
    # the order asked, as the event loop runs the tasks whose sleeps end
    steps = sorted((t, i) for i, (t, _) in enumerate(answers))
    position = [0] * len(answers)
    turn_end = [0] * len(answers)
    released_at = [0.0] * len(answers)
    ends = [0.0] * len(answers)
    writes: list[tuple[float, int, int]] = []
    while steps:
        now, i = steps.pop(0)
        size = answers[i][1]
        if position[i] >= turn_end[i]:
            turn_end[i] = min(size, position[i] + turn)
            released_at[i] = now + bucket.take(turn_end[i] - position[i], now=now)
        n = min(chunk, turn_end[i] - position[i])
        at = max(now, turn_write_release(released_at[i], turn_end[i] - position[i] - n, rate))
        writes.append((at, n, i))
        position[i] += n
        if position[i] >= size:
            ends[i] = at
        else:
            steps.append((at, i))
            steps.sort()
    return writes, ends


@settings(max_examples=200)
@given(
    rate=st.floats(1e3, 1e8),
    burst_s=st.floats(0.0, 0.2),
    turn_chunks=st.integers(1, 8),
    chunk=st.integers(1024, 256 * 1024),
    answers=st.lists(
        st.tuples(st.floats(0.0, 2.0), st.integers(1, 3_000_000)), min_size=1, max_size=30
    ),
)
def test_turns_release_no_more_than_rate_t_plus_burst(
    rate: float, burst_s: float, turn_chunks: int, chunk: int, answers: list[tuple[float, int]]
) -> None:
    """Writes inside turns, many answers at once: the bytes released by any time T stay
    within burst + rate * T, as one take a write would."""
    burst = max(float(chunk), rate * burst_s)
    writes, _ = _paced_transfers(rate, burst, turn_chunks * chunk, chunk, answers)
    released = 0
    for t, n, _ in sorted(writes):
        released += n
        assert released <= (burst + rate * t) * (1 + 1e-9) + 1e-6


def test_answers_of_one_turn_end_in_the_order_asked() -> None:
    """Forty piece fetches (128 KiB) at once on 1 MB/s, turns of 256 KiB and writes of
    64 KiB: the first asked ends first, then one every 131 ms (a piece's time at the
    cap), where writes granted one at a time (a turn of one write, the code before)
    ended none but the first before every first half was out."""
    rate, burst, piece = 1e6, 64 * 1024.0, 128 * 1024
    answers = [(0.0001 * i, piece) for i in range(40)]
    _, ends = _paced_transfers(rate, burst, 256 * 1024, 64 * 1024, answers)
    assert ends == sorted(ends)
    assert ends[0] == pytest.approx((piece - burst) / rate)
    for a, b in itertools.pairwise(ends):
        assert b - a == pytest.approx(piece / rate, abs=1e-3)
    _, before = _paced_transfers(rate, burst, 64 * 1024, 64 * 1024, answers)
    # (the first asked took both its writes before the second asked: it alone ended early)
    assert sorted(before)[1] >= (40 * 64 * 1024 - burst) / rate
    # the last ends no later than it did, and the whole takes what the cap allows
    assert ends[-1] == pytest.approx(max(before))


def test_a_long_answer_takes_turns_with_the_fetches() -> None:
    """A whole-file download asked first and twenty piece fetches right after it: a
    round gives each answer one turn in the order asked, the file 256 KiB and each
    fetch its piece, so the file moves while they are served (it is not left until they
    end), each fetch ends in one turn, and the file ends as late as the round's bytes
    make it, no later."""
    rate, burst, piece, turn = 1e6, 64 * 1024.0, 128 * 1024, 256 * 1024
    answers = [(0.0, 4_000_000)] + [(0.001 + 0.0001 * i, piece) for i in range(20)]
    writes, ends = _paced_transfers(rate, burst, turn, 64 * 1024, answers)
    fetches_end = max(ends[1:])
    assert ends[1:] == sorted(ends[1:])
    assert ends[0] > fetches_end
    # the file had its turn of the round (asked first: the first), each fetch its
    # piece; then it waited behind the round and no byte of the cap was lost
    file_by_then = sum(n for t, n, i in writes if i == 0 and t <= fetches_end)
    assert file_by_then == turn
    _, file_alone = _paced_transfers(rate, burst, turn, 64 * 1024, answers[:1])
    assert ends[0] == pytest.approx(file_alone[0] + 20 * piece / rate, rel=1e-6)
