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
import itertools
import random
from dataclasses import dataclass, field

from pressrun.balancer.algorithms import ScoringAlgorithm, make_algorithm
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.events import (
    ClientHint,
    Directive,
    DirectiveRequested,
    OriginSpec,
    RequestClass,
)
from pressrun.balancer.health import HealthConfig
from pressrun.sim.balancer_adapter import BalancerAdapter
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


class Simulation(BalancerAdapter):
    """Wires one scenario, one algorithm and one seed; `run()` returns a `RunResult`."""

    def __init__(
        self,
        scenario: Scenario,
        algorithm: str,
        seed: int = 1,
        *,
        algorithm_params: dict[str, float] | None = None,
        stop_when_settled: bool = False,
    ) -> None:
        self.scenario = scenario
        # End the run as soon as every client is settled and nothing is scheduled to
        # happen (no arrival, no failure left): the tournament's runs do not idle to
        # the scenario's end. Off by default: the paper's averages are over its length.
        self.stop_when_settled = stop_when_settled
        self._arrivals_left = 0
        self._last_failure_s = max(
            [f.down_at_s for f in scenario.failures]
            + [f.up_at_s for f in scenario.failures if f.up_at_s is not None]
            + [0.0]
        )
        self._unsettled_from = 0
        self.algorithm_name = algorithm
        self.seed = seed
        master = random.Random(seed)
        # One master seed; every stream derived from it in a fixed order.
        self.rng_arrivals = random.Random(master.getrandbits(64))
        self.rng_algorithm = random.Random(master.getrandbits(64))
        server_seeds = [master.getrandbits(64) for _ in scenario.servers]
        self.rng_access = random.Random(master.getrandbits(64))
        self.loop = EventLoop()
        self.assets: dict[str, AssetSpec] = {a.name: a for a in scenario.assets}
        self._asset_list = list(scenario.assets)
        total = 0.0
        self._cum: list[float] = []
        for a in self._asset_list:
            total += a.popularity
            self._cum.append(total)
        # Per request class, its assets and their cumulative popularity (arrivals that
        # name a class draw among its assets).
        self._by_class: dict[str, tuple[list[AssetSpec], list[float]]] = {}
        for a in self._asset_list:
            if a.request_class is not None:
                listed, cum = self._by_class.setdefault(a.request_class, ([], []))
                listed.append(a)
                cum.append((cum[-1] if cum else 0.0) + a.popularity)
        classes = scenario.balancer.classes
        self.servers: dict[str, Server] = {
            spec.name: Server(spec, random.Random(s), small_first=classes)
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
            # Without classes every request is the algorithm's, as before issue 33.
            class_policies=dict(b.class_policies) if b.classes else {},
        )
        self.core = BalancerCore(
            self.config,
            origins,
            self.algorithm,
            now=0.0,
            health=HealthConfig(b.rise, b.fall, b.slowstart_s),
        )
        # flapping origins: server -> (from, until, every N-th poll fails), polls so far
        self._flaps = {
            f.server: (f.down_at_s, f.up_at_s, f.flap_every)
            for f in scenario.failures
            if f.flap_every
        }
        self._polls: dict[str, int] = {}
        if scenario.balancer.tell_needs:
            # What the real service learns from each issue's manifest (its size) and
            # the operator's target download time; a stream's need is its bitrate.
            for a in scenario.assets:
                if a.request_class not in (None, "crowd") and b.classes:
                    # Placed by its class's own policy: the algorithm never sees it.
                    continue
                self.algorithm.set_issue_need(
                    a.name,
                    a.need_bytes_per_s,
                    paced=not a.is_download,
                    deadline_s=a.deadline_s if a.is_download else None,
                )
        self.clients: list[Client] = []
        self.samples: dict[str, list[Sample]] = {name: [] for name in self.servers}
        self._timer_at: float | None = None
        self._timer_token = 0
        self.model = scenario.clients
        self._access_cum = list(itertools.accumulate(self.model.access_weights))

    # --- clients ----------------------------------------------------------------

    def _draw_asset(self, request_class: str | None = None) -> AssetSpec:
        listed, cum = self._asset_list, self._cum
        if request_class is not None and request_class in self._by_class:
            listed, cum = self._by_class[request_class]
        if len(listed) == 1:
            return listed[0]
        x = self.rng_arrivals.random() * cum[-1]
        return listed[min(bisect.bisect_right(cum, x), len(listed) - 1)]

    def _draw_access(self) -> float:
        """A download client's access link: one of the model's rates, by weight."""
        rates = self.model.access_bytes_per_s
        if len(rates) == 1:
            return rates[0]
        x = self.rng_access.random() * self._access_cum[-1]
        return rates[min(bisect.bisect_right(self._access_cum, x), len(rates) - 1)]

    def _arrive(self, asset_name: str | None, request_class: str | None = None) -> None:
        self._arrivals_left -= 1
        asset = self.assets.get(asset_name) if asset_name else None
        if asset is None:
            asset = self._draw_asset(request_class)
        client = Client(len(self.clients), asset, self.loop.now, waiting_since=self.loop.now)
        if asset.is_download:
            client.access_bytes_per_s = self._draw_access()
        self.clients.append(client)
        self._ask(client)

    def _ask(self, client: Client) -> None:
        now = self.loop.now
        hint = None
        if client.asset.is_download and self.model.tells_balancer:
            # What pressrun's client knows: the bytes it has (it resumes), the file's
            # size, its link's rate (the best it measured) and how long it has been
            # at it.
            size = int(client.asset.size_bytes)
            hint = ClientHint(
                min(int(client.received_bytes), size),
                size,
                client.access_bytes_per_s,
                now - client.requested_at,
            )
        klass = client.asset.request_class
        request = DirectiveRequested(
            client.asset.name,
            frozenset(client.failed),
            hint,
            request_class=(
                RequestClass(klass)
                if klass is not None and self.scenario.balancer.classes
                else None
            ),
            reservation=client.reservation,
        )
        answer = self.core.handle_directive_requested(request, now=now)
        client.reservation = None
        if not isinstance(answer, Directive):
            if answer.reservation is not None:
                # A start reserved for it: pressrun's client comes back then and names
                # it; its patience with refusals counts from that start.
                client.reserved += 1
                client.reservation = answer.reservation
                client.waiting_since = now + answer.retry_after_s
                self.loop.after(answer.retry_after_s, self._ask, client)
                return
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
        download = client.asset.is_download
        if client.first_server is None:
            client.first_server = name
            client.end_at = now + client.asset.duration_s
        elif client.dropped_at is not None:
            # Playback stood still from the drop (or failover) to this reconnection.
            gap = now - client.dropped_at
            if not download:
                client.stall_s += gap
                client.end_at += gap
            client.dropped_at = None
        client.server = name
        client.state = ClientState.PLAYING
        if client.asset.name not in self.issues[name]:
            client.non_holder = True
        server.add(client, now)
        if client.first_byte_at is None:
            flow = client.flow
            rate = max(flow.rate if flow is not None else 0.0, 1e-3 * client.cap_bytes_per_s)
            # the first chunk, or the whole object when it is smaller (a manifest)
            chunk = min(self.model.first_chunk_bytes, client.asset.size_bytes)
            client.first_byte_at = now + self.model.rtt_s + min(chunk / rate, 60.0)
        epoch = client.epoch
        self.loop.after(server.spec.startup_s, self._settle, client, name, epoch)
        if client.asset.name not in server.cached:
            self.loop.after(server.spec.startup_s, self._cache, name, client.asset.name)
        if not download:
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
        """A stream's play-through reached its end."""
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

    def _download_done(self, server: Server, client: Client) -> None:
        """A download received its last byte."""
        now = self.loop.now
        server.pop_download(client)
        server.remove(client, now)
        client.ended_at = now
        took = now - client.requested_at
        if took <= client.asset.deadline_s + 1e-9:
            client.state = ClientState.DONE
        else:
            client.state = ClientState.FAILED
            client.reason = f"took {took:.0f} s (deadline {client.asset.deadline_s:.0f} s)"

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
        if client.failovers > self.model.max_failovers:
            # pressrun's client gives up after so many failures without progress.
            self._fail(client, f"gave up after {client.failovers - 1} failovers")
            return
        client.waiting_since = self.loop.now
        client.failed.add(name)
        client.state = ClientState.ASKING
        if client.first_server is not None:
            client.dropped_at = self.loop.now
        self.loop.after(self.model.rtt_s, self._ask, client)

    # --- servers ----------------------------------------------------------------

    def _server_changed(self, server: Server) -> None:
        """Plan the server's next event at its new rates: a download ends or a stream
        has stalled long enough to fail over. One event per change, dropped if the
        server changes again first (its version moves), so a failover storm costs
        events, never a scan of every client."""
        due = float("inf")
        nxt = server.next_download_end()
        if nxt is not None:
            due = nxt[0]
        fs = self.model.failover_stall_s
        if fs > 0:
            for f in server.flows.values():
                if f.download or f.rate >= f.cap:
                    continue
                order = f.order
                while order and order[0].flow is not f:
                    order.popleft()
                if order:
                    wait = (order[0].joined_u + fs - f.stall_u) / (1.0 - f.fraction)
                    due = min(due, max(wait, 0.0))
        if due != float("inf"):
            self.loop.after(due, self._server_due, server, server.version)

    def _server_due(self, server: Server, version: int) -> None:
        if version != server.version:
            return
        now = self.loop.now
        server.advance(now)
        while (nxt := server.next_download_end()) is not None and nxt[0] <= 1e-6:
            self._download_done(server, nxt[1])
        fs = self.model.failover_stall_s
        if fs > 0:
            moved: list[Client] = []
            for f in server.flows.values():
                order = f.order
                while order:
                    c = order[0]
                    if c.flow is not f:
                        order.popleft()
                        continue
                    if f.stall_u - c.joined_u < fs - 1e-9:
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
        if self.stop_when_settled and self._all_settled(now):
            self.loop.stop()
            return
        if now + self.scenario.tick_s <= self.scenario.duration_s + 1e-9:
            self.loop.after(self.scenario.tick_s, self._tick)

    def _all_settled(self, now: float) -> bool:
        """No arrival or failure to come, and every client done or failed."""
        if self._arrivals_left > 0 or now < self._last_failure_s:
            return False
        clients = self.clients
        k = self._unsettled_from
        while k < len(clients) and clients[k].state in (ClientState.DONE, ClientState.FAILED):
            k += 1
        self._unsettled_from = k
        return k == len(clients)

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
            self._arrivals_left += 1
            self.loop.at(arrival.at_s, self._arrive, arrival.asset, arrival.request_class)
        for failure in sc.failures:
            if failure.flap_every:
                continue  # its polls fail (_poll_flaps); it keeps serving
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
            if c.state is ClientState.PLAYING and c.asset.is_download:
                self.servers[c.server or ""].remove(c, end)
                self._fail(c, "download not finished by the end of the test")
            elif c.state is ClientState.PLAYING and c.server is not None:
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
    stop_when_settled: bool = False,
) -> RunResult:
    """Run one scenario with one registered algorithm and one master seed."""
    return Simulation(
        scenario,
        algorithm,
        seed,
        algorithm_params=algorithm_params,
        stop_when_settled=stop_when_settled,
    ).run()
