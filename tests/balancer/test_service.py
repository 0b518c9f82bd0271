"""The balancer service over real HTTP on 127.0.0.1.

Two kinds of origins:

- real ones (`pressrun.origin.start_origin`) serving a bundle made by the real
  `pressrun.content.publish`: the directive, failed=, the 302 (and the file behind it),
  /v1/origins, /metrics, an origin stopped and restarted;
- small aiohttp /stats servers (tests/balancer/fake_origin.py) where a test needs a
  status it chooses (exact scores), a malformed, oversized or hung one: three real
  origins on one machine report the same CPU and RAM.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from balancer.fake_origin import FakeOrigin, start_fake_origin
from pressrun.balancer.aio import BalancerServiceConfig, RunningBalancer, start_balancer
from pressrun.balancer.cli import OriginListError, default_origin_name, parse_origins
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import OriginState
from pressrun.balancer.demand import DemandConfig
from pressrun.balancer.events import OriginSpec
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish
from pressrun.origin import OriginConfig, RunningOrigin, start_origin

INTERVAL_S = 0.2
ISSUE = "weekly-2026-47"
FILE = "weekly-2026-47.pdf"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def origins() -> AsyncIterator[list[FakeOrigin]]:
    # a: idle; b: 10% CPU; c: 50% CPU and holds a second issue
    started = [
        await start_fake_origin("origin-a", [ISSUE], {ISSUE: FILE}, cpu_percent=0.0),
        await start_fake_origin("origin-b", [ISSUE], {ISSUE: FILE}, cpu_percent=10.0),
        await start_fake_origin(
            "origin-c", [ISSUE, "daily-1"], {ISSUE: FILE}, cpu_percent=50.0, ram_percent=0.0
        ),
    ]
    yield started
    for origin in started:
        await origin.stop()


async def start(origins: list[FakeOrigin], **balancer: object) -> RunningBalancer:
    balancer.setdefault("algorithm", "alg2")  # the scores asserted below are alg2's
    config = BalancerServiceConfig(
        origins=tuple(OriginSpec(o.name, o.url) for o in origins),
        balancer=BalancerConfig(
            poll_interval_s=INTERVAL_S,
            stale_after_s=3.5 * INTERVAL_S,
            **balancer,  # type: ignore[arg-type]
        ),
    )
    running = await start_balancer(config)
    await running.wait_until_up(len(origins), timeout_s=5.0)
    return running


@pytest.fixture
async def balancer(origins: list[FakeOrigin]) -> AsyncIterator[RunningBalancer]:
    running = await start(origins)
    yield running
    await running.stop()


async def get_json(
    http: aiohttp.ClientSession, url: str, status: int = 200
) -> tuple[dict[str, object], aiohttp.ClientResponse]:
    async with http.get(url, allow_redirects=False) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/json"
        return await resp.json(), resp


async def wait_for(condition: object, timeout_s: float = 3.0) -> float:
    """Seconds until condition() holds; fails after timeout_s."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not condition():  # type: ignore[operator]
        if loop.time() - started > timeout_s:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
    return loop.time() - started


async def test_directive_json_over_http(
    balancer: RunningBalancer, origins: list[FakeOrigin], http: aiohttp.ClientSession
) -> None:
    doc, _ = await get_json(http, f"{balancer.url}/v1/issues/{ISSUE}/directive")
    # alg2: a 1000+800+1000 = 2800 (RAM 20% by default), b 900+800+1000 = 2700,
    # c 500+1000+1000 = 2500
    assert doc == {
        "issue_id": ISSUE,
        "mode": "origin",
        "origins": [
            {"name": "origin-a", "url": origins[0].url, "score": pytest.approx(2800.0)},
            {"name": "origin-b", "url": origins[1].url, "score": pytest.approx(2700.0)},
            {"name": "origin-c", "url": origins[2].url, "score": pytest.approx(2500.0)},
        ],
        "swarm": None,
        "multicast": None,
        "fallbacks": [],
        "expires_in_s": 5.0,
        "algorithm": "alg2",
    }
    assert balancer.core.origins["origin-a"].picks == 1


