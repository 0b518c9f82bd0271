"""Watching the publisher's control channel from the swarm: a carousel starting.

The balancer starts an issue's carousel at peak demand. A client it sent to the swarm
a few seconds earlier, in the rising wave before the demand estimate crossed the
multicast threshold, would otherwise take the file from whatever the swarm has: in a
swarm of newcomers, mostly the origins' web seeds. `watch_for_carousel` listens on the
control group (signed announcements, the checks of `pressrun.multicast.control`) and
returns the issue's carousel plan once an announcement the client trusts names it with
the manifest the client verified; :mod:`.swarm_handoff` then leaves the swarm for it
once the carousel would bring the file sooner than the swarm's peers the rest
(:mod:`.carousel_switch`). Blocking, for a thread of its own (like the receive loop).
"""

from __future__ import annotations

import selectors
from collections.abc import Callable, Collection

from pressrun.multicast.control import check_datagram
from pressrun.multicast.core import AnnouncementGate
from pressrun.multicast.events import AnnouncementVerdict, CarouselPlan
from pressrun.multicast.net import leave_and_close, receiver_socket
from pressrun.multicast.receiver import MAX_DATAGRAM
from pressrun.multicast.receiver_control import wall_clock

__all__ = ["watch_for_carousel"]

#: how often ``should_stop`` is asked while no announcement arrives (seconds)
POLL_S = 0.25


def watch_for_carousel(
    issue_id: str,
    manifest_sha256: str,
    *,
    control_group: tuple[str, int],
    interface: str,
    trusted_keys: Collection[str],
    should_stop: Callable[[], bool],
    source: str | None = None,
    on_plan: Callable[[CarouselPlan, float], None] | None = None,
) -> CarouselPlan | None:
    """The issue's carousel plan from the first trusted announcement naming it with
    this manifest; None once ``should_stop()`` says so. ``trusted_keys``: hex Ed25519
    publisher keys; ``source``: the sender's address, which a source-specific (232/8)
    control group is joined by (ValueError for one without it). With ``on_plan`` it
    goes on until ``should_stop()``, calling ``on_plan(plan, expires_in_s)`` for every
    such announcement (``expires_in_s``: until the announcement expires by the
    sender's clock, what the plan is good for), and returns None."""
    gate = AnnouncementGate(trusted_keys)
    sock = receiver_socket(*control_group, interface, source=source)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    buffer = bytearray(MAX_DATAGRAM)
    try:
        while not should_stop():
            if not selector.select(POLL_S):
                continue
            while True:
                try:
                    n = sock.recv_into(buffer)
                except BlockingIOError:
                    break
                ann, verdict, _ = check_datagram(bytes(buffer[:n]), gate, now_unix=wall_clock())
                if verdict is not AnnouncementVerdict.ACCEPTED or ann is None:
                    continue
                plan = ann.plan_for(issue_id)
                if plan is not None and plan.manifest_sha256 == manifest_sha256:
                    if on_plan is None:
                        return plan
                    on_plan(plan, ann.expires_at - wall_clock())
        return None
    finally:
        selector.close()
        leave_and_close(sock, control_group[0], interface, source)
