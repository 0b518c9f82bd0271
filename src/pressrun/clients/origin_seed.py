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

What it costs the reader: the sections are not touched; the pieces are read back
from the page cache once and written again by libtorrent into ``share/`` (one more
copy on disk until the seeding ends), and its upload shares the link's up direction
with the download's acknowledgements.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pressrun.clients.carousel_share import FINISH_BATCH, CarouselShare, _read_pieces
from pressrun.clients.events import PlanState
from pressrun.clients.session import FetchState, describe
from pressrun.clients.swarm_handoff import seeds_after_carousel
from pressrun.content.manifest import Manifest

if TYPE_CHECKING:
    from pressrun.clients.core import DownloadPlan
    from pressrun.clients.install import InstallFirst
    from pressrun.peer.results import SwarmResult
    from pressrun.peer.sharing import SharingPeer

__all__ = ["OriginShare"]


@dataclass
class OriginShare(CarouselShare):
    """An origin reader's sharing peer (the module docstring): `join` it before the
    sections, `seed_installed` once the copy is checked, `close` on a failure."""

    #: the origin download's plan: its verified pieces are what is offered
    plan: DownloadPlan | None = None

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
        share = cls(f, m, path, swarm, path.parent, sorted(plan.verified), plan=plan)
        share._task = f.loop.create_task(share._run())
        return share

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
        while_downloading = (
            f"{self.offered_while_receiving} pieces offered and "
            f"{self.uploaded_while_receiving / 1e6:.1f} MB uploaded while downloading"
        )
        if result is None:
            return f"the origin copy in the swarm: {while_downloading}; not seeded"
        rule = "no rule" if result.leave_rule is None else result.leave_rule.value
        return (
            f"the origin copy in the swarm: {while_downloading}, "
            f"{result.uploaded_bytes / 1e6:.1f} MB in all; left by {rule}"
        )
