"""bench/reader_swarm.py's desktop peers: ``pressrun get --json`` and ``pressrun seed``
child processes, their outcomes and their stopping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# sibling scripts: python puts bench/ first on the path when bench/reader_swarm.py runs
from reader_swarm_figures import ISSUE, Desktop, process_cpu_s

#: a desktop peer's command line (``pressrun get`` / ``pressrun seed`` follow), its
#: log at INFO: the directives and the swarm's notices
PRESSRUN_INFO = (sys.executable, "-m", "pressrun.cli", "--log-level", "INFO")


async def desktop_get(
    number: int,
    balancer: str,
    library: Path,
    pub: Path,
    delay_s: float,
    max_seed_s: float,
    running: list[asyncio.subprocess.Process],
    log_path: Path,
    after: Callable[[], Awaitable[None]] | None = None,
) -> Desktop:
    """A desktop peer arriving after ``delay_s`` (and then ``after()``, if given):
    ``pressrun get --json``, which seeds after its download until its fair-exit rule or
    ``max_seed_s`` and then prints its outcome; the process is put in ``running`` (to be
    stopped when the crowd is over: then it has no outcome). Its log (INFO: the
    directives, the swarm's notices) goes to ``log_path``."""
    await asyncio.sleep(delay_s)
    if after is not None:
        await after()
    proc = await asyncio.create_subprocess_exec(
        *PRESSRUN_INFO,
        "get",
        ISSUE,
        "--balancer",
        balancer,
        "--library",
        str(library),
        "--publisher-key",
        str(pub),
        "--json",
        "--max-seed-s",
        f"{max_seed_s:g}",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**_environ(), "PRESSRUN_STUN": ""},
    )
    running.append(proc)
    cpu = [0.0]

    async def watch_cpu() -> None:
        while proc.returncode is None:
            cpu[0] = process_cpu_s(proc.pid) or cpu[0]
            await asyncio.sleep(0.5)

    watcher = asyncio.get_running_loop().create_task(watch_cpu())
    try:
        out, err = await proc.communicate()
    finally:
        watcher.cancel()
    log_path.write_bytes(err)
    if proc.returncode != 0:
        tail = (err or out).decode(errors="replace").strip().splitlines()[-1:]
        why = tail[0] if tail else f"exit {proc.returncode} (stopped while seeding?)"
        return Desktop(number, False, error=why, cpu_s=cpu[0])
    doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return Desktop(
        number,
        True,
        seconds=float(doc["seconds"]),
        bytes_from_origins=int(doc.get("bytes_from_origins") or 0),
        bytes_from_peers=int(doc.get("bytes_from_peers") or 0),
        mode=str(doc.get("mode") or "-"),
        cpu_s=cpu[0],
    )


async def seeding_desktop(
    content: Path, tracker: str, log_path: Path
) -> asyncio.subprocess.Process:
    """--seeding-desktops: a desktop peer that holds the issue before the crowd comes
    and seeds it until the half ends (``pressrun seed --until-stopped``, libtorrent with
    WebRTC through the tracker's WebSocket twin, no STUN server), as a reader's desktop
    seeding in the background; started once its copy is checked (its log says so, at
    most 20 s: "verified"). The caller stops it."""
    bundle = content / ISSUE
    name = json.loads((bundle / "manifest.json").read_text())["manifest"]["file_name"]
    log = log_path.open("wb")
    proc = await asyncio.create_subprocess_exec(
        *PRESSRUN_INFO,
        "seed",
        "--torrent",
        str(bundle / f"{ISSUE}.torrent"),
        "--manifest",
        str(bundle / "manifest.json"),
        "--until-stopped",
        "--listen",
        "127.0.0.1:0",
        "--tracker",
        f"{tracker}/announce",
        str(bundle / name),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
        env={**_environ(), "PRESSRUN_STUN": ""},
    )
    log.close()
    deadline = asyncio.get_running_loop().time() + 20.0
    while asyncio.get_running_loop().time() < deadline and proc.returncode is None:
        if b" verified" in log_path.read_bytes():
            break
        await asyncio.sleep(0.2)
    return proc


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 5 s (libtorrent's WebRTC threads can hang an exit)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _environ() -> dict[str, str]:
    return dict(os.environ)
