"""The peer's way out of its swarm, and the resume data it saves on the way.

`LeaveSequence` runs the leave once, however many callers ask: tell the ring it left
(the `chord` policy), name the leave rule to the tracker (announce to the URL that
carries ``leave_rule=``, then pause: that is the one ``stopped``), save libtorrent's
resume data (`pressrun.peer.resume`), hand a stalled peer's verified pieces over, remove
the torrent. The peer's alert loop (`pressrun.peer.aio`) tells it of the alerts it waits
for: the tracker's reply, the resume data saved (written next to the file here), the
torrent removed.

**A leave is quick on a busy host too.** Its waits (the ring's rounds stopping, the
tracker's answer to the announce naming the rule, the resume data, the removal) share
one budget, `LEAVE_BUDGET_S`, instead of each having its own 2-5 s: on a loaded host
they all ran out one after the other (the flash crowd at 2be7bbe, load 50-140 on 2
cores: the `chord` clients' end of seeding to exit 10.8 s at the median, up to 38 s).
Nothing waited for is lost when the budget ends first: the ring and the tracker drop a
peer that stops reporting by their own expiry, the torrent goes with its session, and a
complete copy is in the library already (without resume data its next seeding checks
the file first). Each step's seconds are kept (`steps`) and reported with the result.

**The session's close is in the budget too** (issue 29). In the flash-crowd pair at
8059ace (load up to 112) the leave took 3.6-3.8 s at the median but up to 25-27 s: its
waits had kept to the budget and the session's close after them took up to 20 s, the
destructor of a session whose torrent's removal the budget had not waited for. Now the
close waits for the removal only as long as the budget has left (`remove_wait_s`;
`pressrun.peer.session.REMOVE_WAIT_S` after a fetch cancelled without a leave), a
command-line peer keeps its session instead of destroying it, and the close's own
seconds are steps: ``links`` (the ring's ``left`` reports finishing, the ring's and the
scrape's HTTP sessions closed) and ``session`` (`pressrun.peer.session.SessionClose`);
``rest`` is what no step accounts for (the loop's own delays on a loaded host).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libtorrent as lt

from pressrun.content.codec import Manifest
from pressrun.peer.events import LeaveRule
from pressrun.peer.results import SwarmResult
from pressrun.peer.resume import write_resume
from pressrun.peer.ring_client import RingClient
from pressrun.peer.session import REMOVE_WAIT_S, AlertSession, SessionClose
from pressrun.peer.verify import verified_pieces

log = logging.getLogger(__name__)

LEAVE_ANNOUNCE_TIMEOUT_S = 5.0
#: the leave's waits together, at most (module docstring); each also keeps its own bound
LEAVE_BUDGET_S = 6.0
#: the ring's rounds stopping, at most (the ``left`` reports are not waited for here)
RING_LEAVE_WAIT_S = 2.0
#: the resume data, at most
RESUME_WAIT_S = 5.0


class LeaveSequence:
    """Leaving the swarm by a rule, once; the pieces handed over after a stall.

    ``handle()`` is the torrent handle and ``alerts()`` the session (None before the
    start and after the close); ``ring()`` the `chord` policy's ring client, if any;
    ``refresh()`` reads the status now (the totals the leave reports);
    ``handing_over()`` says the peer stalled and hands its file to the origin
    downloader; ``fed_bytes()`` the bytes the feed fetched (kept in the resume data).
    """

    def __init__(
        self,
        *,
        manifest: Manifest,
        path: Path,
        resume_path: Path,
        handle: Callable[[], Any],
        alerts: Callable[[], AlertSession | None],
        ring: Callable[[], RingClient | None],
        clock: Callable[[], float],
        refresh: Callable[[], None],
        handing_over: Callable[[], bool],
        fed_bytes: Callable[[], int],
    ) -> None:
        self.manifest = manifest
        self.path = path
        self.resume_path = resume_path
        self._handle = handle
        self._alerts = alerts
        self._ring = ring
        self._clock = clock
        self._refresh = refresh
        self._handing_over = handing_over
        self._fed_bytes = fed_bytes
        #: when the leave started (None: not yet)
        self.left_at: float | None = None
        #: seconds each step of the leave took (``ring``, ``tracker``, ``resume``,
        #: ``handover``, ``remove``, then the close's ``links`` and ``session``), in order
        self.steps: dict[str, float] = {}
        #: what the session's close did (None: not closed yet)
        self.session_close: SessionClose | None = None
        self._budget_ends = 0.0
        #: after a stall, the pieces checked against the manifest and left in the file
        self.handover_pieces: tuple[int, ...] = ()
        self._leaving: asyncio.Future[None] | None = None
        self._tracker_replied = asyncio.Event()
        self._resume_saved = asyncio.Event()
        self._removed = asyncio.Event()

    # --- the alerts it waits for ----------------------------------------------

    def tracker_replied(self, tracker_url: str) -> None:
        """A tracker answered (or failed) an announce."""
        # only the announce to the URL that names the leave rule counts
        if "leave_rule=" in tracker_url:
            self._tracker_replied.set()

    def resume_data(self, params: Any) -> None:
        """libtorrent's resume data (a save_resume_data_alert's): save it by the file."""
        write_resume(self.resume_path, params, self._fed_bytes())
        self._resume_saved.set()

    def resume_failed(self) -> None:
        """libtorrent could not give its resume data."""
        self._resume_saved.set()

    def removed(self) -> None:
        """The torrent is out of the session."""
        self._removed.set()

    # --- leaving --------------------------------------------------------------

    def seeding_s(self, verified_at: float | None) -> float | None:
        """How long the peer seeded since ``verified_at``: until it left, or until now."""
        if verified_at is None:
            return None
        end = self.left_at if self.left_at is not None else self._clock()
        return end - verified_at

    async def leave(self, rule: LeaveRule) -> None:
        """Leave once, however many callers ask (``finished`` and a ``stop`` from a
        signal both do): the first starts the leave, every caller awaits that one."""
        if self._leaving is None:
            self._leaving = asyncio.ensure_future(self._leave_once(rule))
        await asyncio.shield(self._leaving)

    async def _leave_once(self, rule: LeaveRule) -> None:
        """Save resume data, name the rule to the tracker, remove the torrent."""
        handle, alerts = self._handle(), self._alerts()
        if handle is None or alerts is None or self._removed.is_set():
            return
        self.left_at = step_at = self._clock()
        self._budget_ends = self.left_at + LEAVE_BUDGET_S
        self._refresh()
        handle = self._handle()
        ring = self._ring()
        if ring is not None:
            with contextlib.suppress(TimeoutError):
                # never chosen again
                await asyncio.wait_for(ring.leave(), self._within(RING_LEAVE_WAIT_S))
            step_at = self._step("ring", step_at)
        # libtorrent sends `stopped` only to a tracker it has announced to, and sends it
        # when the torrent pauses: first move to the URL that names the rule and
        # announce there, then pause (that is the one `stopped`, naming the rule), then
        # remove. Pausing first would send a `stopped` without the rule to the old URL,
        # and the leave would reach the tracker twice (docs/tracker.md).
        urls = [str(t["url"]) for t in handle.trackers()]
        # a WebSocket tracker keeps its URL: a new URL is a new socket, which the
        # tracker refuses for a peer_id another socket holds (docs/tracker.md)
        if any(not u.startswith(("ws://", "wss://")) for u in urls):
            self._tracker_replied.clear()
            handle.replace_trackers(
                [
                    lt.announce_entry(
                        u
                        if u.startswith(("ws://", "wss://"))
                        else f"{u}{'&' if '?' in u else '?'}leave_rule={rule.tracker_value}"
                    )
                    for u in urls
                ]
            )
            handle.force_reannounce()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._tracker_replied.wait(), self._within(LEAVE_ANNOUNCE_TIMEOUT_S)
                )
            step_at = self._step("tracker", step_at)
        handle.pause()
        await self._save_resume(wait=True)
        step_at = self._step("resume", step_at)
        if self._handing_over():
            # Hand the file over: the origin downloader will fill it in (not bounded:
            # the pieces checked are what the origins need not send again).
            pieces = [i for i, have in enumerate(handle.status().pieces) if have]
            self.handover_pieces = tuple(
                await asyncio.to_thread(verified_pieces, self.manifest, self.path, pieces)
            )
            step_at = self._step("handover", step_at)
        alerts.session.remove_torrent(handle)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._removed.wait(), self._within(LEAVE_ANNOUNCE_TIMEOUT_S))
        self._step("remove", step_at)
        if self._handing_over():
            self.resume_path.unlink(missing_ok=True)

    def remove_wait_s(self) -> float:
        """How long the session's close may wait for libtorrent to remove a torrent: what
        the budget has left after a leave (0: the torrent is asked out and not waited
        for), `REMOVE_WAIT_S` when the peer closes without one (a cancelled fetch)."""
        if self.left_at is None:
            return REMOVE_WAIT_S
        return self._within(REMOVE_WAIT_S)

    def closed(self, *, links_s: float, session: SessionClose) -> None:
        """The peer closed its links (``links_s`` seconds) and then its session: the
        close's steps, after a leave (module docstring)."""
        self.session_close = session
        if self.left_at is not None:
            self.steps["links"] = round(links_s, 3)
            self.steps["session"] = session.seconds

    def _within(self, bound_s: float) -> float:
        """A wait's timeout: ``bound_s``, or less as the leave's budget runs out (0: the
        awaited thing is looked at once, not waited for)."""
        return max(0.0, min(bound_s, self._budget_ends - self._clock()))

    def _step(self, name: str, since: float) -> float:
        """Note the step ``name`` that began at ``since``; the time it ended."""
        now = self._clock()
        self.steps[name] = round(now - since, 3)
        return now

    def leave_s(self) -> float | None:
        """Seconds from the start of the leave until now (None: it never left)."""
        return None if self.left_at is None else self._clock() - self.left_at

    def report(self, result: SwarmResult) -> SwarmResult:
        """``result`` with the leave's seconds (once the session closed): from the end
        of the seeding until now, and each step's (``rest``: what the steps leave)."""
        leave_s = self.leave_s()
        if leave_s is None:
            return result
        steps = dict(self.steps)
        steps["rest"] = round(leave_s - sum(steps.values()), 3)
        log.info(
            "%s: left the swarm in %.2f s (%s)",
            self.manifest.issue_id,
            leave_s,
            ", ".join(f"{k} {v:.2f}" for k, v in steps.items()),
        )
        return dataclasses.replace(result, leave_s=round(leave_s, 3), leave_steps=steps)

    async def _save_resume(self, *, wait: bool) -> None:
        handle = self._handle()
        if handle is None:
            return
        self._resume_saved.clear()
        handle.save_resume_data(lt.save_resume_flags_t.flush_disk_cache)
        if wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resume_saved.wait(), self._within(RESUME_WAIT_S))
