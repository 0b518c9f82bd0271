"""docker-compose.yml's project on an engine: its services and ports, its network
(a free /24 of the benchmarking range, its bridge the multicast querier), docker commands
from the event loop, and the teardown that removes everything a run started."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from pressrun.emulate.engine import DockerCommandError, Engine, end_orphan_shims

log = logging.getLogger(__name__)

ISSUE_ID = "flash-2026-47"
ORIGINS = {"origin-a": 8001, "origin-b": 8002, "origin-c": 8003}
TRACKERS = {"tracker-1": 6969, "tracker-2": 6969}
#: a run's compose projects are named PREFIX<pid>-<variant> (`project_name`)
PROJECT_PREFIX = "pressrun-emu-"
SUPERNODES = ("supernode-1", "supernode-2")
#: the supernodes' port on the project's network (docker-compose.yml)
SUPERNODE_PORT = 7000
BALANCER_PORT = 8080
SENDER_PORT = 8090


class EmulationError(RuntimeError):
    """The emulation could not run to its end; the message says where it stopped."""


def free_subnet(engine: Engine, avoid: Sequence[str] = ()) -> str:
    """A /24 in 198.18.0.0/16 that no host interface and no engine network uses, nor
    any of ``avoid`` (subnets picked for networks not made yet)."""
    used: list[ipaddress.IPv4Network] = [ipaddress.IPv4Network(a) for a in avoid]
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            used.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    ids = engine.docker("network", "ls", "-q").split()
    if ids:
        doc = json.loads(engine.docker("network", "inspect", *ids))
        for net in doc:
            for cfg in (net.get("IPAM") or {}).get("Config") or []:
                with contextlib.suppress(ValueError, KeyError):
                    used.append(ipaddress.IPv4Network(cfg["Subnet"]))
    for third in range(20, 250):
        candidate = ipaddress.IPv4Network(f"198.18.{third}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return str(candidate)
    raise EmulationError("no free /24 left in 198.18.0.0/16 for the emulation's network")


class ComposeProject:
    """docker-compose.yml as one project on an engine."""

    def __init__(
        self,
        engine: Engine,
        compose_file: Path,
        name: str,
        env: Mapping[str, str],
        overrides: Sequence[Path] = (),
    ) -> None:
        self.engine = engine
        self.compose_file = compose_file
        self.name = name
        self.env = {**engine.env, **env}
        #: compose files merged over ``compose_file`` (`pressrun.emulate.amt`)
        self.overrides = tuple(overrides)

    def compose(self, *args: str, timeout_s: float = 600.0, check: bool = True) -> str:
        """``docker-compose -p NAME -f FILE [-f OVERRIDE...] ARGS``; its stdout."""
        files = [arg for f in (self.compose_file, *self.overrides) for arg in ("-f", str(f))]
        done = Engine(self.engine.host, env=self.env).run(
            ["docker-compose", "-p", self.name, *files, *args],
            timeout_s=timeout_s,
            check=check,
            cwd=self.compose_file.parent,
        )
        return done.stdout

    def container(self, service: str) -> str:
        """The container name compose 1.29 gives a service's first replica."""
        return f"{self.name}_{service}_1"

    @property
    def network(self) -> str:
        """The project's default network."""
        return f"{self.name}_default"

    def network_named(self, suffix: str) -> str:
        """A network of the project besides its default (``<project>_<suffix>``)."""
        return f"{self.name}_{suffix}"

    def bridge(self, network: str) -> str:
        """The host's bridge device of one of the engine's networks."""
        net_id = self.engine.docker("network", "inspect", "--format", "{{.Id}}", network).strip()
        return f"br-{net_id[:12]}"

    def address(self, service: str) -> str:
        """A service's address on the project's network."""
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        ip = self.engine.docker("inspect", "--format", fmt, self.container(service)).strip()
        if not ip:
            raise EmulationError(f"{service} has no address on {self.network}")
        return ip


