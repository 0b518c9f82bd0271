"""The state one download shares between its stages, and its talk to the balancer.

`FetchState` holds what the stages of :func:`pressrun.clients.aio.fetch_issue` share
(the session, the origins the balancer named, the bytes per origin, the progress
object) and does the small requests: a directive (``GET /v1/issues/<id>/directive``,
naming failed origins in ``failed=``) and a small body (the manifest, a ``.torrent``).
The stages are :mod:`.manifest_fetch`, :mod:`.multicast_receive`,
:mod:`.swarm_handoff` and :mod:`.sections`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import aiohttp

from pressrun.clients.codec import (
    ClientDirective,
    DirectiveFormatError,
    ResumeState,
    decode_directive,
    decode_error,
    decode_reservation,
)
from pressrun.clients.config import ClientConfig
from pressrun.clients.core import DownloadPlan
from pressrun.clients.events import DownloadGaveUp, Event, OriginFailed
from pressrun.clients.library import Library
from pressrun.content.manifest import Manifest
from pressrun.security import BodyTooLarge, read_body_limited

if TYPE_CHECKING:
    import nacl.public

    from pressrun.clients.carousel_share import CarouselShare
    from pressrun.clients.carousel_switch import SwarmRates
    from pressrun.peer.aio import SwarmPeer
    from pressrun.peer.results import SwarmProgress

__all__ = ["DirectiveUnavailable", "FetchError", "FetchState", "Progress", "describe", "still_good"]

log = logging.getLogger("pressrun.clients")

#: a directive is a few hundred bytes; a balancer answering more is cut off
MAX_DIRECTIVE_BYTES = 1 << 20


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


class DirectiveUnavailable(Exception):
    """No usable directive now; ``refused``: the balancer's 503 (no origin left)."""

    def __init__(
        self,
        reason: str,
        *,
        retry_after_s: float | None = None,
        refused: bool = False,
        reservation: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.refused = refused
        #: a start the balancer reserved (its 503 named one): wait, then ask with it
        self.reservation = reservation


def describe(err: BaseException) -> str:
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


class _NextBalancer(DirectiveUnavailable):
    """This balancer could not answer (refused connection, timeout, 5xx): ask the
    next one the client knows."""


@dataclass
class FetchState:
    """One download in progress: the state shared by its workers."""

    issue_id: str
    #: the balancer asked now (the first of `balancer_urls` that answers)
    balancer_url: str
    library: Library
    config: ClientConfig
    trusted_keys: Collection[bytes] | None
    progress: Progress | None
    session: aiohttp.ClientSession
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
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
    #: why the swarm left pieces to the origins (no torrent, a failure, a stall)
    swarm_note: str | None = None
    #: the swarm's latest progress report (while a swarm fetch runs)
    swarm_progress: SwarmProgress | None = None
    #: the swarm's measured rates (while a swarm fetch runs; `carousel_switch`)
    swarm_rates: SwarmRates | None = None
    #: the client left the swarm for the issue's carousel (`ClientConfig.
    #: carousel_control_group`), and what the swarm had brought by then
    left_for_carousel: bool = False
    left_swarm_web_seed_bytes: int = 0
    left_swarm_peer_bytes: int = 0
    #: the comparison that made it leave (`CarouselChoice.describe`)
    carousel_choice: str | None = None
    #: the carousel reader's sharing peer, joined while it received and handed to
    #: the seeding after the carousel (`carousel_share`, `swarm_handoff`)
    carousel_share: CarouselShare | None = None
    #: the manifest's whole SHA-256 once the partial file was checked whole: the
    #: carousel's object that became it (every piece and the size matched the signed
    #: manifest, `multicast_receive`; docs/multicast.md, "The decoded copy's check")
    #: or the swarm peer's final check (a completed swarm fetch, `swarm_handoff`):
    #: the final check then need not read it again
    checked_sha256: str | None = None
    #: the swarm's uploader policy (set when a swarm fetch starts) and its peer of
    #: each swarm session (their `SwarmPeer.ring_stats`: what the Chord ring answered)
    uploader_policy: str | None = None
    swarm_peers: list[SwarmPeer] = field(default_factory=list)
    #: when this process first asked the balancer for the issue (`now`)
    first_asked_at: float | None = None
    #: every balancer the client knows, in order (empty: `balancer_url` alone); a
    #: refused connection, a timeout or a 5xx moves it to the next (issue 30)
    balancer_urls: tuple[str, ...] = ()
    #: the start a balancer reserved for this download, named in the next request
    reservation: str | None = None
    #: set whenever the plan reports events (a piece verified, a section ended): an
    #: idle worker wakes on it instead of polling (`wait_changed`)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: draws the jitter of this download's retries (`ClientConfig.retry_jitter`),
    #: seeded per download by the system's randomness: clients refused together come
    #: back spread out
    rng: random.Random = field(default_factory=random.Random)

    def retry_wait_s(self, failures_in_a_row: int, retry_after_s: float | None) -> float:
        """The wait before the next attempt, jittered (`ClientConfig.backoff_s`)."""
        return self.config.backoff_s(failures_in_a_row, retry_after_s, self.rng.random())

    def now(self) -> float:
        return self.loop.time()

    def notice(self, text: str, *, level: int = logging.WARNING) -> None:
        """Tell the person (through the progress object), or log at ``level``."""
        if self.progress is not None:
            self.progress.notice(text)
        else:
            log.log(level, "%s: %s", self.issue_id, text)

    # -- balancer

    async def directive(
        self,
        failed: frozenset[str],
        *,
        have: int | None = None,
        size: int | None = None,
        rate: float | None = None,
    ) -> ClientDirective:
        """A directive; `FetchError` for a fatal answer, `DirectiveUnavailable` else.

        `have`, `size`, `rate`: the bytes of the file this client has verified, its
        size, and the best rate it has measured (bytes/s), told to the balancer with
        the seconds since this process first asked for the issue, so it counts what
        this transfer really needs (docs/protocols.md, "Balancer HTTP")."""
        params: dict[str, str] = {"failed": ",".join(sorted(failed))} if failed else {}
        now = self.now()
        if self.first_asked_at is None:
            self.first_asked_at = now
        if size is not None and size > 0:
            params["size"] = str(size)
            params["have"] = str(min(max(have or 0, 0), size))
            params["elapsed"] = f"{max(now - self.first_asked_at, 0.0):.1f}"
        if rate is not None and rate > 0:
            params["rate"] = f"{max(rate, 1.0):.0f}"
        if self.reservation is not None:
            params["reservation"], self.reservation = self.reservation, None
        urls = self.balancer_urls or (self.balancer_url,)
        start = urls.index(self.balancer_url) if self.balancer_url in urls else 0
        failures: list[DirectiveUnavailable] = []
        for step in range(len(urls)):
            base = urls[(start + step) % len(urls)]
            try:
                directive = await self._directive_from(base, params)
            except _NextBalancer as err:
                if err.reservation is not None:
                    # a start reserved on this balancer: come back to it then
                    self.balancer_url = base
                    self.reservation = err.reservation
                    raise
                failures.append(err)
                continue
            if base != self.balancer_url:
                self.notice(
                    f"{failures[-1] if failures else 'the balancer failed'}; "
                    f"asking the balancer at {base} from now on",
                    level=logging.INFO,
                )
                self.balancer_url = base
            return directive
        # every balancer failed: a refusal (503 with Retry-After) first, it says when
        refused = [f for f in failures if f.refused]
        if len(failures) == 1 or refused:
            raise (refused or failures)[0]
        raise DirectiveUnavailable("; ".join(str(f) for f in failures))

    async def _directive_from(self, base: str, params: dict[str, str]) -> ClientDirective:
        """One balancer's directive; `_NextBalancer` when it is unreachable, slow or
        answers a 5xx (another balancer may answer)."""
        url = f"{base}/v1/issues/{self.issue_id}/directive"
        timeout = aiohttp.ClientTimeout(total=self.config.balancer_timeout_s)
        try:
            async with self.session.get(url, params=params, timeout=timeout) as resp:
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
                body = await read_body_limited(resp, MAX_DIRECTIVE_BYTES, f"the directive at {url}")
        except BodyTooLarge as err:
            raise DirectiveUnavailable(str(err)) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            reason = f"the balancer at {base} is unreachable: {describe(err)}"
            raise _NextBalancer(reason) from None
        message = decode_error(body) or f"HTTP {status}"
        if status == 404:
            raise FetchError(
                f"issue {self.issue_id!r} is unknown to the balancer at {base}: {message}"
            )
        if status == 400:
            raise FetchError(f"the balancer refused the request: {message}")
        if status == 503:
            wait: float | None = None
            with contextlib.suppress(TypeError, ValueError):
                wait = max(0.0, float(retry_after))  # type: ignore[arg-type]
            raise _NextBalancer(
                f"the balancer has no origin for {self.issue_id} now: {message}",
                retry_after_s=wait,
                refused=True,
                reservation=decode_reservation(body),
            )
        if status >= 500:
            raise _NextBalancer(f"the balancer at {base} answered {message}")
        if status != 200:
            raise DirectiveUnavailable(f"the balancer answered {message}")
        try:
            directive = decode_directive(body)
        except DirectiveFormatError as err:
            raise DirectiveUnavailable(f"the balancer's answer is malformed: {err}") from None
        for origin in directive.origins:
            self.origin_urls[origin.name] = origin.url
        self.last_directive = directive
        if not directive.origins:
            raise DirectiveUnavailable(
                f"the balancer's {directive.mode!r} directive lists no origin "
                "(this client downloads from origins only)"
            )
        return directive

    async def get_small(self, url: str, limit: int) -> bytes:
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.config.connect_timeout_s,
            sock_read=self.config.stall_timeout_s,
        )
        try:
            async with self.session.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise DirectiveUnavailable(f"GET {url} answered HTTP {resp.status}")
                return await read_body_limited(resp, limit, f"GET {url}")
        except BodyTooLarge as err:
            raise DirectiveUnavailable(str(err)) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise DirectiveUnavailable(f"GET {url}: {describe(err)}") from None

    # -- bookkeeping

    def advanced(self, origin: str | None) -> None:
        if self.progress is not None:
            self.progress.advanced(self.verified_bytes + sum(self.in_progress.values()), origin)

    async def wait_changed(self, timeout_s: float) -> None:
        """Until the plan reports events, at most ``timeout_s`` (an idle worker's wait:
        the last section's end wakes it at once, so a download does not end late)."""
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.changed.wait()

    def apply(self, events: Sequence[Event]) -> None:
        self.changed.set()
        for event in events:
            if isinstance(event, OriginFailed):
                self.notice(f"origin {event.origin} failed: {event.reason}; moving on")
            elif isinstance(event, DownloadGaveUp):
                log.info("%s: %s", self.issue_id, event.reason)

    def save(self, plan: DownloadPlan, m: Manifest) -> None:
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


def still_good(m: Manifest, path: Path, indices: Sequence[int]) -> list[int]:
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
