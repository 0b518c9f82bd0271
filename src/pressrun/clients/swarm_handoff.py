"""The swarm hand-off: the issue from the BitTorrent swarm, origins as web seeds.

The issue's ``.torrent`` from ``swarm.torrent_url`` (or, if that origin does not
answer, from the others the directive names), then
:func:`pressrun.peer.aio.fetch_via_swarm` in the partial folder with the peer profile
of ``config.profile`` (mobile: a metered link never seeds). If the swarm stalls or
fails, the pieces it holds (each checked against the manifest) are kept and the rest
comes from origin sections.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pressrun.clients.codec import DirectiveSwarm
from pressrun.clients.session import DirectiveUnavailable, FetchState, describe, still_good
from pressrun.content.manifest import Manifest

if TYPE_CHECKING:
    from pressrun.chord.host import SupernodeHost
    from pressrun.peer.results import SwarmProgress, SwarmResult

__all__ = ["MAX_TORRENT_BYTES", "fetch_swarm", "torrent_urls"]

#: a .torrent is about 20 bytes per piece; 32 MiB is far beyond any real one
MAX_TORRENT_BYTES = 32 * 1024 * 1024


async def fetch_swarm(
    f: FetchState, m: Manifest, path: Path, swarm: DirectiveSwarm, kept: list[int]
) -> tuple[list[int], SwarmResult | None]:
    """Fetch from the swarm into the partial file; the pieces verified after it
    (all of them when it completed) and its result (None when it never ran)."""
    from pressrun.peer.aio import fetch_via_swarm  # libtorrent: only when needed
    from pressrun.peer.config import profile_config

    f.swarm_tried = True
    torrent: bytes | None = None
    reasons: list[str] = []
    # the directive's torrent, else the same file on every other origin the balancer
    # named (each origin publishes it; fetch_via_swarm checks it against the manifest)
    for url in torrent_urls(swarm.torrent_url, f.origin_urls.values(), m.issue_id):
        try:
            torrent = await f.get_small(url, MAX_TORRENT_BYTES)
            break
        except DirectiveUnavailable as err:
            reasons.append(err.reason)
    if torrent is None:
        f.swarm_note = f"cannot get the torrent ({'; '.join(reasons)})"
        f.notice(f"swarm: {f.swarm_note}; using origins")
        return kept, None
    web_seeds = [f"{url}/content/{m.issue_id}/{m.file_name}" for url in f.origin_urls.values()]
    overrides: dict[str, object] = {}
    if f.config.swarm_stall_after_s is not None:
        overrides["stall_after_s"] = f.config.swarm_stall_after_s
    if f.config.swarm_max_seed_s is not None:
        overrides["max_seed_time_s"] = f.config.swarm_max_seed_s
    name = f.config.profile if f.config.profile in ("desktop", "mobile") else "desktop"
    peer_config = profile_config(name, metered=f.config.metered, **overrides)
    ring = await _supernode(f, m, swarm)
    try:
        result = await fetch_via_swarm(
            torrent=torrent,
            manifest=m,
            partial_dir=path.parent,
            config=peer_config,
            tracker_url=swarm.tracker_url,
            web_seeds=web_seeds,
            on_progress=functools.partial(_swarm_progress, f),
        )
    except Exception as err:  # any swarm failure falls back to origins
        f.swarm_note = f"failed ({describe(err)})"
        f.notice(f"swarm {f.swarm_note}; the rest comes from origins")
        good = await asyncio.to_thread(still_good, m, path, range(m.num_pieces))
        return good, None
    finally:
        if ring is not None:
            await ring.close()  # leaves the ring gracefully
    if result.completed:
        return list(range(m.num_pieces)), result
    have = sorted(set(result.have_pieces) | set(kept))
    f.swarm_note = f"stalled with {len(result.have_pieces)} of {m.num_pieces} pieces"
    f.notice(
        f"the swarm stalled with {len(result.have_pieces)} of {m.num_pieces} pieces; "
        "the rest comes from origins",
        level=logging.INFO,
    )
    return have, result


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
    import yarl

    from pressrun.chord.host import SupernodeHost

    ring = SupernodeHost(
        tracker_base=str(yarl.URL(swarm.tracker_url).origin()), host=f.config.supernode_host
    )
    if await ring.add(m.info_hash, m.num_pieces) is None:
        f.notice("swarm: the tracker did not take this client's supernode; going on without")
    return ring


def _swarm_progress(f: FetchState, progress: SwarmProgress) -> None:
    if f.progress is not None:
        f.progress.advanced(progress.done_bytes, "swarm")
