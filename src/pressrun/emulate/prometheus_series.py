"""The emulation's time series from Prometheus's HTTP API (issue 30): the deployment's
Prometheus scrapes every service, so the report reads the same numbers an operator's
dashboard shows, instead of its own probes.

`read_series` asks ``/api/v1/query_range`` (one step a second, from the run's start to
its end) for

- each origin's body bytes sent so far (``pressrun_origin_sent_bytes_total``, by
  issue), named by the ``origins`` map;
- the carousels' bytes sent so far (``pressrun_multicast_bytes_sent_total``);
- the directives answered so far by mode, over every balancer
  (``pressrun_balancer_directives_total``);

and returns them as the report's series ``[(t, total)]`` with t in seconds from the
run's start (Prometheus's timestamps are wall-clock; the caller gives the start's wall
time). A counter that restarts (a killed service back) is made monotonic again by
adding what it had before the reset, as ``increase()`` does; one that first appears
within the window (a series is born at its first count) starts from 0.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the counters, each series on its own (summed here after its resets and its birth
#: are accounted, which a PromQL sum cannot do for series born at different times)
ORIGIN_BYTES = "pressrun_origin_sent_bytes_total"
SENDER_BYTES = "pressrun_multicast_bytes_sent_total"
DIRECTIVES = "pressrun_balancer_directives_total"


class PrometheusError(RuntimeError):
    """Prometheus did not answer a query, or answered an error."""


@dataclass(slots=True)
class PrometheusSeries:
    """The report's series as Prometheus has them."""

    egress: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    sender: list[tuple[float, int]] = field(default_factory=list)
    directives: list[tuple[float, dict[str, int]]] = field(default_factory=list)


def query_range(
    base: str, expr: str, *, start: float, end: float, step_s: float, timeout_s: float = 10.0
) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    """``/api/v1/query_range``: each series' labels and its (wall time, value) points."""
    query = urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
    )
    try:
        with urllib.request.urlopen(f"{base}/api/v1/query_range?{query}", timeout=timeout_s) as r:
            doc = json.load(r)
    except (OSError, ValueError) as err:
        raise PrometheusError(f"Prometheus at {base} did not answer {expr!r}: {err}") from None
    if doc.get("status") != "success":
        raise PrometheusError(f"Prometheus refused {expr!r}: {doc.get('error', doc)}")
    out = []
    for item in doc["data"]["result"]:
        points = [(float(t), float(v)) for t, v in item["values"] if math.isfinite(float(v))]
        out.append((dict(item["metric"]), points))
    return out


def monotonic(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A counter's points with its resets undone (each drop adds what came before)."""
    out: list[tuple[float, float]] = []
    offset = 0.0
    previous: float | None = None
    for t, value in points:
        if previous is not None and value < previous:
            offset += previous
        previous = value
        out.append((t, value + offset))
    return out


def _summed(
    parts: list[tuple[str, list[tuple[float, int]]]],
) -> dict[str, list[tuple[float, int]]]:
    """Per key, the sum of its series at every time any of them has a point (each
    series held at its last value between its points, 0 before its first)."""
    times = sorted({t for _, points in parts for t, _ in points})
    out: dict[str, list[tuple[float, int]]] = {}
    by_key: dict[str, list[list[tuple[float, int]]]] = {}
    for key, points in parts:
        by_key.setdefault(key, []).append(points)
    for key, group in by_key.items():
        cursors = [0] * len(group)
        last = [0] * len(group)
        summed = []
        for t in times:
            for i, points in enumerate(group):
                while cursors[i] < len(points) and points[cursors[i]][0] <= t:
                    last[i] = points[cursors[i]][1]
                    cursors[i] += 1
            summed.append((t, sum(last)))
        out[key] = summed
    return out


def read_series(
    base: str,
    *,
    origins: Mapping[str, str],
    start_wall: float,
    end_wall: float,
    step_s: float = 1.0,
) -> PrometheusSeries:
    """The report's series from Prometheus at ``base`` between two wall times;
    ``origins`` names each origin's scrape instance (``"origin-a:8001": "origin-a"``)."""

    def rel(points: list[tuple[float, float]]) -> list[tuple[float, int]]:
        out = [(round(t - start_wall, 3), int(v)) for t, v in monotonic(points)]
        if out and out[0][0] > 1.5 * step_s:
            # a series born in the window (its first count, a service started late)
            # counted from 0 just before its first point
            out.insert(0, (round(out[0][0] - step_s, 3), 0))
        return out

    def parts(expr: str, key: str | None) -> list[tuple[str, list[tuple[float, int]]]]:
        found = query_range(base, expr, start=start_wall, end=end_wall, step_s=step_s)
        return [("" if key is None else labels.get(key, ""), rel(p)) for labels, p in found]

    egress = _summed([(origins[k], p) for k, p in parts(ORIGIN_BYTES, "instance") if k in origins])
    series = PrometheusSeries(egress={name: egress.get(name, []) for name in origins.values()})
    series.sender = _summed(parts(SENDER_BYTES, None)).get("", [])
    by_mode = _summed(parts(DIRECTIVES, "mode"))
    times = sorted({t for points in by_mode.values() for t, _ in points})
    at = {mode: dict(points) for mode, points in by_mode.items()}
    series.directives = [(t, {m: at[m][t] for m in by_mode}) for t in times]
    return series


def summary(series: PrometheusSeries) -> dict[str, Any]:
    """Totals at the end of each series (for the report and logs)."""
    return {
        "egress_bytes": {n: (s[-1][1] - s[0][1]) if s else 0 for n, s in series.egress.items()},
        "sender_bytes": (series.sender[-1][1] - series.sender[0][1]) if series.sender else 0,
        "directives": series.directives[-1][1] if series.directives else {},
    }


def prometheus_config_for_emulation(source: Path, out: Path) -> Path:
    """deploy/prometheus/ with every interval at 1 s (the report's resolution) in
    ``out``, for the compose file's ``PRESSRUN_PROMETHEUS_CONFIG_DIR``."""
    out.mkdir(parents=True, exist_ok=True)
    text = (source / "prometheus.yml").read_text()
    text = re.sub(r"(scrape_interval|evaluation_interval): \d+s", r"\1: 1s", text)
    (out / "prometheus.yml").write_text(text)
    shutil.copy(source / "rules.yml", out / "rules.yml")
    return out
