"""One simulation run: the scenario's servers and clients around the real balancer core.

The balancer is `pressrun.balancer.core.BalancerCore` with an algorithm built by
`pressrun.balancer.algorithms.make_algorithm`: the classes the service runs, imported.
The simulator plays the adapter's part with virtual time:

- `handle_timer(now)` returns `PollOrigin` effects; each poll samples the server model
  `status_delay_s / 2` later and delivers `StatusReceived` after `status_delay_s` (or
  `PollFailed` after `poll_timeout_s` if the server is down), so between refreshes the
  balancer works from stale numbers, as the real one does;
- each client request is `handle_directive_requested`; the client connects to the
  first origin of the directive one round trip later.

Every random draw comes from `random.Random`s seeded from one master seed.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from pressrun.balancer.algorithms import ScoringAlgorithm, make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    Directive,
    DirectiveRequested,
    OriginSpec,
    OriginStatus,
    PollFailed,
    PollOrigin,
    StatusReceived,
)
from pressrun.sim.engine import EventLoop
from pressrun.sim.model import AssetSpec, Client, ClientState, Server
from pressrun.sim.scenario import Scenario


@dataclass(slots=True)
class Sample:
    """One server's vitals at one tick (for plots)."""

    t: float
    clients: int
    cpu: float
    ram: float
    out_bytes_per_s: float
    up: bool


@dataclass(slots=True)
class RunResult:
    """Everything a run produced; metrics.py turns it into tables."""

    scenario: Scenario
    algorithm: str
    seed: int
    clients: list[Client]
    servers: dict[str, Server]
    samples: dict[str, list[Sample]]
    end_s: float
    events: int
    crashes: dict[str, int] = field(default_factory=dict)
    refusals: int = 0