async def docker_async(engine: Engine, *args: str, timeout_s: float = 300.0) -> str:
    """``docker ARGS`` as a child process of the event loop (no thread: a hundred may
    run at once); its stdout, or `DockerCommandError`."""
    proc = await asyncio.create_subprocess_exec(
        "docker",
        *args,
        env=engine.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise DockerCommandError(f"docker {args[0]} did not finish in {timeout_s:g} s") from None
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise DockerCommandError(
            f"docker {args[0]} failed (exit {proc.returncode}): " + " | ".join(lines[-3:])
        )
    return out.decode(errors="replace")


#: the bridge's query response interval, set with the querier (centiseconds: the
#: kernel's default, 10 s). For that long after a Linux bridge becomes the querier it
#: does not count one as present (its other-querier delay timer, armed by
#: ``mcast_querier 1``) and floods every multicast group to every port, joined or not
QUERY_RESPONSE_CS = 1000
#: how long after `bridge_querier` the bridge forwards a group only to the ports that
#: joined it: the first client starts no sooner (`pressrun.emulate.run`). The small
#: scenario's carousel starts 8-9 s after its first client; with the querier set just
#: before that client, its first 1-2 s of 16 Mbit/s went to every client's link (a
#: port that joined nothing received the group for 9 s after the querier went on, on a
#: bridge of namespaces: tests/emulate/test_bridge_querier.py), and the swarm clients
#: downloading then took 2.1-3.5x the origin client's time (issue 29)
QUERIER_SETTLE_S = QUERY_RESPONSE_CS / 100


def bridge_querier(engine: Engine, project: ComposeProject) -> None:
    """Make the project's bridge the IGMP querier, so it forwards each multicast group
    only to the ports that joined it instead of flooding every client's access link
    (FIELD-NOTES.md, "Network namespaces"), from `QUERIER_SETTLE_S` on. The bridge is
    the emulation's own."""
    make_querier(project.bridge(project.network))


def make_querier(bridge: str, *, netns: str | None = None) -> None:
    """Make ``bridge`` (in the network namespace ``netns``; None: the host's) the IGMP
    querier with snooping on and a `QUERY_RESPONSE_CS` response interval; a failure is
    logged, not raised (the run goes on, its links flooded)."""
    where = ["ip", "-n", netns] if netns else ["ip"]
    done = subprocess.run(
        [
            *where,
            "link",
            "set",
            "dev",
            bridge,
            "type",
            "bridge",
            "mcast_snooping",
            "1",
            "mcast_querier",
            "1",
            "mcast_query_use_ifaddr",
            "1",
            "mcast_query_response_interval",
            str(QUERY_RESPONSE_CS),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        log.warning("could not make %s the multicast querier: %s", bridge, done.stderr.strip())


def teardown(engine: Engine, project: ComposeProject, log_path: Path) -> dict[str, float]:
    """Save the services' logs to ``log_path``, then remove every container, network
    and volume of the project (by its labels: also what a run killed before its
    teardown left), and end the shims of the engine's containers that are gone; the
    seconds each step took."""
    import time

    took: dict[str, float] = {}
    mark = time.perf_counter()
    try:
        log_path.write_text(service_logs(engine, project.name))
    except OSError as err:
        log.warning("could not save the services' logs: %s", err)
    took["logs"] = time.perf_counter() - mark
    # every container of the run at once (clients and services), then the network and
    # the volumes (what `docker-compose down -v` removes, without its slow start)
    mark = time.perf_counter()
    _remove_containers(engine, project.name)
    took["containers"] = time.perf_counter() - mark
    mark = time.perf_counter()
    _remove_networks_and_volumes(engine, project.name)
    took["network"] = time.perf_counter() - mark
    # the shims docker dropped while removing them under load (`end_orphan_shims`)
    mark = time.perf_counter()
    ended = end_orphan_shims(engine)
    if ended:
        log.info("ended %d shim(s) of containers removed from the engine", len(ended))
    took["shims"] = time.perf_counter() - mark
    return took


def service_logs(engine: Engine, name: str) -> str:
    """Every service container's log of project ``name``, read side by side (``docker
    logs -t``), each line prefixed with its service as ``docker-compose logs`` does."""
    from concurrent.futures import ThreadPoolExecutor

    fmt = '{{.Label "com.docker.compose.service"}} {{.ID}}'
    listed = engine.docker(
        "ps", "-a", "--filter", f"label=com.docker.compose.project={name}", "--format", fmt,
        check=False,
    )  # fmt: skip
    containers = sorted(tuple(line.split()) for line in listed.splitlines() if line.count(" ") == 1)

    def read(service: str, container: str) -> str:
        try:
            done = engine.run(["docker", "logs", "-t", container], check=False, timeout_s=120)
        except DockerCommandError as err:
            return f"{service} | (its log could not be read: {err})\n"
        # its stdout and stderr, in the order of their timestamps (RFC 3339, first)
        lines = sorted((done.stdout + done.stderr).splitlines(), key=lambda ln: ln[:35])
        return "".join(f"{service} | {line}\n" for line in lines)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return "".join(pool.map(lambda c: read(*c), containers))


def _remove_containers(engine: Engine, name: str) -> None:
    """Every container of project ``name``: its services and its clients."""
    ids: list[str] = []
    for label in (f"pressrun.emulate.project={name}", f"com.docker.compose.project={name}"):
        ids += engine.docker("ps", "-aq", "--filter", f"label={label}", check=False).split()
    if ids:
        done = engine.run(["docker", "rm", "-f", "-v", *ids], check=False, timeout_s=300)
        _warn_failed(done, f"some containers of {name} stay")


def _remove_networks_and_volumes(engine: Engine, name: str) -> None:
    """What compose left of project ``name`` (a down that timed out, endpoints of
    killed containers, a run that never got to its teardown)."""
    label = f"label=com.docker.compose.project={name}"
    for net in engine.docker("network", "ls", "-q", "--filter", label, check=False).split():
        fmt = "{{range .Containers}}{{.Name}} {{end}}"
        for member in engine.docker("network", "inspect", "-f", fmt, net, check=False).split():
            engine.run(["docker", "network", "disconnect", "-f", net, member], check=False)
        done = engine.run(["docker", "network", "rm", net], check=False)
        _warn_failed(done, f"a network of {name} stays")
    volumes = engine.docker("volume", "ls", "-q", "--filter", label, check=False).split()
    if volumes:
        done = engine.run(["docker", "volume", "rm", "-f", *volumes], check=False)
        _warn_failed(done, f"some volumes of {name} stay")


def _warn_failed(done: subprocess.CompletedProcess[str], what: str) -> None:
    """A warning with the engine's words when a removal failed (the next run's start
    removes what stayed: `remove_stale_projects`)."""
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        log.warning("%s: %s", what, " | ".join(lines[-4:]))


def project_name(variant: str) -> str:
    """The compose project of this process's run of ``variant``."""
    return f"{PROJECT_PREFIX}{os.getpid()}-{variant}"


def remove_stale_projects(engine: Engine) -> list[str]:
    """Remove what earlier runs left on the engine when they ended without their
    teardown (killed by SIGKILL, the machine stopped): the containers, network and
    volumes of each project whose process, named in the project's name, is gone. The
    projects removed (their bridges would otherwise stay on the host)."""
    fmt = '{{.Label "com.docker.compose.project"}}'
    names = set(engine.docker("network", "ls", "--format", fmt, check=False).split())
    fmt = '{{.Label "pressrun.emulate.project"}}'
    names |= set(engine.docker("ps", "-a", "--format", fmt, check=False).split())
    stale = []
    for name in sorted(names):
        match = re.fullmatch(re.escape(PROJECT_PREFIX) + r"(\d+)-[\w-]+", name)
        if match is None or _alive(int(match.group(1))):
            continue
        _remove_containers(engine, name)
        _remove_networks_and_volumes(engine, name)
        stale.append(name)
    return stale


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
