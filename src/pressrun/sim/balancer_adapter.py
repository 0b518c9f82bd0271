"""The simulation's balancer adapter: the real core's polls, played in virtual time.

`BalancerAdapter` is a mixin of `pressrun.sim.run.Simulation`: it arms the core's timer
on the event loop, turns each `PollOrigin` into a sample of the server model
``status_delay_s / 2`` later, and delivers `StatusReceived` after ``status_delay_s``
(or `PollFailed` after ``poll_timeout_s`` while the server is down or its poll flaps).
Moved as it was from ``pressrun.sim.run``; the attributes it reads are the
simulation's (declared here for the type checker only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pressrun.balancer.events import OriginStatus, PollFailed, PollOrigin, StatusReceived

if TYPE_CHECKING:
    from pressrun.balancer.core import BalancerCore
    from pressrun.sim.engine import EventLoop
    from pressrun.sim.model import Server
    from pressrun.sim.scenario import Scenario


class BalancerAdapter:
    """`Simulation`'s part of the balancer's adapter: the timer, the polls, the answers."""

    # the simulation's own attributes (pressrun.sim.run.Simulation)
    scenario: Scenario
    loop: EventLoop
    core: BalancerCore
    servers: dict[str, Server]
    issues: dict[str, frozenset[str]]
    _flaps: dict[str, tuple[float, float | None, int]]
    _polls: dict[str, int]
    _timer_at: float | None
    _timer_token: int

    def _arm(self) -> None:
        deadline = self.core.next_deadline()
        if deadline is None:
            return
        if (
            self._timer_at is not None
            and self._timer_at <= deadline
            and self._timer_at >= self.loop.now
        ):
            return
        self._timer_token += 1
        self._timer_at = deadline
        self.loop.at(deadline, self._on_timer, self._timer_token)

    def _on_timer(self, token: int) -> None:
        if token != self._timer_token:
            return
        self._timer_at = None
        now = self.loop.now
        for effect in self.core.handle_timer(now=now):
            if isinstance(effect, PollOrigin):
                self._poll(effect.name)
        self._arm()

    def _poll(self, name: str) -> None:
        delay = self.scenario.balancer.status_delay_s
        self.loop.after(delay / 2.0, self._sample_status, name)

    def _sample_status(self, name: str) -> None:
        server = self.servers[name]
        b = self.scenario.balancer
        if self._poll_flaps(name) or not server.up:
            self.loop.after(b.poll_timeout_s - b.status_delay_s / 2.0, self._deliver_failure, name)
            return
        status = server.status(self.issues[name])
        self.loop.after(b.status_delay_s / 2.0, self._deliver_status, status)

    def _poll_flaps(self, name: str) -> bool:
        """Whether this poll of a flapping origin fails (every N-th in its window)."""
        flap = self._flaps.get(name)
        if flap is None:
            return False
        start, end, every = flap
        now = self.loop.now
        if now < start or (end is not None and now >= end):
            return False
        self._polls[name] = count = self._polls.get(name, 0) + 1
        return count % every == 0

    def _deliver_status(self, status: OriginStatus) -> None:
        self.core.handle_status_received(StatusReceived(status), now=self.loop.now)
        self._arm_for(status.name)

    def _deliver_failure(self, name: str) -> None:
        self.core.handle_poll_failed(PollFailed(name, "no answer"), now=self.loop.now)
        self._arm_for(name)

    def _arm_for(self, name: str) -> None:
        """Arm the timer for one origin's next poll if it is due before the armed one.

        An answer only sets that origin's deadlines (its next poll, its staleness);
        the others are unchanged, so the earliest deadline is the armed timer or this
        origin's next poll. `_on_timer` re-arms from `next_deadline()` (O(origins)),
        once per firing instead of after every status.
        """
        due = self.core.origins[name].next_poll_at
        if self._timer_at is not None and self._timer_at <= due and self._timer_at >= self.loop.now:
            return
        self._timer_token += 1
        self._timer_at = due
        self.loop.at(due, self._on_timer, self._timer_token)
