"""``pressrun demo --egress``: does the real balancer keep every origin within its egress
cap? (issue 10's last requirement: origins of different sizes, two issues of different
sizes, the real balancer with an algorithm; no origin above its cap for more than one
poll interval).

Set-up, all ``pressrun serve`` child processes on 127.0.0.1 (port 0, URLs read from
their start-up lines): origins whose egress caps differ (`EgressScenario.caps_mbps`,
told to the balancer as ``--capacity-mbps``), the same two issues published on every
origin, and a balancer (``--poll-interval-s``; the service's default algorithm unless
one is named). The origins run *without* a token bucket: a bucket would hold their
egress at the cap whatever the balancer does (and slow every client on the origin
instead), so the balancer's mistakes would not show. Here an origin overloaded by the
balancer really sends more than its cap, and the check sees it.

The load, in this process: clients arriving at seeded random times over
``arrive_s`` seconds, alternately for each issue, each behind an access link of
``client_bytes_per_s`` (a client-side token bucket on its reads, and small buffers so
loopback buffering cannot run far ahead of it: see `CLIENT_RCVBUF_BYTES`). A client asks the
balancer for a directive, downloads the file from the first origin named and checks
its length; a 503 is retried after its ``Retry-After`` (a refusal is what the
balancer should answer when every origin is full), an origin that fails is named in
``?failed=``. Clients give up at ``deadline_s``.

The check: each origin's windows are its own stats intervals (``/stats``
``recent_intervals``: start and end on its monotonic clock, bytes sent), read about
once per poll interval, so a late read on a loaded host loses no window and stretches
none; the egress of a window is its bytes over its length. A span above the cap is a
run of consecutive windows whose egress exceeds the origin's cap; the result holds
when no span is longer than one window (one poll interval): the balancer may learn of
an overload only at its next poll, but must not let it last.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pressrun.demo.processes import ServiceProcess
from pressrun.demo.testbed import OriginShape, origin_args, wait_for_directive
from pressrun.origin.core import TokenBucket

MIB = 1024 * 1024
#: Every byte between an origin's counter and a client's token bucket is a byte the
#: origin can count as sent ahead of the client's access link: when a process on the
#: loaded host stalls and resumes, the buffers it drains are refilled at once, a burst
#: that the check would see as egress above the cap though no transfer was added. The
#: buffers are kept small for that: the client's socket receive buffer, aiohttp's read
#: buffer (it reads the socket ahead of the client up to twice this) and the origins'
#: send buffer and sendfile chunk (their byte counters move once per chunk handed to the
#: kernel). With 64 KiB buffers and aiohttp's default 64 KiB read buffer, 7 clients of
#: the small scenario at a load average of 31 made 9.4 MB/s windows out of 7 MB/s.
CLIENT_RCVBUF_BYTES = 16 * 1024
#: the client reads this much at a time through its access-link bucket (also aiohttp's
#: read buffer size)
CLIENT_READ_BYTES = 16 * 1024
ORIGIN_SEND_BUFFER_KIB = 16
ORIGIN_CHUNK_KIB = 16


@dataclass(frozen=True, slots=True)
class EgressScenario:
    """What `run_egress_check` starts.

    caps_mbps: each origin's egress cap (Mbit/s), one origin each (origin-1, ...).
    issue_mib: the two (or more) issues' sizes, MiB.
    clients: how many clients; they arrive over ``arrive_s`` seconds (seeded).
    client_bytes_per_s: each client's access link.
    poll_interval_s: the balancer's poll interval, the origins' stats interval and the
        check's sampling window.
    deadline_s: a client not done this long after the first arrival gives up.
    algorithm: the balancer's ``--algorithm``; None: the service's default.
    seed: arrival times and the issues' bytes.
    """

    caps_mbps: tuple[float, ...] = (32.0, 64.0, 128.0)
    issue_mib: tuple[int, ...] = (8, 24)
    clients: int = 48
    arrive_s: float = 12.0
    client_bytes_per_s: float = 1e6
    poll_interval_s: float = 0.5
    deadline_s: float = 120.0
    algorithm: str | None = None
    seed: int = 10

    def __post_init__(self) -> None:
        if not self.caps_mbps or any(not (c > 0 and math.isfinite(c)) for c in self.caps_mbps):
            raise ValueError("every origin needs a positive egress cap")
        if len(self.issue_mib) < 1 or any(s < 1 for s in self.issue_mib):
            raise ValueError("every issue needs a size of at least 1 MiB")
        if self.clients < 1 or self.arrive_s < 0 or self.deadline_s <= 0:
            raise ValueError("clients >= 1, arrive_s >= 0, deadline_s > 0")
        if not self.client_bytes_per_s > 0 or not self.poll_interval_s > 0:
            raise ValueError("client_bytes_per_s and poll_interval_s must be positive")

    def issue_ids(self) -> list[str]:
        """The issues' ids, e.g. ``egress-1-8mib``."""
        return [f"egress-{n}-{mib}mib" for n, mib in enumerate(self.issue_mib, 1)]

    def origin_names(self) -> list[str]:
        """``origin-1``, ``origin-2``, ... in the order of ``caps_mbps``."""
        return [f"origin-{n}" for n in range(1, len(self.caps_mbps) + 1)]


