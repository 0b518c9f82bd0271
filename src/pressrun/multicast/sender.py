"""``pressrun serve multicast``: FLUTE carousels, the control channel, the control API.

- **Issues prepared at publish time** (`pressrun.multicast.prepare`): one pass of
  each of the newest ``prepare_issues`` issues of the content folder is encoded as
  soon as it is published (at the start, then every ``prepare_interval_s``), so a
  carousel start at peak demand costs no encoding.
- **Carousels.** ``POST /v1/carousels`` with an issue id takes the issue's prepared
  pass (or prepares it then, for an issue not prepared or other FEC settings), plans
  the channels (`pressrun.multicast.core.channel_cycles`) on the groups, ports and
  TSI the issue keeps across restarts (`pressrun.multicast.plans`) and hands the
  carousel to the send thread, which repeats it until ``DELETE``.
- **Upkeep** (every ``prepare_interval_s``, each step surviving any error): new issues
  prepared; a running carousel whose issue was republished is re-prepared and carries
  the new version on the same groups; every pass in use gets a fresh FDT every
  ``fdt_renew_s`` (`pressrun.multicast.prepare.renew_fdt`).
- **The send thread** owns every running carousel's `CarouselSchedule`: it sleeps
  until the next packet is due (``time.perf_counter``), takes the due batches and
  hands each to the binding's `PacketBuffer.send`, which loops over blocking
  ``sendto`` with the GIL released (FIELD-NOTES: a thread keeps up with the line where
  an asyncio loop loses packets). Packets are sent already built: one pass of each
  carousel lives in memory (size x channels x (1 + overhead) bytes with RaptorQ).
- **The control channel.** Every ``announce_interval_s`` an `Announcement` of every
  running carousel, signed with the publisher's Ed25519 key, goes to the control
  group with a sequence number and an expiry ``announcement_ttl_s`` later, in as many
  datagrams (parts of one round) as keep each under ``ANNOUNCEMENT_PART_BYTES``.
- **HTTP.** ``/v1/carousels`` (GET, POST), ``/v1/carousels/<issue_id>`` (GET,
  DELETE), all needing ``Authorization: Bearer <token>`` (the shared guard of
  `pressrun.security.operator_middleware`: 401 with ``WWW-Authenticate: Bearer``);
  ``/metrics`` (Prometheus text) and ``/healthz`` are open. docs/multicast.md lists it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nacl.signing
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from pressrun.multicast.codec import ANNOUNCEMENT_PART_BYTES, split_announcement
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.control import sign_announcement
from pressrun.multicast.core import AnnouncementClock, CarouselSchedule
from pressrun.multicast.events import Announcement, CarouselPlan, ChannelSpec
from pressrun.multicast.net import sender_socket
from pressrun.multicast.plans import MAX_TSI, ChannelPlanner
from pressrun.multicast.prepare import CarouselError, IssuePreparer, PreparedIssue, renew_fdt
from pressrun.security import ServiceSecurity, check_operator_token, operator_middleware

if TYPE_CHECKING:
    from pressrun_flute import PacketBuffer

log = logging.getLogger("pressrun.multicast.sender")

#: channel sequence numbers (the binding's LCT extension, HET 250) wrap at 2^24
SEQUENCE_MODULO = 1 << 24

#: the groups of the carousels' range unless configured
DEFAULT_GROUPS = 1024
#: the control API's routes: every one needs ``Authorization: Bearer <token>``
API_ROUTES = frozenset({"/v1/carousels", "/v1/carousels/{issue_id}"})


def wall_clock() -> float:
    """Unix time: announcements are judged by receivers on other machines' clocks."""
    return time.time()  # noqa: TID251 (expiry of announcements read by other hosts)


