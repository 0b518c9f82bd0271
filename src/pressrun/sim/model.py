"""The server and client model: fluid rates, CPU/RAM costs, cache effect, overload, crash.

A server's clients share its outbound link and its CPU as a fluid (no per-packet or
per-tick work per client). Two kinds of transfer:

- a **stream** (the paper's workload) wants its asset's bitrate, no more, for the
  asset's duration (real-time playback);
- a **download** (pressrun's workload: an issue of F bytes fetched as fast as it can
  be) wants as much as the client's access link takes (`access_bytes_per_s`).

Clients with the same cap (a stream's bitrate, a download's access rate) form one
*flow class*; a server has a handful of them. The link is shared max-min fairly
(water-filling, as TCP flows share a bottleneck): classes whose cap is below the fair
level get their cap, the others share the rest equally. Then the CPU: a client costs
`cpu_i` cores at the rate of a 100 kB/s stream (the paper's per-client cost; a stream
costs `cpu_i` at its bitrate, a download `cpu_i` per 100 kB/s it receives), higher
while it starts up and when the asset is not yet in the server's cache (the first
transfer reads the disk). If the rates need more cores than the background load
leaves, every rate is scaled down by the same factor. For one bitrate this is the
earlier model's ``phi = min(1, link / sum(bitrate), cpu_free / sum(cpu))`` exactly.
Rates are recomputed only when the server's client set or background changes.

Per class the server keeps two integrals, so nothing is done per client while it
plays: ``D(t) = integral of rate dt`` (bytes each member received) and, for streams,
``U(t) = integral of (1 - rate / bitrate) dt`` (stall). A stream's stall on a server
is ``U(now) - U(joined)``; a client whose total stall exceeds the scenario's tolerance
fails (the paper's "sub-par delivery"). A download ends when ``D`` reaches its join
value plus the bytes it still needs: the members of a class all receive the same
``D``, so a heap of those targets gives the next completion on the server (one event,
re-planned when the rates change). A download succeeds when it ends within its
asset's deadline of the first request.

RAM: the idle share, plus a fixed amount per client, plus ``(1 - rate / cap) *
ram_backlog_bytes`` per client: data a client cannot receive fast enough piles up in
kernel socket buffers, which is how network overload runs a small machine out of
memory.

Crash (machine C of 000_9aae53f3113e9bd8.txt, section 8: the kernel runs out of memory
under high network load): when RAM in use stays at or above `crash_ram_fraction` for
`crash_after_s`, the server drops every client and answers nothing until
`recover_after_s` later.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from pressrun.balancer.events import OriginStatus


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One server of a scenario (every field is documented in docs/simulator.md)."""

    name: str
    cores: float = 8.0
    cpu_idle: float = 0.01
    cpu_noise: float = 0.0
    cpu_per_client_cores: float = 0.003
    ram_bytes: float = 16 * 2**30
    ram_idle: float = 0.03
    ram_per_client_bytes: float = 2**20
    ram_backlog_bytes: float = 0.0
    link_bytes_per_s: float = 125e6
    told_bytes_per_s: float | None = None
    startup_cpu_factor: float = 1.0
    startup_s: float = 3.0
    cache_miss_cpu_factor: float = 1.5
    crash_ram_fraction: float | None = None
    crash_after_s: float = 2.0
    recover_after_s: float = 400.0
    assets: tuple[str, ...] | None = None
    cached: tuple[str, ...] = ()
    weight: float = 1.0

    @property
    def told(self) -> float:
        """The link capacity the balancer is told (the true one unless misconfigured)."""
        return self.link_bytes_per_s if self.told_bytes_per_s is None else self.told_bytes_per_s


@dataclass(frozen=True, slots=True)
class AssetSpec:
    """An issue: a stream played at `bitrate_bytes_per_s` for `duration_s`, or a download.

    A download (`download_bytes` set) is fetched as fast as the client's link allows and
    succeeds when it ends within `deadline_s` of the client's first request.
    """

    name: str
    bitrate_bytes_per_s: float = 100_000.0
    duration_s: float = 600.0
    popularity: float = 1.0
    download_bytes: float | None = None
    deadline_s: float = 600.0
    #: what requests for it are (``small``, ``crowd``, ``catalogue``; None: unclassed),
    #: told to the balancer and the origins when the scenario has classes
    request_class: str | None = None

    @property
    def is_download(self) -> bool:
        """True for a download, False for a stream."""
        return self.download_bytes is not None

    @property
    def size_bytes(self) -> float:
        """Bytes a complete play-through or download transfers."""
        if self.download_bytes is not None:
            return self.download_bytes
        return self.bitrate_bytes_per_s * self.duration_s

    @property
    def need_bytes_per_s(self) -> float:
        """The rate one transfer needs to succeed: the bitrate, or size over deadline."""
        if self.download_bytes is not None:
            return self.download_bytes / self.deadline_s
        return self.bitrate_bytes_per_s


