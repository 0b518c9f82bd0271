"""Origin sections: Range requests from the origins the balancer names.

``config.concurrency`` workers; each asks the balancer for a fresh directive per
section (naming failed origins in ``failed=``), takes the next section from the plan
(:class:`pressrun.clients.core.DownloadPlan`) and fetches it with one Range request,
hashing each piece as it completes: a good piece is written with ``pwrite`` (all of
it, or the download stops with the disk's error) and
recorded in the state file, a bad one fails the origin and ends the section; an error,
reset, 416 or a stall (no byte for ``stall_timeout_s``) fails the origin and the
pieces not yet verified go back to the plan. An idle worker takes over the rest of a
slow section. Pieces asked of the issue's swarm (an origin reader that shares in it:
`pressrun.clients.swarm_take`) are no section's; a worker with nothing else to do waits
for them to come or go back.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from pressrun.clients.core import DownloadPlan
from pressrun.clients.events import PlanState, Section
from pressrun.clients.session import DirectiveUnavailable, FetchError, FetchState, describe
from pressrun.content.manifest import Manifest, piece_ok
from pressrun.durable import pwrite_all

__all__ = ["download_sections"]

#: read size of a section's body
READ_CHUNK_BYTES = 64 * 1024
#: how often an idle worker looks for a slow section to take over
STEAL_CHECK_S = 0.25


class _Asking:
    """`now`: how many of a download's workers are asking the balancer for a directive for a
    new section now: a worker asks only while the pieces left to assign make more
    sections than that (one, while the download is being refused), so the directives a
    download asks for are the ones it uses.
    Before, two workers whose sections ended together both asked for the last one, and
    one directive in five went unused (every 65 kB download of the security soak test:
    5 directives, 4 transfers): the balancer counts each as a transfer on its way
    (headroom: for `pick_timeout_s`, and in the places its probe floor gives an origin
    per status; alg2: in the origin's bandwidth inflation)."""

    def __init__(self) -> None:
        self.now = 0


async def download_sections(f: FetchState, plan: DownloadPlan, m: Manifest, fd: int) -> None:
    asking = _Asking()
    while plan.state is PlanState.DOWNLOADING:
        workers = [
            asyncio.create_task(_worker(f, n, plan, m, fd, asking))
            for n in range(f.config.concurrency)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)


async def _worker(
    f: FetchState, worker: int, plan: DownloadPlan, m: Manifest, fd: int, asking: _Asking
) -> None:
    # A worker ends when nothing is left to assign and no open section is worth
    # taking over; pieces a failing section releases are picked up by that
    # section's own worker on its next turn.
    while plan.state is PlanState.DOWNLOADING:
        stealing = not plan.has_unassigned()
        if stealing:
            if plan.swarm_claims and not plan.worth_stealing(now=f.now()):
                # the rest was asked of the swarm: it comes, or goes back to the plan
                # (`pressrun.clients.swarm_take`), which wakes this worker
                await f.wait_changed(STEAL_CHECK_S)
                continue
            if not plan.sections or f.config.steal_after_s is None:
                return
            if not plan.worth_stealing(now=f.now()):
                await f.wait_changed(STEAL_CHECK_S)
                continue
        deadline = plan.next_deadline()
        delay = 0.0 if deadline is None else deadline - f.now()
        if delay > 0:
            await asyncio.sleep(delay)
            continue
        # a download being refused (failures since its last verified piece) asks with
        # one worker at a time: its workers, woken together, asked the same balancer
        # the same question at the same instant, and each refusal counted twice
        wanted = plan.unassigned_sections() if plan.failures_in_a_row == 0 else 1
        if not stealing and asking.now >= wanted:
            # the sections left are being asked for by the other workers
            await f.wait_changed(STEAL_CHECK_S)
            continue
        failed = plan.failed_origins(now=f.now())
        if not stealing:
            asking.now += 1
        try:
            # rate=: the best rate a section showed (the origins' and this process's as
            # much as the link's: the balancer refuses on it only for an issue with a
            # stated deadline; docs/balancer.md, "What a client tells").
            directive = await f.directive(
                failed,
                have=plan.verified_bytes,
                size=plan.size_bytes,
                rate=plan.best_rate_bytes_per_s or None,
            )
        except DirectiveUnavailable as err:
            if err.reservation is not None and err.retry_after_s is not None:
                # a turn in the balancer's queue, not a failure: wait for it
                plan.handle_start_reserved(retry_after_s=err.retry_after_s, now=f.now())
                continue
            f.apply(
                plan.handle_directive_failed(
                    err.reason,
                    now=f.now(),
                    retry_after_s=err.retry_after_s,
                    no_origin_left=err.refused and bool(failed),
                )
            )
            continue
        finally:
            # no await from here to `start_section`: the count cannot go stale
            if not stealing:
                asking.now -= 1
        names = [o.name for o in directive.origins]
        if stealing:
            started = plan.steal_section(names, now=f.now())
            if started is None:
                await f.wait_changed(STEAL_CHECK_S)
                continue
            origin = started.section.origin
        else:
            picked = plan.pick_origin(names, now=f.now())
            if picked is None:
                f.apply(
                    plan.handle_directive_failed(
                        "every origin the balancer offered has failed",
                        now=f.now(),
                        no_origin_left=True,
                    )
                )
                continue
            origin = picked
            started = plan.start_section(origin, now=f.now())
            if started is None:
                continue
        if started.handed_off_from is not None:
            s = started.section
            what = "took over" if stealing else "handoff:"
            f.notice(
                f"{what} bytes {s.start_byte}-{s.end_byte - 1} from {origin} "
                f"(the previous section came from {started.handed_off_from})",
                level=logging.INFO,
            )
        await _fetch_section(f, worker, plan, m, fd, started.section)


async def _fetch_section(
    f: FetchState, worker: int, plan: DownloadPlan, m: Manifest, fd: int, section: Section
) -> None:
    url = f"{f.origin_urls[section.origin]}/content/{m.issue_id}/{m.file_name}"
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=f.config.connect_timeout_s,
        sock_read=f.config.stall_timeout_s,
    )
    sid = section.section_id
    f.in_progress[worker] = 0
    try:
        async with f.session.get(
            url, headers={"Range": section.range_header()}, timeout=timeout
        ) as resp:
            problem = _check_answer(resp, section, m.size_bytes)
            if problem is not None:
                f.apply(plan.handle_section_failed(sid, problem, now=f.now()))
                return
            buf = bytearray()
            for index in section.pieces:
                if index >= plan.section_end(sid):
                    # another worker took over the rest of this section
                    resp.close()
                    break
                if plan.should_move(sid, now=f.now()):
                    resp.close()
                    f.notice(
                        f"origin {section.origin} is slow for this download; the rest "
                        f"of the section (from byte {m.piece_span(index)[0]}) moves",
                        level=logging.INFO,
                    )
                    f.apply(plan.handle_section_moved(sid, now=f.now()))
                    return
                offset, length = m.piece_span(index)
                buf.clear()
                while len(buf) < length:
                    chunk = await resp.content.read(min(READ_CHUNK_BYTES, length - len(buf)))
                    if not chunk:
                        break
                    buf += chunk
                    f.in_progress[worker] = len(buf)
                    f.advanced(section.origin)
                if len(buf) < length:
                    break  # a short body: handle_section_finished fails the section
                if not piece_ok(m, index, bytes(buf)):
                    f.in_progress[worker] = 0
                    f.apply(plan.handle_piece_corrupt(sid, index, now=f.now()))
                    return
                try:
                    # all of it or an error: a short write on a full disk is not a
                    # verified piece (durable.pwrite_all)
                    pwrite_all(fd, buf, offset)
                except OSError as err:  # the disk, not the origin: final
                    raise FetchError(
                        f"cannot write to the partial download: {err.strerror or err}"
                    ) from None
                f.in_progress[worker] = 0
                f.verified_bytes += length
                f.bytes_by_origin[section.origin] = (
                    f.bytes_by_origin.get(section.origin, 0) + length
                )
                f.apply(plan.handle_piece_verified(sid, index, now=f.now()))
                f.save(plan, m)
            f.apply(plan.handle_section_finished(sid, now=f.now()))
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        if sid in plan.sections:
            f.apply(plan.handle_section_failed(sid, describe(err), now=f.now()))
    finally:
        f.in_progress.pop(worker, None)
        f.advanced(None)


def _check_answer(resp: aiohttp.ClientResponse, section: Section, size_bytes: int) -> str | None:
    """Why an origin's answer to a section's Range request is unusable, or None."""
    if resp.status == 416:
        return (
            f"answered 416 Range Not Satisfiable to {section.range_header()} "
            f"(its copy is not the {size_bytes}-byte file of the manifest)"
        )
    whole = section.start_byte == 0 and section.end_byte == size_bytes
    if resp.status == 200 and whole:
        return None if resp.content_length in (None, size_bytes) else "a wrong-size file"
    if resp.status != 206:
        return f"answered HTTP {resp.status} to {section.range_header()}"
    expected = f"bytes {section.start_byte}-{section.end_byte - 1}/{size_bytes}"
    got = resp.headers.get("Content-Range", "")
    if got.strip() != expected:
        return f"answered Content-Range {got!r}, expected {expected!r}"
    return None
