"""Arrival patterns of a scenario (``[[arrivals]]``: a rate, a burst, waves, or a
replayed access log) as the client requests they make; the emulation's scenario files
use the same tables (`expand_arrivals`)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pressrun.sim.scenario_checks import _check_keys, _err, _number, _request_class


@dataclass(frozen=True, slots=True)
class Arrival:
    """One client request: when, and for which asset (None: drawn by popularity, among
    the assets of `request_class` when it is set)."""

    at_s: float
    asset: str | None = None
    request_class: str | None = None


_KINDS = {
    "rate": {"kind", "rate_per_s", "start_s", "end_s", "poisson", "asset", "class"},
    "burst": {"kind", "count", "at_s", "spread_s", "asset", "class"},
    "waves": {"kind", "count", "every_s", "waves", "start_s", "spread_s", "asset", "class"},
    "log": {"kind", "path", "time_scale", "start_s", "asset"},
}

# Common Log Format: host ident user [date] "METHOD path PROTO" status bytes
_CLF = re.compile(r'^\S+ \S+ \S+ \[([^\]]+)\] "(?:\S+) (\S+)[^"]*" (\d{3}) \S+')


def _expand_arrivals(
    spec: Mapping[str, Any],
    rng: random.Random,
    where: str,
    source: str,
    *,
    validate_only: bool = False,
) -> list[Arrival]:
    kind = spec.get("kind")
    if kind not in _KINDS:
        raise _err(
            source, f"{where}.kind", f"must be one of {', '.join(sorted(_KINDS))}, got {kind!r}"
        )
    _check_keys(spec, _KINDS[kind], source, where)
    asset = spec.get("asset")
    klass = _request_class(spec.get("class"), source, where)
    if kind == "rate":
        rate = _number(spec, "rate_per_s", None, source, where, positive=True)
        start = _number(spec, "start_s", 0.0, source, where)
        end = _number(spec, "end_s", None, source, where)
        if end <= start:
            raise _err(source, f"{where}.end_s", "must be after start_s")
        poisson = bool(spec.get("poisson", False))
        if validate_only:
            return []
        times: list[float] = []
        t = start
        while True:
            t += rng.expovariate(rate) if poisson else 0.0
            if t >= end:
                break
            times.append(t)
            if not poisson:
                t += 1.0 / rate
        return [Arrival(t, asset, klass) for t in times]
    if kind == "burst":
        count = int(_number(spec, "count", None, source, where, positive=True))
        at = _number(spec, "at_s", 0.0, source, where)
        spread = _number(spec, "spread_s", 0.0, source, where)
        if validate_only:
            return []
        return [Arrival(at + spread * k / count, asset, klass) for k in range(count)]
    if kind == "waves":
        count = int(_number(spec, "count", None, source, where, positive=True))
        every = _number(spec, "every_s", None, source, where, positive=True)
        waves = int(_number(spec, "waves", None, source, where, positive=True))
        start = _number(spec, "start_s", 0.0, source, where)
        spread = _number(spec, "spread_s", 0.0, source, where)
        if validate_only:
            return []
        return [
            Arrival(start + w * every + spread * k / count, asset, klass)
            for w in range(waves)
            for k in range(count)
        ]
    # a replayed access log (Common Log Format), as 002 replays Wikipedia with servload
    path = spec.get("path")
    if not isinstance(path, str):
        raise _err(source, f"{where}.path", "must be the path of a Common Log Format file")
    scale = _number(spec, "time_scale", 1.0, source, where, positive=True)
    start = _number(spec, "start_s", 0.0, source, where)
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise _err(source, f"{where}.path", f"cannot read {path}: {exc.strerror}") from None
    stamps: list[tuple[float, str]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        m = _CLF.match(line)
        if m is None:
            raise _err(source, f"{where}.path", f"{path}:{lineno}: not a Common Log Format line")
        try:
            when = datetime.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S %z").timestamp()
        except ValueError:
            raise _err(
                source, f"{where}.path", f"{path}:{lineno}: bad date {m.group(1)!r}"
            ) from None
        stamps.append((when, m.group(2).rstrip("/").rsplit("/", 1)[-1]))
    if not stamps:
        raise _err(source, f"{where}.path", f"{path} holds no requests")
    t0 = min(s for s, _ in stamps)
    return [Arrival(start + (s - t0) * scale, asset or name) for s, name in stamps]


def expand_arrivals(
    spec: Mapping[str, Any], rng: random.Random, where: str, source: str
) -> list[Arrival]:
    """One ``[[arrivals]]`` table (rate, burst, waves or log) as its arrivals, validated
    with the same messages; the emulation's scenario files use the same tables."""
    return _expand_arrivals(spec, rng, where, source)
