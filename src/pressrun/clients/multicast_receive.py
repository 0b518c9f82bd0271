"""Multicast receive: the issue from its FLUTE carousel (docs/multicast.md).

The receive loop runs in a thread of its own; the pieces it delivers are checked
against the manifest and copied into the partial file, the rest is left to the swarm
or to origin sections.

Readers without a multicast route take the carousel through an AMT relay (RFC 7450,
``ClientConfig.amt``): with ``auto`` the native join gets ``amt_native_wait_s`` to hear
an announcement, then the relays the reader knows are tried (its own ``amt_relays``,
the directive's ``relays``, those RFC 8777 DNS names for the carousel's source with
``amt_dns``); ``always`` goes to the relay at once.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pressrun.clients.carousel_share import CarouselShare
from pressrun.clients.codec import DirectiveMulticast
from pressrun.clients.config import ClientConfig
from pressrun.clients.session import FetchState, describe
from pressrun.content.manifest import Manifest
from pressrun.multicast.events import CarouselPlan

if TYPE_CHECKING:
    from pressrun.multicast.receiver import ReceiveResult

log = logging.getLogger("pressrun.clients.multicast")

__all__ = ["receive_carousel_pieces", "receive_multicast"]


async def receive_multicast(
    f: FetchState,
    m: Manifest,
    manifest_json: bytes,
    path: Path,
    multicast: DirectiveMulticast,
    kept: list[int],
) -> list[int]:
    """Receive the issue from its carousel (docs/multicast.md); the pieces verified
    after it: all of them when the carousel delivered a good file, else the ones
    that checked out, the rest left to the swarm or origin sections."""
    digest = hashlib.sha256(manifest_json).hexdigest()
    good = await receive_carousel_pieces(f, m, digest, path, multicast, kept)
    before = set(kept)
    f.multicast_bytes = sum(m.piece_span(i)[1] for i in good if i not in before)
    return sorted(before | set(good))


async def receive_carousel_pieces(
    f: FetchState,
    m: Manifest,
    manifest_sha256: str,
    path: Path,
    multicast: DirectiveMulticast,
    kept: Sequence[int],
    *,
    announced: CarouselPlan | None = None,
    on_running: Callable[[], None] | None = None,
) -> list[int]:
    """`receive_multicast`'s receive: the pieces the carousel's copy verified (the
    caller counts them against what it held). ``kept``: pieces verified already,
    which the decoder takes as arrived; ``announced``: the issue's plan from an
    announcement the caller accepted (`carousel_watch`), joined at once;
    ``on_running``: called (in the loop) when the receive's first packets came."""
    from pressrun.multicast.net import parse_group

    try:
        group = parse_group(multicast.control_group)
    except ValueError as err:
        f.notice(f"multicast: bad control group in the directive ({err}); skipping it")
        return []
    interface = f.config.multicast_interface or multicast.interface or "0.0.0.0"
    provisional = (
        None if announced is not None else _directive_plan(f, m, manifest_sha256, multicast)
    )
    # when the receive starts after the first directive request (the directive, the
    # manifest and the partial file come before it), for the note: a reader's timeline
    asked = f.first_asked_at
    started_s = None if asked is None else f.now() - asked
    work = path.parent / "multicast"
    work.mkdir(exist_ok=True)
    # a reader that shares while it receives (opt-in, `ClientConfig.carousel_share`)
    # and may seed joins the swarm now and offers what it holds and decodes
    # (`carousel_share`); the seeding after the carousel takes it over
    swarm = f.last_directive.swarm if f.last_directive is not None else None
    share = CarouselShare.start(f, m, path, swarm, work, list(kept))
    options = _Options(group, interface, work, announced, on_running, provisional, started_s)
    try:
        good = await _receive(f, m, manifest_sha256, path, multicast, kept, options, share)
    finally:
        if share is not None and f.carousel_share is not share:
            await share.close()
    return good