#: the small version the test suite runs (tests/integration/test_egress.py): caps of 4
#: and 8 MB/s, 20 clients at 1 MB/s within 2 s, so that for a few seconds they ask for
#: more than both caps together and only refusals keep every origin within its cap
SMALL_SCENARIO = EgressScenario(
    caps_mbps=(32.0, 64.0),
    issue_mib=(3, 6),
    clients=20,
    arrive_s=2.0,
    deadline_s=40.0,
)


@dataclass(slots=True)
class ClientOutcome:
    """One client: its issue, when it arrived and finished, what it was told."""

    number: int
    issue_id: str
    arrived_s: float
    done_s: float | None = None
    origin: str | None = None
    refusals: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass(slots=True)
class OriginEgress:
    """One origin's sampled egress: windows (start, end, bytes), cap, per-issue totals."""

    name: str
    cap_bytes_per_s: float
    windows: list[tuple[float, float, int]] = field(default_factory=list)
    bytes_by_issue: dict[str, int] = field(default_factory=dict)
    transfers_by_issue: dict[str, int] = field(default_factory=dict)
    peak_active_by_issue: dict[str, int] = field(default_factory=dict)

    def rates(self) -> list[float]:
        """Bytes per second of each window."""
        return [b / (end - start) for start, end, b in self.windows if end > start]

    def longest_span_above_cap(self) -> tuple[float, int]:
        """(seconds, windows) of the longest run of consecutive windows above the cap."""
        best_s, best_n, run_s, run_n = 0.0, 0, 0.0, 0
        for start, end, sent in self.windows:
            length = end - start
            if length > 0 and sent / length > self.cap_bytes_per_s:
                run_s += length
                run_n += 1
                if run_s > best_s:
                    best_s, best_n = run_s, run_n
            else:
                run_s, run_n = 0.0, 0
        return best_s, best_n

    def windows_above_cap(self) -> int:
        """How many windows had egress above the cap."""
        return sum(1 for r in self.rates() if r > self.cap_bytes_per_s)

    def peak_ratio(self) -> float:
        """The highest window egress over the cap."""
        return max(self.rates(), default=0.0) / self.cap_bytes_per_s


