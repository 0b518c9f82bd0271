"""The container engine: find a running one or start our own, and talk to it.

`ensure_engine` returns a `Engine` whose `docker`/`compose` methods run the Debian
``docker`` and ``docker-compose`` clients against it. When ``DOCKER_HOST`` is set, that
engine is used as it is. Otherwise pressrun's own engine is used: ``dockerd`` with its
data root in the cache folder and its socket under ``/run/pressrun-emulate/``, started
on demand with the flags that leave the host's network alone (FIELD-NOTES.md,
"Docker"): ``--iptables=false --ip-masq=false``, no default bridge (``--bridge none``),
networks only from the benchmarking range 198.18.0.0/15. Every user holds a shared
lock on the engine; whoever started it stops it when nobody else holds the lock, on
every way out: the end, an exception, a signal the caller turns into one (``pressrun
emulate`` does for SIGINT, SIGTERM and SIGHUP). A watchdog started beside the daemon
(`pressrun.emulate.watchdog`) stops it once the last user's lock is gone, so neither a
starter killed by SIGKILL nor one that left while others still used the engine leaves
it running, and no user loses the engine while it holds the lock.

Where no engine can start (not root, ``dockerd`` missing, the daemon dying at start)
`EngineUnavailable` says exactly why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: every network the engine makes comes from here (the benchmarking range, RFC 2544)
ADDRESS_POOL = "198.18.0.0/16"
ENGINE_START_TIMEOUT_S = 60.0
#: the cgroup every container of our engine lives under, and its CPU weight against
#: the host's other processes (cgroup v1 cpu.shares; a busy process weighs 1024): left
#: at docker's 1024, a hundred containers would share the CPU of one process
ENGINE_CGROUP = "pressrun-emulate"
ENGINE_CPU_SHARES = 4096
#: The kernel's neighbour (ARP) table is one for every network namespace, with a hard
#: limit of ``net.ipv4.neigh.default.gc_thresh3`` entries (1024 by default): in a flash
#: crowd, 150 client containers whose peers each talk to dozens of others pass it, and
#: then no container can resolve a new address ("table_fulls" in
#: /proc/net/stat/arp_cache; measured 2026-11-24: a balancer that could not reach the
#: multicast sender for 35 s at the peak). While our engine runs the limits are these
#: (raised only, never lowered), and the values before are put back when it stops.
NEIGHBOUR_LIMITS = {"gc_thresh3": 65536, "gc_thresh2": 32768, "gc_thresh1": 8192}
NEIGHBOUR_SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")
#: each engine's socket folder is in here
RUN_ROOT = Path("/run/pressrun-emulate")
#: the limits as they were before the first of our engines started
NEIGHBOUR_SAVED = RUN_ROOT / "neighbour-limits.json"
#: containerd's runc shim: one process per container, started with ``-namespace``,
#: ``-id <container>`` and ``-address <its containerd's socket>``
SHIM = "containerd-shim-runc-v2"
#: docker's containers' containerd namespace (its plugins have one of their own)
SHIM_NAMESPACE = "moby"
#: where the shims (containerd 1.6) keep their sockets: sha256 of address/namespace/id
SHIM_SOCKETS = Path("/run/containerd/s")


class EngineUnavailable(RuntimeError):
    """No container engine can be used here; the message says why and what to do."""


class DockerCommandError(RuntimeError):
    """A docker or docker-compose command failed; the message has its last lines."""


@dataclass
class Engine:
    """A reachable container engine and, if we started it, the daemon process."""

    host: str
    process: subprocess.Popen[bytes] | None = None
    lock_file: object | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: our engine's socket folder (None for a ``DOCKER_HOST`` engine)
    run_dir: Path | None = None

    @property
    def containerd_address(self) -> Path | None:
        """The socket of the containerd our engine runs (None for a ``DOCKER_HOST``
        engine: its shims are not ours to end)."""
        return (
            None
            if self.run_dir is None
            else self.run_dir / "exec" / "containerd" / "containerd.sock"
        )

    @property
    def cgroup(self) -> Path | None:
        """Where the CPU use of this engine's containers is counted (cgroup v1
        ``cpuacct``): ours, under `ENGINE_CGROUP`; None for a ``DOCKER_HOST`` engine
        (its containers' cgroups are its own business) or where there is none."""
        if self.host.removeprefix("unix://").startswith(str(RUN_ROOT)):
            path = Path("/sys/fs/cgroup/cpuacct") / ENGINE_CGROUP
            return path if path.is_dir() else None
        return None

    def run(
        self,
        args: Sequence[str],
        *,
        check: bool = True,
        timeout_s: float | None = 600.0,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (``docker ...``, ``docker-compose ...``) on this engine."""
        try:
            done = subprocess.run(
                list(args),
                env=self.env,
                capture_output=True,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
                cwd=cwd,
            )
        except subprocess.TimeoutExpired:
            raise DockerCommandError(
                f"{' '.join(args[:4])} ... did not finish in {timeout_s:g} s"
            ) from None
        if check and done.returncode != 0:
            lines = (done.stderr or done.stdout or "").strip().splitlines()
            raise DockerCommandError(
                f"{' '.join(args[:3])} failed (exit {done.returncode}): " + " | ".join(lines[-4:])
            )
        return done

    def docker(self, *args: str, check: bool = True, timeout_s: float | None = 600.0) -> str:
        """``docker ARGS``; its stdout."""
        return self.run(["docker", *args], check=check, timeout_s=timeout_s).stdout

    def stop(self) -> None:
        """Stop the daemon if we started it and nobody else uses it; release our lock."""
        lock = self.lock_file
        self.lock_file = None
        proc = self.process
        self.process = None
        if lock is None:
            return
        fd = lock.fileno()  # type: ignore[attr-defined]
        if proc is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("the engine stays up: another pressrun emulate still uses it")
                proc = None
        if proc is not None:
            stop_daemon(proc)
            if self.run_dir is not None:
                restore_neighbour_limits(self.run_dir)
        lock.close()  # type: ignore[attr-defined]


def stop_daemon(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM the daemon we started (it stops its containers and its containerd),
    then, after ``grace_s``, SIGKILL its whole process group (it leads one of its own)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def raise_neighbour_limits(sysctl: Path = NEIGHBOUR_SYSCTL, saved: Path = NEIGHBOUR_SAVED) -> None:
    """Raise the kernel's neighbour-table limits to `NEIGHBOUR_LIMITS` (never lower
    them), first saving the values before in ``saved`` unless an engine that is still
    running saved them already (the machine's values, not another engine's raised ones)."""
    try:
        before = {name: int((sysctl / name).read_text()) for name in NEIGHBOUR_LIMITS}
        if not saved.exists():
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(before))
        for name, value in NEIGHBOUR_LIMITS.items():  # gc_thresh3 first
            if before[name] < value:
                (sysctl / name).write_text(str(value))
    except (OSError, ValueError) as err:
        log.warning("the kernel's neighbour-table limits stay as they are: %s", err)
        return
    log.info("neighbour-table limits while the engine runs: %s", NEIGHBOUR_LIMITS)


def restore_neighbour_limits(
    run_dir: Path,
    sysctl: Path = NEIGHBOUR_SYSCTL,
    saved: Path = NEIGHBOUR_SAVED,
    others: Callable[[Path], bool] | None = None,
) -> None:
    """Put back the neighbour-table limits `raise_neighbour_limits` saved, once the
    engine of ``run_dir`` stopped and no other engine of ours runs (the last one to
    stop puts them back; ``others``: `other_engines_running`)."""
    if (others or other_engines_running)(run_dir):
        return
    try:
        before = json.loads(saved.read_text())
    except (OSError, ValueError):
        return
    try:
        for name in reversed(NEIGHBOUR_LIMITS):  # gc_thresh1 first
            if name in before:
                (sysctl / name).write_text(str(int(before[name])))
        saved.unlink()
    except (OSError, ValueError) as err:
        log.warning("could not put the neighbour-table limits back: %s", err)


def other_engines_running(run_dir: Path) -> bool:
    """Whether a ``dockerd`` of ours (its socket under `RUN_ROOT`) other than the one
    of ``run_dir`` runs."""
    mine = str(run_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ours = cmdline.startswith(b"dockerd\0") and str(RUN_ROOT).encode() in cmdline
        if ours and mine not in cmdline:
            return True
    return False


def _socket_dir(cache_dir: Path) -> Path:
    # unix socket paths are limited to 107 bytes: a short path keyed by the cache folder
    key = hashlib.sha256(str(cache_dir.resolve()).encode()).hexdigest()[:10]
    return RUN_ROOT / key


def _client_env(host: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DOCKER_HOST"] = host
    env.pop("DOCKER_CONTEXT", None)
    # compose 1.29 refuses to start with a non-UTF-8 locale in some shells
    env.setdefault("LC_ALL", "C.UTF-8")
    env.setdefault("COMPOSE_INTERACTIVE_NO_CLI", "1")
    return env


def _answers(host: str, timeout_s: float = 10.0) -> bool:
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            env=_client_env(host),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return False
    return done.returncode == 0


def why_no_engine() -> str | None:
    """Why pressrun cannot start its own engine here, or None when it can try."""
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return (
            "the docker and docker-compose clients are not installed: "
            "`make setup` (or apt-get install docker.io docker-compose) as root"
        )
    if shutil.which("dockerd") is None:
        return "dockerd is not installed: `make setup` (or apt-get install docker.io) as root"
    if os.geteuid() != 0:
        return (
            "starting the container engine needs root (dockerd creates bridges and "
            "namespaces): run as root, or set DOCKER_HOST to an engine you may use"
        )
    return None


def ensure_engine(cache_dir: Path) -> Engine:
    """A usable engine: ``DOCKER_HOST``'s, ours if it runs, or ours started now.

    Hold the returned engine (its shared lock) for as long as it is used; `Engine.stop`
    releases it."""
    given = os.environ.get("DOCKER_HOST")
    if given:
        if not _answers(given):
            raise EngineUnavailable(f"DOCKER_HOST={given} does not answer `docker version`")
        return Engine(given, env=_client_env(given))
    problem = why_no_engine()
    if problem is not None:
        raise EngineUnavailable(problem)
    run_dir = _socket_dir(cache_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    host = f"unix://{run_dir}/docker.sock"
    lock = open(run_dir / "users.lock", "a+")  # noqa: SIM115 - held until Engine.stop
    fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
    if _answers(host, timeout_s=5.0):
        return Engine(host, lock_file=lock, env=_client_env(host))
    # nobody's engine answers: start ours (the exclusive section keeps two starters apart)
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    try:
        if _answers(host, timeout_s=5.0):
            return Engine(host, lock_file=lock, env=_client_env(host))
        engine = _start_dockerd(cache_dir, run_dir, host)
        engine.lock_file = lock
        return engine
    except BaseException:
        lock.close()
        raise
    finally:
        if not lock.closed:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH)


def _start_dockerd(cache_dir: Path, run_dir: Path, host: str) -> Engine:
    data_root = cache_dir / "docker"
    data_root.mkdir(parents=True, exist_ok=True)
    log_path = cache_dir / "dockerd.log"
    with contextlib.suppress(FileNotFoundError):
        (run_dir / "docker.sock").unlink()
    args = [
        "dockerd",
        "--host", host,
        "--data-root", str(data_root),
        "--exec-root", str(run_dir / "exec"),
        "--pidfile", str(run_dir / "dockerd.pid"),
        "--iptables=false",
        "--ip-masq=false",
        "--ip-forward=false",
        "--bridge", "none",
        "--default-address-pool", f"base={ADDRESS_POOL},size=24",
        "--storage-driver", "overlay2",
        "--cgroup-parent", f"/{ENGINE_CGROUP}",
    ]  # fmt: skip
    log.info("starting the container engine: %s", " ".join(args))
    with open(log_path, "ab") as out:
        # its own session: a Ctrl-C of the terminal reaches us, and we stop it in order
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.perf_counter() + ENGINE_START_TIMEOUT_S
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise EngineUnavailable(
                f"dockerd exited at start (code {proc.returncode}): {_tail(log_path)}"
            )
        if _answers(host, timeout_s=3.0):
            give_cpu_weight()
            raise_neighbour_limits()
            _start_watchdog(run_dir, proc.pid)
            return Engine(
                host, process=proc, log_path=log_path, env=_client_env(host), run_dir=run_dir
            )
        try:
            time.sleep(0.5)
        except BaseException:  # Ctrl-C while it starts: it does not outlive us
            stop_daemon(proc, grace_s=5.0)
            raise
    stop_daemon(proc, grace_s=5.0)
    raise EngineUnavailable(
        f"dockerd did not answer within {ENGINE_START_TIMEOUT_S:g} s: {_tail(log_path)}"
    )


def _start_watchdog(run_dir: Path, pid: int) -> None:
    """`pressrun.emulate.watchdog`: stops the daemon once the last user's lock is gone,
    however that user ended (our caller holds the lock exclusively while this runs)."""
    import sys

    subprocess.Popen(
        [sys.executable, "-m", "pressrun.emulate.watchdog", str(run_dir / "users.lock"),
         str(pid), str(run_dir)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def give_cpu_weight() -> None:
    """Give our engine's cgroup its CPU weight (cgroup v1; elsewhere a log line)."""
    group = Path("/sys/fs/cgroup/cpu") / ENGINE_CGROUP
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(ENGINE_CPU_SHARES))
    except OSError as err:
        log.info("containers keep docker's default CPU weight (%s: %s)", group, err)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(text[-lines:]) or "no log"


