"""Merging the workers' figures (pure): `merge_stats`, `merge_samples`."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from pressrun.origin.shared import merge_samples, merge_stats


def _snap(slot: int, recent: list[list[float]], **kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "slot": slot,
        "pid": 100 + slot,
        "out_bytes_per_s": 0.0,
        "transfers_seen": 0,
        "mean_transfer_bytes_per_s": 0.0,
        "mean_by_issue": {},
        "transfers_seen_by_issue": {},
        "recent": recent,
        "active": 0,
        "stalled": 0,
        "cached_issues": [],
        "active_by_issue": {},
        "transfers_by_issue": {},
        "bytes_by_issue": {},
        "bytes_sent_total": 0,
        "transfers_total": 0,
    }
    doc.update(kw)
    return doc


def test_counts_add_up_and_means_are_weighted() -> None:
    a = _snap(
        0,
        [],
        out_bytes_per_s=10.0,
        transfers_seen=1,
        mean_transfer_bytes_per_s=10.0,
        mean_by_issue={"i": 10.0},
        transfers_seen_by_issue={"i": 1},
        active=1,
        stalled=2,
        active_by_issue={"i": 1},
        bytes_by_issue={"i": 5},
        transfers_by_issue={"i": 1},
        bytes_sent_total=5,
        transfers_total=1,
        cached_issues=["i"],
    )
    b = _snap(
        1,
        [],
        out_bytes_per_s=30.0,
        transfers_seen=3,
        mean_transfer_bytes_per_s=10.0 / 3 * 2 + 50 / 3,  # rates 10/3 (x2) ... any mean
        mean_by_issue={"i": 2.0, "j": 50.0},
        transfers_seen_by_issue={"i": 2, "j": 1},
        active=2,
        active_by_issue={"i": 1, "j": 1},
        bytes_by_issue={"i": 7, "j": 3},
        transfers_by_issue={"i": 2, "j": 1},
        bytes_sent_total=10,
        transfers_total=3,
        cached_issues=["j"],
    )
    m = merge_stats(a, [b])
    assert m["out_bytes_per_s"] == 40.0
    assert m["active_transfers"] == 3 and m["stalled_transfers"] == 2
    assert m["bytes_sent_total"] == 15 and m["transfers_total"] == 4
    assert m["bytes_sent_by_issue"] == {"i": 12, "j": 3}
    assert m["transfers_total_by_issue"] == {"i": 3, "j": 1}
    assert m["active_transfers_by_issue"] == {"i": 2, "j": 1}
    assert m["cached_issues"] == ["i", "j"]
    # issue i: one transfer at 10, two at 2 -> (10 + 4) / 3
    assert m["mean_transfer_bytes_per_s_by_issue"] == {"i": 14 / 3, "j": 50.0}
    assert m["mean_transfer_bytes_per_s"] == (10.0 + 3 * b["mean_transfer_bytes_per_s"]) / 4
    assert [w["slot"] for w in m["workers"]] == [0, 1]
    assert merge_stats(_snap(0, []), [])["mean_transfer_bytes_per_s"] is None


def test_windows_take_the_others_bytes_by_overlap() -> None:
    own = _snap(0, [[10.0, 11.0, 100], [11.0, 12.0, 100]])
    # the other's windows are 10 ms late; the overlap splits its bytes
    other = _snap(1, [[10.01, 11.01, 1000], [11.01, 12.01, 1000]])
    m = merge_stats(own, [other])
    assert [(w["start_s"], w["end_s"]) for w in m["recent_intervals"]] == [
        (10.0, 11.0),
        (11.0, 12.0),
    ]
    assert [w["bytes"] for w in m["recent_intervals"]] == [100 + 990, 100 + 1000]


def test_a_window_the_other_worker_has_not_published_waits() -> None:
    own = _snap(0, [[10.0, 11.0, 100], [11.0, 12.0, 100]])
    other = _snap(1, [[10.01, 11.01, 1000]])  # has not closed its second interval yet
    m = merge_stats(own, [other])
    # without the hold, (11, 12) would go out with 10 of the other's bytes instead of
    # its ~1000, and a reader that takes each window once would keep the shortfall
    assert [(w["start_s"], w["end_s"]) for w in m["recent_intervals"]] == [(10.0, 11.0)]
    # a worker that published nothing lately (stuck, just replaced) holds nothing back
    stale = _snap(1, [[5.0, 6.0, 1000]])
    assert len(merge_stats(own, [stale])["recent_intervals"]) == 2
    fresh = _snap(1, [])
    assert len(merge_stats(own, [fresh])["recent_intervals"]) == 2


def _family(name: str, kind: str, samples: list[list[Any]]) -> dict[str, Any]:
    return {"name": name, "type": kind, "documentation": "d", "samples": samples}


def test_samples_add_up_created_is_earliest_fixed_gauges_once() -> None:
    w0 = [
        _family(
            "pressrun_origin_sent_bytes",
            "counter",
            [
                ["pressrun_origin_sent_bytes_total", {"issue": "i"}, 5.0],
                ["pressrun_origin_sent_bytes_created", {"issue": "i"}, 200.0],
            ],
        ),
        _family(
            "pressrun_origin_active_transfers",
            "gauge",
            [["pressrun_origin_active_transfers", {}, 2.0]],
        ),
        _family(
            "pressrun_origin_capacity_bytes_per_second",
            "gauge",
            [["pressrun_origin_capacity_bytes_per_second", {}, 9.0]],
        ),
    ]
    w1 = [
        _family(
            "pressrun_origin_sent_bytes",
            "counter",
            [
                ["pressrun_origin_sent_bytes_total", {"issue": "i"}, 7.0],
                ["pressrun_origin_sent_bytes_created", {"issue": "i"}, 100.0],
                ["pressrun_origin_sent_bytes_total", {"issue": "j"}, 1.0],
            ],
        ),
        _family(
            "pressrun_origin_active_transfers",
            "gauge",
            [["pressrun_origin_active_transfers", {}, 3.0]],
        ),
        _family(
            "pressrun_origin_capacity_bytes_per_second",
            "gauge",
            [["pressrun_origin_capacity_bytes_per_second", {}, 9.0]],
        ),
    ]
    merged = {f["name"]: f for f in merge_samples([w0, w1])}
    sent = {
        (n, tuple(lab.items())): v for n, lab, v in merged["pressrun_origin_sent_bytes"]["samples"]
    }
    assert sent[("pressrun_origin_sent_bytes_total", (("issue", "i"),))] == 12.0
    assert sent[("pressrun_origin_sent_bytes_total", (("issue", "j"),))] == 1.0
    assert sent[("pressrun_origin_sent_bytes_created", (("issue", "i"),))] == 100.0
    assert merged["pressrun_origin_active_transfers"]["samples"][0][2] == 5.0
    assert merged["pressrun_origin_capacity_bytes_per_second"]["samples"][0][2] == 9.0
    carried = merge_samples([w0], counters_only=True)
    assert [f["name"] for f in carried] == ["pressrun_origin_sent_bytes"]


def _sent(doc: dict[str, Any]) -> float:
    """The sent-bytes counter in a snapshot's samples (0 before the first transfer)."""
    values = [
        float(s[2])
        for f in doc["metrics"]
        for s in f["samples"]
        if s[0] == "pressrun_origin_sent_bytes_total"
    ]
    return sum(values)