async def test_failed_list_reselects_without_those_origins(
    balancer: RunningBalancer, http: aiohttp.ClientSession
) -> None:
    base = f"{balancer.url}/v1/issues/{ISSUE}/directive"
    doc, _ = await get_json(http, f"{base}?failed=origin-a")
    assert [o["name"] for o in doc["origins"]] == ["origin-b", "origin-c"]  # type: ignore[attr-defined]
    doc, _ = await get_json(http, f"{base}?failed=origin-a,origin-b")
    assert [o["name"] for o in doc["origins"]] == ["origin-c"]  # type: ignore[attr-defined]
    doc, resp = await get_json(http, f"{base}?failed=origin-a,origin-b&failed=origin-c", 503)
    assert resp.headers["Retry-After"] == "2"
    assert "could not use" in str(doc["error"])
    # what a resuming client tells of itself is taken beside failed= (docs/protocols.md)
    doc, _ = await get_json(http, f"{base}?failed=origin-a&have=10&size=100&rate=1e6&elapsed=3")
    assert [o["name"] for o in doc["origins"]] == ["origin-b", "origin-c"]  # type: ignore[attr-defined]


async def test_bad_requests_get_json_errors(
    balancer: RunningBalancer, http: aiohttp.ClientSession
) -> None:
    doc, _ = await get_json(http, f"{balancer.url}/v1/issues/not-here/directive", 404)
    assert "not-here" in str(doc["error"])
    for bad_issue in ("-leading-dash", "x" * 129, "a%20b", "a%2Fb", ".hidden"):
        doc, _ = await get_json(http, f"{balancer.url}/v1/issues/{bad_issue}/directive", 400)
        assert "invalid issue id" in str(doc["error"])
    for bad_failed in ("a,,b", "a%20b", ",", "a/b"):
        doc, _ = await get_json(
            http, f"{balancer.url}/v1/issues/{ISSUE}/directive?failed={bad_failed}", 400
        )
        assert "failed=" in str(doc["error"])
    for bad_hint in ("have=5", "have=9&size=4", "size=-1", "rate=nan", "rate=x"):
        doc, _ = await get_json(http, f"{balancer.url}/v1/issues/{ISSUE}/directive?{bad_hint}", 400)
        assert bad_hint.split("=")[0] + "=" in str(doc["error"])
    await get_json(http, f"{balancer.url}/v1/origins?issue=..", 400)
    await get_json(http, f"{balancer.url}/issues/not-here", 404)
    assert balancer.core.directives_answered == 0


async def test_redirect_to_the_picked_origin_reads_the_manifest_once(
    balancer: RunningBalancer, origins: list[FakeOrigin], http: aiohttp.ClientSession
) -> None:
    async def location() -> str:
        async with http.get(f"{balancer.url}/issues/{ISSUE}", allow_redirects=False) as resp:
            assert resp.status == 302
            return resp.headers["Location"]

    first = await location()
    assert first == f"{origins[0].url}/content/{ISSUE}/{FILE}"
    # concurrent and later requests reuse the cached file name
    locations = await asyncio.gather(*(location() for _ in range(10)))
    assert all(
        re.fullmatch(rf"http://127\.0\.0\.1:\d+/content/{ISSUE}/{FILE}", u) for u in locations
    )
    assert sum(o.manifest_fetches for o in origins) == 1
    assert balancer.core.directives_answered == 11


async def test_redirect_502_when_no_origin_has_a_manifest(
    balancer: RunningBalancer, origins: list[FakeOrigin], http: aiohttp.ClientSession
) -> None:
    # c holds daily-1 but serves no manifest for it
    doc, _ = await get_json(http, f"{balancer.url}/issues/daily-1", 502)
    assert "manifest" in str(doc["error"])


async def test_origins_view(
    balancer: RunningBalancer, origins: list[FakeOrigin], http: aiohttp.ClientSession
) -> None:
    doc, _ = await get_json(http, f"{balancer.url}/v1/origins?issue={ISSUE}")
    assert doc["algorithm"] == "alg2"
    listed = doc["origins"]
    assert isinstance(listed, list)
    assert [o["name"] for o in listed] == ["origin-a", "origin-b", "origin-c"]
    a = listed[0]
    assert a["url"] == origins[0].url
    assert a["state"] == "up"
    assert a["down_reason"] is None
    assert 0.0 <= a["last_status_age_s"] < 1.0
    assert a["status"]["cpu_percent"] == 0.0
    assert a["status"]["issues"] == [ISSUE]
    assert a["score"] == pytest.approx(2800.0)
    assert a["picks"] == 0
    algorithms, _ = await get_json(http, f"{balancer.url}/v1/algorithms")
    assert algorithms["current"] == "alg2"
    assert {"alg1", "alg2", "rr", "wrr", "lc", "wlc", "weighted"} <= {
        a["name"]
        for a in algorithms["algorithms"]  # type: ignore[attr-defined]
    }
    async with http.get(f"{balancer.url}/healthz") as resp:
        assert resp.status == 200 and await resp.text() == "ok"


