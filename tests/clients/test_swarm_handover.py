"""The hand-over's asyncio side (`carousel_handover_aio.HandoverRun`) and the swarm
hand-off's watch (`swarm_handoff._carousel_meanwhile`), with the swarm fetch, the
piece check and the carousel's receive replaced by stand-ins that log what they were
asked, in order.

Asserted: the order of the steps and what the adapter decides, never how long they
took (these run beside containers on a loaded host)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pressrun.clients.multicast_receive
from pressrun.clients import carousel_watch
from pressrun.clients.carousel_handover_aio import HandoverRun
from pressrun.clients.carousel_switch import SwarmRates
from pressrun.clients.swarm_handoff import _carousel_meanwhile, _left_note, _swarm_progress
from pressrun.multicast.events import CarouselPlan, ChannelSpec
from pressrun.peer.events import PeerPhase
from pressrun.peer.results import SwarmProgress

from .test_carousel_switch import _Fetch

PIECES = 40
PIECE = 131_072


def plan() -> CarouselPlan:
    specs = tuple(
        ChannelSpec(f"239.255.74.{53 + c}", 5500 + c, 7, 5e6, 5e6 / 8 / 1384) for c in range(4)
    )
    return CarouselPlan("i-47", "ab" * 32, PIECES * PIECE, 1, "raptorq", 1320, 4000, 9.0, specs)


@dataclass
class _Manifest:
    issue_id: str = "i-47"
    file_name: str = "i-47.pdf"
    num_pieces: int = PIECES
    size_bytes: int = PIECES * PIECE
    sha256: str = "cd" * 32
    publisher_key: str = "00" * 32

    def piece_span(self, index: int) -> tuple[int, int]:
        return index * PIECE, PIECE


class _Peer:
    def __init__(self, held: Sequence[int]) -> None:
        self.held = list(held)

    def pieces_held(self) -> tuple[int, ...]:
        return tuple(self.held)


@dataclass
class _Stage:
    """The stand-ins' shared log: (step, detail) in the order they happened."""

    log: list[tuple[str, Any]] = field(default_factory=list)
    bad: set[int] = field(default_factory=set)
    swarm_closed: asyncio.Event = field(default_factory=asyncio.Event)

    def still_good(self, _m: Any, _path: Path, pieces: Sequence[int]) -> list[int]:
        self.log.append(("check", tuple(pieces)))
        return [i for i in pieces if i not in self.bad]

    def steps(self) -> list[str]:
        return [step for step, _ in self.log]

    def detail(self, step: str) -> Any:
        return next(d for s, d in self.log if s == step)


def _stage(monkeypatch: pytest.MonkeyPatch, receive: Callable[..., Any]) -> _Stage:
    stage = _Stage()

    async def receiving(*args: Any, announced: Any, on_running: Any) -> list[int]:
        stage.log.append(("receive", tuple(args[5])))
        assert announced == plan()  # the watch's plan: joined without waiting
        return list(await receive(stage, on_running))

    monkeypatch.setattr(pressrun.clients.multicast_receive, "receive_carousel_pieces", receiving)
    return stage


async def _swarm_until_cancelled(stage: _Stage, peer: _Peer, more: Sequence[int]) -> Any:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        stage.log.append(("swarm closed", None))
        peer.held += list(more)  # completed while it closed
        stage.swarm_closed.set()
        raise


async def _run(
    stage: _Stage, fetching: asyncio.Future[Any], peer: _Peer, tmp_path: Path
) -> tuple[HandoverRun, _Fetch]:
    f = _Fetch(loop=asyncio.get_running_loop())
    m: Any = _Manifest()
    h = HandoverRun(
        f,  # type: ignore[arg-type]
        m,
        tmp_path / "i-47.pdf",
        plan(),
        fetching,
        "ab" * 32,
        peer,  # type: ignore[arg-type]
        None,
        stage.still_good,
    )
    await h.run(kept=[])
    if h.core.ran:  # as `fetch_swarm` does
        _left_note(f, m, tmp_path / "i-47.pdf", h)  # type: ignore[arg-type]
    return h, f


