"""Origin health as HAProxy checks it: ``rise``, ``fall`` and ``slowstart``.

HAProxy (docs: ``server ... check rise 2 fall 3 slowstart 10s``) does not judge a
server on one check: a server in service goes out after ``fall`` consecutive failed
checks, one out of service comes back after ``rise`` consecutive good ones, and one
that comes back gets a weight that grows linearly from 0 to its full weight over
``slowstart``, so a cold server is not handed its whole share of new connections at
once. HAProxy applies no slow start at its own start (every server would ramp and
the site would be refused); neither do we: an origin's first good poll after the
balancer starts puts it in rotation at its full share.

`HealthChecks` is the pure state the balancer core consults (`BalancerCore`
feeds it each poll result with ``now``):

- `status_ok` on a good poll: whether the origin is (or stays, or becomes) in
  rotation; an origin that was down needs ``rise`` good polls in a row, and its
  slow start begins at the poll that brings it back;
- `poll_failed` on a failed poll: whether it leaves rotation now; an origin in
  rotation needs ``fall`` failed polls in a row (between them it keeps its share
  with its latest status, as in HAProxy);
- `admit` on a directive: the ranking the algorithm gave, with an origin still in
  its slow start demoted behind the others unless its credit allows this request.
  The credit is HAProxy's scaled weight made deterministic: at ramp fraction
  f = elapsed / slowstart, every directive adds f x the origin's static share
  (its weight over the weights of the origins in rotation) to its credit (at most
  2), and the origin takes a request it ranks first for when the credit reaches 1.
  So whatever the algorithm, a returning origin gets at most f times its weight's
  share of new clients (less if the algorithm wants it less), growing to what the
  algorithm gives it over ``slowstart``. A stateful algorithm that keeps ranking
  the cold origin first (it has the most headroom) cannot hand it the crowd at once.
  An origin alone in the ranking is never demoted (better served by a cold origin
  than refused).

Bounded: one small record per configured origin. No clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pressrun.balancer.events import OriginSpec

#: the most credit a ramping origin saves up: enough to wait for a request it ranks
#: first for, not enough to take a burst when the algorithm turns to it
_CREDIT_CAP = 2.0


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """How many polls change an origin's state, and how long its slow start lasts.

    rise: consecutive good polls that bring an origin that was down back into
        rotation (HAProxy's default: 2).
    fall: consecutive failed polls that take an origin in rotation out (HAProxy's
        default: 3). Keep ``fall x poll interval`` below ``stale_after_s`` or the
        staleness rule takes it out first.
    slowstart_s: seconds over which an origin that came back grows from no share of
        new clients to its full share (HAProxy's default is 0, off; ``pressrun serve
        balancer`` uses 10 s: an origin restarted with a cold page cache).
    """

    rise: int = 2
    fall: int = 3
    slowstart_s: float = 10.0

    def __post_init__(self) -> None:
        if self.rise < 1 or self.fall < 1:
            raise ValueError("rise and fall must be at least 1")
        if not (self.slowstart_s >= 0 and math.isfinite(self.slowstart_s)):
            raise ValueError("slowstart must be 0 or more seconds")

    @classmethod
    def immediate(cls) -> HealthConfig:
        """One poll decides, no slow start: the rule before issue 30 (the core's and
        the simulator's default, so recorded runs replay unchanged)."""
        return cls(rise=1, fall=1, slowstart_s=0.0)


@dataclass(slots=True)
class _Health:
    good_in_row: int = 0
    failed_in_row: int = 0
    #: when the origin came back from down (its slow start), None: not ramping
    ramp_from: float | None = None
    credit: float = 0.0


class HealthChecks:
    """Per-origin poll counters and slow starts (see the module docstring)."""

    def __init__(self, config: HealthConfig, origins: Sequence[OriginSpec]) -> None:
        self.config = config
        self._origins: dict[str, _Health] = {o.name: _Health() for o in origins}
        self._weights = {o.name: o.weight for o in origins}
        #: the origins this thinks are in rotation (for the static shares)
        self._in: set[str] = set()

    def status_ok(self, name: str, state: str, *, now: float) -> bool:
        """A good poll of ``name``, whose state is ``state`` ("unknown", "up",
        "down"): whether it is in rotation after it."""
        h = self._origins[name]
        h.failed_in_row = 0
        h.good_in_row += 1
        if state == "up" or state == "unknown":
            # "unknown": the balancer's start, in at once at full share (HAProxy's start)
            self._in.add(name)
            return True
        if h.good_in_row < self.config.rise:
            return False
        if self.config.slowstart_s > 0:
            h.ramp_from = now
            h.credit = 0.0
        self._in.add(name)
        return True

    def poll_failed(self, name: str, state: str) -> bool:
        """A failed poll of ``name``: whether it leaves (or stays out of) rotation."""
        h = self._origins[name]
        h.good_in_row = 0
        h.failed_in_row += 1
        if state != "up" or h.failed_in_row >= self.config.fall:
            h.ramp_from = None
            self._in.discard(name)
            return True
        return False

    def went_down(self, name: str) -> None:
        """The origin left rotation for another reason (its status went stale)."""
        h = self._origins[name]
        h.good_in_row = 0
        h.ramp_from = None
        self._in.discard(name)

    def share(self, name: str, *, now: float) -> float:
        """The fraction of its full share the origin may take now (1: not ramping)."""
        h = self._origins.get(name)
        if h is None or h.ramp_from is None:
            return 1.0
        elapsed = now - h.ramp_from
        if elapsed >= self.config.slowstart_s:
            h.ramp_from = None
            return 1.0
        return max(0.0, elapsed / self.config.slowstart_s)

    def ramping(self) -> dict[str, float]:
        """Origins in their slow start and when each began (for views and tests)."""
        return {n: h.ramp_from for n, h in self._origins.items() if h.ramp_from is not None}

    def admit(self, ranked: list[tuple[str, float]], *, now: float) -> list[tuple[str, float]]:
        """The ranking with origins in their slow start demoted behind the others
        unless their credit lets them take this request (see the module docstring)."""
        ramping = [n for n, h in self._origins.items() if h.ramp_from is not None]
        if not ramping:
            return ranked
        total = sum(self._weights[n] for n in self._in)
        for name in ramping:
            h = self._origins[name]
            fraction = self.share(name, now=now)
            static = self._weights[name] / total if total > 0 else 1.0 / max(1, len(self._in))
            h.credit = min(_CREDIT_CAP, h.credit + fraction * static)
        if len(ranked) < 2:
            return ranked
        demoted: list[tuple[str, float]] = []
        for i, entry in enumerate(ranked):
            h = self._origins[entry[0]]
            if h.ramp_from is None:
                return [*ranked[i:], *demoted] if demoted else ranked
            if h.credit >= 1.0 - 1e-9:
                h.credit -= 1.0
                return [entry, *ranked[i + 1 :], *demoted]
            demoted.append(entry)
        return ranked
