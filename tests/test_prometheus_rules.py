"""The deployment's Prometheus files (deploy/prometheus/): ``promtool check rules``
passes on the rules, ``promtool test rules`` fires each alert on the series that should
fire it and not on healthy ones, and every service of docker-compose.yml that has a
/metrics endpoint is a scrape target (issue 30)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (scripts/setup-system.sh installs Debian's prometheus)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=60, check=False, cwd=PROM
    )


@needs_promtool
def test_promtool_check_rules_passes() -> None:
    done = promtool("check", "rules", "rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 12 rules found" in done.stdout + done.stderr


@needs_promtool
def test_promtool_test_rules_fires_each_alert_where_it_should() -> None:
    done = promtool("test", "rules", "rules_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


@needs_promtool
def test_promtool_check_config_passes() -> None:
    # --syntax-only: the rule file's path is the container's (/etc/pressrun/prometheus)
    done = promtool("check", "config", "--syntax-only", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROM / "rules_test.yml").read_text())
    tested = {case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", [])}
    assert alerts == tested


def test_every_service_with_metrics_is_scraped() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {
        t.split(":")[0]
        for job in config["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    # the services with /metrics (the supernodes, redis, coturn and the clients have none)
    without = {"redis", "supernode-1", "supernode-2", "client", "prometheus", "turn"}
    assert set(compose["services"]) - without <= targets
    assert config["rule_files"] == ["/etc/pressrun/prometheus/rules.yml"]
    prometheus = compose["services"]["prometheus"]
    mount = "${PRESSRUN_PROMETHEUS_CONFIG_DIR:-./deploy/prometheus}:/etc/pressrun/prometheus:ro"
    assert mount in prometheus["volumes"]
