"""Readers behind an AMT relay in the emulation (issue 34's last point).

A scenario's ``[amt_readers]`` run ``pressrun get`` on a network of their own: a second
bridge of the engine, with no multicast route to the project's network (the sender's
island: the host routes no multicast between bridges, it runs no multicast router).
Unicast is routed between the two bridges by the host (IPv4 forwarding on those two
bridges only, `enable_forwarding`; the engine runs without NAT), so the readers reach
the balancers, origins, trackers and peers at their addresses on the island, by the
names docker-compose.yml gives them (`host_entries`, written into each reader's
/etc/hosts: the island's DNS as the readers see it). The carousel reaches them through
``pressrun serve amt-relay``, a service on the island the balancers name in their
multicast directives (`compose_override`).

A relay carries source-specific channels only, so with AMT readers the carousel's
control group and channels are in 232/8 (`SSM_ENV`, unless the scenario sets its own)
and the sender's address is fixed (`island_addresses`): the balancers tell clients the
source (``--multicast-source``), the sender sends from it (``--interface``).

`multicast_path` tells from a client's ``multicast_note`` whether its carousel bytes
came natively or through the relay, for the report's per-kind split.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pressrun.emulate.engine import DockerCommandError, Engine
from pressrun.emulate.project import ComposeProject, EmulationError

log = logging.getLogger(__name__)

#: the relay's service in the generated override, and its port (RFC 7450's)
RELAY_SERVICE = "amt-relay"
RELAY_PORT = 2268
#: the AMT readers' network, ``<project>_amt`` (made by the run, labelled as compose's)
AMT_NETWORK = "amt"
#: the carousel's groups with AMT readers when the scenario names none: source-specific
SSM_ENV = {
    "PRESSRUN_MULTICAST_CONTROL_GROUP": "232.1.70.1:5400",
    "PRESSRUN_MULTICAST_GROUP_BASE": "232.1.71.1",
}
#: the last host numbers of the island's /24, fixed for the sender and the relay (the
#: engine hands out dynamic addresses from the bottom: a flash crowd's 200 containers
#: stay under them)
SENDER_HOST, RELAY_HOST = 251, 250
#: the services an AMT reader reaches by name (its /etc/hosts), when they run
ISLAND_SERVICES = (
    "balancer", "balancer-2", "origin-a", "origin-b", "origin-c", "tracker-1", "tracker-2",
    "supernode-1", "supernode-2", "multicast", "turn", "reader", "subscriptions", RELAY_SERVICE,
)  # fmt: skip
#: ``pressrun get``'s note after a carousel through a relay delivered the issue
RELAY_MARK = "through the AMT relay"


def island_addresses(subnet: str) -> tuple[str, str]:
    """(the sender's, the relay's) fixed addresses on the island's ``subnet``."""
    net = ipaddress.IPv4Network(subnet)
    if net.num_addresses < 256:
        raise ValueError(f"{subnet}: the island needs a /24 or larger")
    return str(net[SENDER_HOST]), str(net[RELAY_HOST])