#: the rate at which a client's `cpu_per_client_cores` is counted (the paper's stream)
CPU_REFERENCE_BYTES_PER_S = 100_000.0


class ClientState(Enum):
    """Where a client is in its life."""

    ASKING = "asking"
    CONNECTING = "connecting"
    PLAYING = "playing"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class Client:
    """One request of the workload: one complete play-through or download of one asset."""

    cid: int
    asset: AssetSpec
    requested_at: float
    waiting_since: float = 0.0
    dropped_at: float | None = None
    state: ClientState = ClientState.ASKING
    server: str | None = None
    first_server: str | None = None
    first_byte_at: float | None = None
    joined_u: float = 0.0
    joined_at: float = 0.0
    stall_s: float = 0.0
    played_s: float = 0.0
    end_at: float = 0.0
    ended_at: float | None = None
    cpu_cores: float = 0.0
    failed: set[str] = field(default_factory=set)
    failovers: int = 0
    refusals: int = 0
    epoch: int = 0
    reason: str = ""
    access_bytes_per_s: float = float("inf")
    received_bytes: float = 0.0
    joined_d: float = 0.0
    flow: FlowClass | None = None
    #: it was sent to a server that does not hold its asset (never, by the core's rule)
    non_holder: bool = False
    #: a start the balancer reserved for it (`NoDirective.reservation`), named when it
    #: asks again; reserved starts it was given
    reservation: str | None = None
    reserved: int = 0

    @property
    def cap_bytes_per_s(self) -> float:
        """The most this client takes: a stream's bitrate, a download's access link."""
        if self.asset.is_download:
            return self.access_bytes_per_s
        return self.asset.bitrate_bytes_per_s


class FlowClass:
    """The clients of one server with the same cap (a bitrate, or an access rate)."""

    __slots__ = (
        "cap",
        "cpu_coef",
        "download",
        "first",
        "integral",
        "members",
        "order",
        "rate",
        "stall_u",
        "targets",
    )

    def __init__(self, cap: float, download: bool, first: bool = False) -> None:
        self.cap = cap
        self.download = download
        # served ahead of the others (small objects on an origin with request classes)
        self.first = first
        self.members = 0
        self.cpu_coef = 0.0  # sum of the members' cores per byte/s
        self.rate = cap  # bytes/s each member gets now
        self.integral = 0.0  # D: bytes each member received since the class began
        self.stall_u = 0.0  # U: stall each (stream) member accumulated
        self.order: deque[Client] = deque()  # streams, in join order (failover check)
        self.targets: list[tuple[float, int, int, Client]] = []  # downloads: D at which each ends

    @property
    def fraction(self) -> float:
        """rate / cap: 1 when every member gets all it takes."""
        return self.rate / self.cap if self.cap > 0 else 1.0


def _water_fill(flows: list[FlowClass], link: float) -> float:
    """Share `link` max-min fairly over `flows` (sorted by cap): each class under the
    fair level gets its cap, the others the level. Returns what is left of the link."""
    left_bw = link
    left_n = sum(f.members for f in flows)
    level = float("inf")
    for f in flows:
        if left_n <= 0:
            break
        level = left_bw / left_n
        if f.cap <= level:
            f.rate = f.cap
            left_bw -= f.cap * f.members
            left_n -= f.members
        else:
            break
    for f in flows:
        if f.cap > level:
            f.rate = level
            left_bw -= level * f.members
    return max(left_bw, 0.0)