@dataclass(frozen=True, slots=True)
class _Options:
    """Where and how `_receive` receives."""

    group: tuple[str, int]
    interface: str
    work: Path
    announced: CarouselPlan | None
    on_running: Callable[[], None] | None
    #: the directive's plan (not signed: `receive_carousel`'s ``provisional``)
    provisional: CarouselPlan | None = None
    #: seconds from the first directive request to the receive's start (None: unknown)
    started_s: float | None = None


async def _receive(
    f: FetchState,
    m: Manifest,
    manifest_sha256: str,
    path: Path,
    multicast: DirectiveMulticast,
    kept: Sequence[int],
    how: _Options,
    share: CarouselShare | None,
) -> list[int]:
    """`receive_carousel_pieces`' receive, check and note; ``share`` (when sharing) is
    stopped before the decoder's folder goes and handed to the seeding
    (``f.carousel_share``) when the copy is complete."""
    from pressrun.multicast.kept_pieces import copy_verified_pieces

    # a thread of its own, not the loop's small default pool: many clients of one
    # process (the demo) each receive at once
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pressrun-multicast")
    stop = threading.Event()  # set when this task ends, cancelled or not
    work = how.work
    options: dict[str, Any] = {
        "control_group": how.group,
        "control_source": multicast.source,
        "interface": how.interface,
        "trusted_keys": {m.publisher_key},
        "work_dir": work,
        "drop_probability": f.config.multicast_receive_drop,
        "on_progress": _multicast_progress(f, m, how.on_running),
        "should_stop": stop.is_set,
        # the pieces held already (from the swarm, checked): the carousel brings the rest
        "known": (path, [m.piece_span(i) for i in kept]) if kept else None,
        # what the link has been seen to carry (the swarm's best rate over a window):
        # the layering starts on that many channels' worth, not on one
        "link_bps": _link_shown_bps(f),
        "announced": how.announced,
        "provisional": how.provisional,
    }
    try:
        result = await f.loop.run_in_executor(
            executor,
            functools.partial(
                receive_native_or_tunnelled,
                m.issue_id,
                manifest_sha256,
                f.config,
                multicast,
                options,
            ),
        )
        good: list[int] = []
        checking = f.now()
        if result.path is not None:
            kept_pieces = await asyncio.to_thread(copy_verified_pieces, m, result.path, path)
            good = kept_pieces.good
            if kept_pieces.moved:
                # the file is the decoded object, every piece and the size matching the
                # signed manifest, which fixes every byte of it: the final check need not
                # read it again (`aio._run`; no whole-file hash: docs/multicast.md)
                f.checked_sha256 = m.sha256
        check_s = f.now() - checking
    except (OSError, ImportError) as err:
        f.notice(f"multicast failed ({describe(err)}); trying the fallbacks")
        return []
    finally:
        stop.set()
        executor.shutdown(wait=False)
        if share is not None:  # it reads the decoder's folder: stopped before it goes
            await share.stop_watching()
        shutil.rmtree(work, ignore_errors=True)
    before = set(kept)
    have = before | set(good)
    if len(have) == m.num_pieces:
        # the channels it held against its link: at most, and at the end (receiver-
        # driven layering), and the packets its own socket dropped (not path loss)
        f.multicast_note = (
            f"{result.most_channels} channel(s), {result.seconds:.1f} s, "
            f"{result.final_channels} at the end, {result.socket_drops} own socket drops"
            + (f", through the AMT relay {result.relay}" if result.relay else "")
            + (f", efficiency {result.efficiency:.3f}" if result.efficiency else "")
            + (
                f", first packet {1000 * result.first_packet_s:.0f} ms after the first join"
                if result.first_packet_s is not None
                else ""
            )
            + f", layering timer late at most {1000 * result.timer_late_max_s:.0f} ms"
            + f", channel changes applied within {1000 * result.change_apply_max_s:.0f} ms"
            # how far behind its channels it read when a window ended, and the probes
            # left because their window was still unread a window after it was due
            + f", read behind at most {1000 * result.read_behind_max_s:.0f} ms"
            + f", {result.late_probes} probes left unread"
            + f", {result.windows_ended} windows ended"
            + f", channels left in {1000 * result.close_s:.0f} ms"
            + f", pieces checked in {check_s:.2f} s"
            # the directive's plan: joined at once, then confirmed or refused by the
            # first signed announcement (`receive_carousel`'s ``provisional``)
            + (f", the directive's plan {result.directive_plan}" if result.directive_plan else "")
            + (
                f", started {how.started_s:.2f} s after the first directive request"
                if how.started_s is not None
                else ""
            )
            # each change as seconds:channels:windows ended by then (the emulation's
            # report times the channels held above the link, to the hundredth, and
            # counts the layering's windows that ended while they were held)
            + "; channels over time "
            + " ".join(
                f"{t:.2f}:{n}:{w}"
                for (t, n), w in zip(result.channel_log, result.channel_log_windows, strict=True)
            )
            + ("" if share is None else f"; {share.describe()}")
        )
        if share is not None and share.sharing and set(good) - before:
            f.carousel_share = share  # `swarm_handoff.seed_after_carousel` seeds with it
        return good
    why = (
        result.reason
        if result.path is None
        else (f"{m.num_pieces - len(good)} of {m.num_pieces} pieces failed the manifest check")
    )
    f.multicast_note = f"fell back: {why}"
    f.notice(
        f"multicast: {why}; keeping {len(good)} verified pieces, the rest from "
        + ("the swarm" if f.last_directive and f.last_directive.swarm else "origins"),
        level=logging.INFO,
    )
    return good


