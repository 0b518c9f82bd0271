"""docker-compose.yml stays valid: `docker-compose config` accepts it, with the
defaults and with the emulation's settings, and every pressrun command in it parses
with today's CLI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pressrun.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (make setup installs it)",
)


def _config(env: dict[str, str] | None = None) -> dict[str, Any]:
    """`docker-compose config` of the file: interpolated, validated, as YAML."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PRESSRUN_")}
    done = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = yaml.safe_load(done.stdout)
    return doc


@needs_compose
def test_compose_config_validates_with_the_defaults() -> None:
    doc = _config()
    services = doc["services"]
    assert {"origin-a", "origin-b", "origin-c", "balancer", "tracker-1", "tracker-2",
            "redis", "multicast", "client"} <= set(services)  # fmt: skip
    for name, service in services.items():
        assert "build" not in service, f"{name}: images are built offline, not by compose"
        assert service["image"] == "pressrun:latest"
        if name != "client":
            assert "healthcheck" in service, f"{name} has no healthcheck"
    # a real deployment: no link shaping, the balancer with both trackers
    for service in services.values():
        for key, value in (service.get("environment") or {}).items():
            if key.startswith("PRESSRUN_LINK_"):
                assert value in ("", None), f"{key} is set by default"
    balancer = services["balancer"]["command"]
    assert "--tracker=http://tracker-1:6969/announce,http://tracker-2:6969/announce" in balancer
    assert "--multicast-sender=http://multicast:8090" in balancer
    subnet = doc["networks"]["default"]["ipam"]["config"][0]["subnet"]
    assert subnet.startswith("198.18.")


@needs_compose
def test_compose_config_takes_every_setting_from_the_environment() -> None:
    doc = _config(
        {
            "PRESSRUN_ORIGIN_C_LINK_RATE": "100mbit",
            "PRESSRUN_ORIGIN_C_CAPACITY_MBPS": "90",
            "PRESSRUN_SWARM_TRACKERS": "",
            "PRESSRUN_MULTICAST_SENDER": "",
            "PRESSRUN_SUBNET": "198.18.99.0/24",
            "PRESSRUN_BALANCER_PUBLISH": "127.0.0.1:",
            "PRESSRUN_IMAGE": "pressrun:test",
        }
    )
    services = doc["services"]
    assert services["origin-c"]["environment"]["PRESSRUN_LINK_RATE"] == "100mbit"
    assert "90" in services["origin-c"]["command"]
    # swarm and multicast off: origin mode only
    assert "--tracker=" in services["balancer"]["command"]
    assert "--multicast-sender=" in services["balancer"]["command"]
    assert services["balancer"]["ports"] == ["127.0.0.1::8080/tcp"]
    assert doc["networks"]["default"]["ipam"]["config"][0]["subnet"] == "198.18.99.0/24"
    assert {s["image"] for s in services.values()} == {"pressrun:test"}


def test_every_pressrun_command_parses() -> None:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = [s["command"] for s in data["services"].values() if s["command"][0] == "pressrun"]
    assert len(commands) >= 7
    parser = build_parser()
    for command in commands:
        # compose's ${VAR:-default} as the default value
        args = [_default(str(part)) for part in command[1:]]
        parsed = parser.parse_args(args)
        assert callable(parsed.func)


def _default(text: str) -> str:
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", text)


@needs_compose
def test_turn_service_runs_the_deployment_coturn_file_and_the_reader_names_it() -> None:
    doc = _config({"PRESSRUN_TURN_PASSWORD": "s3cret-turn", "PRESSRUN_TURN_HOST": "news.example"})
    services = doc["services"]
    turn = services["turn"]
    command = turn["command"]
    assert command[:3] == ["turnserver", "-c", "/etc/pressrun/coturn/turnserver.conf"]
    # the file coturn reads is deploy/coturn/turnserver.conf (tests/test_turn.py runs it)
    mounts = {v.split(":")[1]: Path(v.split(":")[0]) for v in _volumes(turn)}
    assert (mounts["/etc/pressrun/coturn"] / "turnserver.conf").is_file()
    assert mounts["/etc/pressrun/coturn"].resolve() == (ROOT / "deploy" / "coturn").resolve()
    assert "--user=reader:s3cret-turn" in command
    # the relay range coturn allocates from is the range published, one to one
    first = int(command[command.index("--min-port") + 1])
    last = int(command[command.index("--max-port") + 1])
    relayed = {p["target"] for p in turn["ports"] if p["protocol"] == "udp"} - {3478}
    assert relayed == set(range(first, last + 1))
    assert {(p["target"], p["protocol"]) for p in turn["ports"]} >= {(3478, "udp"), (3478, "tcp")}
    # the reader hands the browsers that server and that user (as they reach it)
    reader_env = services["reader"]["environment"]
    assert reader_env["PRESSRUN_READER_ICE_SERVERS"].split(",") == [
        "stun:news.example:3478",
        "turn:news.example:3478",
    ]
    assert reader_env["PRESSRUN_READER_TURN_USER"] == "reader"
    assert reader_env["PRESSRUN_READER_TURN_PASSWORD"] == "s3cret-turn"
    # desktop clients' WebRTC (libtorrent's WebTorrent) uses it for STUN, by its name
    assert services["client"]["environment"]["PRESSRUN_STUN"] == "turn:3478"


def _volumes(service: dict[str, Any]) -> list[str]:
    """A service's bind mounts as ``SOURCE:TARGET`` (compose 1.29 writes them as text)."""
    out: list[str] = []
    for v in service.get("volumes", []):
        out.append(v if isinstance(v, str) else f"{v['source']}:{v['target']}")
    return out


@needs_compose
def test_the_reader_as_compose_starts_it_hands_browsers_the_turn_server(tmp_path: Path) -> None:
    """`pressrun serve reader` with the compose file's command and environment (its port
    and key file aside) serves a config.json naming the turn service and its user."""
    import json
    import sys
    import urllib.request

    from pressrun.content.keys import generate_keypair

    _, pub = generate_keypair(tmp_path / "publisher.key")
    doc = _config({"PRESSRUN_TURN_PASSWORD": "s3cret-turn", "PRESSRUN_TURN_HOST": "news.example"})
    reader = doc["services"]["reader"]
    args = [str(a) for a in reader["command"][1:]]
    args[args.index("--port") + 1] = "0"
    args[args.index("--host") + 1] = "127.0.0.1"
    args = [f"--publisher-key={pub}" if a.startswith("--publisher-key=") else a for a in args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PRESSRUN_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "--log-level", "INFO", *args],
        env={**clean, **{k: str(v) for k, v in reader["environment"].items()}},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            found = re.search(r" on (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url is not None, "the reader exited before listening"
        with urllib.request.urlopen(f"{url}/config.json", timeout=10) as resp:
            config = json.load(resp)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert config["swarm"]["ice_servers"] == [
        {"urls": "stun:news.example:3478"},
        {"urls": "turn:news.example:3478", "username": "reader", "credential": "s3cret-turn"},
    ]