@contextlib.contextmanager
def engine_session(cache_dir: Path) -> Iterator[Engine]:
    """`ensure_engine` as a context: the engine is released (and stopped, if ours and
    unused) on the way out, also on Ctrl-C and errors."""
    engine = ensure_engine(cache_dir)
    try:
        yield engine
    finally:
        engine.stop()


def shims_of(address: Path) -> dict[str, int]:
    """The shims of docker's containers whose containerd is the one at ``address``: each
    container id and its shim's pid (another engine's or the host's are left out)."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not argv[0].endswith(SHIM):
            continue
        flags = dict(itertools.pairwise(argv))  # each flag and its value
        ours = flags.get("-address") == str(address) and "-id" in flags
        if ours and flags.get("-namespace") == SHIM_NAMESPACE:
            found[flags["-id"]] = int(entry.name)
    return found


def end_orphan_shims(engine: Engine, timeout_s: float = 60.0) -> list[str]:
    """End the shims of our engine whose container the engine no longer has; the ids.

    ``docker rm -f`` of a run's containers on a loaded host drops docker's record even
    when containerd's calls to a shim time out (dockerd.log: "cleanup: failed to delete
    container from containerd: cannot delete running task", "failed to delete shim:
    close wait error: context deadline exceeded"): the task stays in containerd, or
    containerd forgot it but the shim never got its shutdown, and the shim (13 MB)
    outlives the run, the engine and the runs after it. containerd deletes what it
    still has (``ctr tasks delete -f``, ``ctr containers delete``), SIGKILL ends the
    rest. Safe beside another run on the same engine: the shims are listed before the
    containers, and a container is docker's before its shim starts."""
    address = engine.containerd_address
    if address is None:
        return []
    shims = shims_of(address)
    if not shims:
        return []
    try:
        known = set(engine.docker("ps", "-aq", "--no-trunc", timeout_s=timeout_s).split())
    except DockerCommandError as err:
        log.warning("left the engine's shims as they are (its containers unknown): %s", err)
        return []
    orphans = {cid: pid for cid, pid in shims.items() if cid not in known}
    if not orphans:
        return []
    if shutil.which("ctr") is not None:
        ctr = ["ctr", "--address", str(address), "--namespace", SHIM_NAMESPACE]
        for args in (["tasks", "delete", "--force"], ["containers", "delete"]):
            with contextlib.suppress(DockerCommandError):
                engine.run([*ctr, *args, *orphans], check=False, timeout_s=timeout_s)
    for cid, pid in orphans.items():
        _kill_shim(pid, cid)
        key = hashlib.sha256(f"{address}/{SHIM_NAMESPACE}/{cid}".encode()).hexdigest()
        with contextlib.suppress(OSError):
            (SHIM_SOCKETS / key).unlink()
    return sorted(orphans)


def _kill_shim(pid: int, cid: str) -> None:
    """SIGKILL the shim ``pid`` of container ``cid`` (if it is still that shim), its
    children (the container's first process, if it lives) first."""
    proc = Path(f"/proc/{pid}")
    try:
        if f"\0{cid}\0".encode() not in (proc / "cmdline").read_bytes():
            return  # it ended, and the pid is another process's now
        children = (proc / "task" / str(pid) / "children").read_text().split()
    except OSError:
        return
    for child in [*map(int, children), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
