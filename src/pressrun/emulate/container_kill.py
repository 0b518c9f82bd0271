"""Killing a container's process from the host (the emulation's `kill` fault): the
container's first process is found through the engine and sent SIGKILL at the second
it is due, not through `docker kill` (which came 33 s late through a loaded engine;
docs/results/2026-11-28-balancer-kill.md)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from pressrun.emulate.engine import DockerCommandError, Engine
from pressrun.emulate.project import docker_async

log = logging.getLogger("pressrun.emulate.run")


async def container_pid(engine: Engine, container: str) -> tuple[int, str] | None:
    """The host pid of a running container's first process and the container's id
    (None: not running, or the engine did not say)."""
    try:
        text = await docker_async(
            engine, "inspect", "--format", "{{.State.Pid}} {{.Id}}", container
        )
        pid, cid = text.split()
        return (int(pid), cid) if int(pid) > 0 else None
    except (DockerCommandError, ValueError) as err:
        log.warning(
            "the pid of %s is not known (%s): it is killed through the engine", container, err
        )
        return None


def kill_container_process(pid: int, container_id: str) -> bool:
    """SIGKILL to ``pid`` if it is still the container's (its cgroup names the
    container: a pid freed and reused is left alone); whether it was sent."""
    try:
        if container_id not in Path(f"/proc/{pid}/cgroup").read_text():
            return False
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True
