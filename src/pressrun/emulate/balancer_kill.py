"""Several balancers in the emulation (issue 30): what the report says about them.

The ``balancer-kill`` scenario runs the crowd over two balancers sharing demand through
Redis and kills one mid-burst; its ``one_balancer_twin`` runs the same crowd again
against ``balancer`` alone (``balancer-2`` scaled to 0), so the report can show that the
crowd's mode changes at the same demand whatever the number of balancers. Per run:

- **the demand at each mode change**: the crowd's size when the first client was
  answered each mode (`mode_change_clients`: the first client, in the order the
  clients began, that was answered ``swarm``, and ``multicast``; a client counts once
  per address and window as demand, so its rank is the demand); and, over every
  balancer, which directive (by its number in the run, all modes counted) was the
  first answered in each mode (`mode_change_demand`). Clients ask more than once (a
  client in origin mode re-asks: 14 directives for the first 4 clients in a measured
  run), so the directive's number is not the crowd's size; and the series come at 1 s
  steps (Prometheus), so it is a range ``[lo, hi]``;
- **the carousel orders** (`carousel_counts`): the multicast sender's own count of
  carousels started and stopped (``pressrun_multicast_carousel_{starts,stops}_total``
  from Prometheus): 1 start in a run where the carousel lease works; and each
  balancer's directives over the run, with those after a restart (`directives_by`:
  the killed one's clients went to the other);
- **each balancer's events** (`balancer_events`), read from the services' log: when it
  took or lost the carousel lease and each carousel it started or stopped, in seconds
  from the first client.

Pure but for `carousel_counts` (Prometheus's HTTP API).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

#: the twin run's name: the crowd against ``balancer`` alone
ONE_BALANCER = "one-balancer"
#: the second balancer of docker-compose.yml (scaled to 0 in the one-balancer run)
SECOND_BALANCER = "balancer-2"
#: the balancers of docker-compose.yml
BALANCER_SERVICES = ("balancer", SECOND_BALANCER)

#: log messages of the balancer (pressrun.balancer.shared and .carousels) -> event
_EVENTS = (
    ("now orders the carousels", "took the carousel lease"),
    ("lost the carousel lease", "lost the carousel lease"),
    ("this balancer stops ordering", "lost the carousel lease (Redis)"),
    ("moves to multicast (carousel started)", "started the carousel"),
    ("is stopped (not wanted)", "stopped the carousel"),
)
#: the service's own time at the head of its line (logging's asctime, UTC in the
#: containers): docker's stamp is when the engine read the line, seconds later under load
_ASCTIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
#: ``<service> | <RFC 3339 time from docker logs -t> <the line>``
_LINE = re.compile(
    r"^(?P<service>[\w.-]+) \| (?P<at>\d{4}-\d\d-\d\dT[\d:]+(?:\.\d+)?Z) (?P<text>.*)$"
)


def _wall_seconds(stamp: str) -> float:
    """Seconds since the epoch of docker's RFC 3339 UTC stamp (nanoseconds cut to
    microseconds)."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    text = head + (f".{frac[:6]}" if frac else "") + "+00:00"
    return datetime.fromisoformat(text).timestamp()


def balancer_events(log_text: str, t0_wall: float | None) -> dict[str, list[list[Any]]]:
    """Per balancer, ``[seconds from the first client, event]`` for each lease taken or
    lost and each carousel started or stopped, from the services' log (`service_logs`
    format). Without ``t0_wall`` (the run never reached its first client) the times are
    seconds since the epoch."""
    out: dict[str, list[list[Any]]] = {name: [] for name in BALANCER_SERVICES}
    for line in log_text.splitlines():
        match = _LINE.match(line)
        if match is None or match["service"] not in out:
            continue
        for needle, event in _EVENTS:
            if needle in match["text"]:
                own = _ASCTIME.match(match["text"])
                try:
                    if own is not None:
                        at = _wall_seconds(f"{own[1].replace(' ', 'T')}.{own[2]}Z")
                    else:
                        at = _wall_seconds(match["at"])
                except ValueError:
                    continue
                when = at - t0_wall if t0_wall is not None else at
                out[match["service"]].append([round(when, 1), event])
                break
    return out


