"""docker-compose.yml stays valid: every service command parses with today's CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pressrun.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _services() -> dict[str, dict[str, object]]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services: dict[str, dict[str, object]] = data["services"]
    return services


def test_compose_has_the_topology() -> None:
    services = _services()
    assert {"origin-a", "origin-b", "origin-c", "balancer", "tracker", "redis"} <= set(services)


@pytest.mark.parametrize("name", [n for n, s in _services().items() if "build" in s])
def test_every_pressrun_service_command_parses(name: str) -> None:
    command = _services()[name]["command"]
    assert isinstance(command, list)
    args = build_parser().parse_args([str(part) for part in command])
    assert args.command == "serve"
    assert callable(args.func)
