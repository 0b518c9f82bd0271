"""Multicast receive: the issue from its FLUTE carousel (docs/multicast.md).

The receive loop runs in a thread of its own; the pieces it delivers are checked
against the manifest and copied into the partial file, the rest is left to the swarm
or to origin sections.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pressrun.clients.codec import DirectiveMulticast
from pressrun.clients.session import FetchState, describe
from pressrun.content.manifest import Manifest

__all__ = ["receive_multicast"]


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
    from pressrun.multicast.net import parse_group
    from pressrun.multicast.receiver import copy_verified_pieces, receive_carousel

    try:
        group = parse_group(multicast.control_group)
    except ValueError as err:
        f.notice(f"multicast: bad control group in the directive ({err}); skipping it")
        return kept
    interface = f.config.multicast_interface or multicast.interface or "0.0.0.0"
    work = path.parent / "multicast"
    work.mkdir(exist_ok=True)
    # a thread of its own, not the loop's small default pool: many clients of one
    # process (the demo) each receive at once
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pressrun-multicast")
    stop = threading.Event()  # set when this task ends, cancelled or not
    try:
        result = await f.loop.run_in_executor(
            executor,
            functools.partial(
                receive_carousel,
                m.issue_id,
                hashlib.sha256(manifest_json).hexdigest(),
                control_group=group,
                interface=interface,
                trusted_keys={m.publisher_key},
                work_dir=work,
                deadline_s=f.config.multicast_deadline_s,
                drop_probability=f.config.multicast_receive_drop,
                on_progress=_multicast_progress(f, m),
                should_stop=stop.is_set,
            ),
        )
        good: list[int] = []
        if result.path is not None:
            good = await asyncio.to_thread(copy_verified_pieces, m, result.path, path)
    except (OSError, ImportError) as err:
        f.notice(f"multicast failed ({describe(err)}); trying the fallbacks")
        return kept
    finally:
        stop.set()
        executor.shutdown(wait=False)
        shutil.rmtree(work, ignore_errors=True)
    have = sorted(set(kept) | set(good))
    before = set(kept)
    f.multicast_bytes = sum(m.piece_span(i)[1] for i in good if i not in before)
    if len(have) == m.num_pieces:
        # the channels it held against its link: at most, and at the end (receiver-
        # driven layering), and the packets its own socket dropped (not path loss)
        f.multicast_note = (
            f"{result.most_channels} channel(s), {result.seconds:.1f} s, "
            f"{result.final_channels} at the end, {result.socket_drops} own socket drops"
        )
        return have
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
    return have


def _multicast_progress(f: FetchState, m: Manifest) -> Callable[[int, int], None] | None:
    if f.progress is None:
        return None
    progress = f.progress
    loop = f.loop

    last = [-1]

    def report(received: int, needed: int) -> None:
        # called from the receive thread for every batch: pass on whole percents
        percent = min(100, 100 * received // max(1, needed))
        if percent > last[0]:
            last[0] = percent
            done = m.size_bytes * percent // 100
            loop.call_soon_threadsafe(progress.advanced, done, "multicast")

    return report
