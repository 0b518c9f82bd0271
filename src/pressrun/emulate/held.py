"""A client container held at the start line, released at its arrival time.

``python -m pressrun.emulate.held --release-dir DIR --name N -- ARGS...`` (after the
entrypoint shaped the link) parses ``pressrun ARGS`` and imports everything the command
may need (the client, libtorrent, the FLUTE receiver), writes ``DIR/N.ready``, and
waits until the host creates ``DIR/N.go``; then it writes ``DIR/N.started`` (JSON:
``ready`` and ``released``, on the monotonic clock) and runs the command in this process,
which ends as the ``pressrun`` console script ends (`pressrun.cli.end`).

Why: starting a container and a Python client costs a few CPU seconds (namespaces,
cgroup, the overlay mount, the ``tc`` commands, the imports). On a host of a few cores a
wave of a hundred clients started at their arrival times queued on the CPU and began
minutes late (docs/emulation.md); started ahead and held, a client's arrival costs a
file the host writes, and ``N.started`` records when it really began. The times are
``CLOCK_MONOTONIC``, the clock of the host's event loop: the containers run on the
host's kernel without a time namespace, so both read the same clock.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: what ``pressrun get`` imports only once it needs it: imported before the release
PRELOAD = (
    "pressrun.clients.aio",
    "pressrun.clients.swarm_handoff",
    "pressrun.clients.multicast_receive",
    "pressrun.peer.aio",
    "pressrun.chord.host",
    "pressrun.multicast.receiver",
    "pressrun.multicast.gateway",  # an AMT reader's gateway (issue 34)
    "pressrun.clients.prefetch",  # a reader of the release minute (issue 35)
)
#: how often a held client looks for its release file (seconds)
POLL_S = 0.05


def ready_path(release_dir: Path, name: str) -> Path:
    """The file a held client writes once it is ready to go."""
    return release_dir / f"{name}.ready"


def go_path(release_dir: Path, name: str) -> Path:
    """The file the host writes at the client's arrival time."""
    return release_dir / f"{name}.go"


def started_path(release_dir: Path, name: str) -> Path:
    """The file the client writes when it saw its release (``ready``, ``released``)."""
    return release_dir / f"{name}.started"


def main(argv: Sequence[str]) -> int:
    """Prepare, wait for the release, run ``pressrun ARGS``; its exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m pressrun.emulate.held",
        description="run `pressrun ARGS` once the host releases this client",
    )
    parser.add_argument("--release-dir", type=Path, required=True)
    parser.add_argument("--name", required=True, help="this client's name in the folder")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- pressrun ARGS...")
    opts = parser.parse_args(argv)
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("no pressrun command given")

    from pressrun.cli import build_parser, run

    args = build_parser().parse_args(command)
    for module in PRELOAD:
        importlib.import_module(module)
    ready = time.clock_gettime(time.CLOCK_MONOTONIC)
    ready_path(opts.release_dir, opts.name).write_text(f"{ready:.3f}\n")
    go = go_path(opts.release_dir, opts.name)
    while not go.exists():
        time.sleep(POLL_S)
    released = time.clock_gettime(time.CLOCK_MONOTONIC)
    started_path(opts.release_dir, opts.name).write_text(
        json.dumps({"ready": round(ready, 3), "released": round(released, 3)})
    )
    return run(args)


if __name__ == "__main__":
    from pressrun.cli import end

    end(main(sys.argv[1:]))