@dataclass(slots=True)
class EgressResult:
    """What `run_egress_check` measured."""

    scenario: EgressScenario
    algorithm: str
    origins: list[OriginEgress]
    clients: list[ClientOutcome]
    wall_s: float

    def holds(self) -> bool:
        """No origin above its cap for more than one sampling window (poll interval)."""
        return all(o.longest_span_above_cap()[1] <= 1 for o in self.origins)

    def longest_span(self) -> tuple[str, float, int]:
        """(origin, seconds, windows) of the longest span above a cap of any origin."""
        spans = [(o.name, *o.longest_span_above_cap()) for o in self.origins]
        return max(spans, key=lambda s: (s[2], s[1]))

    def lines(self) -> list[str]:
        """The report, one line each."""
        sc = self.scenario
        out = [
            f"balancer algorithm {self.algorithm}, poll interval {sc.poll_interval_s:g} s; "
            f"{len(self.clients)} clients at {sc.client_bytes_per_s / 1e6:g} MB/s each, "
            f"arriving over {sc.arrive_s:g} s; issues "
            + ", ".join(f"{i} ({m} MiB)" for i, m in zip(sc.issue_ids(), sc.issue_mib, strict=True))
        ]
        for o in self.origins:
            span_s, span_n = o.longest_span_above_cap()
            per_issue = ", ".join(
                f"{i} {o.transfers_by_issue.get(i, 0)} transfers {b / 1e6:.1f} MB"
                for i, b in sorted(o.bytes_by_issue.items())
            )
            out.append(
                f"  {o.name}: cap {o.cap_bytes_per_s / 1e6:g} MB/s, peak window "
                f"{o.peak_ratio():.2f}x the cap, {o.windows_above_cap()} of "
                f"{len(o.windows)} windows above it, longest span {span_s:.2f} s "
                f"({span_n} window(s)); {per_issue or 'nothing sent'}"
            )
        done = [c for c in self.clients if c.done_s is not None]
        times = sorted(c.done_s - c.arrived_s for c in done if c.done_s is not None)
        refused = sum(c.refusals for c in self.clients)
        median = times[len(times) // 2] if times else float("nan")
        out.append(
            f"  clients: {len(done)} of {len(self.clients)} done within the deadline; "
            f"{refused} refusals (503, retried after Retry-After); download time "
            f"median {median:.1f} s, max {max(times, default=float('nan')):.1f} s; "
            f"wall {self.wall_s:.1f} s"
        )
        name, span_s, span_n = self.longest_span()
        verdict = "holds" if self.holds() else "DOES NOT HOLD"
        out.append(
            f"longest span any origin ran above its cap: {span_s:.2f} s ({span_n} "
            f"window(s), {name}) against the poll interval {sc.poll_interval_s:g} s: {verdict}"
        )
        return out


def _small_rcvbuf_socket(addr_info: Any) -> socket.socket:
    """aiohttp's socket factory for the clients: a small receive buffer, set before
    connecting (the window scale is fixed by the SYN)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF_BYTES)
    return sock


async def _client(
    http: Any,
    balancer_url: str,
    outcome: ClientOutcome,
    *,
    file_name: str,
    size_bytes: int,
    rate_bytes_per_s: float,
    give_up_at: float,
) -> None:
    """One client: directive, download at its access-link rate, retries (see module)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    failed: list[str] = []
    while loop.time() < give_up_at:
        query = f"?failed={','.join(failed)}" if failed else ""
        url = f"{balancer_url}/v1/issues/{outcome.issue_id}/directive{query}"
        try:
            async with http.get(url) as resp:
                if resp.status == 503:
                    outcome.refusals += 1
                    retry_s = float(resp.headers.get("Retry-After", "1"))
                    await asyncio.sleep(min(retry_s, max(0.0, give_up_at - loop.time())))
                    continue
                if resp.status != 200:
                    outcome.failures.append(f"directive: HTTP {resp.status}")
                    await asyncio.sleep(1.0)
                    continue
                directive = await resp.json()
            origin = directive["origins"][0]
        except (aiohttp.ClientError, OSError, ValueError, KeyError, IndexError) as err:
            outcome.failures.append(f"directive: {err!r}")
            await asyncio.sleep(1.0)
            continue
        bucket = TokenBucket(rate_bytes_per_s, CLIENT_READ_BYTES, now=loop.time())
        got = 0
        try:
            async with http.get(f"{origin['url']}/content/{outcome.issue_id}/{file_name}") as resp:
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message="not 200"
                    )
                while chunk := await resp.content.read(CLIENT_READ_BYTES):
                    got += len(chunk)
                    wait_s = bucket.take(len(chunk), now=loop.time())
                    if wait_s > 0:
                        await asyncio.sleep(wait_s)
        except (aiohttp.ClientError, OSError) as err:
            outcome.failures.append(f"{origin['name']}: {err!r}")
            failed = [*failed, origin["name"]]
            continue
        if got != size_bytes:
            outcome.failures.append(f"{origin['name']}: {got} of {size_bytes} bytes")
            failed = [*failed, origin["name"]]
            continue
        outcome.origin = origin["name"]
        outcome.done_s = loop.time()
        return


