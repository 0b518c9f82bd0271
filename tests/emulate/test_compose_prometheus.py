"""The monitored deployment end to end (issue 30): docker-compose.yml's services up on
a container engine, with both balancers and Prometheus; every service's scrape target
is up, and PressrunOriginDown fires when an origin is stopped. Runs where a container
engine can start (root, docker.io installed) and skips with the reason otherwise; the
images are built offline as for the emulation (`pressrun.emulate.images`)."""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pressrun.emulate.cli import cache_dir, project_root
from pressrun.emulate.engine import Engine, engine_session, why_no_engine
from pressrun.emulate.images import build_images
from pressrun.emulate.issue import publish_issue
from pressrun.emulate.project import ComposeProject, free_subnet, teardown

pytestmark = [pytest.mark.slow, pytest.mark.root]

JOBS = {"origin", "balancer", "tracker", "multicast", "subscriptions", "reader", "prometheus"}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    given = os.environ.get("DOCKER_HOST")
    if given:
        yield Engine(given)
        return
    reason = why_no_engine()
    if reason is not None:
        pytest.skip(f"no container engine can start here: {reason}")
    with engine_session(cache_dir(project_root())) as started:
        yield started


def api(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=5) as resp:
        return json.load(resp)["data"]


def wait(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as err:
            last = err
        time.sleep(1.0)
    raise AssertionError(f"{what} not within {timeout_s:g} s (last: {last})")


def test_prometheus_scrapes_every_service_and_alerts_on_a_stopped_origin(
    engine: Engine, tmp_path: Path
) -> None:
    root = project_root()
    built = build_images(engine, cache_dir=cache_dir(root), project_root=root, report=print)
    issue = publish_issue(tmp_path, 1.0, 30)
    ports = ("ORIGIN_A", "ORIGIN_B", "ORIGIN_C", "TRACKER_1", "TRACKER_2", "BALANCER",
             "BALANCER_2", "MULTICAST", "SUBSCRIPTIONS", "READER", "PROMETHEUS",
             "TURN", "TURN_RELAY")  # fmt: skip
    env = {
        "PRESSRUN_IMAGE": built.image,
        "PRESSRUN_SUBNET": free_subnet(engine),
        "PRESSRUN_CONTENT": str(issue.content_dir.resolve()),
        "PRESSRUN_ISSUE": issue.issue_id,
        "PRESSRUN_PUBLISHER_KEY": issue.public_key_hex,
        "PRESSRUN_PUBLISHER_KEY_FILE": str(issue.key_file.resolve()),
        "PRESSRUN_PUBLISHER_PUB_FILE": str(issue.key_file.resolve()) + ".pub",
        "PRESSRUN_MULTICAST_TOKEN": secrets.token_hex(16),
        "PRESSRUN_OPERATOR_TOKEN": secrets.token_hex(16),
        "PRESSRUN_SUBSCRIPTIONS_TOKEN": secrets.token_hex(16),
        "PRESSRUN_RESTART": "no",
        "PRESSRUN_REDIS_SAVE": "",
        **{f"PRESSRUN_{p}_PUBLISH": "127.0.0.1:" for p in ports},
    }
    project = ComposeProject(engine, root / "docker-compose.yml", "pressrun-prom-test", env)
    try:
        project.compose("up", "-d", "--no-build", timeout_s=600)
        prom = f"http://{project.address('prometheus')}:9090"

        not_up: dict[str, str] = {}  # the last look: each target not up and why

        def all_up() -> dict[str, str] | None:
            targets = api(prom, "/api/v1/targets")["activeTargets"]
            health = {t["labels"]["instance"]: t["health"] for t in targets}
            jobs = {t["labels"]["job"] for t in targets}
            not_up.clear()
            not_up.update(
                {t["labels"]["instance"]: t.get("lastError") or t["health"]
                 for t in targets if t["health"] != "up"}
            )  # fmt: skip
            return health if jobs == JOBS and set(health.values()) == {"up"} else None

        try:
            health = wait("every target up", all_up, 180)
        except AssertionError as err:
            raise AssertionError(f"{err}; not up: {not_up}") from None
        print("targets:", health)
        assert len(health) == 11  # 3 origins, 2 balancers, 2 trackers, 4 others
        started = time.monotonic()
        project.compose("stop", "origin-c", timeout_s=120)

        def origin_down_firing() -> list[dict[str, Any]]:
            alerts = api(prom, "/api/v1/alerts")["alerts"]
            return [
                a
                for a in alerts
                if a["labels"]["alertname"] == "PressrunOriginDown"
                and a["labels"].get("origin") == "origin-c"
                and a["state"] == "firing"
            ]

        firing = wait("PressrunOriginDown firing for origin-c", origin_down_firing, 120)
        print(f"PressrunOriginDown fired {time.monotonic() - started:.1f} s after the stop")
        assert firing[0]["labels"]["severity"] == "page"
        # the other origins stay up: no alert for them
        alerts = api(prom, "/api/v1/alerts")["alerts"]
        assert not [
            a for a in alerts
            if a["labels"]["alertname"] == "PressrunOriginDown"
            and a["labels"].get("origin") != "origin-c"
        ]  # fmt: skip
    finally:
        teardown(engine, project, tmp_path / "services.log")