def _directive_plan(
    f: FetchState, m: Manifest, manifest_sha256: str, multicast: DirectiveMulticast
) -> CarouselPlan | None:
    """The carousel plan the directive carries, when it is this issue's carousel of the
    manifest the client verified and of its size; else None, with a notice saying
    why it was refused (the receive then waits for the signed announcement, as
    without a plan). What it names is not trusted beyond that: the first signed
    announcement confirms or replaces it, and the copy is checked piece by piece."""
    plan = multicast.plan
    why = multicast.plan_error
    if plan is not None:
        if plan.issue_id != m.issue_id:
            why = f"the directive's carousel plan is of {plan.issue_id!r}, not {m.issue_id!r}"
        elif plan.manifest_sha256 != manifest_sha256:
            why = (
                f"the directive's carousel plan names another manifest of {m.issue_id} "
                f"({plan.manifest_sha256[:16]}..., the signed one is {manifest_sha256[:16]}...)"
            )
        elif plan.size_bytes != m.size_bytes:
            why = (
                f"the directive's carousel plan says {plan.size_bytes} bytes, the signed "
                f"manifest {m.size_bytes}"
            )
        else:
            return replace(plan, sent_packets=())
    if why is not None:
        f.notice(f"multicast: {why}; refused, waiting for the carousel's signed announcement")
    return None


def _link_shown_bps(f: FetchState) -> float | None:
    """The best rate (payload bits/s) this client's link brought it in this fetch's
    swarm, over a window of its reports (`SwarmRates.best_link_bytes_per_s`: peers
    and web seeds together); None without a swarm or before it brought anything. A
    reader that leaves the swarm for the carousel so starts on the channels its link
    has carried (`receive_carousel`'s ``link_bps``): in flash-crowd-50-desktops the
    median reader is a dsl-20 one that began in the swarm, and one channel a step it
    took 1.6 s or more to hold the 4 its link carries."""
    rates = f.swarm_rates
    if rates is None or rates.best_link_bytes_per_s <= 0:
        return None
    return 8 * rates.best_link_bytes_per_s


