"""Picks from one client count once (issue 25's class: a stranger can neither starve
nor steer headroom dispatch).

A pick on its way costs the asker nothing: eleven back-to-back directive requests from
one address made an idle 1 Gbit/s origin "full" (503) without a byte downloaded, and a
stranger asking 50 times a second had 10 of 20 readers refused. So the picks on their
way from one client for one issue count once: the core names the client
(`BalancerCore`: an IPv4 address, an IPv6 /64, as demand counts them) and each request
of it takes back its pick still on its way (`Headroom.handle_client_asks`, before it is
ranked) and leaves the new one (`Headroom.handle_pick_for`). What is remembered is one
entry per (issue, client), forgotten after `pick_timeout_s` (when the pick itself would
be) and at most `max_clients_tracked` (100,000; the oldest go first). Requests without
an address (the simulator) and from the networks whose every request counts as demand
(loopback by default, ``--demand-count-every-request-from``) add a pick each, as
before. A stranger with many addresses still holds one pick per address for
`pick_timeout_s`, and one client asking for many issues one per issue.

Moved out of `pressrun.balancer.algorithms.headroom` as it was (issue 33).
"""

from __future__ import annotations

from collections import OrderedDict

from pressrun.balancer.algorithms.headroom_model import Pick


class ClientPicks:
    """(issue, client key) -> (origin, its pick on its way there), oldest first,
    bounded by `max_clients` and forgotten after `timeout_s`."""

    def __init__(self, timeout_s: float, max_clients: int) -> None:
        self.timeout_s = timeout_s
        self.max_clients = max_clients
        self._picks: OrderedDict[tuple[str, str], tuple[str, Pick]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._picks)

    def take_back(self, issue_id: str, client_key: str, *, now: float) -> tuple[str, Pick] | None:
        """The client asks again: its pick still on its way (made within `timeout_s`),
        if any, as (origin, pick), forgotten here; the stale ones are dropped first."""
        picks = self._picks
        horizon = now - self.timeout_s
        while picks:
            _, (_, oldest) = next(iter(picks.items()))
            if oldest[0] > horizon:
                break
            picks.popitem(last=False)
        return picks.pop((issue_id, client_key), None)

    def remember(self, issue_id: str, client_key: str, name: str, pick: Pick) -> None:
        """The client's pick on its way to `name`: its next request replaces it."""
        picks = self._picks
        picks[(issue_id, client_key)] = (name, pick)
        picks.move_to_end((issue_id, client_key))
        if len(picks) > self.max_clients:
            picks.popitem(last=False)

    def forget_issue(self, issue_id: str) -> None:
        """The issue is gone: forget its clients' picks."""
        for key in [k for k in self._picks if k[0] == issue_id]:
            del self._picks[key]