def mode_change_demand(
    directives: Sequence[tuple[float, Mapping[str, int]]],
) -> dict[str, dict[str, float]]:
    """Per mode but origin, the range of the first directive of that mode by its
    number among every directive of the run (all balancers, all modes), and when
    (``at_s``: the first sample showing it): ``{"lo": , "hi": , "at_s": }``."""
    out: dict[str, dict[str, float]] = {}
    modes = sorted({m for _, counts in directives for m in counts if m != "origin"})
    for mode in modes:
        for i, (t, counts) in enumerate(directives):
            seen = counts.get(mode, 0)
            if seen <= 0:
                continue
            before = sum(directives[i - 1][1].values()) if i > 0 else 0
            # this sample's directives hold ``seen`` of the mode: the first of them is
            # at most the one after every other directive of the sample
            latest = sum(counts.values()) - seen + 1
            out[mode] = {"lo": before + 1, "hi": max(before + 1, latest), "at_s": round(t, 1)}
            break
    return out


def mode_change_clients(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Per mode but origin, the rank (from 1, in the order the clients began) of the
    first client answered that mode at its directive: ``swarm`` for a client that ended
    in the swarm or left it for the carousel, ``multicast`` for one that went to the
    carousel straight away (not one that left the swarm for it when it started)."""
    began = sorted(
        (row for row in rows if row.get("started_s") is not None),
        key=lambda row: float(row["started_s"]),
    )
    out: dict[str, int] = {}
    for rank, row in enumerate(began, start=1):
        left = bool(row.get("left_swarm_for_carousel"))
        mode = "swarm" if left else str(row.get("mode"))
        if mode in ("swarm", "multicast"):
            out.setdefault(mode, rank)
    return out


def directives_at(
    directives: Sequence[tuple[float, Mapping[str, int]]], at_s: float
) -> dict[str, float] | None:
    """The directives answered over all balancers, all modes, around ``at_s`` (the
    samples either side: ``lo`` at the last one before, ``hi`` at the first one
    after); None outside the series."""
    before = [(t, sum(c.values())) for t, c in directives if t <= at_s]
    after = [(t, sum(c.values())) for t, c in directives if t >= at_s]
    if not before or not after:
        return None
    return {"lo": before[-1][1], "hi": after[0][1], "at_s": round(at_s, 1)}


def carousel_start_demand(
    directives: Sequence[tuple[float, Mapping[str, int]]], events: Mapping[str, Any]
) -> dict[str, float] | None:
    """The directives answered when the first carousel was started (the first
    ``started the carousel`` event of any balancer): the demand at which the policy
    moved the crowd to multicast, within the round that ordered it."""
    starts = [t for evs in events.values() for t, e in evs if e == "started the carousel"]
    return directives_at(directives, min(starts)) if starts else None


def compare_modes(two: Mapping[str, Any], one: Mapping[str, Any]) -> dict[str, Any]:
    """Per mode, the two runs side by side (each run's ``balancers`` of the summary):
    the first client answered it and the first directive's range, and the gaps between
    them (clients; directives, 0 when the ranges overlap)."""
    out: dict[str, Any] = {}
    two_c, one_c = two.get("mode_change_clients") or {}, one.get("mode_change_clients") or {}
    two_d, one_d = two.get("mode_change_demand") or {}, one.get("mode_change_demand") or {}
    out["carousel_started_at_directives"] = {
        "two_balancers": two.get("carousel_start_demand"),
        "one_balancer": one.get("carousel_start_demand"),
    }
    for mode in sorted(set(two_c) | set(one_c) | set(two_d) | set(one_d)):
        a, b = two_d.get(mode), one_d.get(mode)
        entry: dict[str, Any] = {
            "first_client": {"two_balancers": two_c.get(mode), "one_balancer": one_c.get(mode)},
            "first_directive": {"two_balancers": a, "one_balancer": b},
            "client_gap": None,
            "directive_gap": None,
        }
        if mode in two_c and mode in one_c:
            entry["client_gap"] = abs(two_c[mode] - one_c[mode])
        if a is not None and b is not None:
            entry["directive_gap"] = max(0.0, a["lo"] - b["hi"], b["lo"] - a["hi"])
        out[mode] = entry
    return out


def carousel_counts(base: str, *, start_wall: float, end_wall: float) -> dict[str, int]:
    """The carousels the multicast sender started and stopped between two wall times
    (its counters in Prometheus at ``base``, resets undone)."""
    from pressrun.emulate.prometheus_series import monotonic, query_range

    out: dict[str, int] = {}
    for key in ("starts", "stops"):
        found = query_range(
            base,
            f"pressrun_multicast_carousel_{key}_total",
            start=start_wall,
            end=end_wall,
            step_s=1.0,
        )
        total = 0
        for _labels, points in found:
            points = monotonic(points)
            if points:
                # the sender started before the window with 0 (nothing wanted a carousel)
                total += int(points[-1][1])
        out[key] = total
    return out


def directives_by(base: str, *, start_wall: float, end_wall: float) -> dict[str, Any]:
    """Per balancer (scrape instance), the directives it answered between two wall
    times, all modes, and those since its last restart (None: it was not restarted)."""
    from pressrun.emulate.prometheus_series import monotonic, query_range

    found = query_range(
        base, "pressrun_balancer_directives_total", start=start_wall, end=end_wall, step_s=1.0
    )
    out: dict[str, Any] = {}
    for labels, points in found:
        if not points:
            continue
        entry = out.setdefault(labels.get("instance", "?"), {"total": 0, "since_restart": None})
        counted = monotonic(points)
        # a series already there at the window's start counts from its value then
        # (a series born in the window, at its first directive, from 0)
        base_value = points[0][1] if points[0][0] - start_wall <= 1.5 else 0.0
        entry["total"] += int(counted[-1][1] - base_value)
        if counted[-1][1] != points[-1][1]:  # reset: the process was restarted
            entry["since_restart"] = (entry["since_restart"] or 0) + int(points[-1][1])
    return out


def balancers_line(name: str, variant: Mapping[str, Any]) -> str:
    """One console line: the demand at each mode change, the carousel orders and who
    gave them."""
    info = variant.get("balancers") or {}
    changes = info.get("mode_change_demand") or {}
    clients = info.get("mode_change_clients") or {}
    parts = [
        f"{mode} first to client {clients.get(mode, '-')}, directive {r['lo']:g}-{r['hi']:g} "
        f"(t={r['at_s']:g} s)"
        for mode, r in sorted(changes.items(), key=lambda kv: kv[1]["lo"])
    ]
    started = info.get("carousel_start_demand")
    if started is not None:
        parts.append(
            f"the carousel started at {started['at_s']:g} s, after {started['lo']:g}-"
            f"{started['hi']:g} directives"
        )
    for instance, n in sorted((info.get("directives_by") or {}).items()):
        restarted = n.get("since_restart")
        parts.append(
            f"{instance} answered {n['total']} directives"
            + (f" ({restarted} after its restart)" if restarted is not None else "")
        )
    counts = info.get("carousel_counts")
    if counts is not None:
        parts.append(
            f"the sender started {counts['starts']} carousel(s), stopped {counts['stops']}"
        )
    for service, events in sorted((info.get("events") or {}).items()):
        if events:
            parts.append(f"{service}: " + ", ".join(f"{e} at {t:g} s" for t, e in events))
    return f"{name}: balancers: " + ("; ".join(parts) or "nothing recorded")
