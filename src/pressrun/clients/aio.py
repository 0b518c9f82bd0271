"""The client's asyncio adapter: directives, manifest, Range requests, the library.

`fetch_issue` is the whole download of one issue:

1. ask the balancer for a directive (``GET /v1/issues/<id>/directive``);
2. fetch ``manifest.json`` from the first origin, check its Ed25519 signature against
   the trusted publisher keys (given, else the library's ``trusted-publishers``; with
   neither, an error, unless trust on first use was asked for: then the key is
   recorded there and a warning printed); for an encrypted issue, fetch this
   subscriber's wrap and open it now (``subscription.py``), before any download;
3. prepare ``LIBRARY/.partial/<id>/<file>``; pieces a previous run verified (the
   sidecar ``state.json``) are hashed again from disk and kept if they still match;
4. run ``config.concurrency`` workers; each asks the balancer for a fresh directive
   per section (naming failed origins in ``failed=``), takes the next section from
   the plan (:class:`pressrun.clients.core.DownloadPlan`) and fetches it with one
   Range request, hashing each piece as it completes: a good piece is written with
   ``pwrite`` and recorded in the state file, a bad one fails the origin and ends the
   section; an error, reset, 416 or a stall (no byte for ``stall_timeout_s``) fails
   the origin and the pieces not yet verified go back to the plan;
   When the directive says ``swarm`` (docs/protocols.md), steps 3-4 start with the
   swarm instead: the issue's ``.torrent`` from ``swarm.torrent_url``, then
   :func:`pressrun.peer.aio.fetch_via_swarm` in the same partial folder with the
   peer profile of ``config.profile`` (mobile: a metered link never seeds), the
   directive's origins as web seeds. The peer seeds by the fair-exit rules and
   leaves; if the swarm stalls or fails, the pieces it holds (each checked against
   the manifest) are recorded in ``state.json`` and the rest comes from origin
   sections as above (the directive's ``fallbacks: ["origin"]``);
5. hash the whole file against the manifest (an encrypted issue: then decrypt it,
   every piece authenticated, beside it) and move it (the plaintext), with the
   manifest, into ``LIBRARY/<id>/`` in one rename.

Every way it can fail ends in `FetchError` with one line for a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import aiohttp

from pressrun.clients.codec import (
    ClientDirective,
    DirectiveFormatError,
    DirectiveMulticast,
    DirectiveSwarm,
    ResumeState,
    decode_directive,
    decode_error,
)
from pressrun.clients.config import ClientConfig
from pressrun.clients.core import DownloadPlan
from pressrun.clients.events import (
    DownloadGaveUp,
    Event,
    OriginFailed,
    PlanState,
    Section,
)
from pressrun.clients.library import Library, LibraryError
from pressrun.clients.subscription import NotReadable, content_key_for, decrypt_partial
from pressrun.content.manifest import (
    Manifest,
    ManifestError,
    SignedManifest,
    check_file,
    piece_ok,
)
from pressrun.security import BodyTooLarge, client_connector, read_body_limited

if TYPE_CHECKING:
    import nacl.public

    from pressrun.peer.aio import SwarmProgress, SwarmResult

__all__ = ["FetchError", "FetchResult", "Progress", "fetch_issue"]

log = logging.getLogger("pressrun.clients")

#: a manifest is about 70 bytes per piece; 32 MiB is far beyond any real one
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
#: a directive is a few hundred bytes; a balancer answering more is cut off
MAX_DIRECTIVE_BYTES = 1 << 20
#: read size of a section's body
READ_CHUNK_BYTES = 64 * 1024
#: full passes (download + whole-file check) before giving up on a file that keeps
#: failing its final check
MAX_PASSES = 3
#: a .torrent is about 20 bytes per piece; 32 MiB is far beyond any real one
MAX_TORRENT_BYTES = 32 * 1024 * 1024
#: how often an idle worker looks for a slow section to take over
STEAL_CHECK_S = 0.25


class FetchError(Exception):
    """The issue could not be fetched; the message is one line for a person."""


class Progress(Protocol):
    """What `fetch_issue` reports as it goes (the CLI's progress bar, the demo)."""

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        """The manifest is known: the size and what a resume already has."""

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        """Bytes received so far (verified plus pieces in progress), and from where."""

    def notice(self, text: str) -> None:
        """A one-line message for the person (warnings, handoffs, failed origins)."""


@dataclass(frozen=True)
class FetchResult:
    """A finished download: the file is in the library and verified."""

    issue_id: str
    path: Path
    seconds: float
    size_bytes: int
    bytes_by_origin: dict[str, int]
    handoffs: int
    sections: int
    failures: int
    resumed_bytes: int
    verified: bool = True
    mode: str = "origin"
    bytes_from_peers: int = 0
    bytes_from_web_seeds: int = 0
    swarm_stalled: bool = False
    leave_rule: str | None = None
    encrypted: bool = False  # a subscribers-only issue, decrypted into the library
    bytes_from_multicast: int = 0
    multicast_note: str | None = None

    @property
    def bytes_from_origins(self) -> int:
        """Bytes the origins delivered: origin sections plus web seeds (swarm mode)."""
        return sum(self.bytes_by_origin.values()) + self.bytes_from_web_seeds

    @property
    def origins_used(self) -> tuple[str, ...]:
        """The origins that delivered verified pieces, by name."""
        return tuple(sorted(name for name, n in self.bytes_by_origin.items() if n > 0))


class _DirectiveUnavailable(Exception):
    """No usable directive now; ``refused``: the balancer's 503 (no origin left)."""

    def __init__(
        self, reason: str, *, retry_after_s: float | None = None, refused: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.refused = refused


def _describe(err: BaseException) -> str:
    """One line for a transport error."""
    if isinstance(err, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return "stalled (no bytes within the timeout)"
    if isinstance(err, aiohttp.ClientConnectorError):
        return f"cannot connect ({err.os_error.strerror or err.os_error})"
    if isinstance(err, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "the connection was cut mid-transfer"
    if isinstance(err, ConnectionResetError):
        return "the connection was reset"
    text = str(err) or type(err).__name__
    return " ".join(text.split())[:200]


@dataclass
class _Fetch:
    """One download in progress: the state shared by its workers."""

    issue_id: str
    balancer_url: str
    library: Library
    config: ClientConfig
    trusted_keys: Collection[bytes] | None
    progress: Progress | None
    session: aiohttp.ClientSession
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    first_contact: bool = True
    origin_urls: dict[str, str] = field(default_factory=dict)
    bytes_by_origin: dict[str, int] = field(default_factory=dict)
    verified_bytes: int = 0
    in_progress: dict[int, int] = field(default_factory=dict)
    last_directive: ClientDirective | None = None
    swarm_tried: bool = False
    trust_on_first_use: bool = False
    subscriber_key: nacl.public.PrivateKey | None = None
    subscriptions_url: str | None = None
    multicast_bytes: int = 0
    multicast_note: str | None = None

    def now(self) -> float:
        return self.loop.time()

    def notice(self, text: str, *, level: int = logging.WARNING) -> None:
        """Tell the person (through the progress object), or log at ``level``."""
        if self.progress is not None:
            self.progress.notice(text)
        else:
            log.log(level, "%s: %s", self.issue_id, text)

    # -- balancer

    async def directive(self, failed: frozenset[str]) -> ClientDirective:
        """A directive; `FetchError` for a fatal answer, `_DirectiveUnavailable` else."""
        url = f"{self.balancer_url}/v1/issues/{self.issue_id}/directive"
        params = {"failed": ",".join(sorted(failed))} if failed else None
        timeout = aiohttp.ClientTimeout(total=self.config.balancer_timeout_s)
        try:
            async with self.session.get(url, params=params, timeout=timeout) as resp:
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
                body = await read_body_limited(resp, MAX_DIRECTIVE_BYTES, f"the directive at {url}")
        except BodyTooLarge as err:
            raise _DirectiveUnavailable(str(err)) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            reason = f"the balancer at {self.balancer_url} is unreachable: {_describe(err)}"
            if self.first_contact:
                raise FetchError(reason) from None
            raise _DirectiveUnavailable(reason) from None
        self.first_contact = False
        message = decode_error(body) or f"HTTP {status}"
        if status == 404:
            raise FetchError(
                f"issue {self.issue_id!r} is unknown to the balancer at "
                f"{self.balancer_url}: {message}"
            )
        if status == 400:
            raise FetchError(f"the balancer refused the request: {message}")
        if status == 503:
            wait: float | None = None
            with contextlib.suppress(TypeError, ValueError):
                wait = max(0.0, float(retry_after))  # type: ignore[arg-type]
            raise _DirectiveUnavailable(
                f"the balancer has no origin for {self.issue_id} now: {message}",
                retry_after_s=wait,
                refused=True,
            )
        if status != 200:
            raise _DirectiveUnavailable(f"the balancer answered {message}")
        try:
            directive = decode_directive(body)
        except DirectiveFormatError as err:
            raise _DirectiveUnavailable(f"the balancer's answer is malformed: {err}") from None
        for origin in directive.origins:
            self.origin_urls[origin.name] = origin.url
        self.last_directive = directive
        if not directive.origins:
            raise _DirectiveUnavailable(
                f"the balancer's {directive.mode!r} directive lists no origin "
                "(this client downloads from origins only)"
            )
        return directive

    # -- manifest

    async def manifest(self) -> tuple[Manifest, bytes]:
        """The verified manifest and its bytes, from the first origin that serves it."""
        failed: dict[str, str] = {}
        attempts = 0
        while True:
            try:
                directive = await self.directive(frozenset(failed))
            except _DirectiveUnavailable as err:
                attempts += 1
                if attempts >= self.config.max_attempts_without_progress:
                    raise FetchError(
                        f"could not get the manifest of {self.issue_id} after {attempts} "
                        f"attempts; the last: {err.reason}"
                    ) from None
                await asyncio.sleep(err.retry_after_s or self.config.retry_backoff_s)
                failed.clear()  # the balancer may have nothing else: try them again
                continue
            origin = next((o for o in directive.origins if o.name not in failed), None)
            if origin is None:
                origin = directive.origins[0]
            url = f"{origin.url}/content/{self.issue_id}/manifest.json"
            try:
                data = await self._get_small(url, MAX_MANIFEST_BYTES)
            except _DirectiveUnavailable as err:
                attempts += 1
                failed[origin.name] = err.reason
                self.notice(f"origin {origin.name}: {err.reason}; asking for another")
                if attempts >= self.config.max_attempts_without_progress:
                    raise FetchError(
                        f"no origin served the manifest of {self.issue_id} "
                        f"({attempts} attempts; the last: {origin.name}: {err.reason})"
                    ) from None
                await asyncio.sleep(self.config.retry_backoff_s)
                continue
            return self._verified_manifest(data, origin.name), data

    async def _get_small(self, url: str, limit: int) -> bytes:
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.config.connect_timeout_s,
            sock_read=self.config.stall_timeout_s,
        )
        try:
            async with self.session.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise _DirectiveUnavailable(f"GET {url} answered HTTP {resp.status}")
                return await read_body_limited(resp, limit, f"GET {url}")
        except BodyTooLarge as err:
            raise _DirectiveUnavailable(str(err)) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise _DirectiveUnavailable(f"GET {url}: {_describe(err)}") from None

    def _verified_manifest(self, data: bytes, origin: str) -> Manifest:
        where = f"the manifest of {self.issue_id} from origin {origin}"
        first_use = False
        try:
            signed = SignedManifest.from_json_bytes(data)
            if self.trusted_keys is not None:
                manifest = signed.verify(self.trusted_keys)
            else:
                keys = self.library.trusted_keys()
                if not keys and not self.trust_on_first_use:
                    raise FetchError(
                        f"no trusted publisher key to check {where} against: pass "
                        "--publisher-key KEY, or add it to the library with `pressrun trust "
                        f"add KEY --library {self.library.root}`; nothing was saved"
                    )
                # no trusted-publishers yet: only self-consistency (trust on first use,
                # asked for explicitly)
                manifest = signed.verify(keys or None)
                first_use = not keys
        except ManifestError as err:
            raise FetchError(f"{where} is rejected: {err}; nothing was saved") from None
        except LibraryError as err:
            raise FetchError(str(err)) from None
        if manifest.issue_id != self.issue_id:
            raise FetchError(
                f"{where} is for issue {manifest.issue_id!r}, not {self.issue_id!r}; "
                "nothing was saved"
            )
        if first_use:
            try:
                self.library.trust(
                    manifest.publisher_key_bytes, f"trusted on first use, issue {self.issue_id}"
                )
            except OSError as err:
                raise FetchError(
                    f"cannot record the publisher key in {self.library.trusted_path}: "
                    f"{err.strerror or err}"
                ) from None
            self.notice(
                f"warning: trusting publisher key {manifest.publisher_key} on first use "
                f"(recorded in {self.library.trusted_path}); pass --publisher-key to pin "
                "the key you expect"
            )
        return manifest

    # -- the download

    async def run(self) -> FetchResult:
        started_at = self.now()
        try:
            self.library.ensure()
        except LibraryError as err:
            raise FetchError(str(err)) from None
        manifest, manifest_json = await self.manifest()
        m = manifest
        content_key: bytes | None = None
        if m.encryption is not None:
            try:
                content_key = await content_key_for(
                    m,
                    subscriber_key=self.subscriber_key,
                    subscriptions_url=self.subscriptions_url,
                    session=self.session,
                )
            except NotReadable as err:
                raise FetchError(str(err)) from None
        state = self.library.load_state(m.issue_id)
        fresh = state is None or not state.matches(
            m.issue_id, m.file_name, m.sha256, m.size_bytes, m.piece_size_bytes
        )
        try:
            path = self.library.prepare_partial(
                m.issue_id, m.file_name, m.size_bytes, manifest_json, fresh
            )
        except OSError as err:
            raise FetchError(f"cannot write the partial download: {err}") from None
        kept: list[int] = []
        if state is not None and not fresh:
            kept = await asyncio.to_thread(_still_good, m, path, sorted(state.verified))
        plan = DownloadPlan(
            size_bytes=m.size_bytes,
            piece_size_bytes=m.piece_size_bytes,
            config=self.config,
            verified=kept,
            now=self.now(),
        )
        self.verified_bytes = plan.verified_bytes
        resumed = self.verified_bytes
        if kept:
            self.notice(
                f"resuming {m.issue_id}: {len(kept)} of {m.num_pieces} pieces already "
                "verified on disk",
                level=logging.INFO,
            )
        if self.progress is not None:
            self.progress.started(m.issue_id, m.size_bytes, self.verified_bytes)
        swarm_result = None
        directive = self.last_directive
        if (
            directive is not None
            and directive.multicast is not None
            and plan.state is PlanState.DOWNLOADING
        ):
            kept = await self._multicast(m, manifest_json, path, directive.multicast, kept)
            plan = self._replan(m, kept)
        if (
            directive is not None
            and directive.swarm is not None
            and plan.state is PlanState.DOWNLOADING
        ):
            kept, swarm_result = await self._swarm(m, path, directive.swarm, kept)
            plan = self._replan(m, kept)
        self._save(plan, m)
        fd = os.open(path, os.O_RDWR)
        try:
            for _ in range(MAX_PASSES):
                await self._download(plan, m, fd)
                if plan.state is PlanState.GAVE_UP:
                    raise FetchError(
                        f"could not download {m.issue_id}: {plan.give_up_reason}; the "
                        f"{len(plan.verified)} verified pieces are kept for a resume"
                    )
                os.fsync(fd)
                check = await asyncio.to_thread(check_file, m, path)
                if check.matches(m):
                    break
                if not check.bad_pieces:
                    raise FetchError(
                        f"{m.issue_id}: every piece matches but the whole file does not "
                        "match the manifest's SHA-256 (a publisher error); nothing was saved"
                    )
                self._apply(plan.handle_pieces_lost(check.bad_pieces, now=self.now()))
                self.verified_bytes = plan.verified_bytes
                self._save(plan, m)
            else:
                raise FetchError(f"{m.issue_id}: the file kept failing its final check")
        finally:
            os.close(fd)
        file_name = m.file_name
        if m.encryption is not None and content_key is not None:
            try:
                plain = await asyncio.to_thread(decrypt_partial, m, content_key, path)
            except NotReadable as err:
                raise FetchError(str(err)) from None
            file_name = plain.name
        try:
            final = self.library.install(m.issue_id, file_name, manifest_json)
        except OSError as err:
            raise FetchError(f"cannot move {file_name} into the library: {err}") from None
        return FetchResult(
            issue_id=m.issue_id,
            path=final,
            seconds=self.now() - started_at,
            size_bytes=m.size_bytes if m.encryption is None else m.encryption.plain_size_bytes,
            bytes_by_origin=dict(self.bytes_by_origin),
            handoffs=plan.handoffs,
            sections=plan.sections_started,
            failures=plan.failures_total,
            resumed_bytes=resumed,
            mode=(
                "multicast"
                if directive is not None and directive.multicast is not None
                else "origin"
                if swarm_result is None and not self.swarm_tried
                else "swarm"
            ),
            bytes_from_peers=0 if swarm_result is None else swarm_result.bytes_from_peers,
            bytes_from_web_seeds=(0 if swarm_result is None else swarm_result.bytes_from_web_seeds),
            swarm_stalled=swarm_result is not None and swarm_result.stalled,
            leave_rule=(
                None
                if swarm_result is None or swarm_result.leave_rule is None
                else swarm_result.leave_rule.value
            ),
            encrypted=m.encryption is not None,
            bytes_from_multicast=self.multicast_bytes,
            multicast_note=self.multicast_note,
        )

    def _replan(self, m: Manifest, kept: list[int]) -> DownloadPlan:
        """A fresh plan once a carousel or the swarm left ``kept`` verified."""
        plan = DownloadPlan(
            size_bytes=m.size_bytes,
            piece_size_bytes=m.piece_size_bytes,
            config=self.config,
            verified=kept,
            now=self.now(),
        )
        self.verified_bytes = plan.verified_bytes
        self._advanced(None)
        return plan

    async def _multicast(
        self,
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
            self.notice(f"multicast: bad control group in the directive ({err}); skipping it")
            return kept
        interface = self.config.multicast_interface or multicast.interface or "0.0.0.0"
        work = path.parent / "multicast"
        work.mkdir(exist_ok=True)
        # a thread of its own, not the loop's small default pool: many clients of one
        # process (the demo) each receive at once
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pressrun-multicast")
        stop = threading.Event()  # set when this task ends, cancelled or not
        try:
            result = await self.loop.run_in_executor(
                executor,
                functools.partial(
                    receive_carousel,
                    m.issue_id,
                    hashlib.sha256(manifest_json).hexdigest(),
                    control_group=group,
                    interface=interface,
                    trusted_keys={m.publisher_key},
                    work_dir=work,
                    deadline_s=self.config.multicast_deadline_s,
                    drop_probability=self.config.multicast_receive_drop,
                    on_progress=self._multicast_progress(m),
                    should_stop=stop.is_set,
                ),
            )
            good: list[int] = []
            if result.path is not None:
                good = await asyncio.to_thread(copy_verified_pieces, m, result.path, path)
        except (OSError, ImportError) as err:
            self.notice(f"multicast failed ({_describe(err)}); trying the fallbacks")
            return kept
        finally:
            stop.set()
            executor.shutdown(wait=False)
            shutil.rmtree(work, ignore_errors=True)
        have = sorted(set(kept) | set(good))
        before = set(kept)
        self.multicast_bytes = sum(m.piece_span(i)[1] for i in good if i not in before)
        if len(have) == m.num_pieces:
            self.multicast_note = f"{result.most_channels} channel(s), {result.seconds:.1f} s"
            return have
        why = (
            result.reason
            if result.path is None
            else (f"{m.num_pieces - len(good)} of {m.num_pieces} pieces failed the manifest check")
        )
        self.multicast_note = f"fell back: {why}"
        self.notice(
            f"multicast: {why}; keeping {len(good)} verified pieces, the rest from "
            + ("the swarm" if self.last_directive and self.last_directive.swarm else "origins"),
            level=logging.INFO,
        )
        return have

    def _multicast_progress(self, m: Manifest) -> Callable[[int, int], None] | None:
        if self.progress is None:
            return None
        progress = self.progress
        loop = self.loop

        last = [-1]

        def report(received: int, needed: int) -> None:
            # called from the receive thread for every batch: pass on whole percents
            percent = min(100, 100 * received // max(1, needed))
            if percent > last[0]:
                last[0] = percent
                done = m.size_bytes * percent // 100
                loop.call_soon_threadsafe(progress.advanced, done, "multicast")

        return report

    async def _swarm(
        self, m: Manifest, path: Path, swarm: DirectiveSwarm, kept: list[int]
    ) -> tuple[list[int], SwarmResult | None]:
        """Fetch from the swarm into the partial file; the pieces verified after it
        (all of them when it completed) and its result (None when it never ran)."""
        from pressrun.peer.aio import fetch_via_swarm  # libtorrent: only when needed
        from pressrun.peer.config import profile_config

        self.swarm_tried = True
        try:
            torrent = await self._get_small(swarm.torrent_url, MAX_TORRENT_BYTES)
        except _DirectiveUnavailable as err:
            self.notice(f"swarm: cannot get the torrent ({err.reason}); using origins")
            return kept, None
        web_seeds = [
            f"{url}/content/{m.issue_id}/{m.file_name}" for url in self.origin_urls.values()
        ]
        overrides: dict[str, object] = {}
        if self.config.swarm_stall_after_s is not None:
            overrides["stall_after_s"] = self.config.swarm_stall_after_s
        if self.config.swarm_max_seed_s is not None:
            overrides["max_seed_time_s"] = self.config.swarm_max_seed_s
        name = self.config.profile if self.config.profile in ("desktop", "mobile") else "desktop"
        peer_config = profile_config(name, metered=self.config.metered, **overrides)
        try:
            result = await fetch_via_swarm(
                torrent=torrent,
                manifest=m,
                partial_dir=path.parent,
                config=peer_config,
                tracker_url=swarm.tracker_url,
                web_seeds=web_seeds,
                on_progress=self._swarm_progress,
            )
        except Exception as err:  # any swarm failure falls back to origins
            self.notice(f"swarm failed ({_describe(err)}); the rest comes from origins")
            good = await asyncio.to_thread(_still_good, m, path, range(m.num_pieces))
            return good, None
        if result.completed:
            return list(range(m.num_pieces)), result
        have = sorted(set(result.have_pieces) | set(kept))
        self.notice(
            f"the swarm stalled with {len(result.have_pieces)} of {m.num_pieces} pieces; "
            "the rest comes from origins",
            level=logging.INFO,
        )
        return have, result

    def _swarm_progress(self, progress: SwarmProgress) -> None:
        if self.progress is not None:
            self.progress.advanced(progress.done_bytes, "swarm")

    async def _download(self, plan: DownloadPlan, m: Manifest, fd: int) -> None:
        while plan.state is PlanState.DOWNLOADING:
            workers = [
                asyncio.create_task(self._worker(n, plan, m, fd))
                for n in range(self.config.concurrency)
            ]
            try:
                await asyncio.gather(*workers)
            finally:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self, worker: int, plan: DownloadPlan, m: Manifest, fd: int) -> None:
        # A worker ends when nothing is left to assign and no open section is worth
        # taking over; pieces a failing section releases are picked up by that
        # section's own worker on its next turn.
        while plan.state is PlanState.DOWNLOADING:
            stealing = not plan.has_unassigned()
            if stealing:
                if not plan.sections or self.config.steal_after_s is None:
                    return
                if not plan.worth_stealing(now=self.now()):
                    await asyncio.sleep(STEAL_CHECK_S)
                    continue
            deadline = plan.next_deadline()
            delay = 0.0 if deadline is None else deadline - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            failed = plan.failed_origins(now=self.now())
            try:
                directive = await self.directive(failed)
            except _DirectiveUnavailable as err:
                self._apply(
                    plan.handle_directive_failed(
                        err.reason,
                        now=self.now(),
                        retry_after_s=err.retry_after_s,
                        no_origin_left=err.refused and bool(failed),
                    )
                )
                continue
            names = [o.name for o in directive.origins]
            if stealing:
                started = plan.steal_section(names, now=self.now())
                if started is None:
                    await asyncio.sleep(STEAL_CHECK_S)
                    continue
                origin = started.section.origin
            else:
                picked = plan.pick_origin(names, now=self.now())
                if picked is None:
                    self._apply(
                        plan.handle_directive_failed(
                            "every origin the balancer offered has failed",
                            now=self.now(),
                            no_origin_left=True,
                        )
                    )
                    continue
                origin = picked
                started = plan.start_section(origin, now=self.now())
                if started is None:
                    continue
            if started.handed_off_from is not None:
                s = started.section
                what = "took over" if stealing else "handoff:"
                self.notice(
                    f"{what} bytes {s.start_byte}-{s.end_byte - 1} from {origin} "
                    f"(the previous section came from {started.handed_off_from})",
                    level=logging.INFO,
                )
            await self._fetch_section(worker, plan, m, fd, started.section)

    async def _fetch_section(
        self, worker: int, plan: DownloadPlan, m: Manifest, fd: int, section: Section
    ) -> None:
        url = f"{self.origin_urls[section.origin]}/content/{m.issue_id}/{m.file_name}"
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.config.connect_timeout_s,
            sock_read=self.config.stall_timeout_s,
        )
        sid = section.section_id
        self.in_progress[worker] = 0
        try:
            async with self.session.get(
                url, headers={"Range": section.range_header()}, timeout=timeout
            ) as resp:
                problem = _check_answer(resp, section, m.size_bytes)
                if problem is not None:
                    self._apply(plan.handle_section_failed(sid, problem, now=self.now()))
                    return
                buf = bytearray()
                for index in section.pieces:
                    if index >= plan.section_end(sid):
                        # another worker took over the rest of this section
                        resp.close()
                        break
                    if plan.should_move(sid, now=self.now()):
                        resp.close()
                        self.notice(
                            f"origin {section.origin} is slow for this download; the rest "
                            f"of the section (from byte {m.piece_span(index)[0]}) moves",
                            level=logging.INFO,
                        )
                        self._apply(plan.handle_section_moved(sid, now=self.now()))
                        return
                    offset, length = m.piece_span(index)
                    buf.clear()
                    while len(buf) < length:
                        chunk = await resp.content.read(min(READ_CHUNK_BYTES, length - len(buf)))
                        if not chunk:
                            break
                        buf += chunk
                        self.in_progress[worker] = len(buf)
                        self._advanced(section.origin)
                    if len(buf) < length:
                        break  # a short body: handle_section_finished fails the section
                    if not piece_ok(m, index, bytes(buf)):
                        self.in_progress[worker] = 0
                        self._apply(plan.handle_piece_corrupt(sid, index, now=self.now()))
                        return
                    try:
                        os.pwrite(fd, buf, offset)
                    except OSError as err:  # the disk, not the origin: final
                        raise FetchError(
                            f"cannot write to the partial download: {err.strerror or err}"
                        ) from None
                    self.in_progress[worker] = 0
                    self.verified_bytes += length
                    self.bytes_by_origin[section.origin] = (
                        self.bytes_by_origin.get(section.origin, 0) + length
                    )
                    self._apply(plan.handle_piece_verified(sid, index, now=self.now()))
                    self._save(plan, m)
                self._apply(plan.handle_section_finished(sid, now=self.now()))
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            if sid in plan.sections:
                self._apply(plan.handle_section_failed(sid, _describe(err), now=self.now()))
        finally:
            self.in_progress.pop(worker, None)
            self._advanced(None)

    # -- bookkeeping

    def _advanced(self, origin: str | None) -> None:
        if self.progress is not None:
            self.progress.advanced(self.verified_bytes + sum(self.in_progress.values()), origin)

    def _apply(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, OriginFailed):
                self.notice(f"origin {event.origin} failed: {event.reason}; moving on")
            elif isinstance(event, DownloadGaveUp):
                log.info("%s: %s", self.issue_id, event.reason)

    def _save(self, plan: DownloadPlan, m: Manifest) -> None:
        try:
            self.library.save_state(
                ResumeState(
                    issue_id=m.issue_id,
                    file_name=m.file_name,
                    sha256=m.sha256,
                    size_bytes=m.size_bytes,
                    piece_size_bytes=m.piece_size_bytes,
                    verified=frozenset(plan.verified),
                )
            )
        except OSError as err:
            raise FetchError(f"cannot record the download state: {err}") from None


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


def _still_good(m: Manifest, path: Path, indices: Sequence[int]) -> list[int]:
    """Of the pieces a state file lists as verified, those still good on disk."""
    good: list[int] = []
    with open(path, "rb") as f:
        for index in indices:
            if not 0 <= index < m.num_pieces:
                continue
            offset, length = m.piece_span(index)
            f.seek(offset)
            if hashlib.sha256(f.read(length)).hexdigest() == m.piece_sha256[index]:
                good.append(index)
    return good


async def fetch_issue(
    issue_id: str,
    *,
    balancer_url: str,
    library: Path | str,
    config: ClientConfig,
    trusted_keys: Collection[bytes] | None,
    progress: Progress | None = None,
    trust_on_first_use: bool = False,
    subscriber_key: nacl.public.PrivateKey | None = None,
    subscriptions_url: str | None = None,
) -> FetchResult:
    """Download ``issue_id`` through the balancer into ``library``; verified or not at all.

    ``trusted_keys``: the publisher keys to accept; None: the library's
    ``trusted-publishers`` file; when that has none, an error, or with
    ``trust_on_first_use`` the manifest's own key is recorded there. An encrypted
    issue needs ``subscriber_key`` (the reader's X25519 key) and is decrypted into the
    library; ``subscriptions_url`` overrides the manifest's service URL. Raises
    `FetchError` (one line) when the issue cannot be fetched; the pieces verified so
    far stay in ``LIBRARY/.partial/`` for the next attempt.
    """
    # TLS verified against the system's CAs plus $PRESSRUN_CA_FILE (pressrun.security).
    connector = client_connector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        fetch = _Fetch(
            issue_id=issue_id,
            balancer_url=balancer_url.rstrip("/"),
            library=Library(library),
            config=config,
            trusted_keys=trusted_keys,
            progress=progress,
            session=session,
            trust_on_first_use=trust_on_first_use,
            subscriber_key=subscriber_key,
            subscriptions_url=subscriptions_url,
        )
        return await fetch.run()
