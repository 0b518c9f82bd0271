"""The server and client model: fluid rates, CPU/RAM costs, cache effect, overload, crash.

A server's clients share its outbound link and its CPU as a fluid (no per-packet or
per-tick work per client). Every client of a server gets the same fraction `phi` of
the rate it needs (its asset's bitrate)::

    phi = min(1, link_bytes_per_s / sum(bitrate_i), cpu_free_cores / sum(cpu_i))

where `cpu_i` is a client's CPU cost at full rate (higher while it starts up, and higher
again when the asset is not yet in the server's cache: the first transfer of an asset
reads the disk) and `cpu_free_cores` is what the background load leaves. `phi` is
recomputed only when that server's client set or background load changes.

A client that gets `phi < 1` stalls: it falls behind real-time playback by `1 - phi`
seconds every second. The server keeps the integral ``U(t) = integral of (1 - phi) dt``,
so a client's stall on a server is ``U(now) - U(joined)``: no per-client work while
it plays. A client whose total stall exceeds the scenario's tolerance fails (the
paper's "sub-par delivery"; a player that rebuffers that long has lost its viewer).

RAM: the idle share, plus a fixed amount per client, plus ``(1 - phi) *
ram_backlog_bytes`` per client: data a client cannot receive fast enough piles up in
kernel socket buffers, which is how network overload runs a small machine out of
memory.

Crash (machine C of 000_9aae53f3113e9bd8.txt, section 8: the kernel runs out of memory
under high network load): when RAM in use stays at or above `crash_ram_fraction` for
`crash_after_s`, the server drops every client and answers nothing until
`recover_after_s` later.
"""

from __future__ import annotations

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
    """A media asset (an issue): played at `bitrate_bytes_per_s` for `duration_s`."""

    name: str
    bitrate_bytes_per_s: float = 100_000.0
    duration_s: float = 600.0
    popularity: float = 1.0

    @property
    def size_bytes(self) -> float:
        """Bytes a complete play-through transfers."""
        return self.bitrate_bytes_per_s * self.duration_s


class ClientState(Enum):
    """Where a client is in its life."""

    ASKING = "asking"
    CONNECTING = "connecting"
    PLAYING = "playing"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class Client:
    """One request of the workload: one complete play-through of one asset."""

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


