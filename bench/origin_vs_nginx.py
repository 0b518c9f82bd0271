"""pressrun's origin against nginx, same files, same load, same run: whole files and
the crowd's byte ranges at 20, 200 and 1,000 concurrent connections.

Generates an 8 MB file (whole-file downloads) and a 64 MB file (ranges) in a temporary
content directory, starts ``pressrun serve origin`` (its own process tree: a supervisor
and ``--workers``, default one per CPU; no egress cap) and ``/usr/sbin/nginx``
(generated config in a temp prefix: ``worker_processes auto``, sendfile on, tcp_nopush
on, access_log off: the origin logs nothing per request at its default INFO level
either), warms the page cache, then for each pattern and each connection count runs
Debian's ``wrk`` (C, epoll; one thread per CPU) for --seconds against each server in
turn, --rounds times, alternating servers so a slow patch of the shared machine hits
both alike:

- ``whole``: GET of the whole 8 MB file, keep-alive;
- ``ranges``: GET with ``Range: bytes=a-b`` of a random 128 KiB to 1 MiB span at a
  random offset of the 64 MB file (a web seed's piece or a few; the wrk Lua script
  below), every answer must be 206.

Throughput = bytes wrk read / wrk's duration; CPU = user + system seconds of the
server's whole process tree during the round (psutil), per GB read, with its system
(kernel) part beside it; beside it wrk's own CPU per GB and how busy the whole machine
was. The client shares the 2 cores: when the
machine is near 100% busy, throughput is what the cores give divided by (server + wrk)
CPU seconds per GB, so the server that costs more per byte also starves its client;
the summary prints that sum for both. Prints per round
and then, per point, the medians and the ratios ours/nginx, with ``/proc/loadavg``.
Targets (issue 32): throughput ratio >= 1.0, CPU per GB ratio <= 2.0.

The client shares the machine's cores with the server, identically for both servers.

    flock /work/heavy.lock .venv/bin/python bench/origin_vs_nginx.py \\
        [--connections 20,200,1000] [--patterns whole,ranges] [--rounds 3] [--seconds 5]
        [--workers N] [--cap-mbps 80,800,4000 (the cap check; "" skips it)]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PRESSRUN = ROOT / ".venv" / "bin" / "pressrun"
NGINX = "/usr/sbin/nginx"
WRK = "/usr/bin/wrk"
ISSUE = "bench-issue"
FILE = "bench.bin"  # the cap check's file
WHOLE_FILE = "whole.bin"
RANGE_FILE = "ranges.bin"
WHOLE_BYTES = 8_000_000
RANGE_FILE_BYTES = 64 * 1024 * 1024

#: wrk's script: each request a random span of 128 KiB .. 1 MiB at a random offset;
#: done() prints the totals this bench parses (bytes, requests, errors)
WRK_SCRIPT = """
local size = tonumber(os.getenv("BENCH_FILE_BYTES") or "0")
local path = os.getenv("BENCH_PATH")
local ranges = os.getenv("BENCH_RANGES") == "1"
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
end
function init(args)
  math.randomseed(seed * 7919 + os.time())
