"""The asyncio side of the hand-over from the swarm to the carousel
(:mod:`.carousel_handover` decides; this runs its effects and feeds it the outcomes):
the piece check in a thread, the carousel's receive in a task, the swarm fetch
cancelled when the core says so. `swarm_handoff.fetch_swarm` starts it once the
carousel was chosen (:mod:`.carousel_switch`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pressrun.clients.carousel_handover import (
    CarouselHandover,
    CheckPieces,
    HandoverEffect,
    StartReceive,
    StopReceive,
    StopSwarm,
)
from pressrun.clients.codec import DirectiveMulticast
from pressrun.clients.session import FetchState, describe
from pressrun.content.manifest import Manifest

if TYPE_CHECKING:
    from pressrun.multicast.events import CarouselPlan
    from pressrun.peer.aio import SwarmPeer
    from pressrun.peer.results import SwarmResult

__all__ = ["HandoverRun"]


class HandoverRun:
    """Drives one `CarouselHandover`: the held pieces' check (``check``: the pieces of
    a list that match the manifest, in a thread), the receive (in a task; its
    blocking loop in a thread of its own) and the swarm fetch ``fetching``, each
    outcome fed back to the core, until both sides ended (or the swarm goes on).
    ``closing``: the client's ring host's close, run once the swarm has ended."""

    def __init__(
        self,
        f: FetchState,
        m: Manifest,
        path: Path,
        plan: CarouselPlan,
        fetching: asyncio.Future[SwarmResult],
        manifest_sha256: str,
        peer: SwarmPeer | None,
        closing: Callable[[], Awaitable[None]] | None,
        check: Callable[[Manifest, Path, Sequence[int]], list[int]],
    ) -> None:
        self.f, self.m, self.path, self.plan = f, m, path, plan
        self.fetching = fetching
        self.manifest_sha256 = manifest_sha256
        self.peer = peer
        self.closing = closing
        self.check = check
        self.core = CarouselHandover(m.num_pieces)
        self.swarm_result: SwarmResult | None = None
        self._receiving: asyncio.Future[list[int]] | None = None
        self._checks: dict[asyncio.Future[list[int]], CheckPieces] = {}
        #: (loop times) "chosen", the receive's start ("receive") and first packets
        #: ("running"), the swarm's end ("swarm_ended"), the receive's ("received")
        self.at: dict[str, float] = {}
        #: the check before the receive (seconds), and the pieces read back after it
        self.check_s: float | None = None
        self.late_pieces = 0

    async def run(self, kept: Sequence[int]) -> None:
        """Until both sides ended (or the swarm goes on alone); a cancel stops the
        receive and the checks too (the swarm fetch is the caller's)."""
        f = self.f
        self.core = CarouselHandover(self.m.num_pieces, kept)
        self.at["chosen"] = f.now()
        self._apply(self.core.start(self._held()))
        swarm_open = receive_open = True
        try:
            while not self.core.done:
                waits: set[asyncio.Future[Any]] = set(self._checks)
                if swarm_open:
                    waits.add(self.fetching)
                if receive_open and self._receiving is not None:
                    waits.add(self._receiving)
                assert waits, "a hand-over not done waits on a check, the swarm or the receive"
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    if fut in self._checks:
                        effect = self._checks.pop(fut)
                        good = _result_or(fut, [])
                        self._apply(self.core.handle_checked(effect.pieces, good))
                    elif fut is self.fetching and swarm_open:
                        swarm_open = False
                        await self._swarm_ended()
                    elif fut is self._receiving and receive_open:
                        receive_open = False
                        self.at.setdefault("received", f.now())
                        err = None if fut.cancelled() else fut.exception()
                        if err is not None:
                            f.notice(f"multicast failed ({describe(err)})")
                        self._apply(self.core.handle_receive_ended(_result_or(fut, [])))
        finally:
            for task in (self._receiving, *self._checks):
                if task is not None and not task.done():
                    task.cancel()

    def outcome(self) -> list[int]:
        """The pieces verified, from the swarm (and a resume) and the carousel; the
        carousel's bytes counted as the pieces only it brought."""
        if self.core.ran and not self.core.swarm_completed:
            self.f.left_for_carousel = True
            self.f.multicast_bytes = sum(self.m.piece_span(i)[1] for i in self.core.carousel_only())
        return self.core.have()

    def _held(self) -> tuple[int, ...]:
        return self.peer.pieces_held() if self.peer is not None else ()

    def _apply(self, effects: list[HandoverEffect]) -> None:
        f, m = self.f, self.m
        for effect in effects:
            if isinstance(effect, CheckPieces):
                check = asyncio.ensure_future(
                    asyncio.to_thread(self.check, m, self.path, effect.pieces)
                )
                if self._receiving is None:  # the check the receive waits for
                    check.add_done_callback(functools.partial(self._checked, f.now()))
                else:
                    self.late_pieces += len(effect.pieces)
                self._checks[check] = effect
            elif isinstance(effect, StartReceive):
                # (here: `multicast_receive` imports `carousel_share`, which imports this)
                from pressrun.clients.multicast_receive import receive_carousel_pieces

                self.at["receive"] = f.now()
                group = f.config.carousel_control_group or ""
                self._receiving = asyncio.ensure_future(
                    receive_carousel_pieces(
                        f,
                        m,
                        self.manifest_sha256,
                        self.path,
                        DirectiveMulticast(group, source=f.config.carousel_control_source),
                        effect.known,
                        announced=self.plan,
                        on_running=self._running,
                    )
                )
            elif isinstance(effect, StopSwarm):
                self.fetching.cancel()  # the peer closes its session and leaves the swarm
            elif isinstance(effect, StopReceive) and self._receiving is not None:
                self._receiving.cancel()

    def _checked(self, started: float, _check: asyncio.Future[list[int]]) -> None:
        self.check_s = self.f.now() - started

    def _running(self) -> None:
        self.at.setdefault("running", self.f.now())
        self._apply(self.core.handle_receive_running())

    async def _swarm_ended(self) -> None:
        """The swarm fetch ended: closed for the carousel, or by itself (a failure or
        a stall leave the receive going; a completed copy stops it)."""
        self.at["swarm_ended"] = self.f.now()
        result: SwarmResult | None = None
        if not self.fetching.cancelled():
            err = self.fetching.exception()
            if err is None:
                result = self.fetching.result()
            else:
                self.f.notice(
                    f"swarm failed while the carousel's receive started ({describe(err)})"
                )
        self.swarm_result = result
        completed = result is not None and result.completed
        if completed:
            assert result is not None
            if result.path == self.path:
                self.f.checked_sha256 = self.m.sha256  # the peer's final check read it
            held: Sequence[int] = ()
        else:
            held = result.have_pieces if result is not None else self._held()
        self._apply(self.core.handle_swarm_ended(held=held, completed=completed))
        if self.closing is not None:
            await self.closing()  # leaves the ring gracefully


def _result_or(fut: asyncio.Future[list[int]], default: list[int]) -> list[int]:
    """A finished task's pieces, or ``default`` when it failed or was cancelled."""
    if fut.cancelled() or fut.exception() is not None:
        return default
    return fut.result()
