"""The held clients of an emulation run, seen from the host: every client container
started before the schedule (a few at once) and waited for at the start line
(`start_held`), when each really began (`read_started`), and each one waited for until
it exited or the scenario's timeout (`wait_clients`), its outcome read from its log.
The container's side of the start line is `pressrun.emulate.held`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from pressrun.emulate.engine import DockerCommandError, Engine
from pressrun.emulate.held import ready_path, started_path
from pressrun.emulate.outcomes import ClientOutcome, parse_outcome
from pressrun.emulate.project import docker_async
from pressrun.emulate.scenario import ClientPlan

log = logging.getLogger(__name__)

#: client containers started at once before the schedule (each costs the engine and
#: the host CPU seconds: more at once only queue)
STARTING_AT_ONCE = 4
#: how long the held clients get to be ready before the schedule starts anyway (those
#: not ready then start late, and their lag says so)
READY_TIMEOUT_S = 600.0


def plans_of(plans: Sequence[ClientPlan], kind: str) -> list[ClientPlan]:
    """The clients of one kind."""
    return [p for p in plans if p.kind == kind]


async def start_held(
    engine: Engine,
    outcomes: Sequence[ClientOutcome],
    release_dir: Path,
    report: Callable[[str], None],
    variant: str,
) -> None:
    """Start every created client container (a few at once) and wait until each is
    ready at the start line, or `READY_TIMEOUT_S` passed."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    starting = asyncio.Semaphore(STARTING_AT_ONCE)
    started_at: dict[str, float] = {}

    async def start(outcome: ClientOutcome) -> None:
        async with starting:
            try:
                await docker_async(engine, "start", outcome.container)
            except DockerCommandError as err:
                outcome.error = f"could not start: {err}"
                outcome.exit_code = -1
                return
            started_at[outcome.container] = loop.time()

    report(f"[{variant}] starting {len(outcomes)} client containers, held until their time")
    starters = asyncio.gather(*(start(o) for o in outcomes if o.exit_code is None))
    waiting = [o for o in outcomes if o.exit_code is None]
    last_note = began
    while True:
        for outcome in waiting:
            ready = ready_path(release_dir, str(outcome.plan.number))
            if outcome.ready_s is None and ready.exists():
                outcome.ready_s = loop.time() - started_at.get(outcome.container, began)
        waiting = [o for o in waiting if o.ready_s is None and o.exit_code is None]
        if (not waiting and starters.done()) or loop.time() - began > READY_TIMEOUT_S:
            break
        if loop.time() - last_note > 15:
            last_note = loop.time()
            # a client that ended before it was ready (a bad argument) is not waited for
            fmt = "{{.Name}} {{.State.Status}}"
            names = [o.container for o in waiting if o.container in started_at]
            text = (await asyncio.to_thread(
                engine.run, ["docker", "inspect", "--format", fmt, *names], check=False
            )).stdout if names else ""  # fmt: skip
            gone = {ln.lstrip("/").split()[0] for ln in text.splitlines() if "exited" in ln}
            waiting = [o for o in waiting if o.container not in gone]
            report(
                f"[{variant}] {len(outcomes) - len(waiting)}/{len(outcomes)} clients ready "
                f"({loop.time() - began:.0f} s)"
            )
        await asyncio.sleep(0.5)
    await starters
    report(
        f"[{variant}] {len(outcomes) - len(waiting)}/{len(outcomes)} clients ready at the "
        f"start line after {loop.time() - began:.0f} s"
    )


def read_started(outcome: ClientOutcome, release_dir: Path, t0: float) -> None:
    """When the client really began (its ``N.started``: the host's monotonic clock,
    which the containers share), from the schedule's start ``t0``."""
    path = started_path(release_dir, str(outcome.plan.number))
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        outcome.started_s = float(json.loads(path.read_text())["released"]) - t0


async def wait_clients(
    engine: Engine,
    outcomes: Sequence[ClientOutcome],
    deadline: float,
    report: Callable[[str], None],
    variant: str,
    t0: float,
    logs_dir: Path | None = None,
) -> None:
    """Until every client container exited (or the deadline); reads each outcome,
    and keeps each client's log in ``logs_dir`` (`read_outcome`)."""
    loop = asyncio.get_running_loop()
    pending = {o.container: o for o in outcomes if o.exit_code is None}
    last_note = 0.0
    while pending:
        names = list(pending)
        fmt = "{{.Name}} {{.State.Status}} {{.State.ExitCode}}"
        text = (await asyncio.to_thread(
            engine.run, ["docker", "inspect", "--format", fmt, *names], check=False
        )).stdout  # fmt: skip
        finished: list[ClientOutcome] = []
        for line in text.splitlines():
            parts = line.lstrip("/").split()
            if len(parts) == 3 and parts[1] in ("exited", "dead") and parts[0] in pending:
                outcome = pending.pop(parts[0])
                outcome.exit_code = int(parts[2])
                outcome.exited_s = loop.time() - t0
                finished.append(outcome)
        await asyncio.gather(*(read_outcome(engine, o, logs_dir) for o in finished))
        now = loop.time()
        if now - last_note > 15:
            done = len(outcomes) - len(pending)
            report(f"[{variant}] t={now - t0:.0f} s: {done}/{len(outcomes)} clients done")
            last_note = now
        if now > deadline:
            for outcome in pending.values():
                outcome.error = "still running at the scenario's timeout"
                await read_outcome(engine, outcome, logs_dir)
            return
        await asyncio.sleep(2.0)


async def read_outcome(
    engine: Engine, outcome: ClientOutcome, logs_dir: Path | None = None
) -> None:
    """A finished client's outcome from its log (``docker logs`` as a child process
    of the event loop, so many are read at once). With ``logs_dir``, the log is kept
    there as ``client-<number>.log`` (stdout, the ``--json`` document, then stderr:
    the client's log lines, e.g. the swarm's timeline, `pressrun.peer.timeline`), so
    an operator can see where a client's time went after the containers are gone."""
    proc = await asyncio.create_subprocess_exec(
        "docker", "logs", outcome.container, env=engine.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    parse_outcome(outcome, stdout, stderr)
    if logs_dir is not None:
        try:
            logs_dir.mkdir(parents=True, exist_ok=True)
            (logs_dir / f"client-{outcome.plan.number}.log").write_text(
                f"# {outcome.container}: exit {outcome.exit_code}\n# stdout\n{stdout}"
                f"# stderr\n{stderr}"
            )
        except OSError as exc:  # the outcome is read; a log not kept loses nothing else
            log.warning("could not keep the log of %s: %s", outcome.container, exc)