end
function request()
  if ranges then
    local len = math.random(131072, 1048576)
    local first = math.random(0, size - len)
    return wrk.format("GET", path, {["Range"] = "bytes=" .. first .. "-" .. (first + len - 1)})
  end
  return wrk.format("GET", path)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH bytes=%d requests=%d duration_us=%d connect=%d read=%d "
    .. "write=%d status=%d timeout=%d p50_us=%d p99_us=%d\\n", summary.bytes, summary.requests,
    summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_file(path: Path, size_bytes: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        left = size_bytes
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def wait_http(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        rc = subprocess.call(
            ["curl", "-s", "-f", "-o", "/dev/null", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if rc == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def start_origin(
    content: Path, log_level: str, extra: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [
            str(PRESSRUN),
            "--log-level",
            log_level,
            "serve",
            "origin",
            "--content",
            str(content),
            "--port",
            "0",
            "--capacity-mbps",
            "10000",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    deadline = time.perf_counter() + 15
    seen = b""
    while time.perf_counter() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            seen += line
            m = re.search(rb"on (http://127\.0\.0\.1:\d+)", line)
            if m:
                # keep draining stderr so the origin never blocks on a full pipe
                drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
                del drain
                return proc, m.group(1).decode()
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"origin did not start: {seen.decode(errors='replace')}")


def start_nginx(content: Path, workdir: Path, workers: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    conf = workdir / "nginx.conf"
    conf.write_text(
        f"""
user root;
worker_processes {workers};
worker_rlimit_nofile 20000;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 65;
    keepalive_requests 1000000;
    default_type application/octet-stream;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /content/ {{ alias {content}/; }}
    }}
}}
"""
    )
    proc = subprocess.Popen(
        [NGINX, "-p", str(workdir), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/content/{ISSUE}/{WHOLE_FILE}")
    return proc, url


@dataclass(frozen=True)
class Round:
    """One wrk run against one server."""

    bytes_read: int
    seconds: float
    requests: int
    errors: int
    cpu_s: float
    p99_ms: float
    #: wrk's own user + system seconds (the client shares the 2 cores with the server)
    client_cpu_s: float = 0.0
    #: share of the whole machine's CPU time that was busy during the round (0..1)
    host_busy: float = 0.0
    #: of cpu_s, the server's system (kernel) seconds: sendfile(2), TCP, the
    #: loopback's delivery to wrk; the rest is its user-space work
    sys_s: float = 0.0

    @property
    def rate(self) -> float:
        """Bytes per second."""
        return self.bytes_read / self.seconds

    @property
    def cpu_per_gb(self) -> float:
        """Server CPU seconds per GB read."""
        return self.cpu_s / (self.bytes_read / 1e9)

    @property
    def sys_per_gb(self) -> float:
        """Server system (kernel) CPU seconds per GB read."""
        return self.sys_s / (self.bytes_read / 1e9)

    @property
    def client_cpu_per_gb(self) -> float:
        """wrk's CPU seconds per GB read."""
        return self.client_cpu_s / (self.bytes_read / 1e9)


def loadavg() -> str:
    """The first three fields of /proc/loadavg."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wrk_round(
    url: str, pid: int, pattern: str, connections: int, seconds: float, script: Path
) -> Round:
    """wrk with `connections` connections for `seconds` against one server."""
    ranges = pattern == "ranges"
    env = dict(
        os.environ,
        BENCH_PATH=f"/content/{ISSUE}/{RANGE_FILE if ranges else WHOLE_FILE}",
        BENCH_RANGES="1" if ranges else "0",
        BENCH_FILE_BYTES=str(RANGE_FILE_BYTES if ranges else WHOLE_BYTES),
    )
    threads = min(connections, os.cpu_count() or 1)
    before, sys_before = cpu_seconds(pid)
    client_before = _children_cpu_s()
    host_before = psutil.cpu_times()
    out = subprocess.run(
        [WRK, f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "30s",
         "-s", str(script), url],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    after, sys_after = cpu_seconds(pid)
    cpu, sys_s = after - before, sys_after - sys_before
    client_cpu = _children_cpu_s() - client_before
    host_after = psutil.cpu_times()
    idle = (host_after.idle + host_after.iowait) - (host_before.idle + host_before.iowait)
    total = sum(host_after) - sum(host_before)
    m = re.search(r"BENCH (.*)", out)
    if m is None:
        raise RuntimeError(f"wrk printed no totals: {out}")
    fields = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    errors = sum(fields[k] for k in ("connect", "read", "write", "status", "timeout"))
    return Round(
        bytes_read=fields["bytes"],
        seconds=fields["duration_us"] / 1e6,
        requests=fields["requests"],
        errors=errors,
        cpu_s=cpu,
        p99_ms=fields["p99_us"] / 1e3,
        client_cpu_s=client_cpu,
        host_busy=1.0 - idle / total if total > 0 else 0.0,
        sys_s=sys_s,
    )


def _children_cpu_s() -> float:
    """User + system seconds of this process's waited-for children (wrk, curl)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU seconds of a process and its children (nginx's workers),
    and of those the system seconds."""
    proc = psutil.Process(pid)
    total = system = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
            system += times.system
    return total, system


def measure(
    servers: dict[str, tuple[str, int]], args: argparse.Namespace, script: Path
) -> list[str]:
    """Every pattern at every connection count, rounds alternating between servers;
    returns the summary lines (medians and ratios)."""
    for url, pid in servers.values():  # warm-up: page cache, code paths
        for pattern in args.patterns.split(","):
            wrk_round(url, pid, pattern, 4, 1.0, script)
    summary = []
    for pattern in args.patterns.split(","):
        for connections in [int(c) for c in args.connections.split(",")]:
            rounds: dict[str, list[Round]] = {label: [] for label in servers}
            for i in range(args.rounds):
                # who goes first alternates too: a slow patch starting mid-round
                # does not always hit the same server
                order = list(servers.items())
                for label, (url, pid) in order if i % 2 == 0 else order[::-1]:
                    r = wrk_round(url, pid, pattern, connections, args.seconds, script)
                    rounds[label].append(r)
                    print(
                        f"  {pattern:>6} c={connections:<5} round {i + 1} {label:>15}: "
                        f"{r.rate / 1e6:8.1f} MB/s, {r.cpu_per_gb:.3f} CPU-s/GB "
                        f"(sys {r.sys_per_gb:.3f}), "
                        f"wrk {r.client_cpu_per_gb:.3f} CPU-s/GB, host {100 * r.host_busy:.0f}% "
                        f"busy, {r.requests} requests, {r.errors} errors, p99 {r.p99_ms:.1f} ms "
                        f"[load {loadavg()}]",
                        flush=True,
                    )
            ours, theirs = rounds["pressrun origin"], rounds["nginx"]
            ours_rate = statistics.median(r.rate for r in ours)
            theirs_rate = statistics.median(r.rate for r in theirs)
            ours_cpu = statistics.median(r.cpu_per_gb for r in ours)
            theirs_cpu = statistics.median(r.cpu_per_gb for r in theirs)
            ours_sys = statistics.median(r.sys_per_gb for r in ours)
            theirs_sys = statistics.median(r.sys_per_gb for r in theirs)
            ours_wrk = statistics.median(r.client_cpu_per_gb for r in ours)
            theirs_wrk = statistics.median(r.client_cpu_per_gb for r in theirs)
            errors = sum(r.errors for r in ours), sum(r.errors for r in theirs)
            line = (
                f"{pattern:>6} c={connections:<5} ours {ours_rate / 1e6:8.1f} MB/s "
                f"{ours_cpu:.3f} CPU-s/GB | nginx {theirs_rate / 1e6:8.1f} MB/s "
                f"{theirs_cpu:.3f} CPU-s/GB | throughput {ours_rate / theirs_rate:.2f}x, "
                f"CPU/GB {ours_cpu / theirs_cpu:.2f}x | server+wrk CPU-s/GB "
                f"{ours_cpu + ours_wrk:.3f} / {theirs_cpu + theirs_wrk:.3f} | "
                f"server sys CPU-s/GB {ours_sys:.3f} / {theirs_sys:.3f} | "
                f"errors {errors[0]}/{errors[1]} "
                f"[load {loadavg()}]"
            )
            print(line, flush=True)
            summary.append(line)
    return summary


def cap_round(url: str, clients: int, bytes_per_client: int) -> float:
    """`clients` curls at once, each fetching the first `bytes_per_client` bytes with a
    Range request; aggregate bytes per second over the round's wall time."""
    cmd = [
        "curl", "-s", "-f", "-r", f"0-{bytes_per_client - 1}", "-o", "/dev/null",
        "-w", "%{size_download}", f"{url}/content/{ISSUE}/{FILE}",
    ]  # fmt: skip
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for _ in range(clients)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    for p, out in zip(procs, outs, strict=True):
        if p.returncode != 0 or int(out or b"0") != bytes_per_client:
            raise RuntimeError(f"a capped download failed: rc={p.returncode} got {out!r}")
    return clients * bytes_per_client / wall


def check_caps(content: Path, args: argparse.Namespace, size_bytes: int) -> None:
    """Aggregate throughput of --clients concurrent downloads under each egress cap."""
    for cap_mbps in [float(c) for c in args.cap_mbps.split(",") if c]:
        cap = cap_mbps * 1e6 / 8
        per_client = min(size_bytes, int(cap * args.cap_seconds / args.clients))
        extra = ["--egress-cap-mbps", f"{cap_mbps:g}", *args.origin_args.split()]
        origin, url = start_origin(content, args.origin_log_level, extra)
        try:
            wait_http(f"{url}/healthz")
            rates = [cap_round(url, args.clients, per_client) for _ in range(3)]
        finally:
            stop(origin)
        rate = statistics.median(rates)
        print(
            f"egress cap {cap_mbps:g} Mbit/s = {cap / 1e6:.2f} MB/s: measured "
            f"{rate / 1e6:.2f} MB/s ({rate / cap:.3f} of the cap; {args.clients} clients, "
            f"{args.clients * per_client / 1e6:.0f} MB per round, median of 3)",
            flush=True,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", default="20,200,1000", help="comma-separated")
    parser.add_argument("--patterns", default="whole,ranges", help="whole, ranges or both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of a wrk run")
    parser.add_argument("--workers", default="", help="the origin's --workers (default: its own)")
    parser.add_argument("--nginx-workers", default="auto", help="nginx worker_processes")
    parser.add_argument("--origin-log-level", default="INFO")
    parser.add_argument(
        "--cap-mbps",
        default="80,800,4000",
        help="egress caps (Mbit/s, comma-separated) to check; empty: skip",
    )
    parser.add_argument("--clients", type=int, default=20, help="clients of the cap check")
    parser.add_argument("--cap-seconds", type=float, default=4.0, help="length of a cap round")
    parser.add_argument("--skip-nginx", action="store_true", help="only check the caps")
    parser.add_argument(
        "--origin-args", default="", help="extra flags for pressrun serve origin (one string)"
    )
    args = parser.parse_args()
    if shutil.which("curl") is None or not os.path.exists(NGINX) or not os.path.exists(WRK):
        print("needs curl, /usr/sbin/nginx and /usr/bin/wrk (scripts/setup-system.sh)")
        return 2
    extra = args.origin_args.split()
    if args.workers:
        extra += ["--workers", args.workers]
    with tempfile.TemporaryDirectory(prefix="pressrun-bench-origin-") as tmp:
        tmpdir = Path(tmp)
        content = tmpdir / "content"
        make_file(content / ISSUE / WHOLE_FILE, WHOLE_BYTES)
        make_file(content / ISSUE / RANGE_FILE, RANGE_FILE_BYTES)
        script = tmpdir / "bench.lua"
        script.write_text(WRK_SCRIPT)
        print(
            f"wrk, {args.rounds} rounds of {args.seconds:g} s per point, {os.cpu_count()} CPUs, "
            f"connections {args.connections}, patterns {args.patterns} [load {loadavg()}]",
            flush=True,
        )
        if args.cap_mbps:
            make_file(content / ISSUE / FILE, 64_000_000)
            check_caps(content, args, 64_000_000)
        if args.skip_nginx:
            return 0
        origin, origin_url = start_origin(content, args.origin_log_level, extra)
        try:
            wait_http(f"{origin_url}/healthz")
            nginx, nginx_url = start_nginx(content, tmpdir / "nginx", args.nginx_workers)
            try:
                summary = measure(
                    {
                        "pressrun origin": (origin_url, origin.pid),
                        "nginx": (nginx_url, nginx.pid),
                    },
                    args,
                    script,
                )
            finally:
                stop(nginx)
        finally:
            stop(origin)
    print(
        f"medians of {args.rounds} rounds (origin {args.origin_args or 'defaults'}"
        f"{', --workers ' + args.workers if args.workers else ''}; nginx worker_processes "
        f"{args.nginx_workers}); targets: throughput >= 1.00x, CPU/GB <= 2.00x"
    )
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