async def test_a_busy_worker_publishes_samples_at_most_a_second_old(tmp_path: Path) -> None:
    """The snapshot's Prometheus samples: fresh when the worker is idle, reused for up
    to METRICS_EVERY_S while transfers run (collecting them ten times a second was
    2-3% of a busy worker), while the plain totals stay live."""
    import aiohttp

    from pressrun.origin import OriginConfig, start_origin
    from pressrun.origin.shared import WorkerShare
    from pressrun.origin.status import METRICS_EVERY_S

    (tmp_path / "c" / "i").mkdir(parents=True)
    (tmp_path / "c" / "i" / "f.bin").write_bytes(os.urandom(2_000_000))
    share = WorkerShare(slot=0, workers=2, state_dir=tmp_path)
    # 8 Mbit/s: the transfer runs for about 2 s
    config = OriginConfig(content_dir=tmp_path / "c", egress_cap_mbps=8.0)
    origin = await start_origin(config, share=share)
    service = origin.service
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{origin.url}/content/i/f.bin") as resp,
        ):
            await resp.content.readexactly(300_000)
            service.publish()
            first = json.loads((tmp_path / "worker-0.json").read_bytes())
            await resp.content.readexactly(300_000)
            service.publish()
            second = json.loads((tmp_path / "worker-0.json").read_bytes())
            assert first["active"] == second["active"] == 1
            assert second["bytes_sent_total"] > first["bytes_sent_total"]  # live
            # reused: younger than a second (those of the idle start: no bytes yet)
            assert _sent(second) == _sent(first) < first["bytes_sent_total"]
            service._metrics_at -= METRICS_EVERY_S  # a second later
            service.publish()
            third = json.loads((tmp_path / "worker-0.json").read_bytes())
            assert _sent(third) > _sent(first)
            await resp.read()
        for _ in range(100):  # idle again: the last transfer's samples at once
            if service.meter.active_transfers == 0:
                break
            await asyncio.sleep(0.02)
        service.publish()
        idle = json.loads((tmp_path / "worker-0.json").read_bytes())
        assert _sent(idle) == idle["bytes_sent_total"] == 2_000_000
    finally:
        await origin.stop()