def test_the_receive_starts_with_the_held_pieces_and_the_swarm_closes_once_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def receive(stage: _Stage, on_running: Callable[[], None]) -> range:
        await asyncio.sleep(0.01)
        stage.log.append(("running", None))
        on_running()
        await stage.swarm_closed.wait()
        return range(PIECES)

    async def main() -> tuple[_Stage, HandoverRun, _Fetch]:
        stage = _stage(monkeypatch, receive)
        stage.bad = {9}  # its bytes not on disk yet when first read
        peer = _Peer(range(10))
        fetching = asyncio.ensure_future(_swarm_until_cancelled(stage, peer, [10, 11, 12]))
        h, f = await _run(stage, fetching, peer, tmp_path)
        return stage, h, f

    stage, h, f = asyncio.run(main())
    assert stage.steps() == ["check", "receive", "running", "swarm closed", "check"]
    assert stage.detail("check") == tuple(range(10))
    assert stage.detail("receive") == tuple(range(9))  # piece 9 failed: not handed
    # after the swarm closed, only what was not verified before is read back (piece 9
    # again: its bytes should be on disk by now; here they still do not match)
    assert stage.log[-1] == ("check", (9, 10, 11, 12))
    assert h.outcome() == list(range(PIECES))
    # piece 9 came from the carousel; 10-12 are the swarm's, counted once
    assert f.multicast_bytes == (PIECES - 12) * PIECE
    assert f.left_for_carousel
    assert f.swarm_note is not None and f.swarm_note.startswith("left for the carousel with 22%")
    assert "9 held pieces handed to the receive" in f.swarm_note


def test_a_receive_that_never_runs_leaves_the_swarm_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def receive(stage: _Stage, on_running: Callable[[], None]) -> list[int]:
        stage.log.append(("receive failed", None))  # e.g. the join refused
        return []

    async def main() -> tuple[list[str], HandoverRun, _Fetch, bool]:
        stage = _stage(monkeypatch, receive)
        peer = _Peer(range(4))
        fetching = asyncio.ensure_future(_swarm_until_cancelled(stage, peer, []))
        h, f = await _run(stage, fetching, peer, tmp_path)
        steps, running = stage.steps(), not fetching.done()
        fetching.cancel()
        return steps, h, f, running

    steps, h, f, running = asyncio.run(main())
    assert running and h.core.resume_swarm
    assert steps == ["check", "receive", "receive failed"]
    assert h.outcome() == [0, 1, 2, 3]
    assert not f.left_for_carousel and f.multicast_bytes == 0 and f.swarm_note is None


def test_a_swarm_that_fails_while_the_receive_joins_leaves_the_receive_going(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def receive(stage: _Stage, on_running: Callable[[], None]) -> range:
        await stage.swarm_closed.wait()  # the swarm fails before the first packet
        stage.log.append(("running", None))
        on_running()
        return range(PIECES)

    async def swarm(stage: _Stage, peer: _Peer) -> Any:
        await asyncio.sleep(0.01)
        peer.held += [5, 6]
        stage.log.append(("swarm failed", None))
        stage.swarm_closed.set()
        raise RuntimeError("libtorrent went away")

    async def main() -> tuple[_Stage, HandoverRun, _Fetch]:
        stage = _stage(monkeypatch, receive)
        peer = _Peer(range(5))
        fetching = asyncio.ensure_future(swarm(stage, peer))
        h, f = await _run(stage, fetching, peer, tmp_path)
        return stage, h, f

    stage, h, f = asyncio.run(main())
    assert stage.steps()[:3] == ["check", "receive", "swarm failed"]
    assert sorted(stage.steps()[3:]) == ["check", "running"]
    assert ("check", (5, 6)) in stage.log  # what it completed before failing
    assert h.outcome() == list(range(PIECES))
    assert f.multicast_bytes == (PIECES - 7) * PIECE
    assert any("libtorrent went away" in n for n in f.notices)


def test_an_announcement_is_judged_when_it_comes_not_at_the_next_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The swarm brought nothing (the carousel is sooner) and reports come only every
    1000 s: the plan is taken at the announcement, with the swarm still running."""

    def watch(*_: Any, should_stop: Any, on_plan: Any = None, **__: Any) -> None:
        time.sleep(0.05)
        while not should_stop():
            on_plan(plan(), 5.0)
            time.sleep(0.05)

    monkeypatch.setattr(carousel_watch, "watch_for_carousel", watch)

    async def main() -> tuple[CarouselPlan | None, bool]:
        f = _Fetch(loop=asyncio.get_running_loop())
        f.swarm_rates = SwarmRates(started_at=-5.0)
        _swarm_progress(
            f,  # type: ignore[arg-type]
            SwarmProgress(PeerPhase.DOWNLOADING, 0, PIECES * PIECE, 0, 0, 0, 3),
        )
        fetching: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(60))
        try:
            got = await _carousel_meanwhile(
                f,  # type: ignore[arg-type]
                _Manifest(),  # type: ignore[arg-type]
                fetching,
                "ab" * 32,
                check_every_s=1000.0,
            )
            return got, fetching.done()
        finally:
            fetching.cancel()

    got, swarm_ended = asyncio.run(main())
    assert got == plan() and not swarm_ended
