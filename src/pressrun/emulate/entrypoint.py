"""The entrypoint of every pressrun container: shape the link, then run the command.

``python -m pressrun.emulate.entrypoint COMMAND ARGS...`` reads the ``PRESSRUN_LINK_*``
variables (`pressrun.emulate.link`), runs the ``tc``/``nft`` commands that shape
``eth0`` (the container needs ``NET_ADMIN`` for that; with no variable set nothing runs
and no capability is needed), logs one line saying what it did, and replaces itself
with ``COMMAND`` (``pressrun serve ...``, ``pressrun get ...``, ``redis-server``).

An argument ``@own-address@`` is replaced by the container's own address on its network
(what its host name resolves to): a supernode announces where others reach it.

``python -m pressrun.emulate.entrypoint --cut-link`` (through ``docker exec``) cuts the
running container's link: every packet but the loopback's is dropped from then on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from pressrun.emulate.link import LinkConfigError, cut_commands, link_from_env, shaping_commands

PROG = "pressrun-entrypoint"
#: an argument replaced by the container's own address (`own_address`)
OWN_ADDRESS = "@own-address@"


def own_address() -> str:
    """This container's address on its network: its host name resolved (the engine
    writes it into /etc/hosts)."""
    import socket

    return socket.gethostbyname(socket.gethostname())


def run_commands(commands: Sequence[Sequence[str]]) -> str | None:
    """Run each command; None when all succeeded, else what failed and why."""
    for command in commands:
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            return f"{command[0]} is not installed in this image"
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            hint = ""
            if "Operation not permitted" in (done.stderr or ""):
                hint = " (the container needs cap_add: [NET_ADMIN] to shape its link)"
            return f"{' '.join(command)}: {why[-1] if why else f'exit {done.returncode}'}{hint}"
    return None


def main(argv: Sequence[str]) -> int:
    """Shape, then exec the command; 2 on bad link variables, 1 when shaping fails."""
    if not argv:
        print(f"{PROG}: usage: {PROG} COMMAND [ARGS...] | --cut-link", file=sys.stderr)
        return 2
    if argv[0] == "--cut-link":
        problem = run_commands(cut_commands())
        if problem is not None:
            print(f"{PROG}: could not cut the link: {problem}", file=sys.stderr)
            return 1
        print(f"{PROG}: link cut (every packet but the loopback's dropped)", flush=True)
        return 0
    try:
        shape = link_from_env(os.environ)
    except LinkConfigError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    if shape.shaped:
        problem = run_commands(shaping_commands(shape))
        if problem is not None:
            print(f"{PROG}: could not shape the link: {problem}", file=sys.stderr)
            return 1
    if OWN_ADDRESS in argv:
        try:
            address = own_address()
        except OSError as err:
            print(f"{PROG}: cannot tell this container's address: {err}", file=sys.stderr)
            return 1
        argv = [address if arg == OWN_ADDRESS else arg for arg in argv]
    print(f"{PROG}: link {shape.describe()}; running {argv[0]}", file=sys.stderr, flush=True)
    try:
        os.execvp(argv[0], list(argv))  # replaces this process: no return on success
    except OSError as err:
        print(f"{PROG}: cannot run {argv[0]}: {err.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
