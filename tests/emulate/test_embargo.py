"""The release minute in the emulation (issue 35): the scenario's ``[embargo]``, the
host's steps against a real subscription service on 127.0.0.1 (subscribers
registered, the issue published encrypted under an embargo, the release moved, each
reader's key working), ``get --json``'s ``opened_at``, and the report's figures from
known inputs. The real run is ``pressrun emulate --scenario release-minute``
(docs/emulation.md)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pressrun.clients.aio import FetchResult
from pressrun.clients.cli import result_document
from pressrun.content.bundle import Bundle
from pressrun.content.keys import generate_keypair, load_subscriber_key
from pressrun.content.release import unix_of
from pressrun.emulate.embargo import (
    KEYS_MOUNT,
    PREFETCH_TRACKER,
    bytes_from,
    client_args,
    histogram_quantile,
    key_path,
    move_release,
    parse_wrap_buckets,
    publish_for_subscribers,
    register_subscribers,
    release_at_text,
    release_comparison,
    release_line,
    release_summary,
    subscriber_keys,
)
from pressrun.emulate.scenario import load_scenario, parse_scenario, with_readers
from pressrun.sim.scenario import ScenarioError
from pressrun.subscriptions.aio import WRAP_SECONDS_BUCKETS, SubscriptionService
from pressrun.subscriptions.client import Embargoed, SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

SCENARIO = """
name = "t"
issue_mb = 2
[embargo]
readers = 12
window_s = 60
prefetch_spread_s = 20
crowd_spread_s = 30
[[links]]
name = "dsl"
rate = "20mbit"
share = 1
[[links]]
name = "fibre"
rate = "50mbit"
share = 1
"""


def test_the_readers_prefetch_over_the_window_and_crowd_the_twins_release_minute() -> None:
    scenario = parse_scenario(SCENARIO)
    assert scenario.embargo is not None and scenario.embargo.twin
    prefetch = scenario.clients()
    crowd = scenario.release_crowd()
    assert len(prefetch) == len(crowd) == 12
    assert all(0 <= p.at_s <= 20 for p in prefetch)
    assert all(0 <= p.at_s <= 30 for p in crowd)
    # the same readers (numbers, links) in both runs, only the arrival differs
    assert [(p.number, p.link) for p in prefetch] == [(p.number, p.link) for p in crowd]
    fewer = with_readers(scenario, 5)
    assert len(fewer.clients()) == len(fewer.release_crowd()) == 5
    with pytest.raises(ScenarioError, match="--readers is for a scenario with"):
        with_readers(load_scenario("small"), 5)
    assert len(load_scenario("release-minute").clients()) == 150  # the issue's


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("readers = 12", "readers = 12.5"), "must be a whole number"),
        (("prefetch_spread_s = 20", "prefetch_spread_s = 60"), "must end before the release"),
        (("window_s = 60", "window = 60"), "unknown key(s) window"),
        (
            ("[[links]]", "[[arrivals]]\nkind = 'burst'\ncount = 2\nat_s = 0\n[[links]]"),
            "not with [embargo]",
        ),
    ],
)
def test_embargo_mistakes_are_named(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(SCENARIO.replace(*change, 1))


def test_a_reader_gets_its_own_key_and_prefetches_only_with_the_embargo() -> None:
    assert client_args(7, prefetch=True) == [
        "--subscriber-key", f"{KEYS_MOUNT}/7.key", "--prefetch",
    ]  # fmt: skip
    assert client_args(7, prefetch=False) == ["--subscriber-key", f"{KEYS_MOUNT}/7.key"]


def test_get_json_says_when_the_issue_was_readable(tmp_path: Path) -> None:
    path = tmp_path / "issue.pdf"
    path.write_bytes(b"x" * 10)
    result = FetchResult("i", path, 1.0, 10, {}, 0, 0, 0, 0, mode="prefetch")
    before = time.time()
    doc = result_document(result)
    assert before - 0.001 <= doc["opened_at"] <= time.time() + 0.01
    assert json.loads(json.dumps(doc))["mode"] == "prefetch"


def test_wrap_latency_quantiles_from_the_services_histogram() -> None:
    registry = CollectorRegistry()
    h = Histogram("pressrun_subscriptions_wrap_seconds", "x", buckets=WRAP_SECONDS_BUCKETS,
                  registry=registry)  # fmt: skip
    for _ in range(98):
        h.observe(0.0003)  # in (0.0002, 0.0005]
    h.observe(0.015)  # in (0.01, 0.02]
    h.observe(3.0)  # past the last bound: +Inf
    buckets = parse_wrap_buckets(generate_latest(registry).decode())
    assert buckets[0.0005] == 98 and buckets[math.inf] == 100
    # rank 50 of 98 in (0.0002, 0.0005]: linear inside it
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.0002 + 0.0003 * 50 / 98)
    # rank 99: the one in (0.01, 0.02], at its top
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.02)
    assert histogram_quantile(1.0, buckets) == 1.0  # +Inf: the highest finite bound
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {0.001: 0.0, math.inf: 0.0}) is None


def test_release_figures_from_the_readers_and_the_origins_series() -> None:
    release_wall = 1_800_000_000.0
    rows = [
        {"verified": True, "opened_at": release_wall + 0.4, "mode": "prefetch"},
        {"verified": True, "opened_at": release_wall + 2.0, "mode": "prefetch"},
        {"verified": True, "opened_at": release_wall + 31.0, "mode": "swarm"},  # late
        {"verified": False, "opened_at": None, "mode": None},
    ]
    # origin-a sent 100 MB before the release (120 s) and 5 MB from it; origin-b
    # started later (its series from 10 s) and sent 1 MB from the release
    egress = {
        "origin-a": [(0.0, 0), (60.0, 60_000_000), (120.0, 100_000_000), (150.0, 105_000_000)],
        "origin-b": [(10.0, 0), (119.0, 2_000_000), (151.0, 3_000_000)],
    }
    assert bytes_from(egress["origin-a"], 120.0) == 5_000_000
    assert bytes_from(egress["origin-b"], 120.0) == 1_000_000
    assert bytes_from(egress["origin-b"], float("-inf")) == 3_000_000
    summary = release_summary(
        rows, egress, release_s=120.0, release_wall=release_wall, open_within_s=10.0,
        wrap_buckets={0.001: 3.0, 0.002: 3.0, math.inf: 3.0},
    )  # fmt: skip
    assert summary["readers"] == 4 and summary["verified"] == 3
    assert summary["opened_within"] == 2 and summary["share_opened_within"] == 0.5
    assert summary["opened_after_release_s"] == {"min": 0.4, "median": 2.0, "max": 31.0}
    assert summary["prefetched"] == 2
    assert summary["origin_bytes_before_release"] == 102_000_000
    assert summary["origin_bytes_from_release"] == 6_000_000
    assert summary["wraps_timed"] == 3
    assert summary["wrap_latency_s"] == {"p50": 0.0005, "p99": 0.00099}
    line = release_line("emulation", summary)
    assert line.startswith(
        "emulation: 2/4 readers opened the issue within 10 s of the release (50%), 2 by prefetch"
    )
    assert "origins 102 MB before the release, 6 MB from it; wrap latency p50 0.5 ms" in line
    twin = {**summary, "origin_bytes_from_release": 60_000_000}
    assert release_comparison(summary, twin)["ratio"] == 0.1


async def test_the_hosts_steps_against_a_real_subscription_service(tmp_path: Path) -> None:
    """What a run does before its readers start: keys, subscribers, the encrypted
    issue under an embargo an hour off, the release moved to the window's end; each
    reader's key is a subscriber's, and asking before the moved release is refused
    with that time."""
    token = "operator-secret-token-0123"
    service = SubscriptionService(SubscriptionStore(tmp_path / "subs.db"), operator_token=token)
    port = await service.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        keys = await asyncio.to_thread(subscriber_keys, tmp_path / "keys", [1, 2, 3])
        assert sorted(keys) == [1, 2, 3] and key_path(tmp_path / "keys", 2).is_file()
        await register_subscribers(url, token, keys)
        assert len(service.store.subscribers()) == 3
        publisher, _ = generate_keypair(tmp_path / "publisher.key")
        source = tmp_path / "issue.pdf"
        source.write_bytes(b"%PDF-1.4 " + bytes(range(256)) * 400)
        now = time.time()
        await asyncio.to_thread(
            publish_for_subscribers, source, issue_id="rm-1", key_file=publisher,
            content_dir=tmp_path / "content", web_seeds=["http://origin-a:8001"], url=url,
            token=token, release_at=release_at_text(now + 3600),
        )  # fmt: skip
        manifest = Bundle.load(tmp_path / "content" / "rm-1").manifest
        assert manifest.encryption is not None and manifest.encryption.release_at is not None
        assert (
            PREFETCH_TRACKER.encode()
            in (tmp_path / "content" / "rm-1" / "rm-1.torrent").read_bytes()
        )
        moved = release_at_text(now + 120)
        await move_release(url, token, publisher, "rm-1", 1, moved)
        async with aiohttp.ClientSession() as http:
            client = SubscriptionsClient(url, http, operator_token=token)
            doc = await client.release("rm-1", 1)
            assert doc is not None and doc["release"]["sequence"] == 2
            assert doc["release"]["release_at"] == moved
            reader = load_subscriber_key(key_path(tmp_path / "keys", 3))
            with pytest.raises(Embargoed) as refused:
                await client.fetch_wrap("rm-1", 1, reader)
            assert unix_of(refused.value.release_at) == unix_of(moved)
            async with http.get(f"{url}/metrics") as resp:
                buckets = parse_wrap_buckets(await resp.text())
            assert buckets and max(buckets.values()) == 0  # no wrap before the release
    finally:
        await service.close()
