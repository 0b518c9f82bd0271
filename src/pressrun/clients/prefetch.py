"""``pressrun get --prefetch``: pre-position an embargoed issue, open it at the release.

An issue published with ``--encrypt --release-at`` (docs/subscriptions.md, "Embargo")
can travel before its release: only the key is held back. With ``--prefetch`` the
client:

1. asks the balancer for a prefetch grant (``GET /v1/issues/<id>/prefetch``, counted
   apart from the readers: `pressrun.balancer.prefetch`), which names the origins and
   the rate to keep to; a 429 means wait (``Retry-After``) and ask again;
2. fetches and verifies the signed manifest from the first origin. An issue that is
   not encrypted, has no release time, or whose release has come already, is simply
   downloaded as ``pressrun get`` does (`fetch_issue`);
3. asks its wrap once: a non-subscriber, a subscriber without a wrap, or a withdrawn
   issue stops here with nothing downloaded; the embargo's answer gives the seconds
   left by the subscription service's clock, which is the only clock the client
   trusts for the release (its own may be off);
4. downloads the ciphertext piece by piece from the granted origins (HTTP Range, one
   piece at a time, each checked against the manifest and recorded in the resume
   state as ``get`` does), paced to the grant (`PrefetchPace`), renewing the grant
   every ``renew_s``; an interrupted prefetch resumes like any ``get``. When the
   issue's torrent names a tracker, the prefetcher also joins the other
   prefetchers' swarm (`pressrun.clients.prefetch_swarm`, no web seed): pieces come
   from peers unpaced, the origins are asked only for pieces no peer holds, and
   what this one holds is offered to the others, until the release;
5. waits for the release (asking the wrap again every ``RECHECK_S`` meanwhile, so a
   release moved earlier or later, or revoked, is followed), fetches the wrap at the
   release, decrypts and moves the plaintext into the library at once (``download_s``),
   leaving the prefetchers' swarm meanwhile (``leave_s``: the copy does not wait for it).

If the release comes before the ciphertext is all there, the rest is fetched at full
speed the ordinary way (`fetch_issue` resumes from the verified pieces).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nacl.public

from pressrun.clients.aio import FetchResult, _already_there, fetch_issue, fetch_state
from pressrun.clients.codec import ResumeState
from pressrun.clients.config import ClientConfig
from pressrun.clients.library import LibraryError
from pressrun.clients.manifest_fetch import MAX_MANIFEST_BYTES, _BadManifest, _verified_manifest
from pressrun.clients.prefetch_pace import PrefetchPace
from pressrun.clients.prefetch_swarm import PrefetchSwarm, next_origin_piece, swarm_trackers
from pressrun.clients.session import (
    DirectiveUnavailable,
    FetchError,
    FetchState,
    Progress,
    still_good,
)
from pressrun.clients.subscription import (
    NotReadable,
    content_key_or_embargo,
    decrypt_partial,
)
from pressrun.clients.swarm_handoff import MAX_TORRENT_BYTES
from pressrun.content.codec import piece_ok, valid_issue_id
from pressrun.content.manifest import Manifest, check_file
from pressrun.subscriptions.client import Embargoed

__all__ = ["MAX_GRANT_WAIT_S", "RECHECK_S", "prefetch_issue"]

log = logging.getLogger("pressrun.clients.prefetch")

#: while waiting for the release, ask the wrap again this often: a release moved
#: earlier (or later, or revoked) is followed within it
RECHECK_S = 600.0
#: the most a granted or waiting prefetcher waits before asking the balancer again
MAX_GRANT_WAIT_S = 300.0


def _seconds(doc: object, key: str) -> float | None:
    """A non-negative finite number of a balancer's answer (capped at
    MAX_GRANT_WAIT_S for times), or None: a malformed answer is no answer."""
    value = doc.get(key) if isinstance(doc, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 <= value < float("inf"):
        return None
    return float(value) if key == "rate_bytes_per_s" else min(float(value), MAX_GRANT_WAIT_S)


@dataclass
class _Grant:
    rate_bytes_per_s: float
    renew_at: float
    origins: list[tuple[str, str]]  # (name, base URL)


async def prefetch_issue(
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
    client_id: str | None = None,
    swarm: bool = True,
    listen_interfaces: str = "0.0.0.0:0",
) -> FetchResult:
    """Pre-position ``issue_id`` and open it at its release (module docstring).

    The arguments are `fetch_issue`'s; ``client_id`` is what the balancer knows this
    prefetcher by (default: random per run); ``swarm``: share the ciphertext with the
    other prefetchers when the torrent names a tracker (libtorrent listening on
    ``listen_interfaces``). Returns once the plaintext is in the
    library; FetchError (one line) otherwise, the verified ciphertext kept in
    ``LIBRARY/.partial/`` for the next attempt.
    """

    async def ordinary() -> FetchResult:
        return await fetch_issue(
            issue_id,
            balancer_url=balancer_url,
            library=library,
            config=config,
            trusted_keys=trusted_keys,
            progress=progress,
            trust_on_first_use=trust_on_first_use,
            subscriber_key=subscriber_key,
            subscriptions_url=subscriptions_url,
        )

    if not valid_issue_id(issue_id):
        return await ordinary()  # which says what is wrong with it
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
    ) as f:
        prefetcher = _Prefetcher(
            f, client_id or secrets.token_hex(8), swarm=swarm, listen_interfaces=listen_interfaces
        )
        try:
            result = await prefetcher.run()
        finally:
            await prefetcher.leave_swarm()
    return result if result is not None else await ordinary()


class _Prefetcher:
    """One prefetch: the grant, the paced download, the wait, the opening."""

    def __init__(
        self, f: FetchState, client_id: str, *, swarm: bool, listen_interfaces: str
    ) -> None:
        self.f = f
        self.client_id = client_id
        self.started_at = f.now()
        self.bytes_by_origin: dict[str, int] = {}
        self.bytes_from_peers = 0
        self.use_swarm = swarm
        self.listen_interfaces = listen_interfaces
        self.swarm: PrefetchSwarm | None = None
        self.swarm_note: str | None = None
        #: the swarm's leave: its seconds and its steps' (`PrefetchSwarm.close`)
        self.leave_s = 0.0
        self.leave_steps: dict[str, float] | None = None
        # the order of the origin fetches among pieces no peer holds: one per prefetcher
        self.rng = random.Random(client_id)

    # -- the balancer's grant

    async def grant(self) -> _Grant:
        """A grant: the origins and a rate (0 while deferred: ask again at
        ``renew_at``); a balancer that defers without naming origins is waited for."""
        f = self.f
        failures = 0
        while True:
            for base in f.balancer_urls or (f.balancer_url,):
                url = f"{base}/v1/issues/{f.issue_id}/prefetch?client={self.client_id}"
                try:
                    async with f.session.get(
                        url, timeout=aiohttp.ClientTimeout(total=f.config.connect_timeout_s * 3)
                    ) as resp:
                        doc = await resp.json(content_type=None)
                        status = resp.status
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
                    f.notice(f"balancer {base}: {err or type(err).__name__}; trying the next")
                    continue
                origins = []
                if isinstance(doc, dict) and isinstance(doc.get("origins"), list):
                    origins = [
                        (str(o["name"]), str(o["url"]).rstrip("/"))
                        for o in doc["origins"]
                        if isinstance(o, dict) and "name" in o and "url" in o
                    ]
                renew = _seconds(doc, "renew_s")
                if status == 200 and isinstance(doc, dict) and origins and renew is not None:
                    rate = _seconds(doc, "rate_bytes_per_s") or 0.0
                    return _Grant(rate, f.now() + renew, origins)
                wait = _seconds(doc, "retry_after_s")
                if status == 429 and isinstance(doc, dict) and origins and wait is not None:
                    # no room now: a grant of rate 0 until then (the caller reads the
                    # manifest, learns the release and waits no later than it); the
                    # wait jittered, as every one below, so that prefetchers deferred
                    # together do not ask again together (`ClientConfig.retry_jitter`)
                    wait = f.retry_wait_s(1, wait)
                    log.info("%s: prefetch deferred for %.1f s: %s", f.issue_id, wait, doc)
                    return _Grant(0.0, f.now() + wait, origins)
                if status == 404:
                    raise FetchError(
                        f"no origin holds {f.issue_id} yet (the balancer answered 404 to the "
                        "prefetch); run it again once the issue is published"
                    )
                if status == 429:  # deferred, naming no origin: wait and ask again
                    wait = f.retry_wait_s(1, 20.0 if wait is None else wait)
                    log.info("%s: prefetch deferred for %.1f s: %s", f.issue_id, wait, doc)
                    await asyncio.sleep(wait)
                    break
                f.notice(f"balancer {base} answered the prefetch with HTTP {status}")
            else:
                failures += 1
                if f.config.gives_up(failures, f.now() - self.started_at):
                    raise FetchError(
                        f"no balancer answered the prefetch of {f.issue_id} after {failures} rounds"
                    )
                await asyncio.sleep(f.retry_wait_s(failures, None))

    # -- the whole prefetch

    async def run(self) -> FetchResult | None:
        """The issue in the library, or None: download it the ordinary way (not
        embargoed, or released already, or released before the prefetch finished)."""
        f = self.f
        grant = await self.grant()
        m, manifest_json = await self.manifest(grant)
        if m.encryption is None or m.encryption.release_at is None:
            return None
        try:
            f.library.ensure()
            with f.library.lock(f.issue_id):
                for line in f.library.recover(held=frozenset({f.issue_id})):
                    f.notice(f"library: {line}", level=logging.WARNING)
                there = await _already_there(f, m, manifest_json)
                if there is not None:
                    return there
                release = await self.ask_key(m)
                if not isinstance(release, Embargoed):
                    return None  # released already: the ordinary get, at full speed
                deadline = f.now() + release.retry_after_s
                f.notice(
                    f"{f.issue_id} is released at {release.release_at}: downloading it now "
                    "at the prefetch pace, to open at the release",
                    level=logging.INFO,
                )
                path = await self.download(m, manifest_json, grant, deadline)
                if path is None:
                    return None  # the release came first: the rest at full speed
                key = await self.wait_for_release(m, deadline)
                return await self.open(m, manifest_json, path, key)
        except (LibraryError, OSError) as err:
            raise FetchError(f"cannot use the library {f.library.root}: {err}") from None

    async def manifest(self, grant: _Grant) -> tuple[Manifest, bytes]:
        """The verified manifest from the first granted origin that serves a good one."""
        last = ""
        for name, base in grant.origins:
            url = f"{base}/content/{self.f.issue_id}/manifest.json"
            try:
                data = await self.f.get_small(url, MAX_MANIFEST_BYTES)
                return _verified_manifest(self.f, data, name), data
            except (DirectiveUnavailable, _BadManifest) as err:
                last = f"{name}: {err}"
        raise FetchError(f"no origin served a good manifest of {self.f.issue_id}; the last: {last}")

    async def ask_key(self, m: Manifest) -> bytes | Embargoed:
        f = self.f
        try:
            return await content_key_or_embargo(
                m,
                subscriber_key=f.subscriber_key,
                subscriptions_url=f.subscriptions_url,
                session=f.session,
            )
        except NotReadable as err:
            raise FetchError(str(err)) from None

    # -- the paced download

    async def download(
        self, m: Manifest, manifest_json: bytes, grant: _Grant, deadline: float
    ) -> Path | None:
        """Every piece, verified, before ``deadline``; the file, or None if the release
        came first."""
        f = self.f
        state = f.library.load_state(m.issue_id)
        fresh = state is None or not state.matches(
            m.issue_id, m.file_name, m.sha256, m.size_bytes, m.piece_size_bytes
        )
        path = f.library.prepare_partial(
            m.issue_id, m.file_name, m.size_bytes, manifest_json, fresh
        )
        verified: set[int] = set()
        if state is not None and not fresh:
            verified = set(await asyncio.to_thread(still_good, m, path, sorted(state.verified)))
        if f.progress is not None:
            f.progress.started(m.issue_id, m.size_bytes, self._verified_bytes(m, verified))
        swarm = await self.join_swarm(m, grant, path)
        if swarm is not None:  # what libtorrent found on disk is ours, not the peers'
            verified |= swarm.on_disk
        pace = PrefetchPace(grant.rate_bytes_per_s, now=f.now())
        origin = 0
        failures = 0
        last_from_peers = f.now()
        fd = os.open(path, os.O_RDWR)
        try:
            while len(verified) < m.num_pieces:
                if f.now() >= deadline:
                    self._save(m, verified)
                    if swarm is not None:
                        left = [i for i in range(m.num_pieces) if i not in verified]
                        avail = swarm.availability()
                        log.info(
                            "%s: the release came with %d pieces missing %s (held by peers: %s)",
                            m.issue_id,
                            len(left),
                            left[:20],
                            [avail[i] if i < len(avail) else 0 for i in left[:20]],
                        )
                    return None
                if swarm is not None and self._from_peers(m, swarm, verified):
                    last_from_peers = f.now()
                    continue
                if f.now() >= grant.renew_at:
                    try:  # a deferral may last: never past the release
                        async with asyncio.timeout(max(0.0, deadline - f.now())):
                            grant = await self.grant()
                    except TimeoutError:
                        continue  # the release came: the loop's first check
                    pace.set_rate(grant.rate_bytes_per_s)
                missing = [i for i in range(m.num_pieces) if i not in verified]
                if swarm is None:
                    index: int | None = missing[0]
                else:
                    index = next_origin_piece(
                        missing,
                        swarm.availability(),
                        peers_idle_s=f.now() - last_from_peers,
                        rng=self.rng,
                    )
                if index is None:  # every missing piece is a peer's: take it from them
                    await asyncio.sleep(0.1)
                    continue
                offset, length = m.piece_span(index)
                wait = pace.wait_s(length, now=f.now())
                if wait is None:  # no rate: ask again at the renewal (peers meanwhile)
                    until = min(grant.renew_at, deadline)
                    if swarm is not None:
                        until = min(until, f.now() + 0.5)
                    await asyncio.sleep(max(0.0, until - f.now()))
                    continue
                if wait > 0:
                    await asyncio.sleep(min(wait, max(0.0, deadline - f.now())))
                if swarm is not None and self._from_peers(m, swarm, verified):
                    last_from_peers = f.now()
                    if index in verified:
                        continue  # a peer brought it meanwhile
                name, base = grant.origins[origin % len(grant.origins)]
                data = await self._piece(base, m, offset, length)
                if data is None or not piece_ok(m, index, data):
                    failures += 1
                    origin += 1  # the next granted origin
                    if f.config.gives_up(failures, 0.0):
                        grant.renew_at = f.now()  # a new grant: a new list of origins
                        failures = 0
                    await asyncio.sleep(f.retry_wait_s(failures, None))
                    continue
                failures = 0
                await asyncio.to_thread(os.pwrite, fd, data, offset)
                if swarm is not None:
                    swarm.add_piece(index, data)  # libtorrent checks it and offers it
                    log.debug("%s: piece %d from %s handed to the swarm", m.issue_id, index, name)
                verified.add(index)
                self.bytes_by_origin[name] = self.bytes_by_origin.get(name, 0) + length
                if len(verified) % 16 == 0 or len(verified) == m.num_pieces:
                    self._save(m, verified)
                if f.progress is not None:
                    f.progress.advanced(self._verified_bytes(m, verified), name)
            os.fsync(fd)
            if swarm is not None:  # libtorrent offers the others every piece
                await self._offered(m, swarm, fd, deadline)
        finally:
            os.close(fd)
        check = await asyncio.to_thread(check_file, m, path)
        if not check.matches(m):
            raise FetchError(
                f"{m.issue_id}: the prefetched file does not match the manifest "
                f"({len(check.bad_pieces)} bad pieces); run it again"
            )
        return path

    # -- the prefetchers' swarm

    async def join_swarm(self, m: Manifest, grant: _Grant, path: Path) -> PrefetchSwarm | None:
        """The swarm of prefetchers, when the torrent names a tracker; None (and a
        note) otherwise: the origins alone, at the grant's pace."""
        if not self.use_swarm:
            return None
        if self.f.config.metered:  # a metered link uploads nothing: no swarm to trade in
            self.swarm_note = "no prefetch swarm: a metered link"
            return None
        torrent = None
        for _name, base in grant.origins:
            with contextlib.suppress(DirectiveUnavailable):
                torrent = await self.f.get_small(
                    f"{base}/content/{m.issue_id}/{m.issue_id}.torrent", MAX_TORRENT_BYTES
                )
                break
        try:
            if torrent is None:
                raise ValueError("no origin served the torrent")
            if not swarm_trackers(torrent):
                raise ValueError("the torrent names no HTTP tracker")
            swarm = PrefetchSwarm(
                torrent=torrent,
                manifest=m,
                partial_dir=path.parent,
                profile=self.f.config.profile,
                listen_interfaces=self.listen_interfaces,
            )
            self.swarm = swarm  # closed by leave_swarm, whatever happens next
            await swarm.start()
        except (ValueError, RuntimeError, OSError, TimeoutError) as err:
            self.swarm_note = f"no prefetch swarm: {err}"
            log.info("%s: %s; the origins alone", m.issue_id, self.swarm_note)
            await self.leave_swarm()
            return None
        return swarm

    def _from_peers(self, m: Manifest, swarm: PrefetchSwarm, verified: set[int]) -> bool:
        """Count the pieces libtorrent got from peers since the last look (checked
        against the torrent; the whole file against the manifest at the end)."""
        swarm.refresh()
        new = swarm.have() - verified
        if not new:
            return False
        verified |= new
        self.bytes_from_peers += self._verified_bytes(m, new)
        if len(verified) % 16 < len(new) or len(verified) == m.num_pieces:
            self._save(m, verified)
        if self.f.progress is not None:
            self.f.progress.advanced(self._verified_bytes(m, verified), "peers")
        return True

    async def _offered(self, m: Manifest, swarm: PrefetchSwarm, fd: int, deadline: float) -> None:
        """Until libtorrent holds every piece (so it seeds them to the others): a piece
        handed to it that it does not hold after a moment is handed again from the
        file (at most 10 s, never past the release)."""
        end = min(self.f.now() + 10.0, deadline)
        handed_at = self.f.now()
        while self.f.now() < end:
            swarm.refresh()
            lacking = [i for i in range(m.num_pieces) if i not in swarm.have()]
            if not lacking:
                return
            if self.f.now() - handed_at >= 1.0:
                log.info("%s: pieces %s handed to the swarm again", m.issue_id, lacking[:20])
                for i in lacking:
                    offset, length = m.piece_span(i)
                    swarm.add_piece(i, await asyncio.to_thread(os.pread, fd, length, offset))
                handed_at = self.f.now()
            await asyncio.sleep(0.05)

    async def leave_swarm(self) -> None:
        """Leave the prefetchers' swarm (if in it); what it sent is logged."""
        swarm, self.swarm = self.swarm, None
        if swarm is not None:
            began = self.f.now()
            steps = await swarm.close()
            self.leave_s = round(self.f.now() - began, 3)
            self.leave_steps = steps or None
            log.info(
                "%s: left the prefetch swarm in %.2f s (%s): %d bytes from peers, "
                "%d bytes sent to them",
                self.f.issue_id,
                self.leave_s,
                ", ".join(f"{k} {v:.2f}" for k, v in steps.items()),
                self.bytes_from_peers,
                swarm.bytes_to_peers,
            )

    async def _piece(self, base: str, m: Manifest, offset: int, length: int) -> bytes | None:
        f = self.f
        url = f"{base}/content/{m.issue_id}/{m.file_name}"
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=f.config.connect_timeout_s, sock_read=f.config.stall_timeout_s
        )
        try:
            async with f.session.get(url, headers=headers, timeout=timeout) as resp:
                if resp.status != 206:
                    log.info("%s: %s answered HTTP %d to a piece", m.issue_id, base, resp.status)
                    return None
                return await resp.content.readexactly(length)
        except (TimeoutError, aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as err:
            log.info("%s: %s: %s", m.issue_id, base, err or type(err).__name__)
            return None

    def _save(self, m: Manifest, verified: set[int]) -> None:
        try:
            self.f.library.save_state(
                ResumeState(
                    issue_id=m.issue_id,
                    file_name=m.file_name,
                    sha256=m.sha256,
                    size_bytes=m.size_bytes,
                    piece_size_bytes=m.piece_size_bytes,
                    verified=frozenset(verified),
                )
            )
        except OSError as err:
            raise FetchError(f"cannot record the download state: {err}") from None

    @staticmethod
    def _verified_bytes(m: Manifest, verified: set[int]) -> int:
        return sum(m.piece_span(i)[1] for i in verified)

    # -- the release

    async def wait_for_release(self, m: Manifest, deadline: float) -> bytes:
        """The content key, fetched at the release (the service's clock decides)."""
        f = self.f
        while True:
            left = deadline - f.now()
            if left > 0:
                await asyncio.sleep(min(left, RECHECK_S))
            got = await self.ask_key(m)
            if not isinstance(got, Embargoed):
                return got
            deadline = f.now() + got.retry_after_s
            log.info("%s: not released yet; %.1f s left", m.issue_id, got.retry_after_s)

    async def open(self, m: Manifest, manifest_json: bytes, path: Path, key: bytes) -> FetchResult:
        """Decrypt beside the ciphertext and move the plaintext into the library; the
        prefetchers' swarm (seeded until now) is left meanwhile, not before: leaving
        takes a pause for the stopped announce and the session's end in a thread. The
        copy is in the library (`ready_s`) once decrypted, not once the swarm is left."""
        f = self.f
        leaving = asyncio.ensure_future(self.leave_swarm())
        try:
            try:
                plain = await asyncio.to_thread(decrypt_partial, m, key, path)
            except NotReadable as err:
                raise FetchError(str(err)) from None
            try:
                # linked in, the partial folder kept: libtorrent may still be reading
                # the ciphertext there until the leave has ended
                final = f.library.install(m.issue_id, plain.name, manifest_json, seeding=True)
            except (OSError, LibraryError) as err:
                raise FetchError(f"cannot move {plain.name} into the library: {err}") from None
            ready_s = f.now() - self.started_at
        finally:
            await leaving  # out of the swarm before the partial folder goes
        f.library.discard_partial(m.issue_id)
        enc = m.encryption
        assert enc is not None
        return FetchResult(
            issue_id=m.issue_id,
            path=final,
            seconds=f.now() - self.started_at,
            ready_s=ready_s,
            leave_s=self.leave_s,
            leave_steps=self.leave_steps,
            size_bytes=enc.plain_size_bytes,
            bytes_by_origin=dict(self.bytes_by_origin),
            handoffs=0,
            sections=0,
            failures=0,
            resumed_bytes=m.size_bytes - sum(self.bytes_by_origin.values()) - self.bytes_from_peers,
            mode="prefetch",
            encrypted=True,
            bytes_from_peers=self.bytes_from_peers,
            swarm_note=self.swarm_note,
        )
