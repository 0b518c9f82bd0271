"""How headroom dispatch learns an origin from its statuses: its link as delivered,
its CPU per byte and RAM per transfer, what its transfers need (`committed`) and the
max-min level a starved stream gets there. The formulas and the measurements behind
them: `pressrun.balancer.algorithms.headroom`'s docstring; moved here from its class as
they were (issue 33).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pressrun.balancer.algorithms.headroom_clients import relief_total
from pressrun.balancer.algorithms.headroom_model import SATURATED
from pressrun.balancer.events import OriginStatus

if TYPE_CHECKING:
    from pressrun.balancer.algorithms.headroom import Headroom

#: where an issue's need is the default (not stated), its transfers are held back by
#: the origin only when the fastest of them gets less than this share of it
UNSTATED_HELD_BACK = 0.5


def learn_from_status(h: Headroom, name: str, status: OriginStatus, *, now: float) -> None:
    """Learn the origin's link, costs and committed load from a fresh status (the
    formulas of `pressrun.balancer.algorithms.headroom`'s docstring)."""
    m = h.model(name)
    m.reconcile(status, now, h.pick_timeout)
    m.count_picks(h.is_paced)
    m.picked_since_status = 0
    m.status_at = now
    changed = False
    for issue, rate in status.mean_transfer_bytes_per_s_by_issue.items():
        if issue not in h.issue_needs and rate > h.rate_by_issue.get(issue, 0.0):
            h.rate_by_issue[issue] = rate
            changed = True
    mean = status.mean_transfer_bytes_per_s
    if mean is not None and mean > h.rate_any:
        h.rate_any = mean
        changed = changed or not h.issue_needs
    n = status.active_transfers
    out = status.out_bytes_per_s
    a = h.alpha
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
        m.cost_ram = ram_cost if m.cost_ram is None else m.cost_ram + a * (ram_cost - m.cost_ram)
        relief = 0.0
        m.client_slow = {}
        if m.reliefs:
            m.reliefs, relief, m.client_slow = relief_total(
                m.reliefs,
                status.active_transfers_by_issue,
                status.mean_transfer_bytes_per_s_by_issue,
                h.need,
                now,
            )
        m.committed_bytes_per_s, short, m.level = committed_load(h, status, relief, m.client_slow)
        m.under_served = m.level < math.inf
        m.loads = tuple(
            (h.need(i), k, h.is_paced(i)) for i, k in status.active_transfers_by_issue.items()
        )
        counts = status.active_transfers_by_issue
        elastic = bool(counts) and not any(h.is_paced(i) for i in counts)
        if m.link_full(status, elastic, h.slack, m.committed_bytes_per_s):
            short = True
        if short:
            m.learned_bytes_per_s = out
        elif m.learned_bytes_per_s is not None:
            learned = max(m.learned_bytes_per_s, out)
            if (
                not m.under_served
                and out < SATURATED * learned
                and m.committed_bytes_per_s >= 0.8 * h.u_bw * learned
            ):
                # Healthy at the learned limit: the limit may be stale (learned in a
                # transient, or from slow clients); probe upwards, as TCP does.
                learned = min(learned * (1.0 + h.growth), status.capacity_bytes_per_s)
            m.learned_bytes_per_s = learned
    if changed:
        h.touch_all()  # every origin's room is counted in the inferred needs


def committed_load(
    h: Headroom, status: OriginStatus, relief: float, client_slow: Mapping[str, float]
) -> tuple[float, bool, float]:
    """What the origin's transfers need (bytes/s; `relief` less: `relief_total`), whether
    it delivers less than that in total (its capacity is what it delivers), and the
    max-min level a starved paced transfer gets there (inf when none is starved: no
    issue needing more than the level is added until they recover). `client_slow`:
    bytes/s per issue its transfers' own links (told by their clients) keep them
    below their need; a shortfall they explain is the clients', not the origin's."""
    out = status.out_bytes_per_s
    limit = 1.0 - h.slack
    # A busy link is shared max-min fairly: the fastest issue's mean is about the
    # level every transfer not held back by its own client gets. Below the largest
    # need of a paced issue (a stream: it stalls as soon as it gets less) the origin
    # starves those transfers; a slow client alone lowers its own issue's mean, not
    # the level. Elastic downloads need their rate only on average (the small ones
    # finish and leave the link to the big ones): the total shortfall covers them.
    means = status.mean_transfer_bytes_per_s_by_issue
    paced = [h.need(i) for i in means if h.is_paced(i)]
    top = max(means.values(), default=0.0)
    starving = top if paced and top < limit * max(paced) else math.inf
    counts = status.active_transfers_by_issue
    if counts:
        committed = sum(k * h.need(i) for i, k in counts.items()) - relief
        # What each issue's transfers would take from an origin that does not hold
        # them back: their need, or their clients' links where those are slower.
        # Held back below it: by more than the slack where the need is stated (a
        # deadline), below `UNSTATED_HELD_BACK` of it where it is the default.
        needs = [
            h.held_back_share(i) * (h.need(i) - client_slow.get(i, 0.0) / k)
            for i, k in counts.items()
        ]
        demand = committed - sum(client_slow.values())
    elif h.fixed_need > 0 and not h.issue_needs:
        # Elastic transfers fill the link whatever their number: count them instead.
        committed = status.active_transfers * h.fixed_need
        needs = [UNSTATED_HELD_BACK * h.fixed_need]
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
