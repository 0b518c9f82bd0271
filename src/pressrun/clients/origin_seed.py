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
piece at priority 0 and no web seeds (it downloads nothing from the swarm), handed
each piece the origin sections have verified against the manifest (read back from
the partial file every `carousel_share.WATCH_INTERVAL_S`). Once the copy is checked
it is installed first (`install.InstallFirst`: the reader's wait ends there), then the
same session seeds by the fair-exit rules, the copy counting as downloaded (it leaves
once it uploaded one copy, the tracker's counts say it is not needed, or the
profile's seeding time is over).

**On the issue's Chord ring** (the `chord` uploader policy): the sharing session reports
the pieces it offered to the supernodes that answer for them, as a swarm peer's ring
client does (`pressrun.peer.ring_client.RingClient`, fed from the pieces offered, the
bytes verified and uploaded, its fastest upload), names no peers it serves (any asker:
it downloads nothing, so its upload slots are free), and asks the ring for nothing.
Without it the ring did not know the origin reader held anything: the next reader's
`chord` policy held off each piece only the origin reader had (a tree's first
receivers, docs/chord.md) and took them from the origins, which had room, meanwhile;
and libtorrent closed its connection to a sharing peer it wanted nothing of (the
sharer says it is upload-only). Named by the ring, the reader takes them from the origin
reader at once (the run before it: docs/results/2026-11-29-origin-copy-in-the-swarm.md).
The seeding's own ring client takes over once the copy is complete.

What it costs the reader: the sections are not touched; the pieces are read back
from the page cache once and written again by libtorrent into ``share/`` (one more
copy on disk until the seeding ends), and its upload shares the link's up direction
with the download's acknowledgements.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    from pressrun.peer.ring_client import RingClient
    from pressrun.peer.sharing import SharingPeer

__all__ = ["OriginShare"]


@dataclass
class OriginShare(CarouselShare):
    """An origin reader's sharing peer (the module docstring): `join` it before the
    sections, `seed_installed` once the copy is checked, `close` on a failure."""

    #: the origin download's plan: its verified pieces are what is offered
    plan: DownloadPlan | None = None
    #: its reports to the issue's Chord ring while it shares (None: no ring, or not yet)
    ring: RingClient | None = None
    _ring_tried: bool = False
    _peak_upload_bps: int = 0
    _upload_seen: tuple[float, int] | None = None

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
        if not self._ring_tried:
            self._ring_tried = True
            self.ring = self._ring_client(peer)
        self._look_at_upload(peer)
        new = sorted(set(self.plan.verified) - peer.offered)
        for at in range(0, len(new), FINISH_BATCH):
            batch = new[at : at + FINISH_BATCH]
            for index, data in await asyncio.to_thread(_read_pieces, self.m, self.path, batch):
                peer.offer(index, data)
        if new and self.ring is not None:
            self.ring.nudge()

    def _ring_client(self, peer: SharingPeer) -> RingClient | None:
        """The sharing session's reports to the ring (started), or None when the
        uploader policy asks no ring or the session has no address yet."""
        from pressrun.peer.chord_policy import ChordPolicy
        from pressrun.peer.ring_client import RingClient
        from pressrun.peer.ring_link import ring_endpoint
        from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY, make_uploader_policy

        name = self.f.config.uploader_policy or DEFAULT_UPLOADER_POLICY
        self.f.uploader_policy = name  # the swarm is used: its policy is reported, as its ring
        policy = make_uploader_policy(name)
        if not isinstance(policy, ChordPolicy) or peer.listen_port is None:
            return None
        # the address it listens on (`swarm_handoff._listen_interfaces`: the one the
        # tracker is reached from, with a ring), as a swarm peer's ring client says
        base, address = ring_endpoint(
            self.swarm.tracker_url, peer.listen_interfaces, peer.listen_port
        )
        n = self.m.num_pieces
        ring = RingClient(
            tracker_base=base,
            info_hash=self.m.info_hash,
            num_pieces=n,
            peer_id=peer._peer_id,
            address=address,
            policy=policy,
            have=lambda: [i in peer.offered for i in range(n)],
            unheld=tuple,  # it asks the ring for nothing: the origins are its source
            totals=lambda: (self._uploaded(peer), self.f.verified_bytes),
            connect=lambda host, port: None,  # (named for nothing it asked)
            upload_bps=lambda: self._peak_upload_bps,
            missing=lambda: n - len(peer.offered),
            # it serves any asker (said by naming none: few ask a peer that
            # downloads nothing, and its upload slots are free)
            unchoked=lambda: None,
        )
        ring.start()
        return ring

    def _uploaded(self, peer: SharingPeer) -> int:
        with contextlib.suppress(Exception):  # (a session closing)
            return peer.uploaded_bytes
        return 0

    def _look_at_upload(self, peer: SharingPeer) -> None:
        """Note its fastest upload so far (over the time since the last look), for the
        ring's reports."""
        now, up = self.f.now(), self._uploaded(peer)
        if self._upload_seen is not None and now > self._upload_seen[0]:
            rate = (up - self._upload_seen[1]) / (now - self._upload_seen[0])
            self._peak_upload_bps = max(self._peak_upload_bps, int(rate))
        self._upload_seen = (now, up)

    async def _close_ring(self) -> None:
        """Stop the reports (no ``left``: the seeding's own ring client reports the
        same peer as a seed next, or the supernodes forget it)."""
        ring, self.ring = self.ring, None
        if ring is not None:
            await ring.close()

    async def close(self) -> None:
        await self._close_ring()
        await super().close()

    async def seed_installed(self, first: InstallFirst) -> float:
        """The copy is complete and checked: install it (the reader's wait ends), then
        seed it by the fair-exit rules in the same session. The seconds after the
        install (the seeding); a failed seeding is noted, the copy stays installed."""
        f = self.f
        await first.now()
        since = f.now()
        await self.stop_watching()
        await self._close_ring()
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
