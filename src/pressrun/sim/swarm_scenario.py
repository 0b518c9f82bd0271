"""Swarm scenarios for `pressrun sim swarm`: who subscribes, their links, the bound.

A scenario is a TOML file (docs/chord.md has the format; built-ins in
``swarm_scenarios/``): the subscribers, the issue's size and piece size, the origin's
upload, an arrival window and its shape, and classes of access links. `draw_subscribers` gives each
subscriber its class and arrival time from the master seed; `fluid_bound_s` is the
lower bound every uploader choice is measured against.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pressrun.sim.scenario_files import builtin_names, read_scenario_text

#: how arrivals spread over the window: ``uniform``; ``decay`` (a flash crowd that
#: thins out: exponential with a mean of a quarter of the window, cut at the window); or
#: ``rising`` (a crowd that builds up: the arrival rate grows in proportion to the time,
#: the most at the window's end)
ARRIVAL_SHAPES = ("uniform", "decay", "rising")


class SwarmScenarioError(ValueError):
    """A swarm scenario file is missing or wrong; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class PeerClass:
    share: float
    upload_mbps: float
    download_mbps: float


@dataclass(frozen=True, slots=True)
class SwarmScenario:
    name: str
    subscribers: int
    file_mb: float
    piece_kib: int
    origin_upload_mbps: float
    arrival_window_s: float
    classes: tuple[PeerClass, ...]
    arrival_shape: str = "uniform"

    @property
    def piece_bytes(self) -> int:
        return self.piece_kib * 1024

    @property
    def num_pieces(self) -> int:
        return math.ceil(self.file_mb * 1e6 / self.piece_bytes)

    @property
    def file_bytes(self) -> int:
        """F as modelled: whole pieces."""
        return self.num_pieces * self.piece_bytes


def swarm_scenario_names() -> list[str]:
    return builtin_names("pressrun.sim", "swarm_scenarios")


def load_swarm_scenario(name_or_path: str) -> SwarmScenario:
    """A built-in scenario by name, or a TOML file (docs/chord.md has the format)."""
    raw, _ = read_scenario_text(
        name_or_path,
        package="pressrun.sim",
        folder="swarm_scenarios",
        kind="swarm",
        error=SwarmScenarioError,
    )
    try:
        doc = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as err:
        raise SwarmScenarioError(f"{name_or_path}: not valid TOML: {err}") from None
    return _parse(doc, name_or_path)


def _parse(doc: dict[str, Any], where: str) -> SwarmScenario:
    sw = doc.get("swarm")
    if not isinstance(sw, dict):
        raise SwarmScenarioError(f"{where}: needs a [swarm] table")

    def num(key: str, default: float | None = None, *, positive: bool = True) -> float:
        v = sw.get(key, default)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise SwarmScenarioError(f"{where}: swarm.{key} must be a number")
        if v <= 0 if positive else v < 0:
            raise SwarmScenarioError(
                f"{where}: swarm.{key} must be {'> 0' if positive else '>= 0'}"
            )
        return float(v)

    classes_raw = sw.get("classes")
    if not isinstance(classes_raw, list) or not classes_raw:
        raise SwarmScenarioError(f"{where}: needs at least one [[swarm.classes]]")
    classes: list[PeerClass] = []
    for i, c in enumerate(classes_raw):
        try:
            pc = PeerClass(float(c["share"]), float(c["upload_mbps"]), float(c["download_mbps"]))
        except (KeyError, TypeError, ValueError):
            raise SwarmScenarioError(
                f"{where}: swarm.classes[{i}] needs share, upload_mbps, download_mbps numbers"
            ) from None
        if pc.share <= 0 or pc.upload_mbps <= 0 or pc.download_mbps <= 0:
            raise SwarmScenarioError(f"{where}: swarm.classes[{i}]: every value must be > 0")
        classes.append(pc)
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > 1e-6:
        raise SwarmScenarioError(f"{where}: class shares add up to {total}, not 1")
    shape = sw.get("arrival_shape", "uniform")
    if shape not in ARRIVAL_SHAPES:
        raise SwarmScenarioError(
            f"{where}: swarm.arrival_shape must be one of {', '.join(ARRIVAL_SHAPES)}"
        )
    subs = int(num("subscribers"))
    if subs < 2:
        raise SwarmScenarioError(f"{where}: swarm.subscribers must be at least 2")
    return SwarmScenario(
        name=str(doc.get("name", Path(where).stem)),
        subscribers=subs,
        file_mb=num("file_mb"),
        piece_kib=int(num("piece_kib", 1024)),
        origin_upload_mbps=num("origin_upload_mbps"),
        arrival_window_s=num("arrival_window_s", 0.0, positive=False),
        classes=tuple(classes),
        arrival_shape=str(shape),
    )


@dataclass(frozen=True, slots=True)
class Subscribers:
    """Each subscriber's links and arrival, drawn from the master seed."""

    upload_bps: npt.NDArray[np.float64]
    download_bps: npt.NDArray[np.float64]
    arrive_s: npt.NDArray[np.float64]
    #: each subscriber's class (an index into the scenario's classes)
    klass: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def draw_subscribers(sc: SwarmScenario, rng: np.random.Generator) -> Subscribers:
    """Classes in their shares, in random order; arrivals over the window in its shape."""
    n = sc.subscribers
    counts = [round(c.share * n) for c in sc.classes]
    counts[-1] = n - sum(counts[:-1])
    up = np.concatenate(
        [np.full(k, c.upload_mbps * 1e6) for k, c in zip(counts, sc.classes, strict=True)]
    )
    down = np.concatenate(
        [np.full(k, c.download_mbps * 1e6) for k, c in zip(counts, sc.classes, strict=True)]
    )
    klass = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    perm = rng.permutation(n)
    u = rng.uniform(0, 1, n)
    w = sc.arrival_window_s
    if sc.arrival_shape == "decay" and w > 0:
        # exponential with mean w/4 cut at w, by its inverse distribution function
        arrive = -(w / 4) * np.log1p(-u * (1 - math.exp(-4.0)))
    elif sc.arrival_shape == "rising":
        # density 2t/w^2 on [0, w]: the inverse of its distribution function (t/w)^2
        arrive = w * np.sqrt(u)
    else:
        arrive = u * w
    return Subscribers(up[perm], down[perm], arrive, klass[perm])


def fluid_bound_s(sc: SwarmScenario, subs: Subscribers) -> float:
    """The last completion can be no earlier than this (seconds).

    Everyone at t = 0 (a flash crowd): Kumar and Ross's
    max(F/u_s, F/d_min, N*F/(u_s + sum u_i)). With arrivals a_i over a window the same
    three arguments: F/u_s; max_i(a_i + F/d_i); and the T at which all the upload
    available so far, u_s*T + sum_i u_i*max(0, T - a_i), first reaches N*F (a subscriber
    uploads nothing before it arrives).
    """
    f_bits = sc.file_bytes * 8
    u_s = sc.origin_upload_mbps * 1e6
    need = sc.subscribers * f_bits
    # the capacity argument: the available upload is increasing and piecewise linear in
    # T, so bisect between the flash-crowd value (a lower end) and that plus the window
    lo = need / (u_s + float(subs.upload_bps.sum()))
    hi = lo + float(subs.arrive_s.max(initial=0.0))
    for _ in range(100):
        mid = (lo + hi) / 2
        avail = u_s * mid + float((subs.upload_bps * np.maximum(0.0, mid - subs.arrive_s)).sum())
        lo, hi = (mid, hi) if avail < need else (lo, mid)
    return max(f_bits / u_s, float((subs.arrive_s + f_bits / subs.download_bps).max()), hi)
