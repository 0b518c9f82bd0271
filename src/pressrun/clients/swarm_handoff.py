"""The swarm hand-off: the issue from the BitTorrent swarm, origins as web seeds.

The issue's ``.torrent`` from ``swarm.torrent_url`` (or, if that origin does not
answer, from the others the directive names), then
:func:`pressrun.peer.aio.fetch_via_swarm` in the partial folder with the peer profile
of ``config.profile`` (mobile: a metered link never seeds). If the swarm stalls or
fails, the pieces it holds (each checked against the manifest) are kept and the rest
comes from origin sections.

With ``ClientConfig.carousel_control_group`` set, the client watches the publisher's
control channel meanwhile (:mod:`.carousel_watch`): once the balancer has started the
issue's carousel (peak demand), it compares at every announcement and every swarm
progress report the carousel's time for the file with the swarm's peers' time for the
rest, both from rates it measured (:mod:`.carousel_switch`), and when the carousel is
sooner it hands over (:mod:`.carousel_handover`): the receive starts at once with
the pieces the swarm holds, checked, and the swarm closes once the carousel's first
packets came.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yarl

from pressrun.clients.carousel_handover_aio import HandoverRun
from pressrun.clients.carousel_switch import SenderRates, SwarmRates, carousel_choice
from pressrun.clients.codec import DirectiveSwarm
from pressrun.clients.session import DirectiveUnavailable, FetchState, describe, still_good
from pressrun.content.manifest import Manifest

if TYPE_CHECKING:
    from pressrun.chord.host import SupernodeHost
    from pressrun.clients.config import ClientConfig
    from pressrun.multicast.events import CarouselPlan
    from pressrun.peer.config import PeerConfig
    from pressrun.peer.results import SwarmProgress, SwarmResult

__all__ = [
    "MAX_TORRENT_BYTES",
    "fetch_swarm",
    "ring_figures",
    "seed_after_carousel",
    "seeds_after_carousel",
    "torrent_urls",
]

#: a .torrent is about 20 bytes per piece; 32 MiB is far beyond any real one
MAX_TORRENT_BYTES = 32 * 1024 * 1024


async def fetch_swarm(
    f: FetchState,
    m: Manifest,
    path: Path,
    swarm: DirectiveSwarm,
    kept: list[int],
    *,
    manifest_sha256: str | None = None,
    on_verified: Callable[[Path], None] | None = None,
) -> tuple[list[int], SwarmResult | None, CarouselPlan | None]:
    """Fetch from the swarm into the partial file; the pieces verified after it
    (all of them when it completed), its result (None when it never ran or was left)
    and the carousel it was left for (None: not left; watched only with
    ``manifest_sha256``, the verified manifest's digest, and a control group). A
    client that left received from the carousel here (`_hand_over`): the pieces are
    the swarm's and the carousel's, and what is still missing (a carousel that
    failed) is the caller's to fetch. ``on_verified`` is called with the file's path
    once the peer's final check passed, before it seeds (the client installs the
    copy then: `install.InstallFirst`)."""
    from pressrun.peer.aio import fetch_via_swarm  # libtorrent: only when needed
    from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY

    f.swarm_tried = True
    torrent, reason = await _torrent(f, m, swarm)
    if torrent is None:
        f.swarm_note = f"cannot get the torrent ({reason})"
        f.notice(f"swarm: {f.swarm_note}; using origins")
        return kept, None, None
    web_seeds = [f"{url}/content/{m.issue_id}/{m.file_name}" for url in f.origin_urls.values()]
    peer_config = _peer_config(f)
    ring = await _supernode(f, m, swarm)
    f.swarm_progress = None
    f.swarm_rates = SwarmRates(
        started_at=f.now(),
        window_s=f.config.carousel_rate_window_s,
        stall_after_s=peer_config.stall_after_s,
    )
    policy = f.config.uploader_policy or DEFAULT_UPLOADER_POLICY
    f.uploader_policy = policy
    fetching = asyncio.ensure_future(
        fetch_via_swarm(
            torrent=torrent,
            manifest=m,
            partial_dir=path.parent,
            config=peer_config,
            tracker_url=swarm.tracker_url,
            web_seeds=web_seeds,
            listen_interfaces=await _listen_interfaces(policy, swarm.tracker_url),
            uploader_policy=policy,
            on_progress=functools.partial(_swarm_progress, f),
            on_verified=on_verified,
            on_peer=f.swarm_peers.append,
        )
    )
    carousel: CarouselPlan | None = None
    handover: HandoverRun | None = None
    try:
        carousel = await _carousel_meanwhile(
            f, m, fetching, manifest_sha256, peer_config.status_interval_s
        )
        if carousel is not None and manifest_sha256 is not None:
            peer = f.swarm_peers[-1] if f.swarm_peers else None
            closing = ring.close if ring is not None else None
            handover = HandoverRun(
                f, m, path, carousel, fetching, manifest_sha256, peer, closing, still_good
            )
            await handover.run(kept)
            if handover.core.ran:
                _left_note(f, m, path, handover)
            if handover.core.resume_swarm:
                carousel = None  # the receive never ran: the swarm goes on
                f.notice("the carousel's receive did not start; staying in the swarm")
        if carousel is None:
            result = await fetching
    except Exception as err:  # any swarm failure falls back to origins
        f.swarm_note = f"failed ({describe(err)})"
        f.notice(f"swarm {f.swarm_note}; the rest comes from origins")
        good = await asyncio.to_thread(still_good, m, path, range(m.num_pieces))
        return good, None, None
    finally:
        if not fetching.done():
            fetching.cancel()  # the peer closes its session and leaves the swarm
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await fetching
        if ring is not None:
            await ring.close()  # leaves the ring gracefully
    if carousel is not None and handover is not None:
        have = handover.outcome()
        if handover.core.swarm_completed:  # the swarm's copy came first
            return have, handover.swarm_result, None
        return have, None, carousel
    if result.completed:
        if result.path == path:
            # the peer's final check (`pressrun.peer.verify.FinalVerification`) read this
            # file after libtorrent's disk flush: every piece's SHA-256, the whole file's
            # and its size against this manifest; a seeding peer writes nothing, so the
            # client's final check need not read the same bytes again (`aio._run_locked`)
            f.checked_sha256 = m.sha256
        return list(range(m.num_pieces)), result, None
    have = sorted(set(result.have_pieces) | set(kept))
    f.swarm_note = f"stalled with {len(result.have_pieces)} of {m.num_pieces} pieces"
    f.notice(
        f"the swarm stalled with {len(result.have_pieces)} of {m.num_pieces} pieces; "
        "the rest comes from origins",
        level=logging.INFO,
    )
    return have, result, None


async def _torrent(f: FetchState, m: Manifest, swarm: DirectiveSwarm) -> tuple[bytes | None, str]:
    """The issue's torrent: the directive's, else the same file on every other origin
    the balancer named (each origin publishes it; fetch_via_swarm checks it against
    the manifest); None and the reasons when none answered."""
    reasons: list[str] = []
    for url in torrent_urls(swarm.torrent_url, f.origin_urls.values(), m.issue_id):
        try:
            return await f.get_small(url, MAX_TORRENT_BYTES), ""
        except DirectiveUnavailable as err:
            reasons.append(err.reason)
    return None, "; ".join(reasons)


def _peer_config(f: FetchState, **extra: object) -> PeerConfig:
    """The peer's configuration: the profile's, with the client's swarm settings and
    ``extra`` over it."""
    from pressrun.peer.config import profile_config

    # WebRTC peers' STUN server (libtorrent's WebTorrent; docs/tracker.md): none unless set
    overrides: dict[str, object] = {"stun_server": os.environ.get("PRESSRUN_STUN", "")}
    if f.config.swarm_stall_after_s is not None:
        overrides["stall_after_s"] = f.config.swarm_stall_after_s
    if f.config.swarm_max_seed_s is not None:
        overrides["max_seed_time_s"] = f.config.swarm_max_seed_s
    overrides.update(extra)
    name = f.config.profile if f.config.profile in ("desktop", "mobile") else "desktop"
    return profile_config(name, metered=f.config.metered, **overrides)


def seeds_after_carousel(config: ClientConfig, swarm: DirectiveSwarm | None) -> bool:
    """Whether a client whose copy came whole from the carousel seeds the issue's
    swarm afterwards: when its directive named a swarm and it may seed (not metered,
    a seeding time other than 0). The swarm's readers that cannot take the carousel
    (browsers, links without multicast) then take the pieces from it, not from the
    origins' web seeds."""
    return swarm is not None and not config.metered and config.swarm_max_seed_s != 0