@dataclass(frozen=True)
class SenderServiceConfig:
    """Everything ``pressrun serve multicast`` is started with (docs/multicast.md)."""

    content_dir: Path
    control_group: tuple[str, int]
    signing_key: nacl.signing.SigningKey
    token: str
    interface: str = "127.0.0.1"
    host: str = "127.0.0.1"
    port: int = 0
    carousel: CarouselConfig = field(default_factory=CarouselConfig)
    group_base: str = "239.255.71.1"
    #: the carousels' groups are group_base .. group_base + group_count - 1 (None: 1024,
    #: or as many as there are up to 239.255.255.255)
    group_count: int | None = None
    channel_port_base: int = 0  # 0: ports derived from the issue id (plans.py)
    #: where each issue's groups, ports and TSI are kept across restarts (None: only
    #: in memory; without it they are still derived from the issue id)
    state_file: Path | None = None
    announce_interval_s: float = 0.5
    announcement_ttl_s: float = 5.0
    multicast_ttl: int = 1
    tls: ServiceSecurity = field(default_factory=ServiceSecurity)  # HTTPS for the API
    #: the newest issues of the content folder encoded ahead of their carousels (0: none;
    #: each holds one pass in memory: size x channels x (1 + overhead) with RaptorQ)
    prepare_issues: int = 2
    #: how often the content folder is looked at for newly published issues (seconds)
    prepare_interval_s: float = 10.0
    #: a pass's FDT expires this long after it is built (seconds) ...
    fdt_duration_s: int = 86400
    #: ... and is built again this often while the pass is in use (seconds)
    fdt_renew_s: float = 600.0

    def __post_init__(self) -> None:
        if self.prepare_issues < 0 or not self.prepare_interval_s > 0:
            raise ValueError("need prepare_issues >= 0 and prepare_interval_s > 0")
        check_operator_token(self.token)  # the one token rule of every service
        if not ipaddress.IPv4Address(self.group_base).is_multicast:
            raise ValueError(f"--group-base {self.group_base} is not a multicast address")
        count = self.groups()
        last = int(ipaddress.IPv4Address(self.group_base)) + count - 1
        if count < 1 or not ipaddress.IPv4Address(last).is_multicast:
            raise ValueError(
                f"--group-count {count} from --group-base {self.group_base} "
                "leaves the multicast range"
            )
        if not 0 < self.announce_interval_s < self.announcement_ttl_s:
            raise ValueError("need 0 < announce interval < announcement ttl")
        if not 0 < self.fdt_renew_s < self.fdt_duration_s:
            raise ValueError("need 0 < fdt_renew_s < fdt_duration_s")

    def groups(self) -> int:
        """How many groups the carousels' range has (``group_count`` or its default)."""
        if self.group_count is not None:
            return self.group_count
        left = int(ipaddress.IPv4Address("239.255.255.255")) - int(
            ipaddress.IPv4Address(self.group_base)
        )
        return max(1, min(DEFAULT_GROUPS, left + 1))


@dataclass
class RunningCarousel:
    """A carousel handed to the send thread: its plan, one pass of packets, the
    schedule and where each channel goes."""

    plan: CarouselPlan
    packets: PacketBuffer  # the pass: FDT packets, then the object's
    schedule: CarouselSchedule
    addresses: list[tuple[str, int]]
    started_at: float
    config: CarouselConfig  # what it was started with (a republished issue: again)
    prepared: PreparedIssue


