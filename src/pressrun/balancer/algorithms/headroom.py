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

Picks from one client count once: `pressrun.balancer.algorithms.headroom_client_picks`.

Under overload, the room goes to the downloads that cost the others least, and the
crowd's demand (its new clients' asks) says the balancer is overloaded before anyone is
refused: `pressrun.balancer.algorithms.headroom_overload` (issue 33).

Reserved starts under overload: the per-origin queue is
`pressrun.balancer.algorithms.headroom_reservations`, the methods that use it (which
`Headroom` inherits) `pressrun.balancer.algorithms.headroom_booking`.

Defaults: slack 0.02 (a download that gets less than its need on average misses its
deadline: 2 % absorbs a rate sampled over a poll interval, 5 % let a misconfigured
origin take 5 % too many before it was seen), u_bw 0.95, cpu_target 0.95, ram_target
0.9, probe_transfers 10, cache_bonus_slots 2, cost EWMA weight 0.3, probe_growth 0.1,
pick_timeout_s 5, overload_memory_s 30, level_share 0.5, doomed_window_s 4,
deadline_margin 0.05, max_clients_tracked 100000, overload_pricing 1 (0: off),
demand_window_s 30.

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
from collections.abc import Sequence, Set

from pressrun.balancer.algorithms.alg2 import MIN_ESTIMATE_BYTES_PER_S
from pressrun.balancer.algorithms.base import Params, register_algorithm
from pressrun.balancer.algorithms.headroom_booking import HeadroomBooking
from pressrun.balancer.algorithms.headroom_client_picks import ClientPicks
from pressrun.balancer.algorithms.headroom_clients import (
    SLOWER_THAN_ORIGINS,
    client_need,
    finishes_in_time,
)
from pressrun.balancer.algorithms.headroom_deadlines import deadline_free, deadlines_differ
from pressrun.balancer.algorithms.headroom_learning import UNSTATED_HELD_BACK, learn_from_status
from pressrun.balancer.algorithms.headroom_model import SATURATED, OriginModel
from pressrun.balancer.algorithms.headroom_overload import Overload
from pressrun.balancer.events import ClientHint, OriginSpec, OriginStatus

#: a download must get at least 1 MB/s (8 Mbit/s: a 100 MB issue in 100 s), unless the
#: issue's own need is known; 0 infers paced needs from delivered rates instead
DEFAULT_NEED_BYTES_PER_S = 1e6


