"""Whoever starts the container engine stops it on every way out: an exception in the
`engine_session`, a SIGTERM to the starter (``pressrun emulate`` turns it into
KeyboardInterrupt), and the starter's death by SIGKILL (the watchdog stops the daemon
once the last user's lock is gone); and a user of an engine someone else started keeps
it while the starter leaves. Each test starts a real ``dockerd`` on a data root of its
own (nothing else shares it) and checks that neither it nor any process of its
(containerd, the watchdog) is left; and a run's teardown leaves no shim of a container
the engine no longer has. Runs as root where docker.io is installed; skips
otherwise."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pressrun.emulate.engine import (
    SHIM,
    SHIM_NAMESPACE,
    SHIM_SOCKETS,
    Engine,
    _socket_dir,
    engine_session,
    shims_of,
    why_no_engine,
)
from pressrun.emulate.project import ComposeProject, teardown

pytestmark = [pytest.mark.slow, pytest.mark.root]

#: the starter: the CLI's signal handling, then the engine held until a signal
STARTER = """
import sys, time
from pathlib import Path
from pressrun.emulate.cli import interrupt_on_signals
from pressrun.emulate.engine import engine_session

interrupt_on_signals()
with engine_session(Path(sys.argv[1])) as engine:
    assert engine.process is not None, "an engine was already running on this cache"
    print(engine.process.pid, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder (the engine's data root) nobody else uses; any daemon of it still
    running at the end is killed, so a failing test leaves nothing behind either, and
    its socket folder under /run/pressrun-emulate (keyed by this throwaway cache) is
    removed with it."""
    reason = why_no_engine()
    if reason is not None:
        pytest.skip(f"no container engine can start here: {reason}")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    folder = tmp_path / "cache"
    folder.mkdir()
    yield folder
    for pid in processes_of(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run_dir = _socket_dir(folder)
    assert wait_gone(folder) == [], "a daemon of this cache outlived SIGKILL"
    shutil.rmtree(run_dir, ignore_errors=True)
    assert not run_dir.exists()


def processes_of(cache: Path, exclude: int | None = None) -> list[int]:
    """Processes whose command line names this cache's data root or socket folder
    (dockerd, the containerd it started), but this one and ``exclude``."""
    marks = (str(cache.resolve()), str(_socket_dir(cache)))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), exclude):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmdline for m in marks):
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's exit waits for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(cache: Path, timeout_s: float = 60.0, exclude: int | None = None) -> list[int]:
    deadline = time.perf_counter() + timeout_s
    left = processes_of(cache, exclude)
    while left and time.perf_counter() < deadline:
        time.sleep(0.5)
        left = processes_of(cache, exclude)
    return left


def test_an_exception_in_the_session_stops_the_engine(cache: Path) -> None:
    with pytest.raises(RuntimeError, match="the run failed"), engine_session(cache) as engine:
        assert engine.process is not None
        assert engine.process.pid in processes_of(cache)
        raise RuntimeError("the run failed")
    assert wait_gone(cache) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_starter_ending_by_a_signal_stops_the_engine(
    cache: Path, signum: signal.Signals
) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(cache)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()  # the daemon's pid once it answers
        assert line.strip().isdigit(), starter.stderr.read() if starter.stderr else line
        daemon = int(line)
        assert daemon in processes_of(cache, starter.pid)
        starter.send_signal(signum)
        starter.wait(timeout=90)
        assert wait_gone(cache, exclude=starter.pid) == []
        deadline = time.perf_counter() + 30
        while running(daemon) and time.perf_counter() < deadline:
            time.sleep(0.2)  # its exit may still be under way (an empty command line)
        assert not running(daemon)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()


def test_the_engine_stays_up_for_a_user_when_its_starter_is_killed(cache: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(cache)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()
        assert line.strip().isdigit(), starter.stderr.read() if starter.stderr else line
        daemon = int(line)
        with engine_session(cache) as engine:  # a second user of the same engine
            assert engine.process is None  # it found the engine running
            starter.kill()
            starter.wait(timeout=30)
            time.sleep(3)
            assert running(daemon), "the engine died under a user that still holds it"
            assert engine.docker("version", "--format", "{{.Server.Version}}").strip()
        # the last user gone, the watchdog stops it
        assert wait_gone(cache, exclude=starter.pid) == []
        assert not running(daemon)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()


def sleeper_image(engine: Engine, folder: Path) -> str:
    """An image of /bin/sleep and the libraries it loads (imported, nothing pulled)."""
    libs = subprocess.run(["ldd", "/bin/sleep"], capture_output=True, text=True, check=True)
    files = ["/bin/sleep", *(w for w in libs.stdout.split() if w.startswith("/"))]
    tar = folder / "sleeper.tar"
    with tarfile.open(tar, "w") as out:
        for name in files:
            out.add(os.path.realpath(name), arcname=name.lstrip("/"))
    engine.docker("import", str(tar), "pressrun-test-sleeper:1")
    return "pressrun-test-sleeper:1"


def start_shim(bundle: Path, address: Path, cid: str) -> None:
    """A runc shim started as containerd starts one (``start``: it forks the shim and
    prints its socket) for a container its containerd does not have: what a teardown
    on a loaded host left (its task gone, the shim never told to shut down)."""
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text("{}")
    os.mkfifo(bundle / "log")
    subprocess.run(
        [SHIM, "-namespace", SHIM_NAMESPACE, "-id", cid, "-address", str(address), "start"],
        cwd=bundle, env={**os.environ, "TTRPC_ADDRESS": f"{address}.ttrpc"},
        stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=30,
    )  # fmt: skip


def test_the_teardown_ends_the_shims_of_removed_containers(cache: Path, tmp_path: Path) -> None:
    """A run's containers are removed with their shims: a shim whose container the
    engine no longer has is ended, a running container's and another engine's stay."""
    project = "pressrun-emu-1-shims"
    with engine_session(cache) as engine:
        address = engine.containerd_address
        assert address is not None
        image = sleeper_image(engine, tmp_path)
        run = ["run", "-d", "--network", "none", image, "/bin/sleep", "300"]
        label = f"pressrun.emulate.project={project}"
        mine = [engine.docker(*run[:2], "--label", label, *run[2:]).strip()]
        bystander = engine.docker(*run).strip()  # another run's, on the same engine
        start_shim(tmp_path / "ours", address, "a" * 64)
        elsewhere = tmp_path / "another-engine" / "containerd.sock"
        start_shim(tmp_path / "theirs", elsewhere, "b" * 64)
        theirs = shims_of(elsewhere)
        try:
            assert set(theirs) == {"b" * 64}
            assert set(shims_of(address)) == {"a" * 64, bystander, *mine}
            took = teardown(engine, ComposeProject(engine, tmp_path, project, {}), tmp_path / "log")
            deadline = time.perf_counter() + 10
            while set(shims_of(address)) != {bystander} and time.perf_counter() < deadline:
                time.sleep(0.2)
            assert set(shims_of(address)) == {bystander}, took
            assert shims_of(elsewhere) == theirs  # not our engine's: left alone
            assert engine.docker("ps", "-q", "--no-trunc").split() == [bystander]
        finally:
            for pid in theirs.values():
                os.kill(pid, signal.SIGKILL)
            for where, cid in ((elsewhere, "b" * 64), (address, "a" * 64)):  # their sockets
                key = hashlib.sha256(f"{where}/{SHIM_NAMESPACE}/{cid}".encode()).hexdigest()
                (SHIM_SOCKETS / key).unlink(missing_ok=True)