class SenderMetrics:
    """The sender's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("issue", "channel")
        self.packets = Counter(
            "pressrun_multicast_packets_sent",
            "ALC/LCT packets sent, per carousel channel",
            labels,
            registry=self.registry,
        )
        self.bytes = Counter(
            "pressrun_multicast_bytes_sent",
            "UDP payload bytes sent, per carousel channel",
            labels,
            registry=self.registry,
        )
        self.slipped = Counter(
            "pressrun_multicast_packets_slipped",
            "packets not sent because the send thread woke late (the rate is a ceiling)",
            labels,
            registry=self.registry,
        )
        self.cycles = Gauge(
            "pressrun_multicast_cycles",
            "cycles each channel has sent since its carousel started",
            labels,
            registry=self.registry,
        )
        self.carousels = Gauge(
            "pressrun_multicast_carousels", "carousels running", registry=self.registry
        )
        self.prepared = Gauge(
            "pressrun_multicast_issues_prepared",
            "issues encoded ahead of their carousels, held in memory",
            registry=self.registry,
        )
        self.encodes = Counter(
            "pressrun_multicast_encodes",
            "passes encoded (at publish time, or at a carousel start that found none)",
            registry=self.registry,
        )
        self.encode_seconds = Counter(
            "pressrun_multicast_encode_seconds",
            "seconds spent encoding passes",
            registry=self.registry,
        )
        self.starts = Counter(
            "pressrun_multicast_carousel_starts",
            "carousels started through the control API",
            registry=self.registry,
        )
        self.stops = Counter(
            "pressrun_multicast_carousel_stops",
            "carousels stopped through the control API",
            registry=self.registry,
        )
        self.announcements = Counter(
            "pressrun_multicast_announcements_sent",
            "signed announcements sent on the control group",
            registry=self.registry,
        )
        self.send_errors = Counter(
            "pressrun_multicast_send_errors", "sendto failures", registry=self.registry
        )


class SendThread(threading.Thread):
    """Owns the running carousels: sleeps until the next packet is due, sends the due
    batches. The asyncio side starts and stops carousels through `start_carousel`
    and `stop_carousel` (a lock guards the table; the schedules are this thread's)."""

    def __init__(self, sock: socket.socket, metrics: SenderMetrics) -> None:
        super().__init__(name="pressrun-multicast-send", daemon=True)
        self.sock = sock
        self.metrics = metrics
        self._lock = threading.Lock()
        self._carousels: dict[str, RunningCarousel] = {}
        #: set on a start or stop, so an idle thread looks again at once (an event, not
        #: a queue: a queue the thread drains only when idle grew by one per order for
        #: as long as any carousel ran)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._slipped: dict[tuple[str, int], int] = {}
        self._children: dict[tuple[str, int], tuple[Counter, Counter, Gauge, Counter]] = {}
        #: issues whose carousel stopped: their metric children go at the thread's next
        #: round (the thread may be counting a batch of the carousel as it stops)
        self._stopped: set[str] = set()

    def start_carousel(self, carousel: RunningCarousel) -> None:
        """Start (or replace) the carousel of ``carousel.plan.issue_id``."""
        with self._lock:
            self._carousels[carousel.plan.issue_id] = carousel
            self.metrics.carousels.set(len(self._carousels))
        self._wake.set()

    def stop_carousel(self, issue_id: str) -> RunningCarousel | None:
        """Stop an issue's carousel; the stopped carousel, or None if none ran."""
        with self._lock:
            carousel = self._carousels.pop(issue_id, None)
            self.metrics.carousels.set(len(self._carousels))
            if carousel is not None:
                self._stopped.add(issue_id)
        self._wake.set()
        return carousel

    def running(self) -> list[RunningCarousel]:
        """The running carousels (a snapshot)."""
        with self._lock:
            return list(self._carousels.values())

    def get(self, issue_id: str) -> RunningCarousel | None:
        """The running carousel of ``issue_id``."""
        with self._lock:
            return self._carousels.get(issue_id)

    def stop(self) -> None:
        """Ask the thread to end (join it afterwards)."""
        self._stopping.set()
        self._wake.set()

    def _forget_stopped(self) -> None:
        """Remove the per-(issue, channel) metric children of the carousels stopped
        since the last round (a carousel running again keeps its counters)."""
        with self._lock:
            stopped = {i for i in self._stopped if i not in self._carousels}
            self._stopped.clear()
        if not stopped:
            return
        for key in [k for k in self._children if k[0] in stopped]:
            del self._children[key]
            self._slipped.pop(key, None)
            labels = (key[0], str(key[1]))
            for metric in (
                self.metrics.packets,
                self.metrics.bytes,
                self.metrics.cycles,
                self.metrics.slipped,
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._round()
            except Exception:  # every carousel's packets depend on this thread
                log.exception("the send thread's round failed; it goes on")
                time.sleep(0.05)

    def _round(self) -> None:
        self._forget_stopped()
        carousels = self.running()
        if not carousels:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            return
        deadline = min(c.schedule.next_deadline() for c in carousels)
        now = time.perf_counter()
        if deadline > now:
            time.sleep(min(deadline - now, 0.05))
            now = time.perf_counter()
        for carousel in carousels:
            self._send_due(carousel, now)

    def _send_due(self, carousel: RunningCarousel, now: float) -> None:
        fd = self.sock.fileno()
        for batch in carousel.schedule.handle_timer(now=now):
            host, port = carousel.addresses[batch.channel]
            # the binding loops over sendto with the GIL released, numbering each
            # channel's packets (an LCT extension) so receivers see the path's loss
            first = carousel.schedule.sent(batch.channel) - len(batch.packets)
            sent, sent_bytes, failures, error = carousel.packets.send(
                fd, batch.packets, host, port, first % SEQUENCE_MODULO
            )
            if failures:
                self.metrics.send_errors.inc(failures)
                log.warning(
                    "sending %s channel %d: %d packets failed (%s)",
                    carousel.plan.issue_id,
                    batch.channel,
                    failures,
                    error,
                )
            self._count(carousel, batch.channel, sent, sent_bytes)

    def _count(self, carousel: RunningCarousel, channel: int, sent: int, sent_bytes: int) -> None:
        issue = carousel.plan.issue_id
        key = (issue, channel)
        children = self._children.get(key)
        if children is None:
            label = str(channel)
            children = self._children[key] = (
                self.metrics.packets.labels(issue, label),
                self.metrics.bytes.labels(issue, label),
                self.metrics.cycles.labels(issue, label),
                self.metrics.slipped.labels(issue, label),
            )
        packets, nbytes, cycles, slipped_counter = children
        packets.inc(sent)
        nbytes.inc(sent_bytes)
        cycles.set(carousel.schedule.cycles_done(channel))
        slipped = carousel.schedule.slipped(channel)
        if slipped > self._slipped.get(key, 0):
            slipped_counter.inc(slipped - self._slipped.get(key, 0))
            self._slipped[key] = slipped


def _sha256_of_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plan_to_json(plan: CarouselPlan) -> dict[str, Any]:
    """A carousel plan as the control API shows it (the announcement's form)."""
    from pressrun.multicast.codec import announcement_to_dict

    doc = announcement_to_dict(Announcement("0" * 64, 1, 1.0, 2.0, (plan,)))
    carousel: dict[str, Any] = doc["carousels"][0]
    return carousel


class MulticastSender:
    """The sender service: carousels, control channel, HTTP API, metrics."""

    def __init__(
        self, config: SenderServiceConfig, *, clock: Callable[[], float] = wall_clock
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = SenderMetrics()
        self.sock = sender_socket(config.interface, ttl=config.multicast_ttl)
        self.thread = SendThread(self.sock, self.metrics)
        self.publisher_key = bytes(config.signing_key.verify_key).hex()
        self.planner = ChannelPlanner(
            group_base=config.group_base,
            group_count=config.groups(),
            channel_port_base=config.channel_port_base,
            state_file=config.state_file,
        )
        self._starting: dict[str, asyncio.Task[CarouselPlan]] = {}
        self.preparer = IssuePreparer(
            config.content_dir,
            prepared=self.metrics.prepared,
            encodes=self.metrics.encodes,
            encode_seconds=self.metrics.encode_seconds,
            fdt_duration_s=config.fdt_duration_s,
        )
        self._announcer: asyncio.Task[None] | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- carousels -------------------------------------------------------------------

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

    async def _upkeep_loop(self) -> None:
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

    # -- control channel ----------------------------------------------------------------

    def announcement(self, seq: int) -> Announcement:
        """The announcement of every running carousel, numbered ``seq`` (one round,
        before `split_announcement` cuts it into datagrams)."""
        now = self.clock()
        return Announcement(
            publisher_key=self.publisher_key,
            seq=seq,
            issued_at=now,
            expires_at=now + self.config.announcement_ttl_s,
            carousels=tuple(
                replace(
                    c.plan,
                    sent_packets=tuple(c.schedule.sent(i) for i in range(len(c.plan.channels))),
                )
                for c in sorted(self.thread.running(), key=lambda c: c.plan.issue_id)
            ),
        )

    def announcement_datagrams(self, seq: int) -> list[bytes]:
        """One round of announcements: the signed datagrams, numbered from ``seq``."""
        parts = split_announcement(self.announcement(seq), ANNOUNCEMENT_PART_BYTES)
        return [sign_announcement(part, self.config.signing_key) for part in parts]

    async def _announce_loop(self) -> None:
        loop = asyncio.get_running_loop()
        clock = AnnouncementClock(self.config.announce_interval_s, loop.time())
        # sequence numbers start at the Unix time in ms: a restarted sender continues
        # above what receivers saw from it, so its announcements are not "replayed"
        clock.seq = int(self.clock() * 1000)
        while True:
            await asyncio.sleep(max(0.0, clock.next_deadline() - loop.time()))
            seq = clock.handle_timer(now=loop.time())
            if seq is None:
                continue
            try:
                datagrams = self.announcement_datagrams(seq)
            except Exception:  # every carousel's announcements depend on this loop
                log.exception("announcement %d could not be made; the next one is due", seq)
                continue
            # a round of n parts takes n sequence numbers
            clock.seq = seq + len(datagrams) - 1
            for datagram in datagrams:
                try:
                    self.sock.sendto(datagram, self.config.control_group)
                    self.metrics.announcements.inc()
                except OSError as err:
                    self.metrics.send_errors.inc()
                    log.warning("announcement %d not sent: %s", seq, err)

    # -- HTTP ---------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application with every route."""
        # the shared operator-token guard (pressrun.security), with this API's token
        app = web.Application(middlewares=[operator_middleware(self.config.token, API_ROUTES)])
        app.router.add_get("/v1/carousels", self.list_carousels)
        app.router.add_post("/v1/carousels", self.post_carousel)
        app.router.add_get("/v1/carousels/{issue_id}", self.get_carousel)
        app.router.add_delete("/v1/carousels/{issue_id}", self.delete_carousel)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/healthz", self.healthz)
        return app

    def _status(self, carousel: RunningCarousel) -> dict[str, Any]:
        doc = plan_to_json(carousel.plan)
        schedule = carousel.schedule
        doc["sent"] = [
            {
                "packets": schedule.sent(c),
                "cycles": round(schedule.cycles_done(c), 3),
                "slipped": schedule.slipped(c),
            }
            for c in range(len(carousel.plan.channels))
        ]
        doc["running_s"] = round(time.perf_counter() - carousel.started_at, 3)
        return doc

    async def list_carousels(self, request: web.Request) -> web.Response:
        """``GET /v1/carousels``: every running carousel with its counters."""
        return web.json_response(
            {
                "control_group": "{}:{}".format(*self.config.control_group),
                "publisher_key": self.publisher_key,
                "carousels": [self._status(c) for c in self.thread.running()],
            }
        )

    async def get_carousel(self, request: web.Request) -> web.Response:
        """``GET /v1/carousels/<issue_id>``."""
        carousel = self.thread.get(request.match_info["issue_id"])
        if carousel is None:
            return web.json_response({"error": "no carousel for that issue"}, status=404)
        return web.json_response(self._status(carousel))

    async def post_carousel(self, request: web.Request) -> web.Response:
        """``POST /v1/carousels`` ``{"issue_id", "channels"?, "rate_mbps"?, "fec"?}``."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("issue_id"), str):
            return web.json_response({"error": 'give {"issue_id": ...}'}, status=400)
        overrides: dict[str, Any] = {}
        try:
            if "channels" in body:
                overrides["channels"] = int(body["channels"])
            if "rate_mbps" in body:
                overrides["rate_bps"] = float(body["rate_mbps"]) * 1e6
            if "fec" in body:
                overrides["fec"] = str(body["fec"])
            carousel = replace(self.config.carousel, **overrides)
            tsi = body.get("tsi")
            if tsi is not None and (
                isinstance(tsi, bool) or not isinstance(tsi, int) or not 1 <= tsi <= MAX_TSI
            ):
                raise ValueError(f"tsi must be an integer 1 .. {MAX_TSI}")
        except (TypeError, ValueError) as err:
            return web.json_response({"error": str(err)}, status=400)
        issue_id = body["issue_id"]
        was_running = self.thread.get(issue_id) is not None
        try:
            plan = await self.start_carousel(issue_id, carousel, tsi=tsi)
        except CarouselError as err:
            return web.json_response({"error": str(err)}, status=err.status)
        except Exception as err:  # the caller gets the reason, not a bare 500
            log.exception("the carousel of %s did not start", issue_id)
            return web.json_response(
                {"error": f"the carousel of {issue_id} did not start: {err!r}"}, status=500
            )
        return web.json_response(plan_to_json(plan), status=200 if was_running else 201)

    async def delete_carousel(self, request: web.Request) -> web.Response:
        """``DELETE /v1/carousels/<issue_id>``."""
        issue_id = request.match_info["issue_id"]
        if not self.stop_carousel(issue_id):
            return web.json_response({"error": "no carousel for that issue"}, status=404)
        return web.json_response({"stopped": issue_id})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text."""
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``."""
        return web.json_response(
            {
                "ok": True,
                "carousels": len(self.thread.running()),
                "prepared": sorted(self.preparer.prepared),
                "failed": {issue: f[2] for issue, f in sorted(self.preparer.failed.items())},
            }
        )

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> str:
        """Start the send thread, the announcements and the HTTP API; the API's URL."""
        self.thread.start()
        self._announcer = asyncio.get_running_loop().create_task(self._announce_loop())
        self._upkeep = asyncio.get_running_loop().create_task(self._upkeep_loop())
        self._runner = web.AppRunner(self.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.config.host,
            self.config.port,
            ssl_context=self.config.tls.server_ssl_context(),
        )
        await site.start()
        port: int = self._runner.addresses[0][1]
        self.url = f"{self.config.tls.scheme}://{self.config.host}:{port}"
        return self.url

    async def close(self) -> None:
        """Stop the API, the announcements and every carousel."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        loops = [t for t in (self._announcer, self._upkeep) if t is not None]
        for loop_task in loops:
            loop_task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self.preparer.cancel()
        for task in list(self._starting.values()):
            task.cancel()
        self.thread.stop()
        if self.thread.is_alive():
            await asyncio.to_thread(self.thread.join, 5.0)
        self.sock.close()