async def _sample(
    http: Any, urls: dict[str, str], egress: dict[str, OriginEgress], interval_s: float
) -> None:
    """Read every origin's /stats about once per ``interval_s`` until cancelled,
    appending the egress windows it closed since the last read.

    The windows are the origin's own stats intervals (``recent_intervals``: start and
    end on its monotonic clock, bytes sent), the same the balancer's polls see; a read
    that comes late (a loaded host) loses nothing and does not stretch a window.
    """
    loop = asyncio.get_running_loop()
    last_end: dict[str, float] = {}

    async def one(name: str, url: str) -> None:
        async with http.get(f"{url}/stats") as resp:
            doc = await resp.json()
        record = egress[name]
        seen = last_end.get(name, -math.inf)
        for window in doc["recent_intervals"]:
            start, end = float(window["start_s"]), float(window["end_s"])
            if end > seen:
                record.windows.append((start, end, int(window["bytes"])))
                seen = end
        last_end[name] = seen
        record.bytes_by_issue = {k: int(v) for k, v in doc["bytes_sent_by_issue"].items()}
        record.transfers_by_issue = {k: int(v) for k, v in doc["transfers_total_by_issue"].items()}
        for issue, n in doc["active_transfers_by_issue"].items():
            peak = record.peak_active_by_issue
            peak[issue] = max(peak.get(issue, 0), int(n))

    tick = loop.time()
    while True:
        await asyncio.gather(*(one(n, u) for n, u in urls.items()))
        tick += interval_s
        await asyncio.sleep(max(0.0, tick - loop.time()))