def compose_override(compose_doc: Mapping[str, Any], subnet: str) -> dict[str, Any]:
    """The compose override of a run with AMT readers, from docker-compose.yml's own
    services (``compose_doc``, as `yaml.safe_load` reads it: anchors merged): the sender
    on its fixed address sending from it, both balancers naming the source and the
    relay, and the relay service on its fixed address (the sender's image and
    settings). Compose interpolates the ``${...}`` of the copied commands as in the
    file itself."""
    services = compose_doc["services"]
    sender_ip, relay_ip = island_addresses(subnet)
    sender = services["multicast"]
    command = list(sender["command"])
    if "--interface" not in command:
        raise ValueError("docker-compose.yml's multicast service has no --interface")
    command[command.index("--interface") + 1] = sender_ip
    override: dict[str, Any] = {
        "multicast": {"command": command, "networks": {"default": {"ipv4_address": sender_ip}}}
    }
    for name in ("balancer", "balancer-2"):
        override[name] = {
            "command": [
                *services[name]["command"],
                "--multicast-source", sender_ip,
                "--amt-relay", f"{relay_ip}:{RELAY_PORT}",
            ]
        }  # fmt: skip
    relay: dict[str, Any] = {
        key: sender[key] for key in ("image", "cap_add", "init", "restart", "cpu_shares")
        if key in sender
    }  # fmt: skip
    relay["command"] = [
        "pressrun", "serve", "amt-relay", "--listen", f"0.0.0.0:{RELAY_PORT}",
        "--interface", relay_ip, "--relay-address", relay_ip,
    ]  # fmt: skip
    relay["networks"] = {"default": {"ipv4_address": relay_ip}}
    relay["depends_on"] = {"multicast": {"condition": "service_healthy"}}
    override[RELAY_SERVICE] = relay
    return {"services": override}


def write_override(compose_file: Path, subnet: str, out: Path) -> Path:
    """`compose_override` of ``compose_file`` for ``subnet``, written to ``out`` (JSON,
    which is YAML)."""
    import json

    import yaml

    doc = yaml.safe_load(compose_file.read_text())
    out.write_text(json.dumps(compose_override(doc, subnet), indent=1) + "\n")
    return out


def host_entries(addresses: Mapping[str, str]) -> list[str]:
    """``--add-host NAME:ADDR`` arguments for an AMT reader's container: the island's
    services by the names the balancers' directives and the web seeds use."""
    args: list[str] = []
    for name in ISLAND_SERVICES:
        if addresses.get(name):
            args += ["--add-host", f"{name}:{addresses[name]}"]
    return args


def forwarding_paths(bridges: Iterable[str]) -> list[Path]:
    """The sysctl files that turn on IPv4 forwarding of what arrives on each bridge."""
    return [Path("/proc/sys/net/ipv4/conf") / bridge / "forwarding" for bridge in bridges]


def enable_forwarding(bridges: Iterable[str]) -> None:
    """Route unicast between the run's bridges: forwarding on for packets that arrive
    on them, and on no other interface of the host (the bridges go with the run's
    teardown, their settings with them). Multicast stays unrouted (no multicast router
    runs), which is the point."""
    for path in forwarding_paths(bridges):
        path.write_text("1\n")


def multicast_path(row: Mapping[str, Any]) -> str | None:
    """Where a client's carousel bytes came from: ``relay`` (its note names the AMT
    relay), ``native``, ``unattributed`` (carousel bytes without a note: a carousel that
    did not finish the issue), or None without carousel bytes."""
    if not int(row.get("bytes_from_multicast") or 0):
        return None
    note = row.get("multicast_note")
    if not note:
        return "unattributed"
    return "relay" if RELAY_MARK in str(note) else "native"


def amt_network(engine: Engine, project: ComposeProject, subnet: str) -> list[str]:
    """The AMT readers' network (labelled as the project's, so the teardown removes
    it), unicast routed to and from the island; the ``--add-host`` arguments that name
    the island's services for a reader on it."""
    network = project.network_named(AMT_NETWORK)
    engine.docker(
        "network", "create", "--driver", "bridge", "--subnet", subnet,
        "--label", f"com.docker.compose.project={project.name}",
        "--label", f"com.docker.compose.network={AMT_NETWORK}", network,
    )  # fmt: skip
    try:
        enable_forwarding([project.bridge(project.network), project.bridge(network)])
    except OSError as err:
        raise EmulationError(f"cannot route between the island and the AMT readers: {err}") from err
    addresses: dict[str, str] = {}
    for service in ISLAND_SERVICES:
        try:
            addresses[service] = project.address(service)
        except (EmulationError, DockerCommandError):
            continue  # not in this run (balancer-2 in the one-balancer twin)
    return host_entries(addresses)
