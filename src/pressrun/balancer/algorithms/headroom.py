"""Headroom dispatch: learned per-transfer costs and real capacity, most free slots wins.

pressrun's own algorithm, from the lessons of the papers: Algorithm 2
(000_9aae53f3113e9bd8.txt) trusts the configured link capacity (machine C lies) and
its points mix resources that run out at different client counts; "best" dispatch on
stale numbers self-congests (003_fb4a16d3be88866e.txt, Eq. 3). Here every origin's
capacity is counted in *transfers*, from what its own statuses show.

Per origin i, on each status (n = active transfers, r = the rate one transfer needs):

    r        = the highest mean per-transfer rate seen for the issue on any origin
               (a healthy origin delivers a media transfer at its bitrate),
               else the highest overall mean, else 64 KiB/s
    under    = n > 0 and out / n < (1 - slack) * r             (clients under-served)
    learned  = out            if under       (what it really delivers: machine C)
               max(learned, out) otherwise
    cap      = min(capacity_told, learned)
    idle_x   = x seen while n == 0 (EWMA), for x in cpu, ram;  0 if never seen
    cost_x   = EWMA of (x - idle_x) / n                         (per-transfer cost)

Free transfer slots, counting the picks made since the status (`pending`, whose bytes
are `pending_bytes`) so that a burst between two refreshes is spread as it arrives::

    free_bw  = (u_bw * cap - out - pending_bytes) / r
    free_cpu = (cpu_target - cpu) / cost_cpu - pending
    free_ram = (ram_target - ram) / cost_ram - pending
    free     = min(free_bw, free_cpu, free_ram)
    score    = free (+ cache_bonus_slots if the issue is cached)

The origin with the most free slots wins; an origin with `free < 1` is not eligible
and, when none is left, the answer is "full" (the client retries after Retry-After).
An origin whose costs are not measured yet (no status with transfers) takes at most
`probe_transfers` (minus those it has) until they are: the first status with clients
on it tells how many it can hold, before a burst can bury it. Defaults: slack 0.05,
u_bw 0.95, cpu_target 0.85, ram_target 0.85, probe_transfers 10, cache_bonus_slots 2,
cost EWMA weight 0.3. Pair it with clients that re-ask naming a failed origin (WSDM of
003): the core then ranks without it.

`r` inferred from the fastest healthy origin fits paced transfers (media played in
real time: every healthy transfer runs at the bitrate). Elastic downloads (a file sent
as fast as the link allows) have no such rate: every busy origin would look
under-served. For those set the parameter `need_bytes_per_s` to the slowest rate a
transfer may get (e.g. issue size / acceptable download time); it replaces `r`, and
``free_bw = u_bw * cap / r - n - pending`` counts transfers instead of bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pressrun.balancer.algorithms.alg2 import MIN_ESTIMATE_BYTES_PER_S
from pressrun.balancer.algorithms.base import Params, ScoredAlgorithm, register_algorithm
from pressrun.balancer.events import OriginSpec, OriginStatus


@dataclass(slots=True)
class OriginModel:
    """What headroom dispatch has learned about one origin."""

    learned_bytes_per_s: float | None = None
    idle_cpu: float = 0.0
    idle_ram: float = 0.0
    idle_seen: bool = False
    cost_cpu: float | None = None
    cost_ram: float | None = None
    pending: int = 0
    pending_bytes: float = 0.0
    under_served: bool = False


@register_algorithm
class Headroom(ScoredAlgorithm):
    """Most free transfer slots wins; capacity learned from what an origin delivers."""

    name = "headroom"
    summary = (
        "pressrun headroom dispatch: learned real capacity and per-transfer costs, most free slots"
    )

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.slack = self.param("slack", 0.05)
        self.u_bw = self.param("u_bw", 0.95)
        self.cpu_target = self.param("cpu_target", 0.85)
        self.ram_target = self.param("ram_target", 0.85)
        self.probe = self.param("probe_transfers", 10.0)
        self.cache_bonus = self.param("cache_bonus_slots", 2.0)
        self.alpha = self.param("cost_ewma", 0.3)
        self.fixed_need = self.param("need_bytes_per_s", 0.0)
        self.models: dict[str, OriginModel] = {}
        self.rate_by_issue: dict[str, float] = {}
        self.rate_any = 0.0

    def model(self, name: str) -> OriginModel:
        """The learned model of one origin (created empty)."""
        m = self.models.get(name)
        if m is None:
            m = self.models[name] = OriginModel()
        return m

    def need(self, issue_id: str) -> float:
        """The rate one transfer of the issue needs (bytes/s)."""
        if self.fixed_need > 0:
            return self.fixed_need
        r = self.rate_by_issue.get(issue_id)
        if r:
            return r
        return self.rate_any or MIN_ESTIMATE_BYTES_PER_S

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        m = self.model(name)
        m.pending = 0
        m.pending_bytes = 0.0
        changed = False
        for issue, rate in status.mean_transfer_bytes_per_s_by_issue.items():
            if rate > self.rate_by_issue.get(issue, 0.0):
                self.rate_by_issue[issue] = rate
                changed = True
        mean = status.mean_transfer_bytes_per_s
        if mean is not None and mean > self.rate_any:
            self.rate_any = mean
            changed = True
        n = status.active_transfers
        a = self.alpha
        if n <= 0:
            if m.idle_seen:
                m.idle_cpu += a * (status.cpu_fraction - m.idle_cpu)
                m.idle_ram += a * (status.ram_fraction - m.idle_ram)
            else:
                m.idle_cpu, m.idle_ram, m.idle_seen = status.cpu_fraction, status.ram_fraction, True
            m.under_served = False
        else:
            cpu_cost = max(status.cpu_fraction - m.idle_cpu, 0.0) / n
            ram_cost = max(status.ram_fraction - m.idle_ram, 0.0) / n
            m.cost_cpu = (
                cpu_cost if m.cost_cpu is None else m.cost_cpu + a * (cpu_cost - m.cost_cpu)
            )
            m.cost_ram = (
                ram_cost if m.cost_ram is None else m.cost_ram + a * (ram_cost - m.cost_ram)
            )
            need = self.fixed_need or (
                max(
                    (
                        self.rate_by_issue.get(i, 0.0)
                        for i in status.mean_transfer_bytes_per_s_by_issue
                    ),
                    default=0.0,
                )
                or self.rate_any
            )
            per_transfer = status.out_bytes_per_s / n
            m.under_served = need > 0 and per_transfer < (1.0 - self.slack) * need
            if m.under_served:
                m.learned_bytes_per_s = status.out_bytes_per_s
            elif m.learned_bytes_per_s is not None:
                m.learned_bytes_per_s = max(m.learned_bytes_per_s, status.out_bytes_per_s)
        if changed:
            self.touch_all()  # every origin's slots are counted in r

    def free_slots(self, name: str, status: OriginStatus, issue_id: str) -> float:
        """How many more transfers of the issue the origin can take (Eq. above)."""
        m = self.model(name)
        r = self.need(issue_id)
        if m.cost_cpu is None or m.cost_ram is None:
            return self.probe - status.active_transfers - m.pending
        cap = status.capacity_bytes_per_s
        if m.learned_bytes_per_s is not None:
            cap = min(cap, m.learned_bytes_per_s)
        if self.fixed_need > 0:
            # Elastic transfers fill the link whatever their number: count them instead.
            free = self.u_bw * cap / r - status.active_transfers - m.pending
        else:
            free = (self.u_bw * cap - status.out_bytes_per_s - m.pending_bytes) / r
        if m.under_served:
            free = min(free, 0.0)
        if m.cost_cpu > 0:
            free = min(free, (self.cpu_target - status.cpu_fraction) / m.cost_cpu - m.pending)
        if m.cost_ram > 0:
            free = min(free, (self.ram_target - status.ram_fraction) / m.cost_ram - m.pending)
        return free

    def eligible(self, name: str, status: OriginStatus, issue_id: str) -> bool:
        return issue_id in status.issues and self.free_slots(name, status, issue_id) >= 1.0

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        score = self.free_slots(name, status, issue_id)
        if issue_id in status.cached_issues:
            score += self.cache_bonus
        return score

    def on_pick(self, name: str, issue_id: str, *, now: float) -> None:
        m = self.model(name)
        m.pending += 1
        m.pending_bytes += self.need(issue_id)