async def run_egress_check(
    scenario: EgressScenario,
    *,
    keep: Path | None = None,
    progress: bool = False,
    log_decisions: bool = False,
) -> EgressResult:
    """Start the origins and the balancer, publish the issues, run the clients while
    sampling the origins' egress; everything started is stopped on the way out.

    With ``keep``, every service's log is kept there (``NAME.log``); with
    ``log_decisions`` too, the balancer logs at DEBUG: every decision with what the
    algorithm saw of each origin, every status it received (docs/balancer.md)."""
    import aiohttp

    from pressrun.content.keys import generate_keypair
    from pressrun.content.publish import publish

    sc = scenario
    root = Path(tempfile.mkdtemp(prefix="pressrun-egress-")) if keep is None else keep
    content = root / "content"
    content.mkdir(parents=True, exist_ok=True)
    services: list[ServiceProcess] = []
    rng = random.Random(sc.seed)

    def say(text: str) -> None:
        if progress:
            print(text, flush=True)

    try:
        key, _ = generate_keypair(root / "publisher.key")
        sizes: dict[str, int] = {}
        for issue_id, mib in zip(sc.issue_ids(), sc.issue_mib, strict=True):
            source = root / "source" / f"{issue_id}.pdf"
            source.parent.mkdir(exist_ok=True)
            source.write_bytes(rng.randbytes(mib * MIB))
            sizes[issue_id] = mib * MIB
            await asyncio.to_thread(
                publish,
                source,
                issue_id=issue_id,
                title=f"Egress check {issue_id}",
                key_path=key,
                content_dir=content,
            )
        say(f"published {', '.join(sizes)}; starting {len(sc.caps_mbps)} origins ...")
        urls: dict[str, str] = {}
        for name, cap in zip(sc.origin_names(), sc.caps_mbps, strict=True):
            # told the cap, no token bucket: an overload shows as egress above the cap
            shape = OriginShape(name, capacity_mbps=cap, egress_cap_mbps=None)
            args = [
                *origin_args(shape, content, sc.poll_interval_s),
                "--send-buffer-kib",
                str(ORIGIN_SEND_BUFFER_KIB),
                "--sendfile-chunk-kib",
                str(ORIGIN_CHUNK_KIB),
            ]
            proc = await ServiceProcess.start(name, args, log_path=_log_path(keep, name))
            services.append(proc)
            urls[name] = proc.url
        args = [
            "balancer",
            "--origins",
            ",".join(f"{n}={u}" for n, u in urls.items()),
            "--port",
            "0",
            "--poll-interval-s",
            f"{sc.poll_interval_s:g}",
            "--seed",
            str(sc.seed),
        ]
        if sc.algorithm is not None:
            args += ["--algorithm", sc.algorithm]
        balancer = await ServiceProcess.start(
            "balancer",
            args,
            log_level="DEBUG" if log_decisions and keep is not None else "INFO",
            log_path=_log_path(keep, "balancer"),
        )
        services.append(balancer)
        for issue_id in sizes:
            await wait_for_directive(balancer.url, issue_id, timeout_s=20.0)
        egress = {
            name: OriginEgress(name, cap * 1e6 / 8)
            for name, cap in zip(sc.origin_names(), sc.caps_mbps, strict=True)
        }
        connector = aiohttp.TCPConnector(limit=0, socket_factory=_small_rcvbuf_socket)
        async with aiohttp.ClientSession(
            connector=connector, read_bufsize=CLIENT_READ_BYTES
        ) as http:
            async with http.get(f"{balancer.url}/v1/algorithms") as resp:
                algorithm = str((await resp.json())["current"])
            say(f"balancer up ({algorithm}); {sc.clients} clients arriving ...")
            loop = asyncio.get_running_loop()
            started = loop.time()
            arrivals = sorted(rng.uniform(0.0, sc.arrive_s) for _ in range(sc.clients))
            issues = sc.issue_ids()
            outcomes = [
                ClientOutcome(n + 1, issues[n % len(issues)], at) for n, at in enumerate(arrivals)
            ]
            sampler = asyncio.create_task(_sample(http, urls, egress, sc.poll_interval_s))

            async def arrive(outcome: ClientOutcome) -> None:
                await asyncio.sleep(outcome.arrived_s)
                outcome.arrived_s = loop.time() - started
                await _client(
                    http,
                    balancer.url,
                    outcome,
                    file_name=f"{outcome.issue_id}.pdf",
                    size_bytes=sizes[outcome.issue_id],
                    rate_bytes_per_s=sc.client_bytes_per_s,
                    give_up_at=started + sc.deadline_s,
                )
                if outcome.done_s is not None:
                    outcome.done_s -= started

            try:
                await asyncio.gather(*(arrive(o) for o in outcomes))
                # one more window, so the last transfers' bytes are in
                await asyncio.sleep(2 * sc.poll_interval_s)
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            wall = loop.time() - started
        return EgressResult(sc, algorithm, list(egress.values()), outcomes, wall)
    finally:
        for service in reversed(services):
            await service.stop()
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _log_path(keep: Path | None, name: str) -> Path | None:
    """Where a service's log is kept: ``KEEP/NAME.log``, or nowhere."""
    return None if keep is None else keep / f"{name}.log"


def parse_caps(text: str) -> tuple[float, ...]:
    """``32,64,128`` -> (32.0, 64.0, 128.0); ValueError names a bad item."""
    caps: list[float] = []
    for item in text.split(","):
        try:
            caps.append(float(item))
        except ValueError:
            raise ValueError(f"--egress-caps-mbps: {item!r} is not a number") from None
    return tuple(caps)
