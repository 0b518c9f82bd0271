"""bench/reader_swarm.py's figures: one half's outcomes (`Half`, `Desktop`), each page's
swarm trace (--trace-s) and what is printed of them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pressrun.demo.readers import BrowserReaders, ReaderOutcome

ISSUE = "bench-reader-swarm"
MB = 1_000_000


@dataclass
class Desktop:
    """One desktop peer's ``pressrun get --json`` outcome (or its error)."""

    number: int
    ok: bool
    seconds: float | None = None
    bytes_from_origins: int = 0
    bytes_from_peers: int = 0
    mode: str = "-"
    error: str | None = None
    #: the process's CPU seconds (user + system, /proc/<pid>/stat, last seen alive)
    cpu_s: float = 0.0


def process_cpu_s(pid: int) -> float | None:
    """A live process's user + system CPU seconds (/proc/<pid>/stat), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Half:
    """One half of the run: N readers and the desktop peers, peers on or off."""

    readers: int
    peers: bool
    size_bytes: int
    origin_bytes: int = 0
    outcomes: list[ReaderOutcome] = field(default_factory=list)
    desktops: list[Desktop] = field(default_factory=list)
    wall_s: float = 0.0
    load_before: str = ""
    load_after: str = ""
    #: the host's busy cores over the crowd (mean, /proc/stat) and the CPU seconds of
    #: this bench's Chromium processes (/proc/<pid>/stat): whether 2 cores carried it
    host_busy_cores: float = 0.0
    chromium_cpu_s: float = 0.0
    #: the same by Chromium process kind (renderer, network, gpu, browser, utility)
    chromium_by_kind: dict[str, float] = field(default_factory=dict)
    #: the busiest of Chromium's threads ("kind/thread name" -> CPU seconds)
    chromium_threads: dict[str, float] = field(default_factory=dict)
    #: this process's event loop, late by at most this much (it runs the reader service
    #: the pages load the app from, and Playwright's side of every page)
    loop_lag_max_s: float = 0.0
    #: --profile: the profiled pages' functions by self time (s), most first
    profile_top: list[tuple[str, float]] = field(default_factory=list)
    #: the readers' notices saying a peer was disconnected as silent
    silent_disconnects: int = 0
    #: --trace: each page's swarm samples (page index in opening order -> samples)
    trace: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: readers whose page loaded more than once: their row is the later page's (a
    #: resume of what the first page stored), not the crowd's download
    reloaded: list[int] = field(default_factory=list)
    #: --idle-s: Chromium's CPU seconds over that long once the crowd is done, the
    #: pages left open (sharing, in the peers half): what an open page costs a second
    idle_cpu_s: float | None = None
    idle_s: float = 0.0
    #: ... by "kind/thread name", the busiest
    idle_threads: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "peers" if self.peers else "origin-only"

    def ratio(self) -> float:
        """Origin bytes (the origins' own counters, all of them) / (N x size)."""
        return self.origin_bytes / (self.readers * self.size_bytes)

    def ratio_without_desktops(self) -> float:
        """The same, less what the desktop peers report they took from origins."""
        desktop = sum(d.bytes_from_origins for d in self.desktops)
        return (self.origin_bytes - desktop) / (self.readers * self.size_bytes)

    def readers_own_ratio(self) -> float:
        """The readers' own tally of bytes from origins / (N x size)."""
        own = sum(o.bytes_from_origins for o in self.outcomes)
        return own / (self.readers * self.size_bytes)

    def seconds(self) -> list[float]:
        return [o.seconds for o in self.outcomes if o.seconds is not None]

    def median_s(self) -> float | None:
        done = self.seconds()
        return statistics.median(done) if done else None

    def verified(self) -> int:
        return sum(o.verified for o in self.outcomes)

    def cpu_s_per_mb(self) -> float:
        """Chromium's CPU seconds over the crowd per MB the readers stored (N x size):
        what a MB costs a phone, its uploads in the peers half included."""
        return self.chromium_cpu_s / (self.readers * self.size_bytes / MB)

    def from_desktops(self) -> int:
        """Bytes the readers received from desktop peers (libtorrent, "-PR"), by their
        own swarm tally."""
        return sum(desktop_bytes(o) for o in self.outcomes)


#: a desktop peer's id prefix ("-PR0100-": pressrun.peer.session.PEER_ID_PREFIX) in
#: hex, as the reader's tally names its sources ("peer <id's first 12 bytes in hex>")
DESKTOP_SOURCE = "peer " + b"-PR".hex()


def desktop_bytes(outcome: ReaderOutcome) -> int:
    """What one reader received from desktop peers (its swarm tally, by source)."""
    by_source = ((outcome.swarm or {}).get("bytes") or {}).get("by_source") or {}
    return sum(
        int(v.get("received") or 0) for k, v in by_source.items() if k.startswith(DESKTOP_SOURCE)
    )


#: one page's swarm figures for the trace (--trace): bytes received by source kind
#: (web seeds, readers "-WW", desktops "-PR"), the web seeds' mode and offer, the peers
_TRACE = """(issue) => {
  const s = window.pressrun?.swarm?.()?.[issue];
  if (!s) return null;
  let ws = 0, ww = 0, pr = 0;
  for (const [k, v] of Object.entries(s.bytes?.by_source ?? {})) {
    if (k.startsWith('web seed')) ws += v.received;
    else if (k.startsWith('peer 2d5052')) pr += v.received;
    else ww += v.received;
  }
  return {t: performance.now() / 1000, state: s.state, all: s.web_seeds_all_pieces,
    offered: s.web_seed_offered, peers: s.peers, unchoking: s.peers_unchoking,
    desktops: s.desktop_peers, desktops_unchoking: s.desktop_peers_unchoking,
    requests: s.peer_requests, ws, ww, pr, up: s.uploaded_bytes};
}"""


class SwarmTrace:
    """--trace S: every S seconds, each open page's swarm figures (_TRACE), with the
    bench's clock (``at``, seconds from the crowd's start): where a reader's time went
    (which sources sent it bytes, when the web seeds offered what, desktops connected)."""

    def __init__(self, fleet: BrowserReaders, every_s: float) -> None:
        self.fleet, self.every_s = fleet, every_s
        self.samples: dict[int, list[dict[str, Any]]] = {}
        self.task: asyncio.Task[None] | None = None

    async def _follow(self, index: int, page: Any, start: float) -> None:
        # one loop per page: a page still loading (its evaluate waits) holds up no other
        loop = asyncio.get_running_loop()
        while True:
            at = loop.time() - start
            with contextlib.suppress(Exception):
                doc = await asyncio.wait_for(page.evaluate(_TRACE, ISSUE), 5.0)
                if doc is not None:
                    self.samples.setdefault(index, []).append({"at": round(at, 2), **doc})
            await asyncio.sleep(max(0.0, self.every_s - (loop.time() - start - at)))

    async def _watch(self) -> None:
        start = asyncio.get_running_loop().time()
        followed: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                for k, context in enumerate(list(self.fleet._contexts), 1):
                    if k not in followed and context.pages:
                        page = context.pages[0]
                        followed[k] = asyncio.create_task(self._follow(k, page, start))
                await asyncio.sleep(0.2)
        finally:
            for task in followed.values():
                task.cancel()

    def start(self) -> None:
        if self.every_s > 0:
            self.task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> dict[int, list[dict[str, Any]]]:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        return self.samples


def print_trace(half: Half, bin_s: float = 5.0) -> None:
    """Per page (opening order), per bin_s of the crowd: MB from web seeds / readers /
    desktops, the web seeds' mode (A: every piece, h: held back, -: not downloading)
    and the missing pieces they offer, desktops connected (unchoking), requests out to
    peers; each bin's last sample against the bin before."""
    if not half.trace:
        return
    print(
        f"trace (per {bin_s:g} s of the crowd: web seeds/readers/desktops MB, web seeds' "
        "mode and pieces offered, D desktops connected (unchoking), r requests to peers):"
    )
    for index, samples in sorted(half.trace.items()):
        last_of: dict[int, dict[str, Any]] = {}
        for sample in samples:
            last_of[int(sample["at"] // bin_s)] = sample
        cells = []
        before = {"ws": 0, "ww": 0, "pr": 0}
        for k in sorted(last_of):
            x = last_of[k]
            mode = "-" if x["state"] != "downloading" else ("A" if x["all"] else "h")
            cells.append(
                f"{k * bin_s:.0f}s {(x['ws'] - before['ws']) / MB:.1f}/"
                f"{(x['ww'] - before['ww']) / MB:.1f}/{(x['pr'] - before['pr']) / MB:.1f} "
                f"{mode}{x['offered']} D{x['desktops']}({x['desktops_unchoking']}) r{x['requests']}"
            )
            before = {key: x[key] for key in before}
            if x["state"] != "downloading" and k > min(last_of):
                break
        print(f"  page {index}: " + " | ".join(cells))


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def print_half(half: Half) -> None:
    """One half's figures and its readers' rows."""
    med = half.median_s()
    print(
        f"\n== N = {half.readers}, {half.name}: {half.verified()}/{half.readers} readers "
        f"verified, crowd done in {half.wall_s:.1f} s (load {half.load_before} -> "
        f"{half.load_after}); host {half.host_busy_cores:.2f} of {os.cpu_count()} cores "
        f"busy, Chromium {half.chromium_cpu_s:.0f} CPU s ("
        + ", ".join(f"{k} {v:.0f}" for k, v in half.chromium_by_kind.items())
        + f"), this process's loop late by up to "
        f"{half.loop_lag_max_s:.1f} s; silent peers disconnected "
        f"(in the readers' last notices): {half.silent_disconnects}"
    )
    print(
        "Chromium's busiest threads (CPU s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in half.chromium_threads.items())
    )
    print(
        f"Chromium CPU s per MB stored: {half.cpu_s_per_mb():.3f} "
        f"({half.chromium_cpu_s:.1f} s / {half.readers} x {half.size_bytes / MB:.1f} MB)"
    )
    if half.idle_cpu_s is not None:
        print(
            f"the pages left open {half.idle_s:.0f} s after the crowd (sharing, in the peers "
            f"half): Chromium {half.idle_cpu_s:.2f} CPU s, "
            f"{half.idle_cpu_s / half.idle_s / half.readers * 1000:.1f} CPU ms a page a "
            "second; its busiest threads (CPU s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in half.idle_threads.items())
        )
    print(
        f"origin bytes / (N x size): {half.ratio():.3f} (origins' counters, all: "
        f"{half.origin_bytes / MB:.1f} MB); without the desktop peers' "
        f"{sum(d.bytes_from_origins for d in half.desktops) / MB:.1f} MB: "
        f"{half.ratio_without_desktops():.3f}; the readers' own tally: "
        f"{half.readers_own_ratio():.3f}"
    )
    if half.reloaded:
        print(
            f"NOT A VALID MEDIAN: readers {half.reloaded} loaded their page again; their "
            "rows are the later page's resume of what the first one stored"
        )
    secs = half.seconds()
    if secs and med is not None:
        print(
            f"reader download time (the app's seconds): median {med:.1f} s, min "
            f"{min(secs):.1f}, max {max(secs):.1f}"
        )
    if half.peers:
        print(
            f"readers' bytes from desktop peers (libtorrent, their tally): "
            f"{half.from_desktops() / MB:.1f} MB"
        )
    print(
        f"{'reader':>6} {'mode':>7} {'s':>6} {'origins MB':>11} {'peers MB':>9} "
        f"{'desktops MB':>12}  ok"
    )
    for o in half.outcomes:
        if o.seconds is None:
            print(f"{o.number:>6} {'-':>7} {'-':>6} {'-':>11} {'-':>9} {'-':>12}  no: {o.error}")
        else:
            print(
                f"{o.number:>6} {o.mode:>7} {o.seconds:>6.1f} {o.bytes_from_origins / MB:>11.1f} "
                f"{o.bytes_from_peers / MB:>9.1f} {desktop_bytes(o) / MB:>12.1f}  "
                f"{'yes' if o.verified else 'NO'}"
            )
            if half.peers and o.mode == "origin" and o.notices:
                # why a reader with the peer path on took the origin path
                print(f"{'':>6} the app said: {' | '.join(o.notices)[:300]}")
    print_bytes(half)
    print_trace(half)
    loads = [o.swarm["load"] for o in half.outcomes if o.swarm and "load" in o.swarm]
    if loads:
        # the swarm's own cost counters (swarm-load.js), summed over the readers
        total = {k: sum(int(x.get(k) or 0) for x in loads) for k in loads[0]}
        print("the readers' swarm work: " + ", ".join(f"{k} {v}" for k, v in total.items()))
    if half.profile_top:
        print("the profiled pages' JavaScript, functions by self time (summed over the pages):")
        for name, spent in half.profile_top[:25]:
            print(f"  {spent:7.2f} s  {name}")
    for d in half.desktops:
        if d.ok:
            print(
                f"desktop {d.number}: {d.mode}, {d.seconds:.1f} s, "
                f"{d.bytes_from_origins / MB:.1f} MB from origins, "
                f"{d.bytes_from_peers / MB:.1f} MB from peers; {d.cpu_s:.1f} CPU s"
            )
        else:
            print(f"desktop {d.number}: failed: {d.error} ({d.cpu_s:.1f} CPU s)")


def print_bytes(half: Half) -> None:
    """What each reader's swarm received against what it needed (the app's ``swarm()``
    readout, swarm-bytes.js): wasted bytes by cause and source kind, webtorrent's
    hotswaps, and what the web seeds were asked for pieces a peer held."""
    rows = [(o.number, o.swarm["bytes"]) for o in half.outcomes if o.swarm and "bytes" in o.swarm]
    if not rows:
        return
    got = sum(b["received"] for _, b in rows)
    wasted = sum(b["wasted"] for _, b in rows)
    print(
        f"swarm bytes received by {len(rows)} readers: {got / MB:.1f} MB for "
        f"{len(rows)} x {half.size_bytes / MB:.1f} MB ({got / (len(rows) * half.size_bytes):.3f} "
        f"of their copies); wasted {wasted / MB:.1f} MB"
    )
    print(
        f"{'reader':>6} {'recv MB':>8} {'waste MB':>9} {'w.seed':>7} {'peers':>6}  "
        "wasted by cause (MB)                 hotswaps (ws>p ws>ws p>p p>ws)  web seed asked MB "
        "(peer held / lacked)"
    )
    for number, b in rows:
        causes = " ".join(f"{k} {v / MB:.1f}" for k, v in b["wasted_by_cause"].items() if v)
        h = b["hotswaps"]
        print(
            f"{number:>6} {b['received'] / MB:>8.1f} {b['wasted'] / MB:>9.1f} "
            f"{b['wasted_from_web_seeds'] / MB:>7.1f} {b['wasted_from_peers'] / MB:>6.1f}  "
            f"{causes or '-':<36} {h['web_seed_over_peer']:>4} {h['web_seed_over_web_seed']:>4} "
            f"{h['peer_over_peer']:>4} {h['peer_over_web_seed']:>4}   "
            f"{b['web_seed_asked_peer_held'] / MB:.1f} / {b['web_seed_asked_lacked'] / MB:.1f}"
        )