async def seed_after_carousel(
    f: FetchState, m: Manifest, path: Path, swarm: DirectiveSwarm
) -> SwarmResult | None:
    """Seed the issue's swarm with the complete copy at ``path`` (from the carousel,
    every piece verified) by the peer's fair-exit rules, the copy counting as
    downloaded (as `pressrun seed` counts it: it seeds one copy back, or until the
    tracker's counts say it is not needed, or for the profile's seeding time at most).
    No web seeds: a seed has every piece. The result (None when the torrent or the
    swarm failed: the copy is kept, seeding is an extra). A reader that joined the
    swarm while it received (``f.carousel_share``, `carousel_share`) seeds in that
    session, its connections and its upload while receiving carried over."""
    from pressrun.peer.aio import fetch_via_swarm
    from pressrun.peer.uploader import DEFAULT_UPLOADER_POLICY

    share, f.carousel_share = f.carousel_share, None
    if share is not None:
        f.uploader_policy = f.config.uploader_policy or DEFAULT_UPLOADER_POLICY
        try:
            return await share.seed()
        except Exception as err:  # the copy is whole and verified: seeding is an extra
            f.notice(f"swarm: seeding the carousel's copy failed ({describe(err)})")
            return None
    torrent, reason = await _torrent(f, m, swarm)
    if torrent is None:
        f.notice(f"swarm: not seeding the carousel's copy: cannot get the torrent ({reason})")
        return None
    # resume data of an earlier swarm session (left for the carousel, or a run before)
    # lists the pieces held then: the peer would fetch the carousel's pieces again
    _forget_swarm_resume(m, path)
    policy = f.config.uploader_policy or DEFAULT_UPLOADER_POLICY
    f.uploader_policy = policy  # the swarm is used: its policy is reported, as its ring
    try:
        return await fetch_via_swarm(
            torrent=torrent,
            manifest=m,
            partial_dir=path.parent,
            config=_peer_config(f, ratio_basis_bytes=m.size_bytes),
            tracker_url=swarm.tracker_url,
            listen_interfaces=await _listen_interfaces(policy, swarm.tracker_url),
            uploader_policy=policy,
            on_peer=f.swarm_peers.append,
        )
    except Exception as err:  # the copy is whole and verified: seeding is an extra
        f.notice(f"swarm: seeding the carousel's copy failed ({describe(err)})")
        return None


