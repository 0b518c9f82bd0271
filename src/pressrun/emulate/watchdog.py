"""The engine's watchdog: stops pressrun's own ``dockerd`` once nobody uses it.

``python -m pressrun.emulate.watchdog LOCK_FILE PID MARK`` is started beside the daemon
(`pressrun.emulate.engine`), in a session of its own, so it outlives whoever started the
engine. Every user of the engine holds a shared ``flock`` on ``LOCK_FILE`` while it uses
it; the kernel releases a lock when its holder exits, however it ends (SIGKILL
included). The watchdog asks for the exclusive lock and blocks: it gets it once the last
user is gone, and then stops the daemon (SIGTERM, so it stops its containers and its
containerd; SIGKILL to its process group after a grace) if ``PID`` is still the daemon
(its command line contains ``MARK``, the engine's socket folder), and puts back the
kernel's neighbour-table limits the engine's start raised (`pressrun.emulate.engine`).
A starter that ends normally stops the daemon itself first; the watchdog then finds
nothing to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

GRACE_S = 30.0


def is_daemon(pid: int, mark: str) -> bool:
    """Whether ``pid`` runs and its command line contains ``mark``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return mark.encode() in cmdline


def stop(pid: int, mark: str, grace_s: float = GRACE_S) -> None:
    """SIGTERM the daemon, then SIGKILL its process group if it is still there."""
    if not is_daemon(pid, mark):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.perf_counter() + grace_s
    while time.perf_counter() < deadline:
        if not is_daemon(pid, mark):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def main(argv: Sequence[str]) -> int:
    """Wait for the last user to go, then stop the daemon."""
    if len(argv) != 3 or not argv[1].isdigit():
        print("usage: python -m pressrun.emulate.watchdog LOCK_FILE PID MARK", file=sys.stderr)
        return 2
    lock_path, pid, mark = argv[0], int(argv[1]), argv[2]
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # blocks while anyone uses the engine
        stop(pid, mark)
        if not is_daemon(pid, mark):
            from pressrun.emulate.engine import restore_neighbour_limits

            restore_neighbour_limits(Path(mark))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
