"""Placement of requests by class: the content-aware dispatch of LVS-CAD.

LVS-CAD (001_524169374db25375.txt, section 3) sorts requests into classes by what they
ask for and sends each class to the servers suited to it: its GCAP policy gives every
back-end a set of request types it serves and dispatches each type over its servers
with weighted round robin ("each back-end server processes only its own types of
requests"). pressrun's requests have three classes (`RequestClass`):

- ``small``: manifests, torrents, covers, subscription wraps; latency-bound, a few
  kB to a few hundred kB. Admission by bandwidth makes no sense for them (they cost
  next to nothing and a refusal costs a whole Retry-After of latency), and origins
  serve them ahead of bulk transfers (docs/origin.md). Default policy
  ``least-loaded``.
- ``crowd``: the new issue, many clients at once, bulk with a deadline: the scoring
  algorithm (`headroom`: admission against each origin's room). Default
  ``algorithm``.
- ``catalogue``: back issues that only some origins hold and few readers ask for.
  Default ``gwrr`` over the holders: placed without the algorithm's picks, so the
  crowd's accounting (picks on their way, probes) is not moved by them; their
  transfers show in the origins' statuses like any other.

The policies this module implements (``algorithm`` is the core's own path):

- ``gwrr``: grouped weighted round robin. The class's group (`BalancerConfig.
  class_groups`, default every origin) restricted to the origins in rotation that
  hold the issue and are not named failed; nginx's smooth weighted round robin over
  them (each pick adds every candidate's weight to its credit; the most credit wins
  and pays back the candidates' total), one credit table per class. Weight 0: never.
- ``least-loaded``: the same candidates, fewest (active transfers + picks since that
  origin's last status) per unit of weight; ties to the smaller name.

If the group holds no copy of the issue, the class goes to any holder (a request is
never lost to configuration). Neither policy refuses a request while a holder is in
rotation.

Pure: no clock, no I/O. State: one credit per (class, origin) and one count of picks
per origin since its last status, both bounded by the configured origins.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from pressrun.balancer.events import OriginSpec, OriginStatus, RequestClass


class ClassDispatch:
    """The ``gwrr`` and ``least-loaded`` placements, per request class."""

    def __init__(self, origins: Sequence[OriginSpec], groups: Mapping[str, frozenset[str]]) -> None:
        self.weights = {o.name: o.weight for o in origins}
        self.groups = {k: frozenset(v) for k, v in groups.items()}
        self.credits: dict[tuple[RequestClass, str], float] = {}
        self.picked_since_status: dict[str, int] = {}
        #: picks per class and origin (for /v1/origins and the simulator's report)
        self.picks: dict[tuple[RequestClass, str], int] = {}

    def candidates(
        self, klass: RequestClass, holders: Iterable[str], exclude: Set[str]
    ) -> list[str]:
        """The origins that may take a request of the class: the holders in rotation,
        not excluded, of positive weight, within the class's group if it holds any."""
        weights = self.weights
        usable = [n for n in holders if n not in exclude and weights.get(n, 0.0) > 0]
        group = self.groups.get(klass.value)
        if group is None:
            return usable
        inside = [n for n in usable if n in group]
        return inside or usable

    def rank(
        self,
        policy: str,
        klass: RequestClass,
        holders: Iterable[str],
        status_of: Callable[[str], OriginStatus | None],
        *,
        exclude: Set[str] = frozenset(),
        k: int = 3,
    ) -> list[tuple[str, float]]:
        """Up to `k` origins for a request of the class, best first (ties to the
        smaller name), with their scores (credit after this pick for ``gwrr``; minus
        the load per weight for ``least-loaded``). Empty when no holder is usable.
        Changes nothing. O(holders), as every pick of a smooth round robin is."""
        names = self.candidates(klass, holders, exclude)
        if not names:
            return []
        weights = self.weights
        if policy == "gwrr":
            credits = self.credits
            scored = [(credits.get((klass, n), 0.0) + weights[n], n) for n in names]
        elif policy == "least-loaded":
            picked = self.picked_since_status
            scored = []
            for n in names:
                status = status_of(n)
                active = status.active_transfers if status is not None else 0
                scored.append((-(active + picked.get(n, 0)) / weights[n], n))
        else:
            raise ValueError(f"no class policy {policy!r} here")
        best = heapq.nsmallest(k, scored, key=lambda x: (-x[0], x[1]))
        return [(n, score) for score, n in best]

    def handle_pick(
        self, policy: str, klass: RequestClass, name: str, holders: Iterable[str], exclude: Set[str]
    ) -> None:
        """A request of the class was sent to `name`: the round robin's credits move
        (every candidate gains its weight, the pick pays their total) and the origin
        counts one more pick until its next status."""
        self.picked_since_status[name] = self.picked_since_status.get(name, 0) + 1
        self.picks[(klass, name)] = self.picks.get((klass, name), 0) + 1
        if policy != "gwrr":
            return
        names = self.candidates(klass, holders, exclude)
        total = 0.0
        for n in names:
            w = self.weights[n]
            total += w
            self.credits[(klass, n)] = self.credits.get((klass, n), 0.0) + w
        self.credits[(klass, name)] = self.credits.get((klass, name), 0.0) - total

    def handle_status(self, name: str) -> None:
        """A fresh status of `name`: its active transfers count the picks since."""
        self.picked_since_status.pop(name, None)
