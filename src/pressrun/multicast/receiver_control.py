"""The receive loop's control channel: the datagrams that arrived, the issue's plan
they announce, and whether a plan the receiver was given without a signature (the
balancer's directive) is the carousel the signed announcements name.

Used by `pressrun.multicast.receiver.receive_carousel` (the checks themselves:
`pressrun.multicast.control.check_datagram` and the `AnnouncementGate`)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import replace

from pressrun.multicast.control import check_datagram
from pressrun.multicast.core import AnnouncementGate, CarouselPresence
from pressrun.multicast.events import AnnouncementVerdict, CarouselPlan

log = logging.getLogger("pressrun.multicast.receiver")

__all__ = ["drain", "plan_difference", "plan_from_control", "wall_clock"]


def wall_clock() -> float:
    """Unix time: announcements carry the sender's Unix times."""
    return time.time()  # noqa: TID251 (announcement expiry is in Unix time)


def drain(sock: socket.socket, buffer: bytearray) -> Iterator[bytes]:
    """The datagrams waiting on ``sock``."""
    while True:
        try:
            n = sock.recv_into(buffer)
        except BlockingIOError:
            return
        yield bytes(buffer[:n])


def plan_from_control(
    arrived: Iterator[bytes],
    gate: AnnouncementGate,
    presence: CarouselPresence,
    manifest_sha256: str,
    current: CarouselPlan | None,
) -> CarouselPlan | str | None:
    """The control datagrams that arrived: the issue's plan from the latest accepted
    announcement, or a reason (str) when the accepted announcements say the carousel
    is gone (a whole round without it) or now carries another version of the issue."""
    issue_id = presence.issue_id
    found: CarouselPlan | None = None
    for datagram in arrived:
        ann, verdict, detail = check_datagram(datagram, gate, now_unix=wall_clock())
        if verdict is not AnnouncementVerdict.ACCEPTED or ann is None:
            log.warning("ignoring a control announcement (%s): %s", verdict.value, detail)
            continue
        named = presence.handle(ann)
        plan = ann.plan_for(issue_id)
        if plan is None:
            if current is not None and named is False:
                return f"the sender stopped the carousel of {issue_id}"
            continue
        if plan.manifest_sha256 != manifest_sha256:
            if current is not None:
                return f"the carousel of {issue_id} now carries another version of the issue"
            log.warning(
                "the carousel of %s carries another manifest (%s...); not using it",
                issue_id,
                plan.manifest_sha256[:16],
            )
            continue
        found = plan  # the latest: its packets-sent counters are fresh
    return found


def plan_difference(given: CarouselPlan, announced: CarouselPlan) -> str | None:
    """What differs between a plan given without a signature (a directive's) and the
    one a signed announcement names for the same issue and manifest, in words; None
    when they are the same carousel (the packet counters aside)."""
    if replace(given, sent_packets=()) == replace(announced, sent_packets=()):
        return None
    differs = [
        name
        for name in (
            "channels",
            "toi",
            "fec",
            "symbol_bytes",
            "source_symbols",
            "size_bytes",
            "cycle_s",
            "source",
        )
        if getattr(given, name) != getattr(announced, name)
    ]
    if given.channels != announced.channels:
        ours = ", ".join(f"{c.group}:{c.port} tsi {c.tsi}" for c in given.channels[:3])
        theirs = ", ".join(f"{c.group}:{c.port} tsi {c.tsi}" for c in announced.channels[:3])
        return f"{', '.join(differs)} differ (directive {ours}...; announced {theirs}...)"
    return f"{', '.join(differs)} differ"
