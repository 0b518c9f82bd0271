"""The crash harness, test side: a zygote process (crash_zygote.py) runs a pressrun
command in a forked child that is killed, or whose disk fills, at the Nth call that
changes the disk; `sweep` does that for every N a clean run makes, each time in a
fresh copy of the starting state, and checks what the crash left and what a rerun
makes of it."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).with_name("crash_zygote.py")
KILLED = 137
MODES = ("kill", "enospc")


@dataclass(frozen=True)
class Outcome:
    """One command's run in the zygote."""

    rc: int
    calls: int | None  # None when it was killed
    out: str
    err: str

    @property
    def killed(self) -> bool:
        return self.rc == KILLED


class Zygote:
    """The zygote process; `run` one command at a time."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Zygote:
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ZYGOTE),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        n: int = 0,
        mode: str = "none",
        exchange: bool = True,
        env: dict[str, str] | None = None,
    ) -> Outcome:
        """``pressrun ARGV`` in a forked child, the Nth disk call failing as ``mode``."""
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        req = {
            "argv": argv,
            "cwd": str(cwd),
            "n": n,
            "mode": mode,
            "exchange": exchange,
            "env": env or {},
            "scratch": str(self.scratch / "run"),
        }
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not line:
            raise RuntimeError("the crash zygote exited")
        doc: dict[str, Any] = json.loads(line)
        return Outcome(doc["rc"], doc["calls"], doc["out"], doc["err"])


def fresh_copy(template: Path, where: Path) -> Path:
    """A copy of ``template`` at ``where`` (what was there before is removed)."""
    if where.exists():
        shutil.rmtree(where)
    shutil.copytree(template, where, symlinks=True)
    return where


@dataclass
class Sweep:
    """What one sweep did: steps run per mode, and the failures found."""

    calls: int
    runs: int = 0
    failures: list[str] | None = None


async def sweep(
    zygote: Zygote,
    argv: list[str],
    *,
    cwd: Path,
    prepare: Callable[[], object],
    after_crash: Callable[[Outcome, str, int], Awaitable[None]],
    rerun: Callable[[], Awaitable[None]],
    modes: tuple[str, ...] = MODES,
    exchange: bool = True,
    env: dict[str, str] | None = None,
) -> Sweep:
    """Run ``argv`` once cleanly to count its disk calls, then for every mode and every
    N from 1 to that count: ``prepare()`` the starting state, run it failing at N,
    ``after_crash(outcome, mode, n)`` checks what it left, ``rerun()`` runs it again
    and checks the end state. Assertion errors name the mode and N."""
    prepare()
    clean = await zygote.run(argv, cwd=cwd, mode="count", exchange=exchange, env=env)
    assert clean.rc == 0 and clean.calls, f"the clean run failed: {clean.err[-2000:]}"
    result = Sweep(calls=clean.calls)
    for mode in modes:
        for n in range(1, clean.calls + 1):
            prepare()
            outcome = await zygote.run(argv, cwd=cwd, n=n, mode=mode, exchange=exchange, env=env)
            where = f"{mode} at disk call {n} of {clean.calls}"
            if mode == "kill":
                assert outcome.killed or outcome.calls is not None, where
            try:
                await after_crash(outcome, mode, n)
                await rerun()
            except AssertionError as err:
                raise AssertionError(f"{where}: {err}\n{outcome.err[-3000:]}") from None
            result.runs += 1
    return result