class Simulation:
    """Wires one scenario, one algorithm and one seed; `run()` returns a `RunResult`."""

    def __init__(
        self,
        scenario: Scenario,
        algorithm: str,
        seed: int = 1,
        *,
        algorithm_params: dict[str, float] | None = None,
    ) -> None:
        self.scenario = scenario
        self.algorithm_name = algorithm
        self.seed = seed
        master = random.Random(seed)
        # One master seed; every stream derived from it in a fixed order.
        self.rng_arrivals = random.Random(master.getrandbits(64))
        self.rng_algorithm = random.Random(master.getrandbits(64))
        server_seeds = [master.getrandbits(64) for _ in scenario.servers]
        self.loop = EventLoop()
        self.assets: dict[str, AssetSpec] = {a.name: a for a in scenario.assets}
        self.bitrates = {a.name: a.bitrate_bytes_per_s for a in scenario.assets}
        self._asset_list = list(scenario.assets)
        total = 0.0
        self._cum: list[float] = []
        for a in self._asset_list:
            total += a.popularity
            self._cum.append(total)
        self.servers: dict[str, Server] = {
            spec.name: Server(spec, random.Random(s))
            for spec, s in zip(scenario.servers, server_seeds, strict=True)
        }
        all_assets = frozenset(self.assets)
        self.issues: dict[str, frozenset[str]] = {
            spec.name: frozenset(spec.assets) if spec.assets is not None else all_assets
            for spec in scenario.servers
        }
        origins = [OriginSpec(s.name, f"http://{s.name}", s.weight) for s in scenario.servers]
        params = dict(scenario.balancer.params.get(algorithm, {}))
        params.update(algorithm_params or {})
        self.algorithm: ScoringAlgorithm = make_algorithm(
            algorithm, origins, self.rng_algorithm, params
        )
        b = scenario.balancer
        self.config = BalancerConfig(
            poll_interval_s=b.poll_interval_s,
            stale_after_s=b.stale_after_s,
            retry_after_s=b.retry_after_s,
            algorithm=algorithm,
        )
        self.core = BalancerCore(self.config, origins, self.algorithm, now=0.0)
        self.clients: list[Client] = []
        self.samples: dict[str, list[Sample]] = {name: [] for name in self.servers}
        self._timer_at: float | None = None
        self._timer_token = 0
        self.model = scenario.clients

    # --- balancer adapter -------------------------------------------------------

    def _arm(self) -> None:
        deadline = self.core.next_deadline()
        if deadline is None:
            return
        if (
            self._timer_at is not None
            and self._timer_at <= deadline
            and self._timer_at >= self.loop.now
        ):
            return
        self._timer_token += 1
        self._timer_at = deadline
        self.loop.at(deadline, self._on_timer, self._timer_token)

    def _on_timer(self, token: int) -> None:
        if token != self._timer_token:
            return
        self._timer_at = None
        now = self.loop.now
        for effect in self.core.handle_timer(now=now):
            if isinstance(effect, PollOrigin):
                self._poll(effect.name)
        self._arm()

    def _poll(self, name: str) -> None:
        delay = self.scenario.balancer.status_delay_s
        self.loop.after(delay / 2.0, self._sample_status, name)

    def _sample_status(self, name: str) -> None:
        server = self.servers[name]
        b = self.scenario.balancer
        if not server.up:
            self.loop.after(b.poll_timeout_s - b.status_delay_s / 2.0, self._deliver_failure, name)
            return
        status = server.status(self.issues[name], self.bitrates)
        self.loop.after(b.status_delay_s / 2.0, self._deliver_status, status)

    def _deliver_status(self, status: OriginStatus) -> None:
        self.core.handle_status_received(StatusReceived(status), now=self.loop.now)
        self._arm()

    def _deliver_failure(self, name: str) -> None:
        self.core.handle_poll_failed(PollFailed(name, "no answer"), now=self.loop.now)
        self._arm()

    # --- clients ----------------------------------------------------------------

    def _draw_asset(self) -> AssetSpec:
        if len(self._asset_list) == 1:
            return self._asset_list[0]
        x = self.rng_arrivals.random() * self._cum[-1]
        return self._asset_list[min(bisect.bisect_right(self._cum, x), len(self._asset_list) - 1)]

    def _arrive(self, asset_name: str | None) -> None:
        asset = self.assets.get(asset_name) if asset_name else None
        if asset is None:
            asset = self._draw_asset()
        client = Client(len(self.clients), asset, self.loop.now, waiting_since=self.loop.now)
        self.clients.append(client)
        self._ask(client)

    def _ask(self, client: Client) -> None:
        now = self.loop.now
        answer = self.core.handle_directive_requested(
            DirectiveRequested(client.asset.name, frozenset(client.failed)), now=now
        )
        if not isinstance(answer, Directive):
            client.refusals += 1
            if now + answer.retry_after_s - client.waiting_since > self.model.max_wait_s:
                self._fail(client, f"refused: {answer.reason.value}")
                return
            client.failed.clear()
            self.loop.after(answer.retry_after_s, self._ask, client)
            return
        name = answer.origins[0].name
        client.state = ClientState.CONNECTING
        self.loop.after(self.model.rtt_s, self._connect, client, name)

    def _connect(self, client: Client, name: str) -> None:
        now = self.loop.now
        server = self.servers[name]
        if not server.up:
            self._lost(client, name)
            return
        if client.first_server is None:
            client.first_server = name
            client.end_at = now + client.asset.duration_s
        elif client.dropped_at is not None:
            # Playback stood still from the drop (or failover) to this reconnection.
            gap = now - client.dropped_at
            client.stall_s += gap
            client.end_at += gap
            client.dropped_at = None
        client.server = name
        client.state = ClientState.PLAYING
        server.add(client, now)
        if client.first_byte_at is None:
            rate = client.asset.bitrate_bytes_per_s * max(server.phi, 1e-3)
            client.first_byte_at = (
                now + self.model.rtt_s + min(self.model.first_chunk_bytes / rate, 60.0)
            )
        epoch = client.epoch
        self.loop.after(server.spec.startup_s, self._settle, client, name, epoch)
        if client.asset.name not in server.cached:
            self.loop.after(server.spec.startup_s, self._cache, name, client.asset.name)
        self.loop.at(client.end_at, self._finish, client, epoch)
        self._server_changed(server)

    def _settle(self, client: Client, name: str, epoch: int) -> None:
        if client.epoch != epoch or client.server != name:
            return
        server = self.servers[name]
        server.settle(client, self.loop.now)
        self._server_changed(server)

    def _cache(self, name: str, asset: str) -> None:
        server = self.servers[name]
        if server.up:
            server.cached.add(asset)

    def _finish(self, client: Client, epoch: int) -> None:
        if client.epoch != epoch or client.state is not ClientState.PLAYING:
            return
        server = self.servers[client.server or ""]
        client.stall_s += server.remove(client, self.loop.now)
        client.ended_at = self.loop.now
        if client.stall_s > self.model.stall_tolerance_s:
            client.state = ClientState.FAILED
            client.reason = f"stalled {client.stall_s:.0f} s"
        else:
            client.state = ClientState.DONE
        self._server_changed(server)

    def _fail(self, client: Client, reason: str) -> None:
        client.state = ClientState.FAILED
        client.reason = reason
        client.ended_at = self.loop.now
        client.epoch += 1

    def _lost(self, client: Client, name: str) -> None:
        """The client's origin refused the connection or dropped it."""
        if self.model.failover_stall_s > 0:
            self._failover(client, name)
        else:
            self._fail(client, f"origin {name} down")

    def _failover(self, client: Client, name: str) -> None:
        client.failovers += 1
        client.epoch += 1
        client.waiting_since = self.loop.now
        client.failed.add(name)
        client.state = ClientState.ASKING
        if client.first_server is not None:
            client.dropped_at = self.loop.now
        self.loop.after(self.model.rtt_s, self._ask, client)

    # --- servers ----------------------------------------------------------------

    def _server_changed(self, server: Server) -> None:
        """Re-arm the failover check of a server whose share changed (failover mode)."""
        fs = self.model.failover_stall_s
        if fs <= 0 or server.phi >= 1.0 or not server.clients:
            return
        order = server.order
        while order and server.clients.get(order[0].cid) is not order[0]:
            order.popleft()
        if not order:
            return
        first = order[0]
        due = (first.joined_u + fs - server.stall_u) / (1.0 - server.phi)
        self.loop.after(max(due, 0.0), self._check_stalls, server, server.version)

    def _check_stalls(self, server: Server, version: int) -> None:
        if version != server.version:
            return
        now = self.loop.now
        server.advance(now)
        fs = self.model.failover_stall_s
        moved: list[Client] = []
        order = server.order
        while order:
            c = order[0]
            if server.clients.get(c.cid) is not c:
                order.popleft()
                continue
            if server.stall_u - c.joined_u < fs - 1e-9:
                break
            order.popleft()
            moved.append(c)
        for c in moved:
            stall = server.remove(c, now)
            c.stall_s += stall
            c.end_at += stall
            self._failover(c, server.spec.name)
        self._server_changed(server)

    def _tick(self) -> None:
        now = self.loop.now
        for server in self.servers.values():
            server.advance(now)
            if server.up:
                server.set_background(now)
                spec = server.spec
                if (
                    spec.crash_ram_fraction is not None
                    and server.ram_fraction() >= spec.crash_ram_fraction
                ):
                    if server.over_since is None:
                        server.over_since = now
                    elif now - server.over_since >= spec.crash_after_s:
                        self._crash(server, spec.recover_after_s)
                else:
                    server.over_since = None
                self._server_changed(server)
            self.samples[server.spec.name].append(
                Sample(
                    now,
                    len(server.clients),
                    server.cpu_fraction(),
                    server.ram_fraction(),
                    server.out_bytes_per_s(),
                    server.up,
                )
            )
        if now + self.scenario.tick_s <= self.scenario.duration_s + 1e-9:
            self.loop.after(self.scenario.tick_s, self._tick)

    def _crash(self, server: Server, recover_after_s: float | None) -> None:
        now = self.loop.now
        server.crashes += 1
        server.up = False
        server.over_since = None
        dropped = server.drop_all(now)
        server.cached.clear()
        for c in dropped:
            c.epoch += 1
            self._lost(c, server.spec.name)
        if recover_after_s is not None:
            self.loop.after(recover_after_s, self._recover, server)

    def _recover(self, server: Server) -> None:
        server.advance(self.loop.now)
        server.up = True
        server.recompute()

    # --- run --------------------------------------------------------------------

    def run(self) -> RunResult:
        """Simulate the scenario to its end (and until every started client is settled)."""
        sc = self.scenario
        for arrival in sc.arrivals(self.rng_arrivals):
            self.loop.at(arrival.at_s, self._arrive, arrival.asset)
        for failure in sc.failures:
            server = self.servers[failure.server]
            back = None if failure.up_at_s is None else failure.up_at_s - failure.down_at_s
            self.loop.at(failure.down_at_s, self._crash, server, back)
        self.loop.at(0.0, self._tick)
        self._arm()
        horizon = sc.duration_s
        self.loop.run(horizon)
        end = self.loop.now
        # Clients still playing at the end of the test: settle them where they stand.
        for c in self.clients:
            if c.state is ClientState.PLAYING and c.server is not None:
                server = self.servers[c.server]
                c.stall_s += server.remove(c, end)
                c.ended_at = end
                c.state = (
                    ClientState.FAILED
                    if c.stall_s > self.model.stall_tolerance_s
                    else ClientState.DONE
                )
                if c.state is ClientState.FAILED:
                    c.reason = f"stalled {c.stall_s:.0f} s"
            elif c.state in (ClientState.ASKING, ClientState.CONNECTING):
                self._fail(c, "not served by the end of the test")
        for server in self.servers.values():
            server.advance(end)
        return RunResult(
            scenario=sc,
            algorithm=self.algorithm_name,
            seed=self.seed,
            clients=self.clients,
            servers=self.servers,
            samples=self.samples,
            end_s=end,
            events=self.loop.events_processed,
            crashes={n: s.crashes for n, s in self.servers.items()},
            refusals=sum(self.core.refusals.values()),
        )


def run_scenario(
    scenario: Scenario,
    algorithm: str,
    seed: int = 1,
    *,
    algorithm_params: dict[str, float] | None = None,
) -> RunResult:
    """Run one scenario with one registered algorithm and one master seed."""
    return Simulation(scenario, algorithm, seed, algorithm_params=algorithm_params).run()