def _forget_swarm_resume(m: Manifest, path: Path) -> None:
    """Remove the swarm's resume data beside ``path``: the file changed (or is about
    to) under it, so the next swarm session rechecks the file."""
    from pressrun.peer.resume import resume_path_for

    resume_path_for(path.parent, m.file_name).unlink(missing_ok=True)


async def _carousel_meanwhile(
    f: FetchState,
    m: Manifest,
    fetching: asyncio.Future[Any],
    manifest_sha256: str | None,
    check_every_s: float = 0.5,
) -> CarouselPlan | None:
    """While the swarm fetch runs, watch the control channel (when configured); while
    the issue's carousel is on the air (named in an announcement that has not
    expired), compare every ``check_every_s`` (the swarm's status reports) the
    carousel's time for the file with the swarm peers' time for the rest
    (`carousel_choice`): the carousel's plan as soon as it is sooner, None when the
    swarm fetch ends first."""
    group_text = f.config.carousel_control_group
    if group_text is None or manifest_sha256 is None:
        await asyncio.wait({fetching})
        return None
    from pressrun.clients.carousel_watch import watch_for_carousel
    from pressrun.multicast.net import parse_group

    # the latest plan announced and until when (loop time) it is good
    on_air: list[tuple[CarouselPlan, float]] = []

    sender = SenderRates(window_s=f.config.carousel_rate_window_s)

    # set by each announcement: the choice is made again at once, not at the next
    # report (a leaver heard the carousel's first announcement and decided up to a
    # report's 0.5 s later: flash-crowd-50-desktops at a23629d)
    heard = asyncio.Event()

    def seen(plan: CarouselPlan, expires_in_s: float) -> None:
        # an expiry is at most a minute ahead, whatever the clocks say
        on_air[:] = [(plan, f.now() + min(60.0, max(0.0, expires_in_s)))]
        sender.handle_plan(plan, now=f.now())
        heard.set()

    def announced(plan: CarouselPlan, expires_in_s: float) -> None:
        # called in the watch's thread
        f.loop.call_soon_threadsafe(seen, plan, expires_in_s)

    stop = threading.Event()
    # a thread of its own (the loop's default pool is shared with the file checks)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pressrun-carousel-watch")
    watcher = f.loop.run_in_executor(
        executor,
        functools.partial(
            watch_for_carousel,
            m.issue_id,
            manifest_sha256,
            control_group=parse_group(group_text),
            interface=f.config.multicast_interface or "0.0.0.0",
            trusted_keys={m.publisher_key},
            should_stop=stop.is_set,
            source=f.config.carousel_control_source,
            on_plan=announced,
        ),
    )
    try:
        while not fetching.done():
            if on_air and f.swarm_rates is not None and f.now() <= on_air[0][1]:
                plan = on_air[0][0]
                choice = carousel_choice(f.swarm_rates, plan, sender=sender, now=f.now())
                if choice.leave:
                    f.carousel_choice = choice.describe()
                    return plan
            heard.clear()
            hearing = asyncio.ensure_future(heard.wait())
            waits: set[asyncio.Future[Any]] = {fetching, hearing}
            if not watcher.done():
                waits.add(watcher)
            try:
                await asyncio.wait(
                    waits, timeout=check_every_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                hearing.cancel()
            if watcher.done() and not fetching.done():
                # the watch is an extra: a group it cannot join (a 232/8 one without its
                # source) leaves the swarm fetch running, not failed
                err = watcher.exception()
                if err is not None:
                    f.notice(
                        f"cannot watch the control channel ({describe(err)}); staying in the swarm"
                    )
                await asyncio.wait({fetching})
        return None
    finally:
        stop.set()
        executor.shutdown(wait=False)


def _left_note(f: FetchState, m: Manifest, path: Path, run: HandoverRun) -> None:
    """The swarm's note of a client that left for the carousel, and what the swarm
    had brought it."""
    at = run.at
    got = _latest_progress(f)
    if got is not None:  # what the swarm brought before the client left it
        f.left_swarm_web_seed_bytes += got.bytes_from_web_seeds
        f.left_swarm_peer_bytes += max(0, got.downloaded_bytes - got.bytes_from_web_seeds)
    _forget_swarm_resume(m, path)  # the carousel wrote the file
    handed = len(run.core.handed)
    chosen = at["chosen"]
    f.swarm_note = (
        f"left for the carousel with {handed / m.num_pieces:.0%} of the file"
        + (f": {f.carousel_choice}" if f.carousel_choice else "")
        + f"; {handed} held pieces handed to the receive"
        + (f" (checked in {run.check_s:.2f} s)" if run.check_s is not None else "")
        + f", the receive began {at.get('receive', chosen) - chosen:.2f} s after the choice"
        + (f" and ran {at['running'] - chosen:.2f} s after it" if "running" in at else "")
        + (
            f"; the swarm closed in {at['swarm_ended'] - at.get('running', chosen):.1f} s"
            " beside the receive"
            if "swarm_ended" in at
            else ""
        )
        + (
            f", {len(run.core.verified) - handed} of the {run.late_pieces} pieces it"
            " completed meanwhile kept"
            if run.late_pieces
            else ""
        )
    )
    f.notice(f"the issue's carousel started: {f.swarm_note}", level=logging.INFO)


def _latest_progress(f: FetchState) -> SwarmProgress | None:
    """The swarm fetch's latest progress report (set from its callback)."""
    return f.swarm_progress


def torrent_urls(directive_url: str, origin_urls: Iterable[str], issue_id: str) -> list[str]:
    """Where to get the issue's torrent, in order: the directive's URL, then
    ``<origin>/content/<issue>/<issue>.torrent`` on each origin (docs/protocols.md)."""
    urls = [directive_url]
    for origin in origin_urls:
        url = f"{origin.rstrip('/')}/content/{issue_id}/{issue_id}.torrent"
        if url not in urls:
            urls.append(url)
    return urls


async def _supernode(f: FetchState, m: Manifest, swarm: DirectiveSwarm) -> SupernodeHost | None:
    """A supernode of the issue's ring while in the swarm (``config.supernode_host``;
    desktop only, ClientConfig refuses it for mobile); None when not asked or refused."""
    if f.config.supernode_host is None:
        return None
    from pressrun.chord.host import SupernodeHost

    ring = SupernodeHost(
        tracker_base=str(yarl.URL(swarm.tracker_url).origin()), host=f.config.supernode_host
    )
    if await ring.add(m.info_hash, m.num_pieces) is None:
        f.notice("swarm: the tracker did not take this client's supernode; going on without")
    return ring


async def _listen_interfaces(policy: str, tracker_url: str) -> str:
    """libtorrent's ``listen_interfaces``: every interface, except with a policy that
    asks the Chord ring (the peer tells the ring its listening address, which other
    peers then connect to): the address this machine reaches the tracker from."""
    from pressrun.peer.uploader import make_uploader_policy

    if not getattr(make_uploader_policy(policy), "uses_ring", False):
        return "0.0.0.0:0"
    url = yarl.URL(tracker_url)
    try:
        address = await asyncio.to_thread(_source_address, url.host or "", url.port or 80)
    except OSError:
        return "0.0.0.0:0"  # the peer falls back to the tracker's host name
    return f"{address}:0"


def _source_address(host: str, port: int) -> str:
    """The local IPv4 address the kernel routes to ``host`` from (a UDP socket's
    connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        return str(sock.getsockname()[0])


def ring_figures(f: FetchState) -> dict[str, Any] | None:
    """What the swarm's ring client(s) did for this download, summed over its swarm
    sessions (`RingClientStats`' counters; ``failed_supernodes`` as a sorted list),
    or None when no ring client ran (a policy that does not ask the ring)."""
    sessions = [p.ring_stats for p in f.swarm_peers if p.ring_stats is not None]
    if not sessions:
        return None
    import dataclasses

    total: dict[str, Any] = {"sessions": len(sessions), "failed_supernodes": set()}
    for stats in sessions:
        for key, value in dataclasses.asdict(stats).items():
            if key == "failed_supernodes":
                total[key] |= set(value)
            else:
                total[key] = total.get(key, 0) + value
    total["failed_supernodes"] = sorted(total["failed_supernodes"])
    return total


def _swarm_progress(f: FetchState, progress: SwarmProgress) -> None:
    from pressrun.peer.events import PeerPhase

    f.swarm_progress = progress
    if f.swarm_rates is not None:
        f.swarm_rates.handle_progress(
            done_bytes=progress.done_bytes,
            wanted_bytes=progress.wanted_bytes,
            downloaded_bytes=progress.downloaded_bytes,
            web_seed_bytes=progress.bytes_from_web_seeds,
            now=f.now(),
            downloading=progress.phase is PeerPhase.DOWNLOADING,
        )
    if f.progress is not None:
        f.progress.advanced(progress.done_bytes, "swarm")
