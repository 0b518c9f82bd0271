"""The swarm peer's leave on a host where nothing answers: the ring's rounds do not
stop, the tracker does not answer the announce naming the rule, libtorrent neither
saves the resume data nor says the torrent is removed. Each wait had its own bound
(2 + 5 + 5 + 5 s: 17 s of a reader's time before this change); together they now share
`LEAVE_BUDGET_S`, and the leave says how long each step took."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("libtorrent")

from pressrun.peer.events import LeaveRule
from pressrun.peer.leave import LEAVE_BUDGET_S, RING_LEAVE_WAIT_S, LeaveSequence
from pressrun.peer.results import SwarmResult
from pressrun.peer.session import REMOVE_WAIT_S, SessionClose

RESULT = SwarmResult(
    issue_id="issue",
    path=Path("issue.pdf"),
    completed=True,
    stalled=False,
    have_pieces=(),
    missing_spans=(),
    bytes_from_peers=0,
    bytes_from_web_seeds=0,
    uploaded_bytes=0,
    downloaded_bytes=0,
    ratio=None,
    ratio_at_leave=None,
    leave_rule=None,
    download_s=1.0,
    seeding_s=1.0,
    listen_port=None,
)


class SilentHandle:
    """A torrent handle whose tracker, resume data and removal never answer."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._trackers = [{"url": "http://127.0.0.1:9/announce"}]

    def trackers(self) -> list[dict[str, Any]]:
        return self._trackers

    def replace_trackers(self, entries: list[Any]) -> None:
        self.calls.append("replace_trackers")
        self._trackers = [{"url": e.url} for e in entries]

    def force_reannounce(self) -> None:
        self.calls.append("force_reannounce")

    def pause(self) -> None:
        self.calls.append("pause")

    def save_resume_data(self, flags: Any) -> None:
        self.calls.append("save_resume_data")


class SilentSession:
    def __init__(self, handle: SilentHandle) -> None:
        self.handle = handle

    def remove_torrent(self, handle: Any) -> None:
        self.handle.calls.append("remove_torrent")


class Alerts:
    def __init__(self, handle: SilentHandle) -> None:
        self.session = SilentSession(handle)


class HangingRing:
    """A ring client whose rounds never stop (a supernode that does not answer)."""

    def __init__(self) -> None:
        self.asked = 0

    async def leave(self) -> None:
        self.asked += 1
        await asyncio.sleep(3600)


async def test_a_leave_where_nothing_answers_ends_within_its_budget(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    handle = SilentHandle()
    ring = HangingRing()
    leave = LeaveSequence(
        # (only its issue id is read, in the leave's log line, unless handing over)
        manifest=SimpleNamespace(issue_id="issue"),  # type: ignore[arg-type]
        path=tmp_path / "issue.pdf",
        resume_path=tmp_path / "issue.resume",
        handle=lambda: handle,
        alerts=lambda: Alerts(handle),  # type: ignore[arg-type,return-value]
        ring=lambda: ring,  # type: ignore[arg-type,return-value]
        clock=loop.time,
        refresh=lambda: None,
        handing_over=lambda: False,
        fed_bytes=lambda: 0,
    )
    started = loop.time()
    await asyncio.wait_for(leave.leave(LeaveRule.MAX_SEED_TIME), 30)
    took = loop.time() - started
    # every step still ran, in order: the ring told, the rule named to the tracker,
    # paused (the `stopped`), resume data asked for, the torrent removed
    assert ring.asked == 1
    assert handle.calls == [
        "replace_trackers",
        "force_reannounce",
        "pause",
        "save_resume_data",
        "remove_torrent",
    ]
    assert "leave_rule=max_seed_time" in handle.trackers()[0]["url"]
    # within the budget (the code before: 17 s), and the steps say where it went
    assert LEAVE_BUDGET_S - 0.1 <= took <= LEAVE_BUDGET_S + 1.0, took
    assert list(leave.steps) == ["ring", "tracker", "resume", "remove"]
    # the ring's wait ran to its own bound and the tracker's to the budget's end (lower
    # bounds: a loaded host makes a wait longer, never shorter)
    assert leave.steps["ring"] >= RING_LEAVE_WAIT_S - 0.01
    assert leave.steps["ring"] + leave.steps["tracker"] >= LEAVE_BUDGET_S - 0.01
    assert leave.steps["resume"] < 0.3 and leave.steps["remove"] < 0.3
    assert sum(leave.steps.values()) == pytest.approx(took, abs=0.1)
    left_s = leave.leave_s()
    assert left_s is not None and left_s >= took - 0.1
    # the session's close after it is in the budget too (issue 29): none left, so the
    # close asks the torrent out and does not wait for it
    assert leave.remove_wait_s() == 0.0
    leave.closed(links_s=0.25, session=SessionClose(seconds=0.5, removed=1, unconfirmed=1))
    assert list(leave.steps)[-2:] == ["links", "session"]
    assert leave.steps["session"] == 0.5
    result = leave.report(RESULT)
    assert list(result.leave_steps) == [*leave.steps, "rest"]
    assert result.leave_s is not None
    assert result.leave_s == pytest.approx(sum(result.leave_steps.values()), abs=0.01)


def test_a_close_without_a_leave_waits_its_own_bound_and_adds_no_step(tmp_path: Path) -> None:
    # a fetch cancelled mid-download (a client leaving for the carousel): no leave, so
    # no budget; the close waits at most REMOVE_WAIT_S and is not a leave's step
    leave = LeaveSequence(
        manifest=SimpleNamespace(issue_id="issue"),  # type: ignore[arg-type]
        path=tmp_path / "issue.pdf",
        resume_path=tmp_path / "issue.resume",
        handle=lambda: None,
        alerts=lambda: None,
        ring=lambda: None,
        clock=lambda: 100.0,
        refresh=lambda: None,
        handing_over=lambda: False,
        fed_bytes=lambda: 0,
    )
    assert leave.remove_wait_s() == REMOVE_WAIT_S
    closed = SessionClose(seconds=0.1, removed=1, kept=True)
    leave.closed(links_s=0.0, session=closed)
    assert leave.steps == {} and leave.session_close == closed
    assert leave.report(RESULT) == RESULT
