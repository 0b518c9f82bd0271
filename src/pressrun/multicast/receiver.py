"""Receiving an issue from a carousel: the control channel, channel joining, decoding.

`receive_carousel` is blocking and meant for a thread of its own (the client runs it
with ``asyncio.to_thread``): FIELD-NOTES measured a blocking receive loop keeping up
with 150 k packets/s where an asyncio datagram protocol lost 2%. It

1. joins the control group and waits for an announcement that
   `pressrun.multicast.control.check_datagram` and the `AnnouncementGate` accept
   (signed by a trusted publisher, not expired, not replayed) and that names the
   issue with the manifest the client verified; every announcement ignored is logged
   with the reason;
2. joins channels as `LayerCore` decides (receiver-driven layering on the path's
   loss: each window, the channels' sequence counts and socket drops go to the core)
   and lets the binding's receive loop (``Receiver.receive``: recvmmsg, without the
   GIL) feed every packet of every joined channel into one FLUTE session of the crate
   ``flute`` (symbols from several channels meet in one RaptorQ decoder); Python is
   woken at the object's end, an announcement, or the window's end, not per packet;
3. returns when the binding reports the object completed (an event, not a log line),
   at the deadline, or when the sender's announcements stop naming the carousel.

The decoded file is not trusted here: the caller checks it piece by piece against the
signed manifest and keeps what verifies (`pressrun.multicast.kept_pieces`).

``drop_probability`` drops that share of the packets in the receive path, at random
(loss emulation for tests and benchmarks where nftables in a namespace is not
available; docs/multicast.md says which ran).

With ``gateway`` (an `AmtGateway`, RFC 7450) nothing is joined natively: the control
channel and the carousel's channels are joined through the relay by (source, group),
the binding reads the gateway's socket (``tunnel_fd``) and unwraps the channels' data,
and the control channel's datagrams and the relay's queries come back to Python.
"""

from __future__ import annotations

import logging
import random
import selectors
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pressrun.multicast.channels import ChannelSockets
from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.core import AnnouncementGate, CarouselPresence
from pressrun.multicast.events import CarouselPlan, LeaveChannel
from pressrun.multicast.layering import LayerCore
from pressrun.multicast.net import RECEIVE_BUFFER_BYTES, leave_and_close, receiver_socket
from pressrun.multicast.receiver_control import drain, plan_difference, plan_from_control
from pressrun.multicast.receiver_control import wall_clock as wall_clock  # (re-exported)

if TYPE_CHECKING:
    from pressrun_flute import Receiver as FluteReceiver

    from pressrun.multicast.gateway import AmtGateway

log = logging.getLogger("pressrun.multicast.receiver")

#: the largest datagram read (an announcement; data packets are about 1.4 kB)
MAX_DATAGRAM = 65536
#: memory the binding may hold for undecoded blocks of the object, at least; a larger
#: issue gets more (`cache_bytes_for`)
MAX_CACHE_BYTES = 512 * 1024 * 1024
#: what the crate caches per symbol besides its bytes (the packet's headers), at most
CACHED_HEADER_BYTES = 64
#: after a round that read data packets, wait this long before the next one, so each
#: wake-up reads the packets of that time from the socket buffers in one go instead of
#: one packet per wake-up (a carousel of 20 Mbit/s is 1,750 packets/s: 35 per round)
BATCH_WAIT_S = 0.02
#: a channel change whose join or leave took longer than this to return is logged
JOIN_SLOW_S = 0.2


