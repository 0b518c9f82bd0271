"""Debian's Prometheus, run on this host against real pressrun services on 127.0.0.1
with the deployment's rules (deploy/prometheus/rules.yml): every target is up, and
PressrunOriginDown fires for an origin that is stopped, not for the others (issue 30).
The same check on the compose stack in containers is tests/emulate/
test_compose_prometheus.py (it needs a container engine)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from balancer.test_service import REAL_NAMES, start_real_origin
from pressrun.balancer.aio import BalancerServiceConfig, RunningBalancer, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.events import OriginSpec
from pressrun.balancer.health import HealthConfig
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish
from pressrun.origin import RunningOrigin

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (scripts/setup-system.sh installs Debian's)",
)


Services = tuple[list[RunningOrigin], list[RunningBalancer]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def services(
    tmp_path: Path,
) -> AsyncIterator[tuple[list[RunningOrigin], list[RunningBalancer]]]:
    source = tmp_path / "weekly-47.pdf"
    source.write_bytes(b"x" * 100_000)
    key, _ = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    publish(source, issue_id="weekly-47", title="W", key_path=key, content_dir=content)
    origins = [await start_real_origin(content, name) for name in REAL_NAMES]
    balancers = []
    for _ in range(2):
        running = await start_balancer(
            BalancerServiceConfig(
                origins=tuple(OriginSpec(o.name, o.url) for o in origins),
                balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=1.0),
                health=HealthConfig(rise=2, fall=3, slowstart_s=0.0),
            )
        )
        await running.wait_until_up(3, timeout_s=5.0)
        balancers.append(running)
    yield origins, balancers
    for b in balancers:
        await b.stop()
    for o in origins:
        await o.stop()


def api(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=2) as resp:
        return json.load(resp)["data"]


async def wait(what: str, check: Any, timeout_s: float) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    while loop.time() < deadline:
        try:
            last = await asyncio.to_thread(check)
            if last:
                return last
        except OSError as err:
            last = err
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout_s:g} s (last: {last})")


async def test_prometheus_scrapes_the_services_and_alerts_on_a_stopped_origin(
    services: Services, tmp_path: Path
) -> None:
    origins, balancers = services
    hostport = lambda url: url.split("://", 1)[1]  # noqa: E731
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "origin",
             "static_configs": [{"targets": [hostport(o.url) for o in origins]}]},
            {"job_name": "balancer",
             "static_configs": [{"targets": [hostport(b.url) for b in balancers]}]},
        ],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def all_up() -> bool:
            targets = api(base, "/api/v1/targets")["activeTargets"]
            return len(targets) == 5 and all(t["health"] == "up" for t in targets)

        await wait("every target up", all_up, 30)
        stopped = origins[1]
        await stopped.stop()
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        def firing() -> list[dict[str, Any]]:
            return [
                a for a in api(base, "/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == "PressrunOriginDown" and a["state"] == "firing"
            ]  # fmt: skip

        alerts = await wait("PressrunOriginDown firing", firing, 40)
        print(f"PressrunOriginDown fired {loop.time() - t0:.1f} s after the origin stopped")
        assert [a["labels"]["origin"] for a in alerts] == [stopped.name]
        up = api(base, "/api/v1/query?query=up")["result"]
        down = [r["metric"]["instance"] for r in up if r["value"][1] == "0"]
        assert down == [hostport(stopped.url)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