class Server:
    """The fluid state of one server."""

    __slots__ = (
        "asset_counts",
        "bg_cpu",
        "bytes_out",
        "cached",
        "clients",
        "cpu_area",
        "cpu_used",
        "crashes",
        "flows",
        "last_t",
        "out",
        "over_since",
        "ram_area",
        "ram_backlog",
        "rng",
        "small_first",
        "spec",
        "started",
        "status_memo",
        "up",
        "version",
    )

    def __init__(self, spec: ServerSpec, rng: random.Random, *, small_first: bool = False) -> None:
        self.spec = spec
        self.rng = rng
        # The origin knows request classes: small objects go ahead of bulk transfers.
        self.small_first = small_first
        self.clients: dict[int, Client] = {}
        # asset -> flow class -> members of that asset in it (for per-issue rates)
        self.asset_counts: dict[str, dict[FlowClass, int]] = {}
        # asset -> transfers started for it (the agent's transfers_total_by_issue)
        self.started: dict[str, int] = {}
        self.flows: dict[tuple[bool, float, bool], FlowClass] = {}
        self.bg_cpu = spec.cpu_idle
        self.out = 0.0
        self.cpu_used = 0.0  # cores the clients use at their current rates
        self.ram_backlog = 0.0  # sum over clients of (1 - rate / cap)
        self.last_t = 0.0
        self.bytes_out = 0.0
        self.cpu_area = 0.0
        self.ram_area = 0.0
        self.up = True
        self.crashes = 0
        self.over_since: float | None = None
        self.version = 0
        self.cached: set[str] = set(spec.cached)
        self.status_memo: tuple[int, int, OriginStatus] | None = None

    @property
    def phi(self) -> float:
        """The worst share any client gets of what it takes (1: nobody is held back)."""
        return min((f.fraction for f in self.flows.values()), default=1.0)

    # --- fluid accounting ---------------------------------------------------

    def advance(self, now: float) -> None:
        """Integrate bytes, stall, CPU and RAM from the last change to `now`."""
        dt = now - self.last_t
        if dt <= 0:
            return
        self.last_t = now
        for f in self.flows.values():
            f.integral += f.rate * dt
            if not f.download and f.rate < f.cap:
                f.stall_u += (1.0 - f.rate / f.cap) * dt
        self.bytes_out += self.out * dt
        self.cpu_area += self.cpu_fraction() * dt
        self.ram_area += self.ram_fraction() * dt

    def recompute(self) -> None:
        """Every class's rate, after the client set or background changed.

        Water-filling over the classes by cap (max-min fair sharing of the link), then
        one factor for all if the CPU cannot keep up. With request classes, the small
        objects' classes are filled first and the rest share what they leave (strict
        priority: an origin sends a manifest ahead of bulk transfers).
        """
        spec = self.spec
        flows = sorted(self.flows.values(), key=lambda f: f.cap)
        left_bw = spec.link_bytes_per_s
        if self.small_first:
            ahead = [f for f in flows if f.first]
            if ahead:
                left_bw = _water_fill(ahead, left_bw)
                flows = [f for f in flows if not f.first]
        _water_fill(flows, left_bw)
        flows = list(self.flows.values())
        flows.sort(key=lambda f: f.cap)
        need_cpu = 0.0
        for f in flows:
            need_cpu += f.rate * f.cpu_coef
        free = max(spec.cores * (1.0 - self.bg_cpu), 0.0)
        if need_cpu > free:
            scale = free / need_cpu
            for f in flows:
                f.rate *= scale
            need_cpu = 0.0
            for f in flows:
                need_cpu += f.rate * f.cpu_coef
        # One pass for the totals, summed in the same order as before (same floats).
        out = backlog = 0.0
        for f in flows:
            out += f.rate * f.members
            backlog += (1.0 - (f.rate / f.cap if f.cap > 0 else 1.0)) * f.members
        self.out = out
        self.cpu_used = need_cpu
        self.ram_backlog = backlog
        self.version += 1

    def cpu_fraction(self) -> float:
        """CPU in use, 0..1: background plus what the clients' delivered rates cost."""
        return min(self.bg_cpu + self.cpu_used / self.spec.cores, 1.0)

    def ram_fraction(self) -> float:
        """RAM in use, 0..1 (may exceed 1: that is the out-of-memory condition)."""
        spec = self.spec
        used = len(self.clients) * spec.ram_per_client_bytes + self.ram_backlog * (
            spec.ram_backlog_bytes
        )
        return spec.ram_idle + used / spec.ram_bytes

    def out_bytes_per_s(self) -> float:
        """Outbound rate right now."""
        return self.out

    # --- clients --------------------------------------------------------------

    def client_cpu(self, client: Client) -> float:
        """A new client's CPU cost in cores at full rate, start-up and cache miss included."""
        spec = self.spec
        cost = spec.cpu_per_client_cores * spec.startup_cpu_factor
        if client.asset.name not in self.cached:
            cost *= spec.cache_miss_cpu_factor
        return cost

    @staticmethod
    def _coef(client: Client, cores: float) -> float:
        """Cores per byte/s of a client whose per-client cost is `cores`."""
        if client.asset.is_download:
            return cores / CPU_REFERENCE_BYTES_PER_S
        return cores / client.asset.bitrate_bytes_per_s

    def add(self, client: Client, now: float) -> None:
        """A client starts receiving from this server."""
        self.advance(now)
        download = client.asset.is_download
        cap = client.cap_bytes_per_s
        first = self.small_first and client.asset.request_class == "small"
        key = (download, cap, first)
        flow = self.flows.get(key)
        if flow is None:
            flow = self.flows[key] = FlowClass(cap, download, first)
        client.flow = flow
        client.joined_u = flow.stall_u
        client.joined_d = flow.integral
        client.joined_at = now
        client.cpu_cores = self.client_cpu(client)
        client.epoch += 1
        self.clients[client.cid] = client
        flow.members += 1
        flow.cpu_coef += self._coef(client, client.cpu_cores)
        if download:
            left = max(client.asset.size_bytes - client.received_bytes, 0.0)
            heapq.heappush(flow.targets, (flow.integral + left, client.cid, client.epoch, client))
        else:
            flow.order.append(client)
        per_asset = self.asset_counts.setdefault(client.asset.name, {})
        per_asset[flow] = per_asset.get(flow, 0) + 1
        self.started[client.asset.name] = self.started.get(client.asset.name, 0) + 1
        self.recompute()

    def settle(self, client: Client, now: float) -> None:
        """A client's start-up is over: it costs the steady per-client CPU from now."""
        if self.clients.get(client.cid) is not client or client.flow is None:
            return
        self.advance(now)
        steady = self.spec.cpu_per_client_cores
        client.flow.cpu_coef += self._coef(client, steady) - self._coef(client, client.cpu_cores)
        client.cpu_cores = steady
        self.recompute()

    def remove(self, client: Client, now: float) -> float:
        """A client leaves; returns the stall it had on this server (0 for a download)."""
        self.advance(now)
        del self.clients[client.cid]
        flow = client.flow
        assert flow is not None
        client.flow = None
        flow.members -= 1
        flow.cpu_coef -= self._coef(client, client.cpu_cores)
        per_asset = self.asset_counts[client.asset.name]
        left = per_asset[flow] - 1
        if left:
            per_asset[flow] = left
        else:
            del per_asset[flow]
            if not per_asset:
                del self.asset_counts[client.asset.name]
        stall = 0.0
        if flow.download:
            client.received_bytes += flow.integral - client.joined_d
        else:
            stall = flow.stall_u - client.joined_u
        if flow.members <= 0:
            del self.flows[(flow.download, flow.cap, flow.first)]
        self.recompute()
        return stall

    def drop_all(self, now: float) -> list[Client]:
        """Every client at once (a crash); their stall and bytes are settled here."""
        self.advance(now)
        dropped = list(self.clients.values())
        for c in dropped:
            flow = c.flow
            assert flow is not None
            if flow.download:
                c.received_bytes += flow.integral - c.joined_d
            else:
                c.stall_s += flow.stall_u - c.joined_u
            c.flow = None
        self.clients.clear()
        self.asset_counts.clear()
        self.flows.clear()
        self.recompute()
        return dropped

    def next_download_end(self) -> tuple[float, Client] | None:
        """The next download to end on this server at the current rates: (delay, client)."""
        best: tuple[float, Client] | None = None
        for f in self.flows.values():
            if not f.download:
                continue
            targets = f.targets
            while targets and (targets[0][3].flow is not f or targets[0][3].epoch != targets[0][2]):
                heapq.heappop(targets)  # left the class (ended, failed over, dropped)
            if not targets or f.rate <= 0:
                continue
            delay = max(targets[0][0] - f.integral, 0.0) / f.rate
            if best is None or delay < best[0]:
                best = (delay, targets[0][3])
        return best

    def pop_download(self, client: Client) -> None:
        """Forget `client`'s completion target (it is about to be removed)."""
        flow = client.flow
        if flow is not None and flow.targets and flow.targets[0][3] is client:
            heapq.heappop(flow.targets)

    def set_background(self, now: float) -> None:
        """Draw the background load for the next tick (machine B's interference)."""
        spec = self.spec
        if spec.cpu_noise <= 0:
            return
        self.advance(now)
        noise = (self.rng.random() * 2.0 - 1.0) * spec.cpu_noise
        self.bg_cpu = min(max(spec.cpu_idle + noise, 0.0), 1.0)
        self.recompute()

    def status(self, issues: frozenset[str]) -> OriginStatus:
        """What the status agent reports now (000, section 4; docs/protocols.md /stats).

        The same object as last time while nothing changed (an idle server's polls).
        """
        memo = self.status_memo
        if memo is not None and memo[0] == self.version and memo[1] == len(self.cached):
            return memo[2]
        n = len(self.clients)
        out = self.out
        by_issue: dict[str, float] = {}
        counts: dict[str, int] = {}
        for name, per_flow in self.asset_counts.items():
            count = 0
            total = 0.0
            for f, k in per_flow.items():
                count += k
                total += k * f.rate
            by_issue[name] = total / count
            counts[name] = count
        status = OriginStatus(
            name=self.spec.name,
            cpu_fraction=self.cpu_fraction(),
            ram_fraction=min(self.ram_fraction(), 1.0),
            out_bytes_per_s=out,
            capacity_bytes_per_s=self.spec.told,
            active_transfers=n,
            issues=issues,
            cached_issues=frozenset(self.cached),
            mean_transfer_bytes_per_s=out / n if n else None,
            mean_transfer_bytes_per_s_by_issue=by_issue,
            active_transfers_by_issue=counts,
            transfers_total=sum(self.started.values()),
            transfers_total_by_issue=dict(self.started),
        )
        self.status_memo = (self.version, len(self.cached), status)
        return status