def cache_bytes_for(plan: CarouselPlan) -> int:
    """The binding's cache for a carousel's object: every source block of it is in
    progress at once (each channel's cycle spreads its symbols over all blocks), so
    the crate may hold about the whole object's symbols, with their headers, before
    the blocks decode: a quarter more than that, and never under `MAX_CACHE_BYTES`
    (an issue past 367 MB failed with "Pkt cache is full" at a fixed 512 MiB)."""
    symbols = -(-plan.size_bytes // max(1, plan.symbol_bytes))
    needed = symbols * (plan.symbol_bytes + CACHED_HEADER_BYTES) * 5 // 4
    return max(MAX_CACHE_BYTES, needed)


@dataclass
class ReceiveResult:
    """What a receiver got from a carousel."""

    completed: bool
    path: Path | None  # the decoded object (not yet checked against the manifest)
    reason: str  # why it ended
    plan: CarouselPlan | None = None
    packets_received: int = 0  # packets on the joined channels (after emulated loss)
    object_packets: int = 0  # packets of the object pushed until it completed
    #: source symbols taken from the bytes the receiver held already (``known``),
    #: not from the network
    known_symbols: int = 0
    dropped: int = 0  # packets dropped by the receive-path loss emulation
    seconds: float = 0.0  # from the first join to the end
    #: from the arrival of the first data packet to that of the packet that completed
    #: the file, by the kernel's receive stamps (independent of when a busy receiver
    #: read them); None without stamps or without completion
    arrival_seconds: float | None = None
    most_channels: int = 0
    #: channels joined when it ended
    final_channels: int = 0
    #: (seconds since the first join, channels joined) at the start and each change
    channel_log: list[tuple[float, int]] = field(default_factory=list)
    #: the layering's measuring windows ended by each entry of channel_log (the core's
    #: windows_ended then), and by the end: a channel held across more than one
    #: window end was judged and kept, one left at its first window's end was not
    channel_log_windows: list[int] = field(default_factory=list)
    windows_ended: int = 0
    #: path loss per measuring window (sequence gaps less the own socket's drops)
    losses: list[float] = field(default_factory=list)
    #: packets the own sockets dropped for a full queue (SO_RXQ_OVFL)
    socket_drops: int = 0
    #: windows in which a join was held back because the own socket overflowed
    overflow_windows: int = 0
    #: the start's first packet's arrival (at the earliest when the start's joins
    #: returned), in seconds after the first join began: the layering's first window
    #: or settling starts there (`LayerCore.start`); None if none came
    first_packet_s: float | None = None
    #: how late the layering's timer calls came after their deadline, at most (the
    #: receive loop's wake-up: a probe is held settle_s + window_s plus the lateness of
    #: its two timer calls; the emulation's report allows exactly that)
    timer_late_max_s: float = 0.0
    #: how long the joins and leaves took to return after the decision, at most (the
    #: settling is timed from their return)
    change_apply_max_s: float = 0.0
    #: how far behind its channels the receive loop read at a window's end, at most
    #: (the window is judged on what arrived in it: `LayerCore.handle_timer`)
    read_behind_max_s: float = 0.0
    #: joins left because their window was still unread a window after it was due
    late_probes: int = 0
    #: windows in which a join was held back because the loop read over a window behind
    behind_windows: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    #: the AMT relay it came through (``HOST:PORT``), None when native
    relay: str | None = None
    #: how long leaving the channels and the control group took after the end (the
    #: leaves are system calls that wait for the kernel's network lock)
    close_s: float = 0.0
    #: what became of a plan given by the balancer's directive (``provisional``):
    #: "confirmed" (a signed announcement named the same carousel), "unconfirmed"
    #: (none did before the end), or why it was refused; None without one
    directive_plan: str | None = None

    @property
    def efficiency(self) -> float | None:
        """Source symbols / object packets received until complete (1.0 is ideal); the
        source symbols the receiver held already (``known_symbols``) are not counted."""
        if not self.completed or self.plan is None or not self.object_packets:
            return None
        return max(0, self.plan.source_symbols - self.known_symbols) / self.object_packets


def receive_carousel(
    issue_id: str,
    manifest_sha256: str,
    *,
    control_group: tuple[str, int],
    interface: str,
    trusted_keys: Collection[str],
    work_dir: Path,
    deadline_s: float,
    layering: LayeringConfig | None = None,
    drop_probability: float = 0.0,
    seed: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    receive_buffer_bytes: int = RECEIVE_BUFFER_BYTES,
    control_source: str | None = None,
    gateway: AmtGateway | None = None,
    announcement_wait_s: float | None = None,
    known: tuple[Path, Sequence[tuple[int, int]]] | None = None,
    link_bps: float | None = None,
    announced: CarouselPlan | None = None,
    provisional: CarouselPlan | None = None,
) -> ReceiveResult:
    """Receive ``issue_id`` from its carousel into ``work_dir`` (blocking; see the
    module docstring). ``trusted_keys``: hex Ed25519 keys whose announcements count.
    ``on_progress(object_packets, source_symbols)`` is called now and then.
    ``receive_buffer_bytes``: each channel socket's receive buffer (tests make it tiny
    to starve a receiver). ``control_source``: the sender's address, for a
    source-specific (232/8) control group. ``gateway``: receive through an AMT relay
    (the module docstring; the caller closes it). ``announcement_wait_s``: end when
    no announcement of the issue was accepted that long after the start (the client
    then tries a relay). ``known``: a file and the (start, length) byte ranges of it
    the receiver holds already and checked, at the object's offsets (pieces from the
    swarm): the decoder takes their source symbols as if they had arrived, so each
    block needs only the rest from the network. Without it the carousel brings the
    whole object whatever the receiver holds (flash-crowd-50 at 297117b: readers that
    left the swarm with 23-48% of the file took as long on the carousel as readers
    with nothing). ``link_bps``: the rate (payload bits/s) the receiver's link has been
    seen to carry (a swarm's best rate over a window): the layering starts on the
    channels whose rates together are at most that (`LayerCore.channels_within`),
    not on one. ``announced``: the issue's plan from an announcement the caller
    accepted with the same checks and that is still good (a swarm client's watch of
    the control channel, `pressrun.clients.carousel_watch`): its channels are joined
    at once, not at the next announcement (up to ``announce_interval_s`` later).
    ``provisional``: the issue's plan from the balancer's directive (not signed; not
    with ``announced``): its channels are joined at once too, and the first accepted
    announcement naming the issue confirms it (the same carousel) or refuses it: its
    channels are left, what came on them is dropped and the announced plan is joined
    (`ReceiveResult.directive_plan` says which). Until then it counts as no
    announcement for ``announcement_wait_s`` while nothing arrived on its channels."""
    import pressrun_flute  # the native binding: only when a carousel is used

    if not 0 <= drop_probability < 1:
        raise ValueError("drop_probability must be in [0, 1)")
    if link_bps is not None and not link_bps >= 0:
        raise ValueError("link_bps must be a rate, not negative")
    if announced is not None and (
        announced.issue_id != issue_id or announced.manifest_sha256 != manifest_sha256
    ):
        raise ValueError("the announced plan is not this issue's with this manifest")
    if provisional is not None:
        if announced is not None:
            raise ValueError("a plan is either announced or the directive's, not both")
        if provisional.issue_id != issue_id or provisional.manifest_sha256 != manifest_sha256:
            raise ValueError("the directive's plan is not this issue's with this manifest")
        # joined at once as an announced plan is, until an announcement says otherwise
        announced = replace(provisional, sent_packets=())
        result_note: str | None = "unconfirmed"
    else:
        result_note = None
    seed_once: int | None = seed if seed is not None else random.getrandbits(63)
    started = time.perf_counter()
    deadline = started + deadline_s
    gate = AnnouncementGate(trusted_keys)
    presence = CarouselPresence(issue_id)
    result = ReceiveResult(False, None, "deadline", directive_plan=result_note)
    selector = selectors.DefaultSelector()
    control: socket.socket | None = None
    if gateway is None:
        control = receiver_socket(*control_group, interface, source=control_source)
        selector.register(control, selectors.EVENT_READ, None)
    else:
        if control_source is None:
            raise ValueError("through an AMT relay the control group needs its source (SSM)")
        selector.register(gateway.sock, selectors.EVENT_READ, None)
        gateway.listen(control_source, *control_group)
        gateway.start(now=started)
    buffer = bytearray(MAX_DATAGRAM)
    plan: CarouselPlan | None = None
    channels: ChannelSockets | None = None
    layers: LayerCore | None = None
    flute: FluteReceiver | None = None
    joined_at = started
    timer_at: float | None = None  # the layering deadline last called at
    change_at: float | None = None  # when the joins and leaves under way were decided
    # when the start's joins returned, while their first packet is still to come: the
    # start takes effect (`LayerCore.handle_applied`) at that packet's arrival
    starting: float | None = None
    try:
        while True:
            now = time.perf_counter()
            if now >= deadline:
                result.reason = f"no complete file within the {deadline_s:g} s deadline"
                break
            if should_stop is not None and should_stop():
                result.reason = "stopped"
                break
            waited = announcement_wait_s
            unheard = plan is None or (provisional is not None and not result.packets_received)
            if unheard and waited is not None and now >= started + waited:
                result.reason = f"no announcement within {waited:g} s"
                plan = None if provisional is not None else plan  # nothing came on it
                break
            control_ready = False
            datagrams: list[bytes] | None = None  # the control channel's, through a relay
            gateway_at = gateway.next_deadline() if gateway is not None else None
            if flute is None or layers is None or channels is None:
                # no plan yet: the control group alone
                wait = min(deadline, gateway_at if gateway_at is not None else deadline) - now
                if announcement_wait_s is not None:
                    wait = min(wait, started + announcement_wait_s - now)
                if announced is not None:
                    wait = 0.0  # the plan is known: its channels are joined now
                control_ready = bool(selector.select(max(0.0, min(wait, 0.2))))
                if control_ready and gateway is not None:
                    datagrams = gateway.read(now=time.perf_counter())
            else:
                # the binding reads the channels without the GIL until the object
                # ends, an announcement waits, or the window ends (at most 0.2 s, so
                # should_stop is asked often enough)
                wake = (None if starting is not None else layers.next_deadline()) or deadline
                if wake <= now or change_at is not None:
                    # the layering's deadline passed but what arrived by then is still
                    # in the sockets, or a join or leave is under way: read on for a
                    # batch's time, then look again
                    wake = now + BATCH_WAIT_S
                wake = min(deadline, wake)
                if gateway_at is not None:
                    wake = min(wake, gateway_at)
                try:
                    per_channel, pushed, emulated, control_ready, ended = flute.receive(
                        [(index, sock.fileno()) for index, sock in channels.sockets.items()],
                        max(0.0, min(wake - now, 0.2)),
                        wake_fds=[control.fileno()] if control is not None else [],
                        batch_wait_s=BATCH_WAIT_S,
                        drop_probability=drop_probability,
                        seed=seed_once,
                        tunnel_fd=gateway.fileno() if gateway is not None else None,
                    )
                except OSError as err:
                    if gateway is None:
                        raise
                    # the relay's port unreachable for now (an ICMP error on the
                    # gateway's connected socket, e.g. a relay restarting): the
                    # keep-alives find it again, the deadline bounds the wait
                    log.info("AMT tunnel: %s; going on", err)
                    time.sleep(0.05)
                    continue
                seed_once = None
                if gateway is not None:
                    at = time.perf_counter()
                    datagrams = [
                        d for m in flute.take_tunnel_messages() for d in gateway.handle(m, now=at)
                    ]
                    control_ready = bool(datagrams)
                result.object_packets += pushed
                result.dropped += emulated
                if starting is not None and any(c or d for _, c, d in per_channel):
                    _started(result, layers, flute, joined_at, starting)
                    starting = None
                for index, count, drops in per_channel:
                    result.packets_received += count
                    layers.handle_packets(index, count)
                    if drops:
                        layers.handle_sequence(index, received=0, expected=0, socket_drops=drops)
                if ended:
                    _ended(result, flute, issue_id)
                    return _finish(result, plan, layers, gate, joined_at, flute)
                if on_progress is not None and plan is not None:
                    on_progress(result.object_packets, plan.source_symbols)
            if gateway is not None:
                at = time.perf_counter()
                step = gateway.next_deadline()
                if step is not None and at >= step:
                    gateway.poll(now=at)
                if gateway.failed is not None:
                    result.reason = f"AMT: {gateway.failed}"
                    return _finish(result, plan, layers, gate, joined_at, flute)
            if control_ready or announced is not None:
                stop: CarouselPlan | str | None = announced
                if announced is not None:
                    announced = None
                else:
                    if datagrams is not None:
                        arrived = iter(datagrams)
                    else:
                        assert control is not None
                        arrived = drain(control, buffer)
                    stop = plan_from_control(arrived, gate, presence, manifest_sha256, plan)
                if isinstance(stop, str):
                    result.reason = stop
                    return _finish(result, plan, layers, gate, joined_at, flute)
                if stop is not None and provisional is not None and plan is not None:
                    differs = plan_difference(provisional, stop)
                    provisional = None  # judged: an announced plan from here on
                    if differs is None:
                        result.directive_plan = "confirmed"
                        log.info("a signed announcement confirmed the directive's plan")
                    else:
                        result.directive_plan = f"refused: {differs}"
                        log.warning(
                            "the directive's carousel plan is not the one the signed "
                            "announcement names (%s); refusing it and joining the announced "
                            "channels",
                            differs,
                        )
                        # what came on the refused channels is dropped with its decoder
                        assert channels is not None
                        channels.close()
                        channels, layers, flute, plan = None, None, None, None
                        starting = change_at = timer_at = None
                        result.plan, result.first_packet_s = None, None
                        result.object_packets = 0
                        result.channel_log.clear()
                        result.channel_log_windows.clear()
                        announced = stop  # joined at the next turn
                        continue
                if stop is not None and layers is not None and plan is not None:
                    if stop.channels == plan.channels and stop.sent_packets:
                        layers.handle_sent(stop.sent_packets, now=time.perf_counter())
                elif stop is not None and plan is None:
                    if gateway is not None and stop.source is None:
                        result.reason = (
                            "the carousel's channels are any-source; an AMT relay carries "
                            "source-specific (232/8) channels only"
                        )
                        return _finish(result, plan, layers, gate, joined_at, flute)
                    plan = stop
                    result.plan = plan
                    flute = pressrun_flute.Receiver(work_dir, max_cache_bytes=cache_bytes_for(plan))
                    if known is not None and known[1]:
                        flute.set_known(plan.toi, known[0], [(a, n) for a, n in known[1]])
                    channels = ChannelSockets(
                        plan,
                        interface,
                        receive_buffer_bytes,
                        None if gateway is None else (gateway, flute),
                    )
                    layers = LayerCore(
                        layering or LayeringConfig(),
                        tuple(ch.packets_per_s for ch in plan.channels),
                    )
                    joined_at = time.perf_counter()
                    if plan.sent_packets:
                        layers.handle_sent(plan.sent_packets, now=joined_at)
                    first = plan.channels[0]
                    start = None
                    if link_bps and first.rate_bps > 0:
                        rate = link_bps * first.packets_per_s / first.rate_bps
                        start = layers.channels_within(rate)
                    for effect in layers.start(now=joined_at, channels=start):
                        channels.join(effect.index)
                    # the start takes effect at its first packet's arrival (a join
                    # can block for seconds, and the network may forward the group
                    # later still): `_started`, then the settling and windows
                    starting = time.perf_counter()
                    result.channel_log.append((0.0, channels.count))
                    result.channel_log_windows.append(layers.windows_ended)
            started_up = starting is None
            if layers is not None and channels is not None and flute is not None and started_up:
                now = time.perf_counter()
                if change_at is None:
                    step = layers.next_deadline()
                    if step is not None and now >= step:
                        if step != timer_at:  # its first call (it is called again while
                            # what arrived by then is still unread)
                            timer_at = step
                            result.timer_late_max_s = max(result.timer_late_max_s, now - step)
                        _feed_sequences(flute, layers)
                        effects = layers.handle_timer(now=now, read_up_to=channels.read_up_to())
                        for effect in effects:
                            if isinstance(effect, LeaveChannel):
                                # an undo's line gives the window's loss too (without
                                # it, a slow sender's undo was read as path loss)
                                why = "" if effect.why == "path loss" else f"{effect.why}, "
                                log.info(
                                    "%spath loss %.0f%%: leaving channel %d",
                                    why,
                                    100 * effect.loss,
                                    effect.index,
                                )
                                flute.forget_channel(effect.index)
                        if effects:
                            # the joins and leaves run beside the reading (`ChannelSockets`)
                            channels.change(effects)
                            change_at = now
                if change_at is not None and not channels.changing:
                    # the change took effect when the join or leave returned, which may
                    # be seconds after the decision (the kernel's lock): the settling
                    # starts then, and the log says when the link got it
                    applied = channels.applied_at or time.perf_counter()
                    channels.applied_at = None
                    _feed_sequences(flute, layers)  # read before: not the next window's
                    if applied - change_at > JOIN_SLOW_S:
                        log.info("a channel change took %.2f s to apply", applied - change_at)
                    layers.handle_applied(now=applied, read_up_to=channels.read_up_to())
                    result.change_apply_max_s = max(result.change_apply_max_s, applied - change_at)
                    result.channel_log.append((applied - joined_at, channels.count))
                    result.channel_log_windows.append(layers.windows_ended)
                    change_at = None
        return _finish(result, plan, layers, gate, joined_at, flute)
    finally:
        # the binding's Receiver is unsendable: drop it here, in its own thread, even
        # when an exception's traceback (which keeps this frame) goes to another one
        flute = None
        closing = time.perf_counter()
        if channels is not None:
            channels.close()
        if control is not None:
            selector.unregister(control)
            leave_and_close(control, control_group[0], interface, control_source)
        elif gateway is not None:
            selector.unregister(gateway.sock)
        selector.close()
        result.close_s = time.perf_counter() - closing


def _started(
    result: ReceiveResult,
    layers: LayerCore,
    flute: FluteReceiver,
    joined_at: float,
    returned: float,
) -> None:
    """The start's first packet was read: the start took effect at its arrival (the
    kernel's stamp; through an AMT relay, whose socket is not stamped, now), or when
    the start's joins ``returned`` if that is later (several channels: the first
    packet may come while the last join blocks), and the layering's first settling or
    window begins there (`LayerCore.start`). Call it before the packets of that read
    are counted."""
    now = time.perf_counter()
    at = now
    if flute.first_arrival is not None:
        at = now - max(0.0, wall_clock() - flute.first_arrival)
    at = min(now, max(at, returned))
    layers.handle_applied(now=at)
    result.first_packet_s = at - joined_at
    log.info("the first packet came %.0f ms after the first join", 1000 * result.first_packet_s)


def _ended(result: ReceiveResult, flute: FluteReceiver, issue_id: str) -> None:
    """The object ended: its events into the result."""
    first, last = flute.first_arrival, flute.end_arrival
    if first is not None and last is not None:
        result.arrival_seconds = last - first
    for event in flute.take_events():
        if event.kind == "completed" and event.path is not None:
            result.completed = True
            result.path = Path(event.path)
            result.reason = "completed"
        else:
            log.warning("carousel %s: the object ended in %s", issue_id, event.kind)
            result.reason = f"the FLUTE object ended in {event.kind}"


def _finish(
    result: ReceiveResult,
    plan: CarouselPlan | None,
    layers: LayerCore | None,
    gate: AnnouncementGate,
    joined_at: float,
    flute: FluteReceiver | None = None,
) -> ReceiveResult:
    result.plan = plan
    result.seconds = time.perf_counter() - joined_at
    if flute is not None:
        result.known_symbols = flute.known_symbols
    if layers is not None:
        result.most_channels = layers.most_joined
        result.final_channels = len(layers.joined)
        result.losses = list(layers.losses)
        result.socket_drops = layers.socket_drops
        result.overflow_windows = layers.overflow_windows
        result.windows_ended = layers.windows_ended
        result.read_behind_max_s = layers.behind_max_s
        result.late_probes = layers.late_probes
        result.behind_windows = layers.behind_windows
    result.verdicts = {v.value: n for v, n in gate.counts.items()}
    return result


def _feed_sequences(flute: FluteReceiver, layers: LayerCore) -> None:
    """Hand the layering each channel's sequence counts of the window (the socket
    drops were handed over as the binding read them)."""
    for index, received, expected in flute.take_sequence_counts():
        layers.handle_sequence(index, received=received, expected=expected)
