"""What each balancer's demand policy saw and decided over a run (issue 28), kept with
the report: without it a carousel that did not start could not be explained after the
containers (and Prometheus's store) were gone.

`read_demand` asks the deployment's Prometheus (one step a second, the run's window)
for the balancers' demand families (`pressrun.balancer.demand_metrics`): per balancer
and issue, D (the downloaders the thresholds are compared with), the request rate
counted there and heard from the others, the mode, whether ``multicast`` was answered
(the carousel running by the sender's list), and per balancer whether it held the
carousel lease; and the thresholds. The run writes it whole to
``<variant>-demand.json``; `demand_summary` (pure) gives the report per balancer and
issue: the peak of D, when D first reached each enter threshold, each mode change with
the D it was taken at, the seconds D was at the multicast level while the mode was
not multicast (a step up held back), the seconds in multicast mode with no carousel
answered (the sender's start, or a lost lease), and the seconds it held the lease.
"""

from __future__ import annotations

import itertools
from typing import Any

from pressrun.emulate.prometheus_series import query_range

DOWNLOADERS = "pressrun_balancer_demand_downloaders"
RATE = "pressrun_balancer_demand_requests_per_second"
MODE = "pressrun_balancer_demand_mode"
ANSWERED = "pressrun_balancer_carousel_answered"
LEADER = "pressrun_balancer_carousel_leader"
THRESHOLD = "pressrun_balancer_demand_threshold"