async def test_metrics(balancer: RunningBalancer, http: aiohttp.ClientSession) -> None:
    await get_json(http, f"{balancer.url}/v1/issues/{ISSUE}/directive")
    await get_json(http, f"{balancer.url}/v1/issues/nope/directive", 404)
    async with http.get(f"{balancer.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'pressrun_balancer_directives_total{algorithm="alg2",mode="origin"} 1.0' in text
    assert 'pressrun_balancer_refusals_total{reason="unknown_issue"} 1.0' in text
    assert 'pressrun_balancer_origin_up{origin="origin-b"} 1.0' in text
    assert 'pressrun_balancer_picks_total{origin="origin-a"} 1.0' in text
    assert re.search(
        rf'pressrun_balancer_origin_score\{{issue="{ISSUE}",origin="origin-c"\}} 2500', text
    )
    assert 'pressrun_balancer_poll_seconds_count{outcome="ok"}' in text


async def test_stopped_origin_leaves_rotation_within_an_interval_and_comes_back(
    balancer: RunningBalancer,
    origins: list[FakeOrigin],
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pressrun.balancer.poller")
    a = origins[0]
    rec = balancer.core.origins["origin-a"]
    await a.stop()
    took = await wait_for(lambda: rec.state is OriginState.DOWN)
    # the next poll (at most one interval away) is refused at once
    assert took < INTERVAL_S + 0.5
    assert f"origin {a.url} did not answer /stats: " in caplog.text
    assert "it is out of rotation until it does" in caplog.text
    doc, _ = await get_json(http, f"{balancer.url}/v1/issues/{ISSUE}/directive")
    assert [o["name"] for o in doc["origins"]] == ["origin-b", "origin-c"]  # type: ignore[attr-defined]
    view, _ = await get_json(http, f"{balancer.url}/v1/origins")
    a_view = view["origins"][0]  # type: ignore[index]
    assert a_view["state"] == "down" and a_view["down_reason"]
    await a.start()  # same port
    await wait_for(lambda: rec.state is OriginState.UP)
    assert "origin origin-a" in caplog.text and "it is in rotation" in caplog.text
    doc, _ = await get_json(http, f"{balancer.url}/v1/issues/{ISSUE}/directive")
    assert doc["origins"][0]["name"] == "origin-a"  # type: ignore[index]


async def test_malformed_stats_takes_an_origin_out_with_the_field_named(
    balancer: RunningBalancer, origins: list[FakeOrigin]
) -> None:
    origins[1].stats["cpu_percent"] = "busy"
    rec = balancer.core.origins["origin-b"]
    await wait_for(lambda: rec.state is OriginState.DOWN)
    assert "malformed /stats: field 'cpu_percent'" in rec.down_reason
    origins[1].stats["cpu_percent"] = 10.0
    origins[2].stats_status = 500
    await wait_for(lambda: rec.state is OriginState.UP)
    rec_c = balancer.core.origins["origin-c"]
    await wait_for(lambda: rec_c.state is OriginState.DOWN)
    assert "HTTP 500" in rec_c.down_reason


async def test_a_hung_origin_times_out_before_its_next_poll() -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_get("/stats", hang)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    running = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("slow", f"http://127.0.0.1:{port}"),),
            balancer=BalancerConfig(poll_interval_s=INTERVAL_S, stale_after_s=1.0),
        )
    )
    try:
        rec = running.core.origins["slow"]
        await wait_for(lambda: rec.state is OriginState.DOWN)
        assert rec.down_reason == f"no answer within {0.8 * INTERVAL_S:g} s"
    finally:
        await running.stop()
        release.set()
        await runner.cleanup()


