"""Whole-file download throughput: pressrun's origin against nginx, same file, same load.

Generates a 64 MB file in a temporary content directory, starts ``pressrun serve origin``
(its own process, no egress cap) and ``/usr/sbin/nginx`` (generated config in a temp
prefix: sendfile on, access_log off, daemon off, one loopback port), warms the page
cache, then for each round starts N concurrent ``curl`` processes (default 20) that each
download the whole file to /dev/null, and times the round from the first spawn to the
last exit with time.perf_counter. Throughput of a round = N * file size / wall time.
Prints the median of --rounds rounds for each server and the ratio ours/nginx.
Target: ratio >= 0.7.

curl (C, one process per client) is the load generator, so the client side costs far
less CPU than a Python client would; on a 2-core machine clients and server still share
the cores, identically for both servers.

    .venv/bin/python bench/origin_vs_nginx.py [--clients 20] [--rounds 3] [--size-mb 64]
        [--nginx-workers auto] [--origin-log-level INFO]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PRESSRUN = ROOT / ".venv" / "bin" / "pressrun"
NGINX = "/usr/sbin/nginx"
ISSUE = "bench-issue"
FILE = "bench.bin"


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
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 65;
    default_type application/octet-stream;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    server {{
        listen 127.0.0.1:{port};
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
    wait_http(f"{url}/content/{ISSUE}/{FILE}")
    return proc, url


def one_round(url: str, clients: int, downloads: int, size_bytes: int) -> float:
    """`clients` curls at once, each downloading the file `downloads` times over one
    keep-alive connection; bytes per second over the round's wall time."""
    file_url = f"{url}/content/{ISSUE}/{FILE}"
    cmd = ["curl", "-s", "-f", "-w", "%{size_download}\\n"]
    for _ in range(downloads):
        cmd += ["-o", "/dev/null", file_url]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for _ in range(clients)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    for p, out in zip(procs, outs, strict=True):
        sizes = [int(x) for x in out.split()]
        if p.returncode != 0 or sizes != [size_bytes] * downloads:
            raise RuntimeError(f"a download failed: rc={p.returncode} got {sizes} bytes")
    return clients * downloads * size_bytes / wall


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (nginx's workers)."""
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def measure(
    servers: dict[str, tuple[str, int]], args: argparse.Namespace, size_bytes: int
) -> dict[str, tuple[float, float]]:
    """Median throughput of each server and its CPU seconds per GB sent; rounds
    alternate between servers, so a slow patch of the machine hits both alike."""
    for url, _ in servers.values():
        one_round(url, 2, 1, size_bytes)  # warm-up: page cache, code paths
    rates: dict[str, list[float]] = {label: [] for label in servers}
    cpu: dict[str, float] = dict.fromkeys(servers, 0.0)
    for i in range(args.rounds):
        for label, (url, pid) in servers.items():
            before = cpu_seconds(pid)
            rate = one_round(url, args.clients, args.downloads_per_client, size_bytes)
            cpu[label] += cpu_seconds(pid) - before
            rates[label].append(rate)
            print(f"  round {i + 1} {label:>16}: {rate / 1e6:8.1f} MB/s", flush=True)
    gigabytes = args.rounds * args.clients * args.downloads_per_client * size_bytes / 1e9
    return {label: (statistics.median(r), cpu[label] / gigabytes) for label, r in rates.items()}


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
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--downloads-per-client", type=int, default=3, help="whole-file downloads per curl"
    )
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--nginx-workers", default="auto", help="nginx worker_processes")
    parser.add_argument("--origin-log-level", default="INFO")
    parser.add_argument(
        "--cap-mbps",
        default="80,800,4000",
        help="egress caps (Mbit/s, comma-separated) to check; empty: skip",
    )
    parser.add_argument("--cap-seconds", type=float, default=4.0, help="length of a cap round")
    parser.add_argument("--skip-nginx", action="store_true", help="only check the caps")
    parser.add_argument(
        "--origin-args", default="", help="extra flags for pressrun serve origin (one string)"
    )
    args = parser.parse_args()
    if shutil.which("curl") is None or not os.path.exists(NGINX):
        print("needs curl and /usr/sbin/nginx", file=sys.stderr)
        return 2
    size_bytes = args.size_mb * 1_000_000
    with tempfile.TemporaryDirectory(prefix="pressrun-bench-origin-") as tmp:
        tmpdir = Path(tmp)
        content = tmpdir / "content"
        make_file(content / ISSUE / FILE, size_bytes)
        print(
            f"{args.clients} concurrent curl clients x {args.downloads_per_client} downloads "
            f"x {args.size_mb} MB, "
            f"{args.rounds} rounds, {os.cpu_count()} CPUs",
            flush=True,
        )
        if args.cap_mbps:
            check_caps(content, args, size_bytes)
        if args.skip_nginx:
            return 0
        origin, origin_url = start_origin(content, args.origin_log_level, args.origin_args.split())
        try:
            wait_http(f"{origin_url}/healthz")
            nginx, nginx_url = start_nginx(content, tmpdir / "nginx", args.nginx_workers)
            try:
                results = measure(
                    {
                        "pressrun origin": (origin_url, origin.pid),
                        "nginx": (nginx_url, nginx.pid),
                    },
                    args,
                    size_bytes,
                )
            finally:
                stop(nginx)
        finally:
            stop(origin)
    (ours, ours_cpu), (theirs, theirs_cpu) = results["pressrun origin"], results["nginx"]
    print(
        f"pressrun origin: {ours / 1e6:8.1f} MB/s (median of {args.rounds}), "
        f"{ours_cpu:.3f} CPU-s per GB sent"
    )
    print(
        f"nginx:           {theirs / 1e6:8.1f} MB/s (median of {args.rounds}, "
        f"worker_processes {args.nginx_workers}), {theirs_cpu:.3f} CPU-s per GB sent"
    )
    print(f"ratio ours/nginx: {ours / theirs:.2f} (target >= 0.7)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