def _multicast_progress(
    f: FetchState, m: Manifest, on_running: Callable[[], None] | None = None
) -> Callable[[int, int], None] | None:
    """The receive's ``on_progress``: whole percents to the progress bar, and
    ``on_running`` called in the loop once the first object packets were counted."""
    if f.progress is None and on_running is None:
        return None
    progress = f.progress
    loop = f.loop

    last = [-1]
    ran = [on_running is None]

    def report(received: int, needed: int) -> None:
        # called from the receive thread for every batch
        if not ran[0] and received > 0 and on_running is not None:
            ran[0] = True
            loop.call_soon_threadsafe(on_running)
        if progress is None:
            return
        # pass on whole percents
        percent = min(100, 100 * received // max(1, needed))
        if percent > last[0]:
            last[0] = percent
            done = m.size_bytes * percent // 100
            loop.call_soon_threadsafe(progress.advanced, done, "multicast")

    return report


def relays_for(
    config: ClientConfig, multicast: DirectiveMulticast
) -> tuple[list[tuple[str, int]], bool]:
    """The AMT relays to try, best first (the reader's own, the directive's, then
    DNS's by RFC 8777 when ``amt_dns`` is set and the directive names the source),
    and whether to start with a Relay Discovery (DNS records with the D bit clear).
    Bad entries are logged and skipped; a failed DNS lookup too."""
    from pressrun.multicast.gateway import parse_relay

    relays: list[tuple[str, int]] = []
    for text in (*config.amt_relays, *multicast.relays):
        try:
            relay = parse_relay(text)
        except ValueError as err:
            log.warning("AMT: skipping a relay: %s", err)
            continue
        if relay not in relays:
            relays.append(relay)
    discovery = False
    if config.amt_dns and multicast.source:
        from pressrun.multicast import driad

        try:
            server = (
                driad.system_resolver()
                if config.amt_dns == "system"
                else parse_relay_dns(config.amt_dns)
            )
            found, direct = driad.discover_relays(multicast.source, server)
        except (OSError, ValueError) as err:
            log.warning("AMT: no relay from DNS (%s)", err)
        else:
            log.info("AMT: DNS names %s for %s", found, multicast.source)
            if not relays:
                discovery = not direct
            relays += [r for r in found if r not in relays]
    return relays, discovery


def parse_relay_dns(text: str) -> tuple[str, int]:
    """A resolver ``HOST[:PORT]`` (port 53 by default)."""
    from pressrun.multicast.gateway import parse_relay

    host, port = parse_relay(text if ":" in text else f"{text}:53")
    return host, port


def receive_native_or_tunnelled(
    issue_id: str,
    manifest_sha256: str,
    config: ClientConfig,
    multicast: DirectiveMulticast,
    options: dict[str, Any],
) -> ReceiveResult:
    """The carousel natively, or through an AMT relay (the module docstring);
    blocking, for the receive thread. ``options``: `receive_carousel`'s."""
    import time

    from pressrun.multicast.gateway import AmtGateway
    from pressrun.multicast.receiver import receive_carousel

    started = time.perf_counter()
    deadline_s = config.multicast_deadline_s
    relays: list[tuple[str, int]] = []
    discovery = False
    if config.amt != "never":
        relays, discovery = relays_for(config, multicast)
    if config.amt != "always" or not relays:
        wait = config.amt_native_wait_s if relays else None
        try:
            result = receive_carousel(
                issue_id,
                manifest_sha256,
                deadline_s=deadline_s,
                announcement_wait_s=wait,
                **options,
            )
        except OSError as err:  # no multicast route: the join itself fails
            if not relays:
                raise
            why = f"the native join failed ({err})"
        else:
            if result.plan is not None or not relays:
                return result
            why = result.reason
        log.info("multicast: %s natively; trying the AMT relay(s) %s", why, relays)
    gateway = AmtGateway(relays, discovery=discovery)
    try:
        left = max(0.5, deadline_s - (time.perf_counter() - started))
        result = receive_carousel(
            issue_id, manifest_sha256, deadline_s=left, gateway=gateway, **options
        )
        result.relay = "{}:{}".format(*gateway.relay) if gateway.relay else None
        return result
    finally:
        gateway.close()