async def test_each_algorithm_answers_over_http(
    origins: list[FakeOrigin], http: aiohttp.ClientSession
) -> None:
    for name in ("alg1", "rr", "wrr", "lc", "wlc", "weighted"):
        running = await start(origins, algorithm=name)
        try:
            doc, _ = await get_json(http, f"{running.url}/v1/issues/{ISSUE}/directive")
            assert doc["algorithm"] == name
            assert len(doc["origins"]) == 3  # type: ignore[arg-type]
        finally:
            await running.stop()


# --- real origins (pressrun.origin) serving a published bundle ---------------------

REAL_NAMES = ("origin-a", "origin-b", "origin-c")


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, bytes]:
    """A content folder holding ISSUE as `pressrun publish` makes it; and its bytes."""
    source = tmp_path / FILE
    data = random.Random(47).randbytes(300_001)
    source.write_bytes(data)
    key, _ = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    publish(source, issue_id=ISSUE, title="Weekly 47", key_path=key, content_dir=content)
    return content, data


async def start_real_origin(content: Path, name: str, port: int = 0) -> RunningOrigin:
    return await start_origin(
        OriginConfig(content_dir=content, port=port, name=name, stats_interval_s=INTERVAL_S)
    )


@pytest.fixture
async def real_origins(published: tuple[Path, bytes]) -> AsyncIterator[list[RunningOrigin]]:
    content, _ = published
    started = [await start_real_origin(content, name) for name in REAL_NAMES]
    yield started
    for origin in started:
        await origin.stop()


@pytest.fixture
async def real_balancer(real_origins: list[RunningOrigin]) -> AsyncIterator[RunningBalancer]:
    config = BalancerServiceConfig(
        origins=tuple(OriginSpec(o.name, o.url) for o in real_origins),
        balancer=BalancerConfig(
            poll_interval_s=INTERVAL_S, stale_after_s=3.5 * INTERVAL_S, algorithm="alg2"
        ),
    )
    running = await start_balancer(config)
    await running.wait_until_up(3, timeout_s=5.0)
    yield running
    await running.stop()


async def test_real_origins_directive_and_failed(
    real_balancer: RunningBalancer,
    real_origins: list[RunningOrigin],
    http: aiohttp.ClientSession,
) -> None:
    base = f"{real_balancer.url}/v1/issues/{ISSUE}/directive"
    doc, _ = await get_json(http, base)
    urls = {o.name: o.url for o in real_origins}
    listed = doc["origins"]
    assert isinstance(listed, list)
    assert sorted(o["name"] for o in listed) == sorted(REAL_NAMES)
    assert all(o["url"] == urls[o["name"]] for o in listed)
    scores = [o["score"] for o in listed]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= score <= 3200.0 for score in scores)
    assert (doc["mode"], doc["algorithm"], doc["swarm"]) == ("origin", "alg2", None)
    first = listed[0]["name"]
    assert real_balancer.core.origins[first].picks == 1
    doc, _ = await get_json(http, f"{base}?failed={first}")
    assert first not in [o["name"] for o in doc["origins"]]  # type: ignore[attr-defined]
    assert len(doc["origins"]) == 2  # type: ignore[arg-type]
    await get_json(http, f"{base}?failed={','.join(REAL_NAMES)}", 503)
    await get_json(http, f"{real_balancer.url}/v1/issues/weekly-1999-01/directive", 404)


