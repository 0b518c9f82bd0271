"""``pressrun serve origin --workers N``: a supervisor and N forked worker processes.

The supervisor binds N listening sockets on the one port with ``SO_REUSEPORT`` (the
kernel spreads new connections over them by a hash of the addresses, as nginx's
``reuseport``), makes the shared egress bucket and a state directory
(:mod:`pressrun.origin.shared`), then forks one worker per socket. It keeps every
socket open itself, so when a worker dies (SIGKILL, a crash) the connections the kernel
queued on its socket wait there for its replacement instead of being refused; the
replacement is forked on the same socket within `REAP_EVERY_S` and carries on the
slot's totals. Transfers on the other workers are not touched.

SIGTERM / SIGINT to the supervisor: it passes SIGTERM on to every worker (each stops
as a single origin does: grace period, cut the rest, its own stop line), waits for them
and exits 0. A worker that dies within `EARLY_DEATH_S` of its start `GIVE_UP_AFTER`
times in a row stops the whole origin (exit 1): something is wrong with the set-up,
not with one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pressrun.origin.config import OriginConfig
from pressrun.origin.shared import SharedBucket, WorkerShare, new_bucket_memory

log = logging.getLogger("pressrun.origin")

#: where the state directory goes when it can: a memory-backed file system. Each worker
#: rewrites its snapshot (write, rename) up to 10 times a second; a rename over a file
#: on ext4 (/tmp here) costs about 0.7 ms (auto_da_alloc flushes the new data first),
#: on tmpfs 0.03 ms, and the worker's event loop waits for it
MEMORY_DIR = "/dev/shm"


def state_parent(memory_dir: str = MEMORY_DIR) -> str | None:
    """The parent of a supervisor's state directory: `memory_dir` when it is a
    writable directory, else None (the system's temporary directory)."""
    if os.path.isdir(memory_dir) and os.access(memory_dir, os.W_OK | os.X_OK):
        return memory_dir
    return None


#: how often the supervisor looks for dead workers
REAP_EVERY_S = 0.05
#: a worker dead this soon after its start is an early death
EARLY_DEATH_S = 2.0
#: this many early deaths of one slot in a row stop the origin
GIVE_UP_AFTER = 5
#: after the grace period, how long stopping workers get before SIGKILL
STOP_MARGIN_S = 10.0


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def bind_reuseport(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one port (``SO_REUSEPORT``); port 0 takes a free
    one for the first and the same for the others."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            # 1,000 clients connecting at once must not overflow aiohttp's 128
            sock.listen(4096)
            sock.setblocking(False)
            address = sock.getsockname()  # port 0 resolved: the others take the same
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


@dataclass(slots=True)
class _Slot:
    index: int
    pid: int = 0
    started: float = 0.0
    early_deaths: int = 0


class Supervisor:
    """Forks and replaces the workers of one origin (see the module docstring)."""

    def __init__(
        self,
        config: OriginConfig,
        workers: int,
        *,
        supernodes: str | None = None,
        supernode_host: str = "127.0.0.1",
    ) -> None:
        if workers < 2:
            raise ValueError("a supervisor runs two workers or more")
        self.socks = bind_reuseport(config.host, config.port, workers)
        port = int(self.socks[0].getsockname()[1])
        self.config = dataclasses.replace(config, port=port, name=config.name or f"origin-{port}")
        self.workers = workers
        self.supernodes = supernodes
        self.supernode_host = supernode_host
        self.state_dir = Path(tempfile.mkdtemp(prefix="pressrun-origin-", dir=state_parent()))
        cap = self.config.egress_cap_bytes_per_s
        # last refill 0: the first take refills it to the full burst
        self._bucket_memory = (
            new_bucket_memory(self.config.cap_burst_bytes, 0.0) if cap is not None else None
        )
        self.slots = [_Slot(i) for i in range(workers)]
        self._stopping = False
        self.replaced = 0

    @property
    def url(self) -> str:
        """Where the origin listens."""
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self.config.tls_cert is not None else "http"
        return f"{scheme}://{host}:{self.config.port}"

    def _share(self, slot: int) -> WorkerShare:
        bucket = None
        cap = self.config.egress_cap_bytes_per_s
        if cap is not None and self._bucket_memory is not None:
            bucket = SharedBucket(
                self._bucket_memory,
                self.state_dir / "bucket.lock",
                cap,
                self.config.cap_burst_bytes,
            )
        return WorkerShare(
            slot=slot,
            workers=self.workers,
            state_dir=self.state_dir,
            bucket=bucket,
            parent_pid=os.getpid(),
        )

    def _spawn(self, slot: _Slot) -> None:
        share = self._share(slot.index)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                for i, sock in enumerate(self.socks):
                    if i != slot.index:
                        sock.close()
                from pressrun.origin.cli import serve_until_signal

                asyncio.run(
                    serve_until_signal(
                        self.config,
                        supernodes=self.supernodes if slot.index == 0 else None,
                        supernode_host=self.supernode_host,
                        sock=self.socks[slot.index],
                        share=share,
                    )
                )
                code = 0
            except BaseException:
                log.exception("origin %s worker %d failed", self.config.name, slot.index)
            finally:
                for handler in logging.getLogger().handlers:
                    with contextlib.suppress(Exception):
                        handler.flush()
                os._exit(code)
        slot.pid = pid
        slot.started = time.perf_counter()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def _reap(self) -> bool:
        """Replace every worker that died; False when one keeps dying at start."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return True
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is None or self._stopping:
                continue
            how = (
                f"signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit {os.waitstatus_to_exitcode(status)}"
            )
            early = time.perf_counter() - slot.started < EARLY_DEATH_S
            slot.early_deaths = slot.early_deaths + 1 if early else 0
            if slot.early_deaths >= GIVE_UP_AFTER:
                log.error(
                    "origin %s: worker %d died %d times within %.0f s of its start (%s); stopping",
                    self.config.name,
                    slot.index,
                    slot.early_deaths,
                    EARLY_DEATH_S,
                    how,
                )
                return False
            log.warning(
                "origin %s: worker %d (pid %d) died (%s); replacing it",
                self.config.name,
                slot.index,
                pid,
                how,
            )
            if early:
                time.sleep(0.2 * slot.early_deaths)  # no hot loop of failing forks
            self.replaced += 1
            self._spawn(slot)

    def run(self) -> int:
        """Fork the workers, replace the dead, stop on SIGTERM/SIGINT; the exit code."""
        old = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        cap = self.config.egress_cap_mbps
        try:
            for slot in self.slots:
                self._spawn(slot)
            log.info(
                "origin %s serving %s on %s (capacity %g Mbit/s, egress cap %s, %d workers)",
                self.config.name,
                self.config.content_dir,
                self.url,
                self.config.capacity_mbps,
                f"{cap:g} Mbit/s" if cap is not None else "none",
                self.workers,
            )
            code = 0
            while not self._stopping:
                if not self._reap():
                    code = 1
                    break
                time.sleep(REAP_EVERY_S)
            if self._stopping:
                log.info(
                    "origin %s: signal received, stopping %d workers (grace %.1f s)",
                    self.config.name,
                    self.workers,
                    self.config.shutdown_grace_s,
                )
            self._stop_workers()
            return code
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            for sock in self.socks:
                sock.close()
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop_workers(self) -> None:
        live = {s.pid for s in self.slots if s.pid}
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.perf_counter() + self.config.shutdown_grace_s + STOP_MARGIN_S
        while live and time.perf_counter() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                live.clear()  # every child reaped
                break
            if pid:
                live.discard(pid)
                continue
            time.sleep(REAP_EVERY_S)
        for pid in live:
            log.warning("origin %s: worker pid %d did not stop; killed", self.config.name, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