def read_demand(
    base: str, *, start_wall: float, end_wall: float, step_s: float = 1.0
) -> dict[str, Any]:
    """The balancers' demand series from Prometheus at ``base`` between two wall times:
    ``{"step_s", "thresholds": {name: value}, "balancers": {instance: {"leader":
    [[t, 0|1]], "issues": {issue: [[t, D, local rate, others' rate, mode, answered]]}}}}``
    with t in seconds from ``start_wall`` (a point is left out where Prometheus has no
    sample of D: a missed scrape)."""

    def rows(expr: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        return query_range(base, expr, start=start_wall, end=end_wall, step_s=step_s)

    def rel(t: float) -> float:
        return round(t - start_wall, 3)

    thresholds: dict[str, float] = {}
    for labels, points in rows(THRESHOLD):
        if points:
            thresholds[labels.get("threshold", "")] = points[-1][1]
    balancers: dict[str, dict[str, Any]] = {}
    # per (instance, issue): t -> [D, local, others, mode, answered]
    at: dict[tuple[str, str], dict[float, list[Any]]] = {}
    for labels, points in rows(DOWNLOADERS):
        key = (labels.get("instance", ""), labels.get("issue", ""))
        cells = at.setdefault(key, {})
        for t, value in points:
            cells[rel(t)] = [round(value, 2), None, None, None, 0]
    for labels, points in rows(RATE):
        key = (labels.get("instance", ""), labels.get("issue", ""))
        column = 1 if labels.get("source") == "local" else 2
        for t, value in points:
            cell = at.get(key, {}).get(rel(t))
            if cell is not None:
                cell[column] = round(value, 4)
    for labels, points in rows(f"{MODE} == 1"):
        key = (labels.get("instance", ""), labels.get("issue", ""))
        for t, _ in points:
            cell = at.get(key, {}).get(rel(t))
            if cell is not None:
                cell[3] = labels.get("mode")
    for labels, points in rows(ANSWERED):
        key = (labels.get("instance", ""), labels.get("issue", ""))
        for t, value in points:
            cell = at.get(key, {}).get(rel(t))
            if cell is not None:
                cell[4] = int(value)
    for (instance, issue), cells in at.items():
        series = [[t, *cells[t]] for t in sorted(cells)]
        balancers.setdefault(instance, {"leader": [], "issues": {}})["issues"][issue] = series
    for labels, points in rows(LEADER):
        entry = balancers.setdefault(labels.get("instance", ""), {"leader": [], "issues": {}})
        entry["leader"] = [[rel(t), int(v)] for t, v in points]
    return {"step_s": step_s, "thresholds": thresholds, "balancers": balancers}


def _seconds(points: list[list[Any]], step_s: float, keep: Any) -> float:
    """Seconds of the series' points for which ``keep(point)`` holds (one step each)."""
    return round(sum(step_s for p in points if keep(p)), 1)


def _first(points: list[list[Any]], keep: Any) -> float | None:
    return next((p[0] for p in points if keep(p)), None)


def demand_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Per balancer and issue, what the policy saw and decided (module docstring)."""
    thresholds = doc.get("thresholds") or {}
    step = float(doc.get("step_s") or 1.0)
    swarm_enter = thresholds.get("swarm_enter")
    mc_enter = thresholds.get("multicast_enter")
    out: dict[str, Any] = {"thresholds": thresholds, "balancers": {}}
    for instance, entry in sorted((doc.get("balancers") or {}).items()):
        issues: dict[str, Any] = {}
        for issue, points in sorted(entry.get("issues", {}).items()):
            if not points:
                continue
            peak = max(points, key=lambda p: p[1])
            changes = []
            previous = None
            for p in points:
                if p[4] is not None and p[4] != previous:
                    if previous is not None:
                        changes.append({"at_s": p[0], "mode": p[4], "downloaders": p[1]})
                    previous = p[4]
            issues[issue] = {
                "samples": len(points),
                "first_s": points[0][0],
                "last_s": points[-1][0],
                "peak_downloaders": peak[1],
                "peak_at_s": peak[0],
                "swarm_level_from_s": (
                    None if swarm_enter is None else _first(points, lambda p: p[1] >= swarm_enter)
                ),
                "multicast_level_from_s": (
                    None if mc_enter is None else _first(points, lambda p: p[1] >= mc_enter)
                ),
                "multicast_level_s": (
                    None if mc_enter is None else _seconds(points, step, lambda p: p[1] >= mc_enter)
                ),
                "mode_changes": changes,
                "multicast_level_not_multicast_s": (
                    None
                    if mc_enter is None
                    else _seconds(
                        points, step, lambda p: p[1] >= mc_enter and p[4] not in (None, "multicast")
                    )
                ),
                "multicast_not_answered_s": _seconds(
                    points, step, lambda p: p[4] == "multicast" and not p[5]
                ),
                "answered_from_s": _first(points, lambda p: p[5]),
                "answered_s": _seconds(points, step, lambda p: p[5]),
            }
        leader = entry.get("leader", [])
        out["balancers"][instance] = {
            "leader_s": _seconds(leader, step, lambda p: p[1] == 1),
            "leader_changes": sum(1 for a, b in itertools.pairwise(leader) if a[1] != b[1]),
            "issues": issues,
        }
    return out


def demand_lines(name: str, summary: dict[str, Any]) -> list[str]:
    """The console's lines: one per balancer and issue."""
    lines = []
    th = summary.get("thresholds") or {}
    for instance, entry in summary.get("balancers", {}).items():
        for issue, s in entry["issues"].items():
            changes = ", ".join(
                f"{c['mode']} at {c['at_s']:g} s (D {c['downloaders']:g})"
                for c in s["mode_changes"]
            )
            line = (
                f"{name}: {instance} {issue}: D peaked at {s['peak_downloaders']:g} "
                f"({s['peak_at_s']:g} s)"
            )
            if s["multicast_level_from_s"] is not None:
                line += (
                    f", at the multicast level ({th.get('multicast_enter', 0):g}) from "
                    f"{s['multicast_level_from_s']:g} s for {s['multicast_level_s']:g} s"
                )
            line += f"; modes: {changes or 'no change'}"
            if s["multicast_level_not_multicast_s"]:
                line += (
                    f"; {s['multicast_level_not_multicast_s']:g} s at the multicast level "
                    "not in multicast"
                )
            if s["multicast_not_answered_s"]:
                line += f"; {s['multicast_not_answered_s']:g} s in multicast with no carousel"
            if s["answered_from_s"] is not None:
                line += f"; multicast answered from {s['answered_from_s']:g} s"
            lines.append(line + f"; lease held {entry['leader_s']:g} s")
    return lines
