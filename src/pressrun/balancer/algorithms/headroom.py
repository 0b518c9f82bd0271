"""Headroom dispatch: capacity in bytes per second, learned from each origin's statuses.

pressrun's own algorithm, from the lessons of the papers: Algorithm 2
(000_9aae53f3113e9bd8.txt) trusts the configured link capacity (machine C lies) and
its points mix resources that run out at different client counts; "best" dispatch on
stale numbers self-congests (003_fb4a16d3be88866e.txt, Eq. 3). Here every origin's
room is counted in *bytes per second*, and every transfer in what its own issue needs.

The need of an issue, ``need(i)``: what one transfer must get to succeed. Known when
the operator or the simulator says so (`set_issue_need`: a stream's bitrate, a
download's size over its target time), else the parameter `need_bytes_per_s` (default
1 MB/s: pressrun's clients download, elastically), else, with `need_bytes_per_s=0`,
inferred per issue for paced streams: the highest mean per-transfer rate any origin
reported for *that* issue (a healthy origin delivers a stream at its bitrate), else
64 KiB/s.

Per origin, on each status (n_i = its active transfers of issue i, m_i their mean
rate, out = bytes/s it sends, cpu and ram in use, 0..1)::

    committed = sum_i n_i * need(i)        (bytes/s its transfers need; when the agent
                                            does not report n_i: n * need_bytes_per_s
                                            when that is set, else out for paced streams)
    level     = max_i m_i  if that is < (1 - slack) * max_{paced i} need(i), else inf
                (the max-min level a starved stream gets there)
    take_i    = need(i) - slow_i / n_i    (what they would take from an origin not
                                          holding them back: slow_i, the bytes/s their
                                          clients' links, told by ``rate=``, are below
                                          their need: `Relief.slow`)
    short     = out < (1 - slack) * (committed - sum_i slow_i)    (it does not deliver
                and max_i m_i < max_i h_i * take_i               what they take, and
                                     holds them back: the fastest gets less than the
                                     largest; h_i = 1 - slack where need(i) is stated,
                                     `UNSTATED_HELD_BACK` (0.5) where it is the default)
                or the link is full (`OriginModel.link_full`: `out` within slack while
                the transfers' number changed by 10 % since a status, and with
                streams there, their needs by 2 x slack of `out`)
    learned   = out                          if short (what it really delivers: C)
                max(learned, out), and x (1 + probe_growth) up to the told capacity
                while it runs healthy near the learned limit and below 0.99 x it
                (a link saturated by elastic downloads is at its capacity)  otherwise
    cap       = min(capacity_told, learned)
    idle_x    = x seen while n == 0 (EWMA), for x in cpu, ram
    cpu_byte  = EWMA of (cpu - idle_cpu) / out          (CPU share per byte/s sent)
    ram_cost  = EWMA of (ram - idle_ram) / n            (RAM share per transfer)

Room for one more transfer of issue i, counting the picks on their way (`pending`,
needing `pending_bytes`) so a burst between two refreshes is spread as it arrives. A
pick is on its way until the origin reports its transfer started: each status's
counters of transfers started per issue (`transfers_total_by_issue`) settle that many
of the issue's oldest picks; a pick whose client connects after the origin answered
stays pending, and one whose client never comes is dropped after `pick_timeout_s`
(an agent without the counters: every status settles every pick). A pick whose
directive sends the client to the swarm or the carousel first is not pending
(`handle_pick_not_sent`). `picked` counts the picks since the last status;
squeezed(r) = sum over the transfers there and the picks on their way of min(need, r)
for a stream, r for a download (the bytes/s the link must give for its max-min level
to stay at r)::

    room       = min(u_bw * cap, (cpu_target - idle_cpu) / cpu_byte)
    free       = (room - committed - pending_bytes) / need(i)
    level_free = (room - squeezed(need(i))) / need(i)
    free       = min(free, level_free) if free >= 1 else level_free   for a stream i
    free       = min(free, min over the streams' needs r there of
                                (room - squeezed(r)) / r)           for a download i,
                 where the streams need at least level_share of what the downloads need
    free       = min(free, (ram_target - ram) / ram_cost - pending)
    free       = min(free, 0)                       if level < (1 - slack) * need(i)
    free       = max(free, min(probe_transfers - n - picked, told_free))
                                                    otherwise, if out is below 0.99 x
                                                    the told capacity
    told_free  = (u_bw * capacity_told - max(committed, out) - pending_bytes) / need(i)
    score      = free (+ cache_bonus_slots if the issue is cached)

Max-min admission: a link is shared max-min fairly (TCP), so on a full origin a stream
needing less than the level the link would still give it gets all it needs; only the
transfers needing more are squeezed (they stall, fail over, and are refused where
there is no room for them). With the same bytes, the smaller needs serve more clients:
when the biggest server of a cluster fails, its streams crowd onto the small ones,
which keep the low bitrates (issue 10, gen-2026-016: 467 served against alg2's 407,
where admitting first come first served kept 259). The starvation `level` is per issue
for the same reason: an origin starving its 2.5 MB/s streams still serves 64 kB/s.
An elastic download is not held to its own need by the link: it takes the level, as
much as any stream there (a 64 MB issue needing 0.36 MB/s, on a gigabit client, takes
the 1.9 MB/s every 2.5 MB/s stream beside it gets). So a stream counts every download
on the origin at its own bitrate, and a download is not added where a stream's level
would drop below its bitrate (issue 10, gen-7-005: counting the downloads at their
needs let 614 of them starve 160 streams of 2.5 MB/s on one origin; 977 served of a
bound of 1247, 1327 with the level counted).

The floor of `probe_transfers`: the costs are a forecast from readings that can
mislead (the agent reports the whole machine's CPU and RAM, so other work on it looks
like the origin's own; transfers slow at the clients' end teach a capacity at what
they took). An origin where no stream starves and whose told link is not full always
takes up to `probe_transfers`, so it is never shut out for good while capacity frees
up, and its next statuses show what it really carries. (Without it, the security soak
test's clients were refused "full" until they gave up: on the loaded machine the
origins' CPU read 100 % with no transfer, so `cpu_target - idle_cpu < 0`, and their
65 kB downloads, read by one busy client process at 0.4-0.55 MB/s, looked held back
against the 1 MB/s need.) Never beyond its told capacity (`told_free`: an operator
tells a misconfigured origin more than it has, never less): without that bound, the
loopback egress check (docs/results/2026-11-24-egress-caps.md) measured a 4 MB/s
origin taking 9 downloads of 1 MB/s, since with transfers just started `out` (the
last interval's rate) is below
the told capacity, and the floor admitted up to 10.

The origin with the most room wins (ranking by the free *share* instead was tried: the
misconfigured machine C then takes its share of a burst before its first status can
show it, and the paper's waves and burst lose 140 clients). An origin with `free < 1`
is not eligible and, when none is left, the answer is "full" (the service says 503 with
Retry-After): under overload the origins keep the transfers they can serve well, and
the rest are refused quickly instead of everyone being slowed down. An origin whose
costs are not measured yet (no status with transfers) is ranked by its told room
(`told_free`: net of the transfers it runs and the picks on their way) and takes at
most `probe_transfers` (minus those it has) per status until one shows its costs.
The probe counts the picks since the last status, not all those still on their way:
it is a rate, `probe_transfers` per status, until the statuses show what the origin
carries (counting every pick on its way, the security soak test's origins refused
every other client "full": docs/results/2026-11-24-egress-caps.md, "Egress caps in
the loopback demo").

"Most room wins" puts a burst on the biggest origin while it has room, and a failure of
that origin then drops it all at once onto origins with no room for it (issue 10,
gen-7-033: 463 of a burst of 483 downloads on the 1.25 GB/s origin, which failed 32 s
later: 236 served against alg2's 301). Spreading instead was measured worse, each for a
reason that holds beyond the scenario (docs/results/2026-11-24-tournament-rounds.md,
"Spreading, measured": by the share of room still free, the paper's machine C takes
a third of a burst before a
status shows it short, and a download on a small link finishes near its deadline
where on the biggest it gets its whole access rate and finishes early).

Downloads beside streams: the rule above holds where the streams need at least
`level_share` (0.5) of what the downloads there need (each at its issue's need). Where
the downloads lead, a download is counted at its own need: a few streams there are not
worth the downloads the rule would refuse, and when the level drops below their bitrate
they stall and fail over to an origin that has room for them (issue 10, gen-13-064:
one stream of 1.25 MB/s beside 235 downloads made an origin of 312 MB/s count them at
1.25 MB/s each and refuse downloads with 175 MB/s of their needs unused: 1246 served of
a bound of 1485, 1488 counted at their needs there; in gen-7-005 the streams lead and
it still holds). The share is 0.5, not 1: at 1, in gen-2026-166 (where the two differ
only on origins whose streams need 0.5 to 1 of what the downloads need), 26 downloads
with links fast enough finished late (1406 against alg2's 1424; 1429 at 0.5).

A link full at what it sends is learned even when its transfers are not held back
below their needs: with only downloads there, `out` staying within `slack` while their
number changed by a tenth shows the link (or the CPU) at its limit, whatever the origin
is told. (Issue 10, gen-7-033: an origin told 1.13 GB/s, with 125 MB/s, sent 125 MB/s
to 45 to 58 downloads each getting more than its need; believed at 1.13 GB/s, it took 39
of the clients a failed origin dropped within one poll interval, and all its 84
transfers finished late: 280 served, 317 with its link learned.)

Downloads of different deadlines on one origin (issue 33): a link shared evenly gives
every download there the same rate, so one of S_k bytes is done once every other has
received min(S_j, S_k). Where the deadlines D of the downloads there differ (stated
with the need: `set_issue_need(..., deadline_s=)`, S = need x D), a download is
admitted only if for every issue k there and itself::

    sum_j n_j * min(S_j, S_k) + min(S_new, S_k) <= room * D_k * (1 - deadline_margin)

(the transfers on the origin and the picks on their way, counted whole). With one
deadline for all this is the committed rule, so it applies only where they differ
(`headroom_deadlines`; crowd-33-014: 392 to 644 served of a bound of 1045).

What a client tells (`ClientHint`, ``have=``, ``size=``, ``rate=``, ``elapsed=``) and
how a download is counted for it: `pressrun.balancer.algorithms.headroom_clients`.

Picks from one client (issue 25's class: a stranger can neither starve nor steer it).
A pick on its way costs the asker nothing: eleven back-to-back directive requests from
one address made an idle 1 Gbit/s origin "full" (503) without a byte downloaded, and a
stranger asking 50 times a second had 10 of 20 readers refused. So the picks on their
way from one client for one issue count once: the core names the client
(`BalancerCore`: an IPv4 address, an IPv6 /64, as demand counts them) and each request
of it takes back its pick still on its way (`handle_client_asks`, before it is ranked)
and leaves the new one (`handle_pick_for`). What is remembered is one entry per
(issue, client), forgotten after `pick_timeout_s` (when the pick itself would be) and
at most `max_clients_tracked` (100,000; the oldest go first). Requests without an
address (the simulator) and from the networks whose every request counts as demand
(loopback by default, ``--demand-count-every-request-from``) add a pick each, as
before. A stranger with many addresses still holds one pick per address for
`pick_timeout_s`, and one client asking for many issues one per issue.

Defaults: slack 0.02 (a download that gets less than its need on average misses its
deadline: 2 % absorbs a rate sampled over a poll interval, 5 % let a misconfigured
origin take 5 % too many before it was seen), u_bw 0.95, cpu_target 0.95, ram_target
0.9, probe_transfers 10, cache_bonus_slots 2, cost EWMA weight 0.3, probe_growth 0.1,
pick_timeout_s 5, overload_memory_s 30, level_share 0.5, doomed_window_s 4,
deadline_margin 0.05, max_clients_tracked 100000.

Why per issue and per byte: a single rate per origin (the highest bitrate seen) makes
an origin streaming low-bitrate issues look under-served; it then learns a capacity far
below its real one and refuses (issue 10: under 1 % served on a mixed cluster). Counting
bytes per issue makes a 64 kB/s stream and a 2.5 MB/s one cost what they cost, and the
same formula holds for elastic downloads, which take whatever the link gives: their
`out` is not what they need, `committed` is.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence, Set

from pressrun.balancer.algorithms.alg2 import MIN_ESTIMATE_BYTES_PER_S
from pressrun.balancer.algorithms.base import Params, ScoredAlgorithm, register_algorithm
from pressrun.balancer.algorithms.headroom_clients import (
    SLOWER_THAN_ORIGINS,
    client_need,
    finishes_in_time,
    relief_total,
)
from pressrun.balancer.algorithms.headroom_deadlines import deadline_free, deadlines_differ
from pressrun.balancer.algorithms.headroom_model import SATURATED, OriginModel, Pick
from pressrun.balancer.events import ClientHint, OriginSpec, OriginStatus

#: a download must get at least 1 MB/s (8 Mbit/s: a 100 MB issue in 100 s), unless the
#: issue's own need is known; 0 infers paced needs from delivered rates instead
DEFAULT_NEED_BYTES_PER_S = 1e6
#: where an issue's need is the default (not stated), its transfers are held back by
#: the origin only when the fastest of them gets less than this share of it
UNSTATED_HELD_BACK = 0.5


@register_algorithm
class Headroom(ScoredAlgorithm):
    """Most room in bytes/s wins; capacity learned from what an origin delivers."""

    name = "headroom"
    summary = (
        "pressrun headroom dispatch (the default): room in bytes/s per issue's need, "
        "learned real capacity and costs, max-min admission of streams, full when none"
    )

    def __init__(
        self, origins: Sequence[OriginSpec], rng: random.Random, params: Params | None = None
    ) -> None:
        super().__init__(origins, rng, params)
        self.slack = self.param("slack", 0.02)
        self.u_bw = self.param("u_bw", 0.95)
        self.cpu_target = self.param("cpu_target", 0.95)
        self.ram_target = self.param("ram_target", 0.9)
        self.probe = self.param("probe_transfers", 10.0)
        self.cache_bonus = self.param("cache_bonus_slots", 2.0)
        self.alpha = self.param("cost_ewma", 0.3)
        self.growth = self.param("probe_growth", 0.1)
        self.fixed_need = self.param("need_bytes_per_s", DEFAULT_NEED_BYTES_PER_S)
        self.pick_timeout = self.param("pick_timeout_s", 5.0)
        self.overload_memory = self.param("overload_memory_s", 30.0)
        self.level_share = self.param("level_share", 0.5)
        self.doomed_window = self.param("doomed_window_s", 4.0)
        self.deadline_margin = self.param("deadline_margin", 0.05)
        self.max_clients_tracked = int(self.param("max_clients_tracked", 100_000))
        #: (issue, client key) -> (origin, its pick on its way there), oldest first:
        #: one pick on its way per client and issue (`handle_client_asks`)
        self._client_picks: OrderedDict[tuple[str, str], tuple[str, Pick]] = OrderedDict()
        #: when a client was last refused for want of room (none eligible)
        self.refused_at = -math.inf
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
        known = self.issue_needs.get(issue_id)
        if known:
            return known
        if self.fixed_need > 0:
            return self.fixed_need
        r = self.rate_by_issue.get(issue_id)
        if r:
            return r
        return self.rate_any or MIN_ESTIMATE_BYTES_PER_S

    def is_paced(self, issue_id: str) -> bool:
        """A stream (told so, or its need inferred from delivered rates), not a download."""
        if issue_id in self.issue_needs:
            return issue_id in self.paced_issues
        return self.fixed_need <= 0

    def on_refresh(self, name: str, status: OriginStatus, *, now: float) -> None:
        m = self.model(name)
        m.reconcile(status, now, self.pick_timeout)
        m.count_picks(self.is_paced)
        m.picked_since_status = 0
        m.status_at = now
        changed = False
        for issue, rate in status.mean_transfer_bytes_per_s_by_issue.items():
            if issue not in self.issue_needs and rate > self.rate_by_issue.get(issue, 0.0):
                self.rate_by_issue[issue] = rate
                changed = True
        mean = status.mean_transfer_bytes_per_s
        if mean is not None and mean > self.rate_any:
            self.rate_any = mean
            changed = changed or not self.issue_needs
        n = status.active_transfers
        out = status.out_bytes_per_s
        a = self.alpha
        if n <= 0:
            if m.idle_seen:
                m.idle_cpu += a * (status.cpu_fraction - m.idle_cpu)
                m.idle_ram += a * (status.ram_fraction - m.idle_ram)
            else:
                m.idle_cpu, m.idle_ram, m.idle_seen = status.cpu_fraction, status.ram_fraction, True
            m.under_served = False
            m.level = math.inf
            m.loads = ()
            m.committed_bytes_per_s = 0.0
            m.reliefs.clear()
        else:
            if out > 0:
                per_byte = max(status.cpu_fraction - m.idle_cpu, 0.0) / out
                m.cpu_per_byte = (
                    per_byte
                    if m.cpu_per_byte is None
                    else m.cpu_per_byte + a * (per_byte - m.cpu_per_byte)
                )
            ram_cost = max(status.ram_fraction - m.idle_ram, 0.0) / n
            m.cost_ram = (
                ram_cost if m.cost_ram is None else m.cost_ram + a * (ram_cost - m.cost_ram)
            )
            relief = 0.0
            m.client_slow = {}
            if m.reliefs:
                m.reliefs, relief, m.client_slow = relief_total(
                    m.reliefs,
                    status.active_transfers_by_issue,
                    status.mean_transfer_bytes_per_s_by_issue,
                    self.need,
                    now,
                )
            m.committed_bytes_per_s, short, m.level = self._committed(status, relief, m.client_slow)
            m.under_served = m.level < math.inf
            m.loads = tuple(
                (self.need(i), k, self.is_paced(i))
                for i, k in status.active_transfers_by_issue.items()
            )
            counts = status.active_transfers_by_issue
            elastic = bool(counts) and not any(self.is_paced(i) for i in counts)
            if m.link_full(status, elastic, self.slack, m.committed_bytes_per_s):
                short = True
            if short:
                m.learned_bytes_per_s = out
            elif m.learned_bytes_per_s is not None:
                learned = max(m.learned_bytes_per_s, out)
                if (
                    not m.under_served
                    and out < SATURATED * learned
                    and m.committed_bytes_per_s >= 0.8 * self.u_bw * learned
                ):
                    # Healthy at the learned limit: the limit may be stale (learned in a
                    # transient, or from slow clients); probe upwards, as TCP does.
                    learned = min(learned * (1.0 + self.growth), status.capacity_bytes_per_s)
                m.learned_bytes_per_s = learned
        if changed:
            self.touch_all()  # every origin's room is counted in the inferred needs

    def _committed(
        self, status: OriginStatus, relief: float, client_slow: Mapping[str, float]
    ) -> tuple[float, bool, float]:
        """What the origin's transfers need (bytes/s; `relief` less: `relief_total`), whether
        it delivers less than that in total (its capacity is what it delivers), and the
        max-min level a starved paced transfer gets there (inf when none is starved: no
        issue needing more than the level is added until they recover). `client_slow`:
        bytes/s per issue its transfers' own links (told by their clients) keep them
        below their need; a shortfall they explain is the clients', not the origin's."""
        out = status.out_bytes_per_s
        limit = 1.0 - self.slack
        # A busy link is shared max-min fairly: the fastest issue's mean is about the
        # level every transfer not held back by its own client gets. Below the largest
        # need of a paced issue (a stream: it stalls as soon as it gets less) the origin
        # starves those transfers; a slow client alone lowers its own issue's mean, not
        # the level. Elastic downloads need their rate only on average (the small ones
        # finish and leave the link to the big ones): the total shortfall covers them.
        means = status.mean_transfer_bytes_per_s_by_issue
        paced = [self.need(i) for i in means if self.is_paced(i)]
        top = max(means.values(), default=0.0)
        starving = top if paced and top < limit * max(paced) else math.inf
        counts = status.active_transfers_by_issue
        if counts:
            committed = sum(k * self.need(i) for i, k in counts.items()) - relief
            # What each issue's transfers would take from an origin that does not hold
            # them back: their need, or their clients' links where those are slower.
            # Held back below it: by more than the slack where the need is stated (a
            # deadline), below `UNSTATED_HELD_BACK` of it where it is the default.
            needs = [
                self._held_back_share(i) * (self.need(i) - client_slow.get(i, 0.0) / k)
                for i, k in counts.items()
            ]
            demand = committed - sum(client_slow.values())
        elif self.fixed_need > 0 and not self.issue_needs:
            # Elastic transfers fill the link whatever their number: count them instead.
            committed = status.active_transfers * self.fixed_need
            needs = [UNSTATED_HELD_BACK * self.fixed_need]
            demand = committed
        else:
            return out, starving < math.inf, starving
        # Short only when the origin holds its transfers back: the fastest of them gets
        # less than the largest need there. Transfers that finish within a poll (a small
        # issue), or whose own clients are slow, send less than they need in total
        # while each is served fast: that is no sign of a smaller capacity.
        if not means and status.mean_transfer_bytes_per_s is not None:
            top = status.mean_transfer_bytes_per_s
        held_back = not means and status.mean_transfer_bytes_per_s is None
        held_back = held_back or top < max(needs)
        return committed, held_back and out < limit * demand, starving

    def _held_back_share(self, issue_id: str) -> float:
        """Below this share of its need a transfer of the issue is held back: 1 - slack
        where the need is stated (its size over a deadline), `UNSTATED_HELD_BACK` where
        it is the default (what a transfer should get: clients whose links carry about
        that, the egress demo's 1 MB/s ones reading at 0.89 MB/s on a loaded machine,
        are no sign the origin is at its limit; a link that is, is seen full when
        its transfers' number changes and its `out` does not: `OriginModel.link_full`)."""
        return 1.0 - self.slack if issue_id in self.issue_needs else UNSTATED_HELD_BACK

    def room(
        self, name: str, status: OriginStatus, issue_id: str, need: float | None = None
    ) -> tuple[float, float]:
        """(free, score): transfers of the issue the origin can still take (Eq. above),
        and what ranks it: the same, or for an origin not measured yet its told room, plus
        the cache bonus. `need`: what this transfer needs, if not its issue's need (a
        client that told the balancer of itself, `client_need`)."""
        m = self.model(name)
        if need is None:
            need = self.need(issue_id)
        paced = self.is_paced(issue_id)
        bonus = self.cache_bonus if issue_id in status.cached_issues else 0.0
        if m.cpu_per_byte is None or m.cost_ram is None:
            # Not measured yet: ranked by what it is told (else the origins already
            # measured would look roomier and it would never be), but it takes at most
            # `probe_transfers` until a status with transfers shows its costs.
            told = self._told_free(m, status, need)
            return min(
                told, self.probe - status.active_transfers - m.picked_since_status
            ), told + bonus
        room = self._room_bytes(m, status)
        if paced:
            # A link is shared max-min (TCP): a stream gets its need while the level
            # the link gives each transfer is at least that. Streams needing less take
            # their need, bigger ones are squeezed (to fail over and be refused):
            # admitting the smaller need serves more clients with the same bytes (an
            # outage's survivors: issue 10). Elastic downloads take the level whatever
            # their own need, so each counts as much as this stream.
            squeezed = (room - m.squeezed(need)) / need
            free = (room - m.committed_bytes_per_s - m.pending_bytes) / need
            free = min(free, squeezed) if free >= 1.0 else squeezed
        else:
            free = (room - m.committed_bytes_per_s - m.pending_bytes) / need
            # An elastic download lowers the level to what every stream there needs
            # before it is counted full: each stream's need must still be the level.
            # Only where the streams lead: where the downloads do, the streams are not
            # worth the downloads this would refuse (they fail over when squeezed).
            if m.streams_lead(self.level_share):
                for rate in m.paced_needs():
                    free = min(free, (room - m.squeezed(rate)) / rate)
            deadlines = self.issue_deadlines
            active = status.active_transfers_by_issue
            if issue_id in deadlines and deadlines_differ(
                issue_id, active, m.picks, deadlines, self.slack
            ):
                # Downloads of different deadlines there: each counted at what it costs
                # the others, its link shared evenly (`headroom_deadlines`).
                free = min(
                    free,
                    deadline_free(
                        issue_id, active, m.picks, deadlines, self.need, room, self.deadline_margin
                    ),
                )
        if m.cost_ram > 0:
            free = min(free, (self.ram_target - status.ram_fraction) / m.cost_ram - m.pending)
        if m.level < (1.0 - self.slack) * need:
            free = min(free, 0.0)
        elif free < 1.0 and status.out_bytes_per_s < SATURATED * status.capacity_bytes_per_s:
            # No stream starves there and it sends less than its told link, but the
            # costs say full. They are a forecast from readings that can mislead: the
            # machine's CPU or RAM held by other work (the agent reports the whole
            # machine), transfers slow at the clients' end (they get less than their
            # need, so the capacity was learned at what they took). The origin still
            # takes `probe_transfers`, so it is never shut out for good and its next
            # statuses show what it really carries. Never beyond its told capacity.
            probe = self.probe - status.active_transfers - m.picked_since_status
            free = max(free, min(probe, self._told_free(m, status, need)))
        return free, free + bonus

    def _room_bytes(self, m: OriginModel, status: OriginStatus) -> float:
        """Bytes/s the origin can send: its link and CPU."""
        room = self.u_bw * self._link(m, status)
        if m.cpu_per_byte is not None and m.cpu_per_byte > 0:
            room = min(room, (self.cpu_target - m.idle_cpu) / m.cpu_per_byte)
        return room

    @staticmethod
    def _link(m: OriginModel, status: OriginStatus) -> float:
        """The origin's link: as learned, at most as told."""
        cap = status.capacity_bytes_per_s
        if m.learned_bytes_per_s is not None:
            cap = min(cap, m.learned_bytes_per_s)
        return cap

    def _told_free(self, m: OriginModel, status: OriginStatus, need: float) -> float:
        """Transfers of `need` the told capacity still holds: beyond what its running
        transfers need or take (whichever is more: a told capacity is an upper bound,
        a misconfigured origin has less) and the picks on their way to it."""
        used = max(m.committed_bytes_per_s, status.out_bytes_per_s)
        return (self.u_bw * status.capacity_bytes_per_s - used - m.pending_bytes) / need

    def explain(self, name: str, issue_id: str) -> dict[str, float]:
        status = self.statuses.get(name)
        if status is None:
            return {}
        m = self.model(name)
        free, score = self.room(name, status, issue_id)
        learned = m.learned_bytes_per_s
        return {
            "free": free,
            "score": score,
            "measured": float(m.cpu_per_byte is not None and m.cost_ram is not None),
            "active": float(status.active_transfers),
            "active_issue": float(status.active_transfers_by_issue.get(issue_id, 0)),
            "pending": float(m.pending),
            "picked": float(m.picked_since_status),
            "committed_MBps": m.committed_bytes_per_s / 1e6,
            "pending_MBps": m.pending_bytes / 1e6,
            "out_MBps": status.out_bytes_per_s / 1e6,
            "told_MBps": status.capacity_bytes_per_s / 1e6,
            "learned_MBps": math.nan if learned is None else learned / 1e6,
        }

    def free_slots(self, name: str, status: OriginStatus, issue_id: str) -> float:
        """How many more transfers of the issue the origin can take (Eq. above)."""
        return self.room(name, status, issue_id)[0]

    def eligible(self, name: str, status: OriginStatus, issue_id: str) -> bool:
        return issue_id in status.issues and self.free_slots(name, status, issue_id) >= 1.0

    def eligible_score(self, name: str, status: OriginStatus, issue_id: str) -> float | None:
        if issue_id not in status.issues:
            return None
        free, score = self.room(name, status, issue_id)
        return score if free >= 1.0 else None

    def compute_score(self, name: str, status: OriginStatus, issue_id: str) -> float:
        return self.room(name, status, issue_id)[1]

    def handle_client_asks(self, issue_id: str, client_key: str, *, now: float) -> None:
        """The client asks for the issue again: its pick still on its way (if any, made
        within `pick_timeout_s`) is taken back before it is ranked, so however often it
        asks it counts as one transfer on its way (module docstring, "Picks from one
        client")."""
        picks = self._client_picks
        horizon = now - self.pick_timeout
        while picks:
            _, (_, oldest) = next(iter(picks.items()))
            if oldest[0] > horizon:
                break
            picks.popitem(last=False)
        entry = picks.pop((issue_id, client_key), None)
        if entry is None:
            return
        name, pick = entry
        m = self.models.get(name)
        if m is not None and m.take_back(pick, self.is_paced):
            self.touch(name)

    def clients_with_picks(self) -> int:
        """How many (issue, client) picks on their way are remembered (bounded)."""
        return len(self._client_picks)

    def forget_issue(self, issue_id: str) -> None:
        super().forget_issue(issue_id)
        for key in [k for k in self._client_picks if k[0] == issue_id]:
            del self._client_picks[key]

    def handle_pick_not_sent(self, name: str, issue_id: str, *, now: float) -> None:
        m = self.model(name)
        for k in range(len(m.picks) - 1, -1, -1):
            if m.picks[k][1] == issue_id:
                del m.picks[k]
                m.picked_since_status = max(m.picked_since_status - 1, 0)
                m.count_picks(self.is_paced)
                self.touch(name)
                return

    def client_need(self, issue_id: str, client: ClientHint | None) -> float | None:
        """What a download of the issue by this client needs, where what it told the
        balancer makes that less than the issue's need (`headroom_clients.client_need`),
        else None; a stream is always counted at its bitrate (a resumed stream plays at
        the same rate)."""
        if self.is_paced(issue_id):
            return None
        return client_need(self.need(issue_id), client)

    def rank_for(
        self,
        issue_id: str,
        client: ClientHint | None,
        *,
        exclude: Set[str] = frozenset(),
        k: int = 3,
        now: float,
    ) -> list[tuple[str, float]]:
        """Rank for a download whose client told what it needs (`client_need`: an
        origin with room for that, though not for a whole transfer of the issue, is
        eligible) or its link's rate: an origin where it would get all its link
        carries (the origin's room shared evenly among its transfers, the picks on
        their way and this one: `share`) ranks before one where it would not, and
        the most room wins among those (an idle small origin takes a slow client
        before a big busy one does). It scores every holder (the index is by the
        issue's need and has no client); requests without a hint take `rank`."""
        need = self.client_need(issue_id, client)
        rate = None if client is None else client.rate_bytes_per_s
        if self.is_paced(issue_id) or (need is None and rate is None):
            return self.rank(issue_id, exclude=exclude, k=k, now=now)
        # Refused on its link's rate while others are refused for want of room, for
        # an issue with a deadline (`headroom_clients`, "a client whose link cannot").
        slow = (
            rate is not None
            and issue_id in self.issue_needs
            and rate < (1.0 - self.slack) * (need or self.need(issue_id))
            and now - self.refused_at < self.overload_memory
        )
        fastest = 0.0
        found: list[tuple[bool, float, str]] = []
        for name, status in self.statuses.items():
            if name in exclude or issue_id not in status.issues:
                continue
            fastest = max(fastest, status.mean_transfer_bytes_per_s or 0.0)
            free, score = self.room(name, status, issue_id, need)
            if free >= 1.0:
                whole_link = rate is not None and self.share(name, status) >= rate
                found.append((not whole_link, -score, name))
        if slow and rate is not None and SLOWER_THAN_ORIGINS * rate < fastest:
            return []
        if not found:
            self.refused_at = now
            return []
        found.sort()
        if (
            client is not None
            and client.size_bytes
            and issue_id in self.issue_needs
            and now - self.refused_at < self.doomed_window
        ):
            # Refusing already: one that cannot finish in time at the rate it would
            # get is refused too (`headroom_clients`, "a client that cannot finish").
            top = found[0][2]
            got = min(self.share(top, self.statuses[top]), rate or math.inf)
            if not finishes_in_time(client, self.need(issue_id), got):
                return []
        return [(name, -score) for _, score, name in found[:k]]

    def rank(
        self, issue_id: str, *, exclude: Set[str] = frozenset(), k: int = 3, now: float
    ) -> list[tuple[str, float]]:
        ranked = super().rank(issue_id, exclude=exclude, k=k, now=now)
        if not ranked:
            self.refused_at = now
        return ranked

    def share(self, name: str, status: OriginStatus) -> float:
        """The rate one more transfer would get there, the origin's room (its learned
        link, at most as told) shared evenly among its transfers, the picks on their
        way and it."""
        m = self.model(name)
        return self.u_bw * self._link(m, status) / (status.active_transfers + m.pending + 1)

    def handle_pick_for(
        self,
        name: str,
        issue_id: str,
        client: ClientHint | None,
        *,
        now: float,
        client_key: str | None = None,
    ) -> None:
        self._pick_for(name, issue_id, client, now=now)
        m = self.models.get(name)
        if client_key is None or m is None or not m.picks:
            return
        # Remembered as this client's pick on its way: its next request replaces it.
        picks = self._client_picks
        picks[(issue_id, client_key)] = (name, m.picks[-1])
        picks.move_to_end((issue_id, client_key))
        if len(picks) > self.max_clients_tracked:
            picks.popitem(last=False)

    def _pick_for(self, name: str, issue_id: str, client: ClientHint | None, *, now: float) -> None:
        if client is None or client.size_bytes is None or self.is_paced(issue_id):
            self.handle_pick(name, issue_id, now=now)
            return
        # Counted at what it needs (`client_need`), and its link's rate kept: a
        # client resuming, or one whose link is slower than its need, is remembered
        # once its transfer starts (`OriginModel.reconcile`).
        need = self.client_need(issue_id, client) or self.need(issue_id)
        rate = client.rate_bytes_per_s or math.inf
        if need >= self.need(issue_id) and rate >= need:
            self.handle_pick(name, issue_id, now=now)
            return
        left = float(max(client.size_bytes - client.have_bytes, 0))
        pick = (now, issue_id, need, self.need(issue_id) - need, left, rate)
        self.model(name).add_pick(pick, self.is_paced(issue_id))
        self.touch(name)

    def on_pick(self, name: str, issue_id: str, *, now: float) -> None:
        pick = (now, issue_id, self.need(issue_id), 0.0, 0.0, 0.0)
        self.model(name).add_pick(pick, self.is_paced(issue_id))