async def test_swarm_mode_once_demand_passes_the_threshold(
    real_origins: list[RunningOrigin], http: aiohttp.ClientSession
) -> None:
    tracker = "http://127.0.0.1:6969/announce"
    # each request adds 1/tau x typical = 3 estimated downloaders: the 4th request
    # (about 12) passes 10
    demand = DemandConfig(
        tau_s=10.0,
        typical_download_s=30.0,
        enter_downloaders=10.0,
        leave_downloaders=2.0,
        min_dwell_s=0.0,
    )
    config = BalancerServiceConfig(
        origins=tuple(OriginSpec(o.name, o.url) for o in real_origins),
        balancer=BalancerConfig(poll_interval_s=INTERVAL_S, stale_after_s=3.5 * INTERVAL_S),
        tracker_url=tracker,
        demand=demand,
    )
    running = await start_balancer(config)
    try:
        await running.wait_until_up(3, timeout_s=5.0)
        base = f"{running.url}/v1/issues/{ISSUE}/directive"
        modes = []
        for _ in range(3):
            doc, _ = await get_json(http, base)
            modes.append(doc["mode"])
            assert doc["fallbacks"] == []
            # once known, an origin directive names the swarm its copy is to seed
            assert doc["swarm"] is None or doc["swarm"]["tracker_url"] == tracker
        assert modes == ["origin"] * 3
        # the first request started reading the manifest: the swarm is known soon
        await wait_for(lambda: ISSUE in running.service.swarms)
        doc, _ = await get_json(http, base)
        assert doc["mode"] == "swarm"
        assert doc["fallbacks"] == ["origin"]
        swarm = doc["swarm"]
        assert isinstance(swarm, dict)
        assert swarm["tracker_url"] == tracker
        async with http.get(swarm["torrent_url"]) as resp:
            assert resp.status == 200
            torrent = await resp.read()
        assert torrent.startswith(b"d")
        origin_url = swarm["torrent_url"].split("/content/")[0]
        async with http.get(f"{origin_url}/content/{ISSUE}/manifest.json") as resp:
            manifest = (await resp.json())["manifest"]
        assert swarm["info_hash"] == manifest["info_hash"]
        assert isinstance(doc["origins"], list) and len(doc["origins"]) == 3
        # an issue whose manifest is unknown stays origin however high its demand
        for _ in range(6):
            await get_json(http, f"{running.url}/v1/issues/weekly-1999-01/directive", 404)
    finally:
        await running.stop()


async def test_real_origins_redirect_leads_to_the_published_file(
    real_balancer: RunningBalancer,
    published: tuple[Path, bytes],
    http: aiohttp.ClientSession,
) -> None:
    _, data = published
    async with http.get(f"{real_balancer.url}/issues/{ISSUE}", allow_redirects=False) as resp:
        assert resp.status == 302
        location = resp.headers["Location"]
    assert location.endswith(f"/content/{ISSUE}/{FILE}")
    async with http.get(location) as resp:
        assert resp.status == 200
        assert await resp.read() == data
    # and a client following redirects gets the same bytes
    async with http.get(f"{real_balancer.url}/issues/{ISSUE}") as resp:
        assert await resp.read() == data


async def test_real_origins_view_and_metrics(
    real_balancer: RunningBalancer, http: aiohttp.ClientSession
) -> None:
    doc, _ = await get_json(http, f"{real_balancer.url}/v1/origins?issue={ISSUE}")
    listed = doc["origins"]
    assert isinstance(listed, list)
    for view in listed:
        assert view["state"] == "up"
        status = view["status"]
        assert status["name"] == view["name"]  # the balancer's name for it
        assert status["issues"] == [ISSUE]
        assert 0.0 <= status["cpu_percent"] <= 100.0
        assert status["capacity_bytes_per_s"] == 125_000_000.0  # 1000 Mbit/s default
        assert 0.0 <= view["score"] <= 3200.0
        assert view["last_status_age_s"] < 1.0
    async with http.get(f"{real_balancer.url}/metrics") as resp:
        text = await resp.text()
    for name in REAL_NAMES:
        assert f'pressrun_balancer_origin_up{{origin="{name}"}} 1.0' in text