class Server:
    """The fluid state of one server."""

    __slots__ = (
        "asset_counts",
        "bg_cpu",
        "bytes_out",
        "cached",
        "clients",
        "cpu_area",
        "cpu_demand",
        "crashes",
        "demand",
        "last_t",
        "order",
        "over_since",
        "phi",
        "ram_area",
        "rng",
        "spec",
        "stall_u",
        "up",
        "version",
    )

    def __init__(self, spec: ServerSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.clients: dict[int, Client] = {}
        self.asset_counts: dict[str, int] = {}
        self.order: deque[Client] = deque()
        self.demand = 0.0
        self.cpu_demand = 0.0
        self.bg_cpu = spec.cpu_idle
        self.phi = 1.0
        self.stall_u = 0.0
        self.last_t = 0.0
        self.bytes_out = 0.0
        self.cpu_area = 0.0
        self.ram_area = 0.0
        self.up = True
        self.crashes = 0
        self.over_since: float | None = None
        self.version = 0
        self.cached: set[str] = set(spec.cached)

    # --- fluid accounting ---------------------------------------------------

    def advance(self, now: float) -> None:
        """Integrate stall, bytes, CPU and RAM from the last change to `now`."""
        dt = now - self.last_t
        if dt <= 0:
            return
        self.last_t = now
        phi = self.phi
        if phi < 1.0:
            self.stall_u += (1.0 - phi) * dt
        self.bytes_out += self.demand * phi * dt
        self.cpu_area += self.cpu_fraction() * dt
        self.ram_area += self.ram_fraction() * dt

    def recompute(self) -> None:
        """The share every client gets, after the client set or background changed."""
        spec = self.spec
        phi = 1.0
        if self.demand > spec.link_bytes_per_s:
            phi = spec.link_bytes_per_s / self.demand
        free = spec.cores * (1.0 - self.bg_cpu)
        if self.cpu_demand > free:
            phi = min(phi, max(free, 0.0) / self.cpu_demand)
        self.phi = phi
        self.version += 1

    def cpu_fraction(self) -> float:
        """CPU in use, 0..1: background plus what the clients' delivered rate costs."""
        used = self.bg_cpu + self.cpu_demand * self.phi / self.spec.cores
        return min(used, 1.0)

    def ram_fraction(self) -> float:
        """RAM in use, 0..1 (may exceed 1: that is the out-of-memory condition)."""
        spec = self.spec
        per_client = spec.ram_per_client_bytes + (1.0 - self.phi) * spec.ram_backlog_bytes
        return spec.ram_idle + len(self.clients) * per_client / spec.ram_bytes

    def out_bytes_per_s(self) -> float:
        """Outbound rate right now."""
        return self.demand * self.phi

    # --- clients --------------------------------------------------------------

    def client_cpu(self, client: Client) -> float:
        """A new client's CPU cost in cores at full rate, start-up and cache miss included."""
        spec = self.spec
        cost = spec.cpu_per_client_cores * spec.startup_cpu_factor
        if client.asset.name not in self.cached:
            cost *= spec.cache_miss_cpu_factor
        return cost

    def add(self, client: Client, now: float) -> None:
        """A client starts streaming from this server."""
        self.advance(now)
        client.joined_u = self.stall_u
        client.joined_at = now
        client.cpu_cores = self.client_cpu(client)
        client.epoch += 1
        self.clients[client.cid] = client
        self.order.append(client)
        name = client.asset.name
        self.asset_counts[name] = self.asset_counts.get(name, 0) + 1
        self.demand += client.asset.bitrate_bytes_per_s
        self.cpu_demand += client.cpu_cores
        self.recompute()

    def settle(self, client: Client, now: float) -> None:
        """A client's start-up is over: it costs the steady per-client CPU from now."""
        if self.clients.get(client.cid) is not client:
            return
        self.advance(now)
        steady = self.spec.cpu_per_client_cores
        self.cpu_demand += steady - client.cpu_cores
        client.cpu_cores = steady
        self.recompute()

    def remove(self, client: Client, now: float) -> float:
        """A client leaves; returns the stall it had on this server."""
        self.advance(now)
        del self.clients[client.cid]
        name = client.asset.name
        left = self.asset_counts[name] - 1
        if left:
            self.asset_counts[name] = left
        else:
            del self.asset_counts[name]
        self.demand -= client.asset.bitrate_bytes_per_s
        self.cpu_demand -= client.cpu_cores
        if not self.clients:
            self.demand = 0.0
            self.cpu_demand = 0.0
            self.order.clear()
            self.asset_counts.clear()
        self.recompute()
        return self.stall_u - client.joined_u

    def drop_all(self, now: float) -> list[Client]:
        """Every client at once (a crash); their stall is settled by the caller."""
        self.advance(now)
        dropped = list(self.clients.values())
        for c in dropped:
            c.stall_s += self.stall_u - c.joined_u
        self.clients.clear()
        self.asset_counts.clear()
        self.order.clear()
        self.demand = 0.0
        self.cpu_demand = 0.0
        self.recompute()
        return dropped

    def set_background(self, now: float) -> None:
        """Draw the background load for the next tick (machine B's interference)."""
        spec = self.spec
        if spec.cpu_noise <= 0:
            return
        self.advance(now)
        noise = (self.rng.random() * 2.0 - 1.0) * spec.cpu_noise
        self.bg_cpu = min(max(spec.cpu_idle + noise, 0.0), 1.0)
        self.recompute()

    def status(self, issues: frozenset[str], bitrates: dict[str, float]) -> OriginStatus:
        """What the status agent reports now (000, section 4; docs/protocols.md /stats)."""
        n = len(self.clients)
        out = self.out_bytes_per_s()
        phi = self.phi
        by_issue = {name: bitrates[name] * phi for name in self.asset_counts}
        return OriginStatus(
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
        )
