"""The client's asyncio adapter: `fetch_issue`, the stages of one download in order.

`fetch_issue` is the whole download of one issue; each stage is a module of its own:

1. ask the balancer for a directive (``GET /v1/issues/<id>/directive``;
   :mod:`.session` holds what the stages share and does the small requests);
2. fetch ``manifest.json`` from the first origin and check its Ed25519 signature
   against the trusted publisher keys (:mod:`.manifest_fetch`); for an encrypted
   issue, fetch this subscriber's wrap and open it now (:mod:`.subscription`), before
   any download;
3. prepare ``LIBRARY/.partial/<id>/<file>``; pieces a previous run verified (the
   sidecar ``state.json``) are hashed again from disk and kept if they still match;
4. when the directive says ``multicast``, receive the carousel first
   (:mod:`.multicast_receive`); when it says ``swarm`` (docs/protocols.md), the swarm
   next (:mod:`.swarm_handoff`): the origins are web seeds, the peer seeds by the
   fair-exit rules and leaves (a swarm client watching the control channel moves to
   the issue's carousel when the balancer starts one while little of the file has
   come, the swarm then its fallback; a copy the carousel completed seeds the
   directive's swarm afterwards, `swarm_handoff.seed_after_carousel`); whatever
   either leaves missing (each piece checked
   against the manifest) comes from origin sections, Range requests from the origins
   the balancer names (:mod:`.sections`, the directive's ``fallbacks: ["origin"]``);
5. hash the whole file against the manifest (an encrypted issue: then decrypt it,
   every piece authenticated, beside it) and move it (the plaintext), with the
   manifest, into ``LIBRARY/<id>/`` in one swap (:mod:`.install`, :mod:`.library`).
   A copy that seeds (a swarm peer's, a carousel copy's, an origin copy whose
   directive named the issue's swarm: :mod:`.origin_seed`, in the swarm while it
   downloads, taking from its peers the pieces they hold: :mod:`.swarm_take`) is
   installed as soon as it is verified, before the seeding
   (`install.InstallFirst`): the reader does not wait for the fair-exit rules.

Before step 2 the run takes the issue's lock in the library and recovers what a crash
left there (`Library.recover`); after step 2, an issue already in the library with
this very manifest is checked, not downloaded again.

Every way it can fail ends in `FetchError` with one line for a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from pressrun.clients.config import ClientConfig, parse_balancer_urls
from pressrun.clients.core import DownloadPlan
from pressrun.clients.events import PlanState
from pressrun.clients.install import InstallFirst, install_copy
from pressrun.clients.library import Library, LibraryError
from pressrun.clients.manifest_fetch import fetch_manifest
from pressrun.clients.multicast_receive import receive_multicast
from pressrun.clients.origin_seed import OriginShare
from pressrun.clients.sections import download_sections
from pressrun.clients.session import FetchError, FetchState, Progress, still_good
from pressrun.clients.subscription import NotReadable, content_key_for
from pressrun.clients.swarm_handoff import (
    fetch_swarm,
    ring_figures,
    seed_after_carousel,
    seeds_after_carousel,
)
from pressrun.content.codec import valid_issue_id
from pressrun.content.manifest import Manifest, check_file, file_sha256
from pressrun.security import client_connector

if TYPE_CHECKING:
    import nacl.public

    from pressrun.peer.results import SwarmResult

__all__ = ["FetchError", "FetchResult", "Progress", "fetch_issue"]

#: full passes (download + whole-file check) before giving up on a file that keeps
#: failing its final check
MAX_PASSES = 3


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
    swarm_note: str | None = None  # why the swarm left pieces to the origins, if it did
    seeding_s: float = 0.0  # in swarm mode, the seeding after the download (in `seconds`)
    #: seconds from the start until the issue was verified and in the library, ready to
    #: read (the reader's wait, `download_s`): less than `seconds` when the copy was
    #: installed before its seeding; None: `seconds`
    ready_s: float | None = None
    #: the swarm peer's leave after its seeding (in `seconds`, not in `download_s`):
    #: from the end of the seeding until its session was closed, and each step's
    #: seconds (`pressrun.peer.leave`); 0.0 / None: no swarm peer left
    leave_s: float = 0.0
    leave_steps: dict[str, float] | None = None
    #: sent to the swarm, it left it for the issue's carousel when that started
    left_swarm_for_carousel: bool = False
    #: the swarm's uploader policy (None: the swarm was not used) and, for a policy
    #: that asks the Chord ring (``chord``), what its ring client did: rounds,
    #: requests, ``uploaders`` (answers naming an uploader), ``connects`` (distinct
    #: uploaders connected to), ``first``, ``bring_in``, ``waits`` (nobody to upload
    #: it yet), ``lookups``,
    #: ``supernode_failures`` and ``failed_supernodes`` (`swarm_handoff.ring_figures`)
    uploader_policy: str | None = None
    ring: dict[str, Any] | None = None
    #: the library already held this very version of the issue; it was checked
    #: (every piece, or the plaintext's SHA-256) instead of downloaded again
    already_in_library: bool = False

    @property
    def download_s(self) -> float:
        """Seconds from the start until the verified copy was in the library (`ready_s`,
        on the fetch's monotonic clock), in every mode: the reader's wait. Nothing
        after it counts (a seeding, the swarm peer's leave, the session's close): those
        are in `seconds`, `seeding_s` and `leave_s`."""
        return self.seconds if self.ready_s is None else self.ready_s

    @property
    def bytes_from_origins(self) -> int:
        """Bytes the origins delivered: origin sections plus web seeds (swarm mode)."""
        return sum(self.bytes_by_origin.values()) + self.bytes_from_web_seeds

    @property
    def origins_used(self) -> tuple[str, ...]:
        """The origins that delivered verified pieces, by name."""
        return tuple(sorted(name for name, n in self.bytes_by_origin.items() if n > 0))


async def _run(f: FetchState) -> FetchResult:
    if not valid_issue_id(f.issue_id):  # it names files in the library (the lock)
        raise FetchError(
            f"{f.issue_id!r} is not an issue id: use 1-128 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    try:
        f.library.ensure()
        with f.library.lock(f.issue_id):
            # what a crash left (this issue's or any other's): finished or rolled back
            for line in f.library.recover(held=frozenset({f.issue_id})):
                f.notice(f"library: {line}", level=logging.WARNING)
            return await _run_locked(f)
    except (LibraryError, OSError) as err:
        if isinstance(err, OSError):
            raise FetchError(f"cannot use the library {f.library.root}: {err}") from None
        raise FetchError(str(err)) from None


async def _already_there(f: FetchState, m: Manifest, manifest_json: bytes) -> FetchResult | None:
    """The result for an issue whose copy in the library is this very manifest's and
    checks out; None when it must be downloaded (absent, another version, damaged)."""
    if f.library.installed_manifest(m.issue_id) != manifest_json:
        return None
    name = m.file_name if m.encryption is None else m.encryption.plain_file_name
    path = f.library.issue_dir(m.issue_id) / name
    try:
        if m.encryption is None:
            good = (await asyncio.to_thread(check_file, m, path)).matches(m)
        else:
            enc = m.encryption
            good = (
                path.stat().st_size == enc.plain_size_bytes
                and (await asyncio.to_thread(file_sha256, path)) == enc.plain_sha256
            )
    except OSError:
        good = False
    if not good:
        f.notice(f"the copy of {m.issue_id} in the library is damaged; downloading it again")
        return None
    f.library.discard_partial(m.issue_id)
    size = m.size_bytes if m.encryption is None else m.encryption.plain_size_bytes
    return FetchResult(
        issue_id=m.issue_id,
        path=path,
        seconds=0.0,
        size_bytes=size,
        bytes_by_origin={},
        handoffs=0,
        sections=0,
        failures=0,
        resumed_bytes=size,
        encrypted=m.encryption is not None,
        already_in_library=True,
    )


async def _run_locked(f: FetchState) -> FetchResult:
    started_at = f.now()
    manifest, manifest_json = await fetch_manifest(f)
    m = manifest
    plain_name = None if m.encryption is None else m.encryption.plain_file_name
    # the plaintext is decrypted beside the ciphertext (and the swarm's sidecar files)
    if plain_name is not None and (
        plain_name == m.file_name or plain_name.startswith(m.file_name + ".")
    ):
        raise FetchError(
            f"{m.issue_id}: the manifest names the same file for the ciphertext and the "
            "plaintext (a publisher error); nothing was saved"
        )
    there = await _already_there(f, m, manifest_json)
    if there is not None:
        return dataclasses.replace(
            there, seconds=f.now() - started_at, ready_s=f.now() - started_at
        )
    content_key: bytes | None = None
    if m.encryption is not None:
        try:
            content_key = await content_key_for(
                m,
                subscriber_key=f.subscriber_key,
                subscriptions_url=f.subscriptions_url,
                session=f.session,
            )
        except NotReadable as err:
            raise FetchError(str(err)) from None
    state = f.library.load_state(m.issue_id)
    fresh = state is None or not state.matches(
        m.issue_id, m.file_name, m.sha256, m.size_bytes, m.piece_size_bytes
    )
    try:
        path = f.library.prepare_partial(
            m.issue_id, m.file_name, m.size_bytes, manifest_json, fresh
        )
    except OSError as err:
        raise FetchError(f"cannot write the partial download: {err}") from None
    kept: list[int] = []
    if state is not None and not fresh:
        kept = await asyncio.to_thread(still_good, m, path, sorted(state.verified))
    plan = DownloadPlan(
        size_bytes=m.size_bytes,
        piece_size_bytes=m.piece_size_bytes,
        config=f.config,
        verified=kept,
        now=f.now(),
        rng=f.rng,
    )
    f.verified_bytes = plan.verified_bytes
    resumed = f.verified_bytes
    if kept:
        f.notice(
            f"resuming {m.issue_id}: {len(kept)} of {m.num_pieces} pieces already verified on disk",
            level=logging.INFO,
        )
    if f.progress is not None:
        f.progress.started(m.issue_id, m.size_bytes, f.verified_bytes)
    swarm_result = None
    directive = f.last_directive
    first = InstallFirst(f, m, manifest_json, content_key, path, started_at)
    if (
        directive is not None
        and directive.multicast is not None
        and plan.state is PlanState.DOWNLOADING
    ):
        kept = await receive_multicast(f, m, manifest_json, path, directive.multicast, kept)
        plan = _replan(f, m, kept)
    if (
        directive is not None
        and directive.swarm is not None
        and plan.state is PlanState.DOWNLOADING
    ):
        digest = hashlib.sha256(manifest_json).hexdigest()
        kept, swarm_result, carousel = await fetch_swarm(
            f, m, path, directive.swarm, kept, manifest_sha256=digest, on_verified=first.on_verified
        )
        plan = _replan(f, m, kept)
        # a client that left for the carousel received there (`swarm_handoff`); the
        # swarm is the carousel's fallback
        if carousel is not None and plan.state is PlanState.DOWNLOADING:
            kept, swarm_result, _ = await fetch_swarm(
                f, m, path, directive.swarm, kept, on_verified=first.on_verified
            )
            plan = _replan(f, m, kept)
    seeded_s: float | None = None
    if (
        directive is not None
        and swarm_result is None
        and f.multicast_bytes > 0
        and plan.state is PlanState.COMPLETE
        and directive.swarm is not None
        and seeds_after_carousel(f.config, directive.swarm)
    ):
        # the carousel's copy seeds the swarm for the readers it cannot reach (its
        # whole time is seeding: the copy was complete and verified before it), once
        # it is in the library
        await first.now()
        since = f.now()
        swarm_result = await seed_after_carousel(f, m, path, directive.swarm)
        seeded_s = f.now() - since
    f.save(plan, m)
    final = await first.installed()
    if final is not None:  # installed before the seeding, which has ended now
        f.library.discard_partial(m.issue_id)
        return _result(
            f, m, plan, final, started_at, resumed, first.ready_s, swarm_result, seeded_s
        )
    fd = os.open(path, os.O_RDWR)
    share = OriginShare.join(f, m, path, plan)  # the origin copy in the swarm (origin_seed)
    try:
        for _ in range(MAX_PASSES):
            await download_sections(f, plan, m, fd)
            if plan.state is PlanState.GAVE_UP:
                raise FetchError(
                    f"could not download {m.issue_id}: {plan.give_up_reason}; the "
                    f"{len(plan.verified)} verified pieces are kept for a resume"
                )
            os.fsync(fd)
            if f.checked_sha256 == m.sha256 and len(plan.verified) == m.num_pieces:
                # the carousel's object became this file, or the swarm peer's final
                # check read it: every piece and the size checked on that read (the
                # swarm's also the whole SHA-256), nothing written since
                break
            check = await asyncio.to_thread(check_file, m, path)
            f.checked_sha256 = None  # sections written after this check are not in it
            if check.matches(m):
                break
            if not check.bad_pieces:
                raise FetchError(
                    f"{m.issue_id}: every piece matches but the whole file does not "
                    "match the manifest's SHA-256 (a publisher error); nothing was saved"
                )
            f.apply(plan.handle_pieces_lost(check.bad_pieces, now=f.now()))
            f.verified_bytes = plan.verified_bytes
            f.save(plan, m)
        else:
            raise FetchError(f"{m.issue_id}: the file kept failing its final check")
    except BaseException:
        if share is not None:
            await share.close()
        raise
    finally:
        os.close(fd)
    if share is not None:  # installed, then it seeds the issue's swarm
        f.checked_sha256 = m.sha256  # the loop above ends on a checked file
        seeded_s = await share.seed_installed(first)
        final = await first.installed()
        if final is not None:
            f.library.discard_partial(m.issue_id)
            return _result(
                f,
                m,
                plan,
                final,
                started_at,
                resumed,
                first.ready_s,
                None,
                seeded_s,
                peer_bytes=share.taken_bytes,
            )
    final = await install_copy(f, m, manifest_json, content_key, path)
    return _result(
        f,
        m,
        plan,
        final,
        started_at,
        resumed,
        None,
        swarm_result,
        seeded_s,
        peer_bytes=0 if share is None else share.taken_bytes,
    )


def _result(
    f: FetchState,
    m: Manifest,
    plan: DownloadPlan,
    final: Path,
    started_at: float,
    resumed: int,
    ready_s: float | None,
    swarm_result: SwarmResult | None,
    seeded_s: float | None,
    *,
    peer_bytes: int = 0,
) -> FetchResult:
    """The finished download's result (``ready_s`` None: installed just now;
    ``peer_bytes``: what an origin reader took from the swarm, `origin_seed`)."""
    directive = f.last_directive
    seconds = f.now() - started_at
    return FetchResult(
        issue_id=m.issue_id,
        path=final,
        seconds=seconds,
        ready_s=seconds if ready_s is None else ready_s,
        size_bytes=m.size_bytes if m.encryption is None else m.encryption.plain_size_bytes,
        bytes_by_origin=dict(f.bytes_by_origin),
        handoffs=plan.handoffs,
        sections=plan.sections_started,
        failures=plan.failures_total,
        resumed_bytes=resumed,
        mode=(
            "multicast"
            if f.left_for_carousel or (directive is not None and directive.multicast is not None)
            else "origin"
            if swarm_result is None and not f.swarm_tried
            else "swarm"
        ),
        bytes_from_peers=f.left_swarm_peer_bytes
        + peer_bytes
        + (0 if swarm_result is None else swarm_result.bytes_from_peers),
        bytes_from_web_seeds=f.left_swarm_web_seed_bytes
        + (0 if swarm_result is None else swarm_result.bytes_from_web_seeds),
        swarm_stalled=swarm_result is not None and swarm_result.stalled,
        leave_rule=(
            None
            if swarm_result is None or swarm_result.leave_rule is None
            else swarm_result.leave_rule.value
        ),
        encrypted=m.encryption is not None,
        bytes_from_multicast=f.multicast_bytes,
        multicast_note=f.multicast_note,
        swarm_note=f.swarm_note,
        seeding_s=(
            seeded_s
            if seeded_s is not None
            else 0.0
            if swarm_result is None or swarm_result.seeding_s is None
            else swarm_result.seeding_s
        ),
        leave_s=0.0
        if swarm_result is None or swarm_result.leave_s is None
        else swarm_result.leave_s,
        leave_steps=None if swarm_result is None else swarm_result.leave_steps or None,
        left_swarm_for_carousel=f.left_for_carousel,
        uploader_policy=f.uploader_policy,
        ring=ring_figures(f),
    )


def _replan(f: FetchState, m: Manifest, kept: list[int]) -> DownloadPlan:
    """A fresh plan once a carousel or the swarm left ``kept`` verified."""
    plan = DownloadPlan(
        size_bytes=m.size_bytes,
        piece_size_bytes=m.piece_size_bytes,
        config=f.config,
        verified=kept,
        now=f.now(),
        rng=f.rng,
    )
    f.verified_bytes = plan.verified_bytes
    f.advanced(None)
    return plan


async def fetch_issue(
    issue_id: str,
    *,
    balancer_url: str | Sequence[str],
    library: Path | str,
    config: ClientConfig,
    trusted_keys: Collection[bytes] | None,
    progress: Progress | None = None,
    trust_on_first_use: bool = False,
    subscriber_key: nacl.public.PrivateKey | None = None,
    subscriptions_url: str | None = None,
) -> FetchResult:
    """Download ``issue_id`` through the balancer into ``library``; verified or not at all.

    ``balancer_url``: one balancer, a comma-separated list or a sequence of them; the
    client asks the first and moves to the next on a refused connection, a timeout or
    a 5xx, keeping every piece it has (issue 30).

    ``trusted_keys``: the publisher keys to accept; None: the library's
    ``trusted-publishers`` file; when that has none, an error, or with
    ``trust_on_first_use`` the manifest's own key is recorded there. An encrypted
    issue needs ``subscriber_key`` (the reader's X25519 key) and is decrypted into the
    library; ``subscriptions_url`` overrides the manifest's service URL. Raises
    `FetchError` (one line) when the issue cannot be fetched; the pieces verified so
    far stay in ``LIBRARY/.partial/`` for the next attempt.
    """
    async with fetch_state(
        issue_id,
        balancer_url=balancer_url,
        library=library,
        config=config,
        trusted_keys=trusted_keys,
        progress=progress,
        trust_on_first_use=trust_on_first_use,
        subscriber_key=subscriber_key,
        subscriptions_url=subscriptions_url,
    ) as fetch:
        return await _run(fetch)


@contextlib.asynccontextmanager
async def fetch_state(
    issue_id: str,
    *,
    balancer_url: str | Sequence[str],
    library: Path | str,
    config: ClientConfig,
    trusted_keys: Collection[bytes] | None,
    progress: Progress | None,
    trust_on_first_use: bool,
    subscriber_key: nacl.public.PrivateKey | None,
    subscriptions_url: str | None,
) -> AsyncIterator[FetchState]:
    """One download's state with its HTTP session (`fetch_issue`'s arguments; the
    prefetch of clients/prefetch.py uses it too), closed at the end."""
    try:
        balancers = parse_balancer_urls(balancer_url)
    except ValueError as err:
        raise FetchError(str(err)) from None
    # TLS verified against the system's CAs plus $PRESSRUN_CA_FILE (pressrun.security).
    connector = client_connector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        yield FetchState(
            issue_id=issue_id,
            balancer_url=balancers[0],
            balancer_urls=balancers,
            library=Library(library),
            config=config,
            trusted_keys=trusted_keys,
            progress=progress,
            session=session,
            trust_on_first_use=trust_on_first_use,
            subscriber_key=subscriber_key,
            subscriptions_url=subscriptions_url,
        )