async def test_real_origin_stopped_leaves_rotation_and_returns_when_restarted(
    real_balancer: RunningBalancer,
    real_origins: list[RunningOrigin],
    published: tuple[Path, bytes],
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pressrun.balancer.poller")
    b = real_origins[1]
    rec = real_balancer.core.origins[b.name]
    await b.stop()
    took = await wait_for(lambda: rec.state is OriginState.DOWN)
    assert took < INTERVAL_S + 0.5
    assert f"origin {b.url} did not answer /stats" in caplog.text
    others = [real_balancer.core.origins[o.name] for o in real_origins if o is not b]
    for _ in range(5):
        # the others in rotation first: on a loaded host one of them can miss a /stats
        # poll's 0.16 s too, and with all down the answer is a 503, not a directive
        await wait_for(lambda: all(o.state is OriginState.UP for o in others))
        doc, _ = await get_json(http, f"{real_balancer.url}/v1/issues/{ISSUE}/directive")
        assert b.name not in [o["name"] for o in doc["origins"]]  # type: ignore[attr-defined]
    content, _ = published
    real_origins[1] = await start_real_origin(content, b.name, port=b.port)
    await wait_for(lambda: rec.state is OriginState.UP)
    doc, _ = await get_json(http, f"{real_balancer.url}/v1/issues/{ISSUE}/directive?failed=a")
    assert b.name in [o["name"] for o in doc["origins"]]  # type: ignore[attr-defined]


# --- the command line ----------------------------------------------------------------


def test_parse_origins() -> None:
    assert parse_origins("http://h:1,b=http://h:2/@5,http://h:3") == (
        OriginSpec("origin-a", "http://h:1", 1.0),
        OriginSpec("b", "http://h:2", 5.0),
        OriginSpec("origin-c", "http://h:3", 1.0),
    )
    assert default_origin_name(25) == "origin-z"
    assert default_origin_name(26) == "origin-aa"
    for bad, why in [
        ("http://h:1,,http://h:2", "empty entry"),
        ("a=ftp://h", "not an http"),
        ("a=http://h@x", "not a number"),
        ("a=http://h@-1", "0 or more"),
        ("a=http://h,a=http://g", "unique"),
        ("a b=http://h", "letters, digits"),
    ]:
        with pytest.raises(OriginListError, match=why):
            parse_origins(bad)


async def test_serve_balancer_command_runs_and_stops_on_sigterm(
    origins: list[FakeOrigin], http: aiohttp.ClientSession
) -> None:
    spec = ",".join(f"{o.name}={o.url}" for o in origins)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from pressrun.cli import main; sys.exit(main())",
        "serve",
        "balancer",
        "--origins",
        spec,
        "--port",
        "0",
        "--poll-interval-s",
        "0.2",
        "--algorithm",
        "wrr",
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        url = None
        while url is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
            assert line, "the balancer exited before listening"
            found = re.search(r"balancer listening on (http://\S+)", line)
            url = found.group(1) if found else None
        for _ in range(100):
            async with http.get(f"{url}/v1/issues/{ISSUE}/directive") as resp:
                if resp.status == 200:
                    assert (await resp.json())["algorithm"] == "wrr"
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no directive from the balancer process")
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


def test_serve_balancer_bad_flags_exit_2() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pressrun.cli import main; sys.exit(main())",
            "serve",
            "balancer",
            "--origins",
            "a=http://h@x",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "not a number" in result.stderr


async def test_an_oversized_stats_answer_is_malformed(
    origins: list[FakeOrigin], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pressrun.balancer import poller

    monkeypatch.setattr(poller, "MAX_STATS_BYTES", 100)  # a real /stats is ~400 bytes
    running = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("a", origins[0].url),),
            balancer=BalancerConfig(poll_interval_s=INTERVAL_S, stale_after_s=1.0),
        )
    )
    try:
        rec = running.core.origins["a"]
        await wait_for(lambda: rec.state is OriginState.DOWN)
        assert rec.down_reason.startswith("malformed /stats: ")
        assert "more than 100" in rec.down_reason
    finally:
        await running.stop()


async def test_access_log_only_when_asked(
    origins: list[FakeOrigin], http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    specs = tuple(OriginSpec(o.name, o.url) for o in origins)
    quiet = await start_balancer(BalancerServiceConfig(origins=specs))
    loud = await start_balancer(BalancerServiceConfig(origins=specs, access_log=True))
    try:
        async with http.get(f"{quiet.url}/healthz") as resp:
            assert resp.status == 200
        assert "GET /healthz" not in caplog.text
        async with http.get(f"{loud.url}/healthz") as resp:
            assert resp.status == 200
        await wait_for(lambda: "GET /healthz" in caplog.text)
    finally:
        await quiet.stop()
        await loud.stop()


def test_serve_balancer_swarm_thresholds_out_of_order_exit_2() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pressrun.cli import main; sys.exit(main())",
            "serve",
            "balancer",
            "--origins",
            "a=http://127.0.0.1:1",
            "--tracker",
            "http://127.0.0.1:1/announce",
            "--swarm-enter-downloaders",
            "3",
            "--swarm-leave-downloaders",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "leave_downloaders < enter_downloaders" in result.stderr
