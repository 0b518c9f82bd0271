"""An origin reader's copy in the issue's swarm (issue 28).

A reader the balancer sends to the origins (the issue's demand below the swarm's
threshold: the first readers of a crowd) took its copy whole from them and, before,
left with it: the next reader, sent to the swarm seconds later, found no peer and
took its copy whole from the origins' web seeds too (flash-crowd-50-desktops, runs
E2, F1 and F2 of session 22: the first reader on 20 Mbit/s from 0 to 21 s, the
second on 50 Mbit/s from 7.5 s, 50 MB from the web seeds and 0 from peers).

Now an ``origin`` directive names the issue's swarm (`ClientDirective.seed_swarm`,
docs/protocols.md), and a reader that may seed (`swarm_handoff.seeds_after_carousel`:
a swarm named, not metered, a seeding time other than 0) joins it while it
downloads, as a carousel reader shares while it receives
(`carousel_share.CarouselShare`, whose sharing peer this is): a
`pressrun.peer.sharing.SharingPeer` in ``share/`` beside the partial file, every
piece at priority 0 but one that no connected peer holds (`pressrun.peer.sharing`)
and no web seeds (it downloads nothing from the swarm), handed
each piece the origin sections have verified against the manifest (read back from
the partial file every `carousel_share.WATCH_INTERVAL_S`). Once the copy is checked
it is installed first (`install.InstallFirst`: the reader's wait ends there), then the
same session seeds by the fair-exit rules, the copy counting as downloaded (it leaves
once it uploaded one copy, the tracker's counts say it is not needed, or the
profile's seeding time is over).

**On the issue's Chord ring** it reports the pieces it offered to the supernodes that
answer for them (`CarouselShare`'s reports, module docstring there). Without it the
ring did not know the origin reader held anything: the next reader's `chord` policy
held off each piece only the origin reader had and took them from the origins, which
had room, meanwhile. Named by the ring, the reader takes them from the origin reader at
once (the run before it: docs/results/2026-11-29-origin-copy-in-the-swarm.md). And its
session keeps one piece it lacks wanted (`pressrun.peer.sharing`), so the next reader,
not interested in it until the ring names it, does not close the connection to an
"upload-only peer" (docs/results/2026-11-29-origin-egress.md).

**It takes from its peers the pieces they hold** that the origins need not bring
(`pressrun.clients.swarm_take`: which, and when they go back to the origins; the
rule that keeps it no slower than the origins alone is there): at each look its
session is asked for them (`SharingPeer.take`, no web seed), and each piece
libtorrent finishes is read back from ``share/``, checked against the manifest's
SHA-256, written to the partial file and only then taken by the plan (`_accept`).
Before, in flash-crowd-50-desktops it fetched its last 11-12 MB from the origins
while the second reader, whose own feed had brought those very pieces from the
origins, was already seeding the whole issue (docs/results/2026-11-29-origin-egress.md).

What it costs the reader: the sections are not touched; the pieces are read back
from the page cache once and written again by libtorrent into ``share/`` (one more
copy on disk until the seeding ends), and its upload shares the link's up direction
with the download's acknowledgements.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pressrun.clients.carousel_share import FINISH_BATCH, CarouselShare, _read_pieces
from pressrun.clients.events import PlanState
from pressrun.clients.session import FetchState, describe
from pressrun.clients.swarm_handoff import seeds_after_carousel
from pressrun.clients.swarm_take import SwarmTake
from pressrun.content.manifest import Manifest, piece_ok
from pressrun.durable import pwrite_all

if TYPE_CHECKING:
    from pressrun.clients.core import DownloadPlan
    from pressrun.clients.install import InstallFirst
    from pressrun.peer.results import SwarmResult
    from pressrun.peer.sharing import SharingPeer

__all__ = ["TAKE_INTERVAL_S", "OriginShare"]

log = logging.getLogger("pressrun.clients.origin_seed")

#: how often it looks at what its peers hold and at how the swarm delivers (a piece
#: takes 0.05 s on a 20 Mbit/s link: the watch's 1 s would leave the swarm's last
#: pieces, or a slow swarm's claims, waiting up to a second)
TAKE_INTERVAL_S = 0.25
#: reads of a piece libtorrent finished before it is given up: its hash check may run
#: on blocks still on their way to the file (a read at once found piece 89 of 97 not
#: yet written, 127.0.0.1, 29 Nov), so a read that does not match is tried again after
#: `READ_AGAIN_S`, doubled each time (0.6 s in all)
READ_TRIES = 5
READ_AGAIN_S = 0.02


def _copy_piece(m: Manifest, source: Path, target: Path, index: int) -> bool:
    """Read piece ``index`` from ``source`` (the sharing session's file), and when it
    matches the manifest's SHA-256 write it into ``target`` (the partial file) at its
    offset; whether it matched. Blocking: for a worker thread."""
    offset, length = m.piece_span(index)
    with open(source, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if not piece_ok(m, index, data):
        return False
    fd = os.open(target, os.O_WRONLY)
    try:
        pwrite_all(fd, data, offset)
    finally:
        os.close(fd)
    return True


@dataclass
class OriginShare(CarouselShare):
    """An origin reader's sharing peer (the module docstring): `join` it before the
    sections, `seed_installed` once the copy is checked, `close` on a failure."""

    #: the origin download's plan: its verified pieces are what is offered
    plan: DownloadPlan | None = None
    #: what it takes from the swarm (`swarm_take`), made with the plan
    take: SwarmTake | None = None
    #: the pieces libtorrent finished that are being read back (`_accept`)
    _accepting: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    _taking: asyncio.Task[None] | None = None

    @classmethod
    def join(cls, f: FetchState, m: Manifest, path: Path, plan: DownloadPlan) -> OriginShare | None:
        """Join the swarm the ``origin`` directive names (in a task of its own) when
        this reader may seed; None otherwise (no swarm named, another mode, metered,
        ``--max-seed-s 0``, nothing left to download)."""
        directive = f.last_directive
        swarm = None if directive is None else directive.seed_swarm
        if (
            swarm is None
            or plan.state is not PlanState.DOWNLOADING
            or f.swarm_tried
            or f.multicast_bytes > 0
            or not seeds_after_carousel(f.config, swarm)
        ):
            return None
        share = cls(
            f, m, path, swarm, path.parent, sorted(plan.verified), plan=plan, take=SwarmTake(plan)
        )
        share._task = f.loop.create_task(share._run())
        return share

    async def _run(self) -> None:
        """The sharing (`CarouselShare._run`); once its looks end (the copy is whole, the
        sharing failed or is closing), what was asked of the swarm goes back to the
        origins."""
        try:
            await super()._run()
        finally:
            self._release_all()

    async def _offer_decoded(self, peer: SharingPeer) -> None:
        """Offer the pieces the origin sections verified since the last look (the
        carousel's watch reads the decoder's file here instead), and tell the ring."""
        assert self.plan is not None
        new = sorted(set(self.plan.verified) - peer.offered)
        for at in range(0, len(new), FINISH_BATCH):
            batch = new[at : at + FINISH_BATCH]
            for index, data in await asyncio.to_thread(_read_pieces, self.m, self.path, batch):
                peer.offer(index, data)
        self._tell_ring(peer, bool(new))
        if self._taking is None and self.take is not None:
            self._taking = self.f.loop.create_task(self._take_loop(peer))

    async def _take_loop(self, peer: SharingPeer) -> None:
        """`_take_from` every `TAKE_INTERVAL_S` until the looks end; a failure gives
        every claim back to the origins (the sharing goes on)."""
        try:
            while not self._stop.is_set():
                self._take_from(peer)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), TAKE_INTERVAL_S)
        except Exception as err:
            log.warning("%s: not taking from the swarm: %s", self.m.issue_id, describe(err))
        finally:
            self._release_all()

    async def _end_taking(self) -> None:
        """End the take loop and settle the pieces being read back."""
        self._stop.set()
        if self._taking is not None:
            await asyncio.gather(self._taking, return_exceptions=True)
        pending = list(self._accepting.values())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self._release_all()

    def _take_from(self, peer: SharingPeer) -> None:
        """Ask the peers for what they hold that the origins need not bring, give back
        what no peer holds any more, and, once nothing is left to assign, what the swarm
        is too slow for (`SwarmTake`)."""
        take, f = self.take, self.f
        if take is None or take.plan.state is not PlanState.DOWNLOADING:
            return
        if peer.on_piece is None:
            peer.on_piece = self._on_piece
        availability = peer.availability()
        held = {i for i, n in enumerate(availability) if n > 0} - peer.offered
        if peer.bait is not None:
            held.discard(peer.bait)
        gone = [i for i in take.plan.swarm_claims if i < len(availability) and not availability[i]]
        back = take.release(gone)
        back += take.take_back(peer.asked(), now=f.now())
        peer.untake(back)
        claimed = take.claim(held, now=f.now())
        peer.take(claimed)
        if back:
            f.changed.set()  # (an idle section worker takes them)

    def _on_piece(self, index: int) -> None:
        """libtorrent finished piece ``index`` (from the alert loop): a piece it took
        from a peer is read back and checked (`_accept`); one handed over is not."""
        peer = self.peer
        if peer is None or index in peer.offered or index in self._accepting:
            return
        self._accepting[index] = self.f.loop.create_task(self._accept(index))

    async def _accept(self, index: int) -> None:
        """Read piece ``index`` back from the sharing session's file, check it against
        the manifest, write it to the partial file, then tell the plan (a piece the
        plan has verified meanwhile is left alone)."""
        take, peer, f = self.take, self.peer, self.f
        try:
            if take is None or peer is None or index in take.plan.verified:
                return
            if take.plan.state is not PlanState.DOWNLOADING:
                return
            good = False
            for attempt in range(READ_TRIES):
                if attempt:
                    await asyncio.sleep(READ_AGAIN_S * 2 ** (attempt - 1))
                    if index in take.plan.verified:
                        return
                good = await asyncio.to_thread(_copy_piece, self.m, peer.path, self.path, index)
                if good:
                    break
            if not good:
                f.notice(f"piece {index} from the swarm failed the manifest's check")
                peer.untake(take.release([index], for_good=True))
                f.changed.set()
                return
            took, events = take.taken(index, now=f.now())
            if took:
                peer.offered.add(index)  # (held: the ring hears of it, never handed over)
                f.verified_bytes += self.m.piece_span(index)[1]
                f.save(take.plan, self.m)
                f.advanced(None)
            f.apply(events)
        except Exception as err:  # a piece it could not take: the origins bring it
            log.warning("%s: piece %d from the swarm: %s", self.m.issue_id, index, describe(err))
            if take is not None:
                take.release([index], for_good=True)
            f.changed.set()
        finally:
            self._accepting.pop(index, None)

    def _release_all(self) -> None:
        """Everything asked of the swarm goes back to the origins (the sharing ended)."""
        released = () if self.take is None else self.take.release_all()
        if released:
            with contextlib.suppress(Exception):  # (a session closing)
                if self.peer is not None:
                    self.peer.untake(released)
            self.f.changed.set()

    async def stop_watching(self) -> None:
        """The looks end (`CarouselShare.stop_watching`), taking too."""
        await self._end_taking()
        await super().stop_watching()

    async def close(self) -> None:
        """Leave the swarm (`CarouselShare.close`), the taking ended first."""
        await self._end_taking()
        await super().close()

    @property
    def taken_bytes(self) -> int:
        """Bytes it took from the swarm (verified and in the partial file)."""
        return 0 if self.take is None else self.take.bytes

    async def seed_installed(self, first: InstallFirst) -> float:
        """The copy is complete and checked: install it (the reader's wait ends), then
        seed it by the fair-exit rules in the same session. The seconds after the
        install (the seeding); a failed seeding is noted, the copy stays installed."""
        f = self.f
        await first.now()
        since = f.now()
        await self.stop_watching()
        result: SwarmResult | None = None
        if self.sharing:
            try:
                result = await self.seed()
            except Exception as err:  # the copy is whole and verified: seeding is an extra
                f.notice(f"swarm: seeding the origin copy failed ({describe(err)})")
        else:
            await self.close()
        f.notice(self._seeded(result), level=logging.INFO)
        return f.now() - since

    def _seeded(self, result: SwarmResult | None) -> str:
        """One line on what the origin copy did in the swarm."""
        if self.failed is not None:
            return f"the origin copy did not join the swarm: {self.failed}"
        take = self.take
        taken = (
            ""
            if take is None
            else f", {take.pieces} pieces ({take.bytes / 1e6:.1f} MB) taken from its peers "
            f"({take.claimed_total} asked, {take.taken_back_total} given back to the origins, "
            f"{take.spare} that a section brought too)"
        )
        while_downloading = (
            f"{self.offered_while_receiving} pieces offered and "
            f"{self.uploaded_while_receiving / 1e6:.1f} MB uploaded while downloading{taken}"
        )
        if result is None:
            return f"the origin copy in the swarm: {while_downloading}; not seeded"
        rule = "no rule" if result.leave_rule is None else result.leave_rule.value
        return (
            f"the origin copy in the swarm: {while_downloading}, "
            f"{result.uploaded_bytes / 1e6:.1f} MB in all; left by {rule}"
        )
