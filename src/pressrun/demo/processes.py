"""Child processes of the demo and the test bed: ``pressrun serve ...`` services, the
CPU burner beside origin B, and what they cost in CPU seconds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


def start_cpu_burner() -> subprocess.Popen[bytes]:
    """A real background load: a separate Python process in a busy loop (niced)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import os; os.nice(5)\nwhile True: pass"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a process this module started, then kill it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


@dataclass
class ServiceProcess:
    """A ``pressrun serve ...`` child process and the URL it listens on.

    Started with ``--port 0``; the URL is read from the service's own start-up log line
    ("... on http://127.0.0.1:PORT ..."), so no port is guessed. Its stderr is drained
    for as long as it runs (the last lines are kept for error messages).
    """

    name: str
    proc: asyncio.subprocess.Process
    url: str
    tail: list[str]
    drain: asyncio.Task[None]

    @classmethod
    async def start(
        cls,
        name: str,
        args: list[str],
        timeout_s: float = 20.0,
        env: dict[str, str] | None = None,
        *,
        log_level: str = "INFO",
        log_path: Path | None = None,
    ) -> ServiceProcess:
        """Run ``pressrun --log-level LOG_LEVEL serve ARGS`` and wait for its URL;
        ``env`` adds environment variables (e.g. a service's API token); ``log_path``
        keeps every line of its log there."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pressrun.cli",
            "--log-level",
            log_level,
            "serve",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
        )
        assert proc.stderr is not None
        tail: list[str] = []
        log_file = None if log_path is None else log_path.open("w", encoding="utf-8")

        def keep(text: str) -> None:
            tail.append(text)
            del tail[:-20]
            if log_file is not None:
                log_file.write(text + "\n")

        pattern = re.compile(r" on (http://127\.0\.0\.1:\d+)")

        async def first_url() -> str:
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                text = line.decode(errors="replace").rstrip()
                keep(text)
                found = pattern.search(text)
                if found:
                    return found.group(1)
            raise RuntimeError(
                f"{name} exited before listening: {' | '.join(tail[-3:]) or 'no output'}"
            )

        try:
            url = await asyncio.wait_for(first_url(), timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            if log_file is not None:
                log_file.close()
            raise

        async def drain() -> None:
            assert proc.stderr is not None
            try:
                while line := await proc.stderr.readline():
                    keep(line.decode(errors="replace").rstrip())
            finally:
                if log_file is not None:
                    log_file.close()

        return cls(name, proc, url, tail, asyncio.create_task(drain()))

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        self.drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.drain
