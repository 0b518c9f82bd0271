"""The multicast sender's carousels: `CarouselRegistry` starts an issue's carousel
(its prepared pass, or one prepared then; the groups, ports and TSI of
`pressrun.multicast.plans`) and hands it to the send thread (`pressrun.multicast.send`),
stops it, and keeps them up to date (the upkeep loop, every ``prepare_interval_s``, each
step surviving any error): new issues prepared, a running carousel whose issue was
republished re-prepared onto the same groups, every pass in use given a fresh FDT every
``fdt_renew_s`` (`pressrun.multicast.prepare.renew_fdt`)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pressrun.multicast.config import CarouselConfig, is_ssm
from pressrun.multicast.core import CarouselSchedule
from pressrun.multicast.events import CarouselPlan, ChannelSpec
from pressrun.multicast.metrics import SenderMetrics
from pressrun.multicast.plans import ChannelPlanner
from pressrun.multicast.prepare import CarouselError, IssuePreparer, PreparedIssue, renew_fdt
from pressrun.multicast.send import RunningCarousel, SendThread

if TYPE_CHECKING:
    from pressrun.multicast.sender import SenderServiceConfig

log = logging.getLogger("pressrun.multicast.sender")


def _sha256_of_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CarouselRegistry:
    """The sender's carousels: start, stop, and their upkeep (the running ones are
    the send thread's)."""

    def __init__(
        self,
        config: SenderServiceConfig,
        *,
        thread: SendThread,
        planner: ChannelPlanner,
        preparer: IssuePreparer,
        metrics: SenderMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.thread = thread
        self.planner = planner
        self.preparer = preparer
        self.metrics = metrics
        self.clock = clock
        self._starting: dict[str, asyncio.Task[CarouselPlan]] = {}

    async def start_carousel(
        self, issue_id: str, carousel: CarouselConfig, *, tsi: int | None = None
    ) -> CarouselPlan:
        """Encode the issue and start its carousel; the plan. A carousel already
        running for the issue is kept (its plan is answered). ``tsi``: the carousel's
        TSI (None: the one it had before, else the issue's own; `plans`)."""
        running = self.thread.get(issue_id)
        if running is not None:
            return running.plan
        pending = self._starting.get(issue_id)
        if pending is None:
            pending = asyncio.ensure_future(self._start(issue_id, carousel, tsi))
            self._starting[issue_id] = pending
            pending.add_done_callback(lambda _t: self._starting.pop(issue_id, None))
        return await asyncio.shield(pending)

    async def upkeep_loop(self) -> None:
        """Forever, every ``prepare_interval_s`` (or ``fdt_renew_s`` if shorter): new
        issues prepared, republished issues' carousels re-prepared, FDTs renewed.
        Each step survives any error (logged) and the next round comes."""
        interval = min(self.config.prepare_interval_s, self.config.fdt_renew_s)
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("preparing new issues", self._prepare_round),
            ("following republished issues", self._follow_republished),
            ("renewing FDTs", self._renew_fdts),
        ]
        while True:
            for what, step in steps:
                try:
                    await step()
                except Exception:  # the loop outlives any round's error
                    log.exception("%s failed; the next round is due in %.1f s", what, interval)
            await asyncio.sleep(interval)

    async def _prepare_round(self) -> None:
        # with --prepare-issues 0 too: the passes of carousels no longer on the air go
        # (they were kept for the sender's life, one pass per issue ever carouselled)
        await self.preparer.refresh(
            self.config.prepare_issues,
            self.config.carousel,
            on_air=lambda issue_id: self.thread.get(issue_id) is not None,
            tsi_for=self.planner.tsi_for,
        )

    async def _follow_republished(self) -> None:
        """A running carousel whose issue's manifest changed on disk carries the new
        version from now on (same groups, ports and TSI; a new TOI): receivers of the
        new manifest refuse a carousel of the old one."""
        for running in self.thread.running():
            issue_id = running.plan.issue_id
            manifest = self.config.content_dir / issue_id / "manifest.json"
            try:
                digest = await asyncio.to_thread(_sha256_of_file, manifest)
            except OSError:
                continue  # withdrawn or unreadable: the carousel keeps what it has
            if digest == running.plan.manifest_sha256:
                continue
            tsi = running.plan.channels[0].tsi
            try:
                prepared = await self.preparer.prepare(issue_id, running.config, tsi=tsi)
            except CarouselError as err:
                # the preparer logged why (once); the carousel keeps the old version
                log.debug("%s was republished but cannot be prepared: %s", issue_id, err)
                continue
            if self.thread.get(issue_id) is not running:
                continue  # stopped or restarted meanwhile
            addresses = [(ch.group, ch.port) for ch in running.plan.channels]
            self._launch(issue_id, running.config, prepared, addresses, tsi)
            log.info(
                "%s was republished: its carousel now carries manifest %s...",
                issue_id,
                digest[:16],
            )

    async def _renew_fdts(self) -> None:
        """Every pass in use (running or prepared) whose FDT is ``fdt_renew_s`` old
        gets a fresh one (`renew_fdt`)."""
        now = time.perf_counter()
        passes = {id(p): p for p in self.preparer.prepared.values()}
        passes.update({id(c.prepared): c.prepared for c in self.thread.running()})
        for prepared in passes.values():
            if now - prepared.fdt.built_at < self.config.fdt_renew_s:
                continue
            renewed = await asyncio.to_thread(
                renew_fdt, prepared, fdt_duration_s=self.config.fdt_duration_s, built_at=now
            )
            if not renewed:
                log.warning("the FDT of %s could not be renewed in place", prepared.issue_id)

    async def _start(
        self, issue_id: str, carousel: CarouselConfig, tsi: int | None
    ) -> CarouselPlan:
        taken = {ch.group for c in self.thread.running() for ch in c.plan.channels}
        try:
            planned = self.planner.plan(issue_id, carousel.channels, tsi=tsi, taken=taken)
        except ValueError as err:
            raise CarouselError(str(err), 409 if "free groups" in str(err) else 400) from None
        prepared = await self.preparer.prepare(issue_id, carousel, tsi=planned.tsi)
        # groups may have been taken while the pass was encoded: plan again
        taken = {ch.group for c in self.thread.running() for ch in c.plan.channels}
        try:
            planned = self.planner.plan(issue_id, carousel.channels, tsi=planned.tsi, taken=taken)
        except ValueError as err:
            raise CarouselError(str(err), 409) from None
        self.planner.remember(issue_id, planned, now_unix=self.clock())
        addresses = list(zip(planned.groups, planned.ports, strict=True))
        plan = self._launch(issue_id, carousel, prepared, addresses, planned.tsi)
        self.metrics.starts.inc()
        log.info(
            "carousel %s started: %d channel(s) of %.1f Mbit/s, fec %s, %d packets per pass, "
            "cycle %.2f s, tsi %d, groups %s",
            issue_id,
            len(plan.channels),
            carousel.rate_bps / 1e6,
            carousel.fec,
            prepared.object_packets,
            plan.cycle_s,
            planned.tsi,
            ", ".join(f"{s.group}:{s.port}" for s in plan.channels),
        )
        return plan

    def _launch(
        self,
        issue_id: str,
        carousel: CarouselConfig,
        prepared: PreparedIssue,
        addresses: list[tuple[str, int]],
        tsi: int,
    ) -> CarouselPlan:
        """Hand the send thread a carousel of ``prepared`` on ``addresses`` (replacing
        the issue's running one, if any); its plan."""
        pps = carousel.rate_bps / 8 / prepared.mean_packet_bytes
        specs = [ChannelSpec(group, port, tsi, carousel.rate_bps, pps) for group, port in addresses]
        cycles = prepared.cycles
        now = time.perf_counter()
        # a late wake-up may send up to 20 ms of a channel's packets at once; later
        # than that the schedule slips (on a loaded host, sleeps overshoot by ms)
        schedule = CarouselSchedule(
            cycles, [pps] * len(cycles), now=now, max_burst=max(32, int(pps * 0.02))
        )
        plan = CarouselPlan(
            issue_id=issue_id,
            manifest_sha256=prepared.manifest_sha256,
            size_bytes=prepared.size_bytes,
            toi=prepared.toi,
            fec=carousel.fec,
            symbol_bytes=prepared.symbol_bytes,
            source_symbols=prepared.source_symbols,
            cycle_s=max(schedule.cycle_s(c) for c in range(len(cycles))),
            channels=tuple(specs),
            # source-specific groups are joined by (S, G): S is the address the send
            # socket sends from (IP_MULTICAST_IF)
            source=self.config.interface if any(is_ssm(g) for g, _ in addresses) else None,
        )
        self.thread.start_carousel(
            RunningCarousel(plan, prepared.packets, schedule, addresses, now, carousel, prepared)
        )
        return plan

    def stop_carousel(self, issue_id: str) -> bool:
        """Stop an issue's carousel; False if none ran."""
        carousel = self.thread.stop_carousel(issue_id)
        if carousel is None:
            return False
        self.metrics.stops.inc()
        log.info("carousel %s stopped", issue_id)
        return True

    def cancel(self) -> None:
        """Cancel the preparations and the carousel starts under way."""
        self.preparer.cancel()
        for task in list(self._starting.values()):
            task.cancel()
