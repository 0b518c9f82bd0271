"""The crash harness's zygote: a process that imports pressrun once, then forks one
child per command, in which the Nth disk-changing call kills the child or fails.

Run as ``python crash_zygote.py``; it reads one JSON request a line on stdin and
answers one JSON line on stdout:

    {"argv": [...], "cwd": DIR, "n": N, "mode": "count" | "kill" | "enospc" | "none",
     "exchange": true}
    -> {"rc": RC, "calls": CALLS, "out": STDOUT, "err": STDERR}

The hooked calls are ``os.rename``, ``os.replace``, ``os.fsync``, ``os.write``,
``os.pwrite`` and ``pressrun.durable.exchange`` (``renameat2(RENAME_EXCHANGE)``):
every step by which pressrun changes what is on disk. ``kill``: the Nth call ends the
process with ``os._exit(137)`` on the spot (no ``finally``, no ``atexit``, like
SIGKILL; what the kernel already has stays, as it does after a SIGKILL). ``enospc``:
the Nth call raises ``OSError(ENOSPC)`` and so does every ``write``/``pwrite`` after
it (the disk stays full). ``count``: no fault; ``calls`` says how many there were.
``exchange: false`` makes ``exchange`` answer "not supported", so the two-rename path
is the one taken. Forking a process with no thread and no event loop is safe, and
costs milliseconds instead of the second a new interpreter takes to import pressrun.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

# everything the commands import lazily, imported once here (the children inherit it)
import aiohttp  # noqa: F401
import libtorrent  # noqa: F401
import nacl.public  # noqa: F401
import rich.console
import rich.progress  # noqa: F401

import pressrun.cli
import pressrun.clients.aio
import pressrun.clients.cli
import pressrun.content.cli
import pressrun.content.publish
import pressrun.subscriptions.client

try:  # the code before issue 27 has no durable.exchange
    import pressrun.durable as durable
except ImportError:  # pragma: no cover - older trees
    durable = None  # type: ignore[assignment]

KILLED = 137


def parser() -> argparse.ArgumentParser:
    """``pressrun``'s parser with the commands under test only (get, trust, keys,
    publish, verify): the same functions, without importing every other component."""
    p = argparse.ArgumentParser(prog="pressrun")
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="command", required=True)
    pressrun.clients.cli.register(sub)
    pressrun.content.cli.register(sub)
    return p


PARSER = parser()
REAL_WRITE = os.write
HOOKED_OS = ("rename", "replace", "fsync", "write", "pwrite")


def install(n: int, mode: str, exchange: bool) -> Callable[[], int]:
    """Hook the disk-changing calls; returns a function telling how many were made."""
    calls = [0]
    full = [False]

    def hook(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if full[0] and name in ("write", "pwrite"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if calls[0] == n:
                if mode == "kill":
                    os._exit(KILLED)
                if mode == "enospc":
                    full[0] = True
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args, **kwargs)

        return hooked

    for name in HOOKED_OS:
        setattr(os, name, hook(name, getattr(os, name)))
    if durable is not None and hasattr(durable, "exchange"):
        real_exchange = durable.exchange
        if not exchange:

            def real_exchange(a: Any, b: Any) -> bool:
                return False

        durable.exchange = hook("exchange", real_exchange)
    return lambda: calls[0]


def child(req: dict[str, Any], out_path: str, err_path: str, count_path: str) -> None:
    """In the forked child: run the command under the hooks; never returns."""
    rc = 70
    try:
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.chdir(req["cwd"])
        for key, value in req.get("env", {}).items():
            os.environ[key] = value
        count = install(int(req["n"]), str(req["mode"]), bool(req.get("exchange", True)))
        try:
            rc = pressrun.cli.run(PARSER.parse_args(list(req["argv"])))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 70
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(count_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        REAL_WRITE(fd, str(count()).encode())
        os.close(fd)
    finally:
        os._exit(rc)


def main() -> None:
    """Serve requests until stdin closes."""
    for line in sys.stdin:
        req = json.loads(line)
        base = req["scratch"]
        paths = (f"{base}.out", f"{base}.err", f"{base}.count")
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            child(req, *paths)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)

        def read(p: str) -> str:
            try:
                with open(p, encoding="utf-8", errors="replace") as f:
                    return f.read()
            except FileNotFoundError:
                return ""

        calls = read(paths[2])
        answer = {
            "rc": rc,
            "calls": int(calls) if calls else None,
            "out": read(paths[0]),
            "err": read(paths[1]),
        }
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