@register_algorithm
class Headroom(HeadroomBooking):
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
        self.demand_overload = self.param("demand_overload", 1.0) > 0
        self.overload = (
            Overload(self._sizes, self._total_capacity, self.param("demand_window_s", 30.0))
            if self.param("overload_pricing", 1.0) > 0
            else None
        )
        #: one pick on its way per client and issue (`handle_client_asks`)
        self.client_picks = ClientPicks(
            self.pick_timeout, int(self.param("max_clients_tracked", 100_000))
        )
        #: when a client was last refused for want of room (none eligible)
        self.refused_at = -math.inf
        self._init_booking()  # reserved starts (`headroom_booking`)
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
        learn_from_status(self, name, status, now=now)
        if self.reservations is not None:
            self.reservations.observe(name, now=now)
            deadlines = self.issue_deadlines
            if any(n and i not in deadlines for i, n in status.active_transfers_by_issue.items()):
                self._serving_others.add(name)
            else:
                self._serving_others.discard(name)

    def held_back_share(self, issue_id: str) -> float:
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
        entry = self.client_picks.take_back(issue_id, client_key, now=now)
        if entry is None:
            return
        name, pick = entry
        m = self.models.get(name)
        if m is not None and m.take_back(pick, self.is_paced):
            self.touch(name)

    def clients_with_picks(self) -> int:
        """How many (issue, client) picks on their way are remembered (bounded)."""
        return len(self.client_picks)

    def forget_issue(self, issue_id: str) -> None:
        super().forget_issue(issue_id)
        if self.overload is not None:
            self.overload.demand.forget(issue_id)
            self.overload.recent.forget(issue_id)
        self.client_picks.forget_issue(issue_id)

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
        self._planned = None
        self._claimed = None
        need = self.client_need(issue_id, client)
        rate = None if client is None else client.rate_bytes_per_s
        if self.is_paced(issue_id) or (need is None and rate is None):
            return self.rank(issue_id, exclude=exclude, k=k, now=now)
        # Counted in the demand whatever the answer; under overload the book queues
        # the downloads it is told enough of (first come, first served: pricing
        # refused dear ones the book can still serve in time, measured worse with
        # the book: docs/results/2026-11-28-balancer-reservations.md).
        priced_out = self._priced_out(issue_id, client, now=now)
        booked = self._from_book(issue_id, client, exclude, now=now)
        if booked is not None:
            return booked
        if priced_out:
            return []
        # Refused on its link's rate while others are refused for want of room, for
        # an issue with a deadline (`headroom_clients`, "a client whose link cannot").
        slow = (
            rate is not None
            and issue_id in self.issue_needs
            and rate < (1.0 - self.slack) * (need or self.need(issue_id))
            and self._overloaded(self.overload_memory, now=now)
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
            and self._overloaded(self.doomed_window, now=now)
        ):
            # Refusing already: one that cannot finish in time at the rate it would
            # get is refused too (`headroom_clients`, "a client that cannot finish").
            top = found[0][2]
            got = min(self.share(top, self.statuses[top]), rate or math.inf)
            if not finishes_in_time(client, self.need(issue_id), got):
                return []
        return [(name, -score) for _, score, name in found[:k]]

    def _priced_out(self, issue_id: str, client: ClientHint | None, *, now: float) -> bool:
        """Counts a new client's ask in its issue's demand; whether the download is
        priced out while others are refused for want of room (`headroom_overload`)."""
        deadline = self.issue_deadlines.get(issue_id)
        if client is None or deadline is None or self.overload is None:
            return False
        self.overload.asked(issue_id, client, self.need(issue_id), deadline, now=now)
        if now - self.refused_at >= self.overload_memory:
            return False
        if not self.overload.exceeds_capacity(now=now):
            return False
        return self.overload.priced_out(client, self.need(issue_id) * deadline, now=now)

    def _overloaded(self, memory_s: float, *, now: float) -> bool:
        """Whether clients are turned away: one was refused for want of room in the
        last `memory_s`, or the new clients, each issue's counted over its deadline,
        ask for more than the origins send (a crowd's first seconds, before anyone is
        refused: `headroom_overload`)."""
        if now - self.refused_at < memory_s:
            return True
        if self.overload is None or not self.demand_overload:
            return False
        return self.overload.exceeds_capacity(now=now)

    def _sizes(self) -> dict[str, float]:
        """The size of every download whose deadline is stated (need x deadline)."""
        return {
            i: self.need(i) * d
            for i, d in self.issue_deadlines.items()
            if i not in self.paced_issues
        }

    def _total_capacity(self) -> float:
        """Bytes/s every origin in rotation can send (`_capacity`)."""
        return sum(self._capacity(name, status) for name, status in self.statuses.items())

    def _capacity(self, name: str, status: OriginStatus) -> float:
        """Bytes/s the origin can send: as measured (`_room_bytes`), or as told while
        its costs are not measured yet."""
        m = self.model(name)
        if m.cpu_per_byte is None:
            return self.u_bw * status.capacity_bytes_per_s
        return self._room_bytes(m, status)

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
        self._book_pick(name, issue_id, client, now=now)
        m = self.models.get(name)
        if client_key is None or m is None or not m.picks:
            return
        # Remembered as this client's pick on its way: its next request replaces it.
        self.client_picks.remember(issue_id, client_key, name, m.picks[-1])

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
