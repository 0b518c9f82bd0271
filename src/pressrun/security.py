"""What every pressrun service and client shares to stay safe on an open network.

One place for the three mechanisms docs/security.md describes, so a new service gets
them by calling three functions instead of writing its own:

- **Operator token.** Endpoints that change state or list users answer only a request
  with ``Authorization: Bearer <token>``. The token comes from ``--operator-token`` or
  the environment variable ``PRESSRUN_OPERATOR_TOKEN`` (the flag wins). Without a
  configured token those endpoints are closed (401), never open. Use
  :func:`add_security_arguments` for the flags and :func:`operator_middleware` with the
  set of protected routes.
- **TLS.** ``--tls-cert FILE --tls-key FILE`` make a service listen with TLS
  (:func:`server_ssl_context`, passed to ``web.TCPSite(..., ssl_context=...)``).
  Clients verify certificates against the system's CAs plus the file in
  ``PRESSRUN_CA_FILE`` (or ``--ca-file`` where a command has it):
  :func:`client_ssl_context` / :func:`client_connector`.
  A certificate and key renewed on disk are used from the next handshake on, and a
  CA file changed on disk is read again (:class:`ReloadingServerContext`,
  :class:`ReloadingClientContext`): no restart for a renewal.
- **Body limits.** Every body read from the network goes through
  :func:`read_body_limited` (a client reading an answer) or :func:`read_request_limited`
  (a service reading a request), which read to the end, stop at the limit and raise
  `BodyTooLarge` with a message that names what was too large. Never
  ``content.read(n)``: it answers the first buffered chunk, not n bytes.
- **Private files.** State holding names, keys or secrets (SQLite files) is created
  ``0600`` in folders created ``0700`` (:func:`private_file`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hmac
import logging
import os
import ssl
import stat
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

TOKEN_ENV = "PRESSRUN_OPERATOR_TOKEN"
CA_FILE_ENV = "PRESSRUN_CA_FILE"
#: a token shorter than this is refused at start-up (guessable)
MIN_TOKEN_CHARS = 16
#: how often (at most) a TLS context looks at its files' mtimes again: once a second
#: costs one stat(2) per file per second of handshakes, and a renewal is in use within it
RELOAD_CHECK_S = 1.0

log = logging.getLogger("pressrun.security")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SecurityConfigError(ValueError):
    """A flag or environment variable of the security settings is unusable."""


@dataclass(frozen=True, slots=True)
class ServiceSecurity:
    """A service's TLS files and operator token (all optional).

    tls_cert, tls_key: PEM certificate chain and private key; both or neither.
    operator_token: the bearer token of the operator endpoints; None closes them.
    """

    tls_cert: Path | None = None
    tls_key: Path | None = None
    operator_token: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SecurityConfigError("--tls-cert and --tls-key go together: give both or neither")
        if self.operator_token is not None:
            check_operator_token(self.operator_token)

    @property
    def scheme(self) -> str:
        """``https`` with TLS, ``http`` without."""
        return "https" if self.tls_cert is not None else "http"

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The listening socket's TLS context, or None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return server_ssl_context(self.tls_cert, self.tls_key)


def check_operator_token(token: str) -> str:
    """The one token rule of every service: at least `MIN_TOKEN_CHARS` characters.

    Returns the token; raises `SecurityConfigError` (a ValueError) with what to do."""
    if len(token) < MIN_TOKEN_CHARS:
        raise SecurityConfigError(
            f"the operator token must be at least {MIN_TOKEN_CHARS} characters "
            "(e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'`)"
        )
    return token


def _file_stamp(*paths: Path) -> tuple[tuple[int, int, int], ...] | None:
    """What changes when a file is renewed: (mtime, size, inode) of each; None if one
    cannot be read (a renewal half done: keep what is loaded)."""
    try:
        return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in (os.stat(p) for p in paths))
    except OSError:
        return None


class _FileWatch:
    """Whether some files changed since they were last loaded, looked at no more often
    than once per `RELOAD_CHECK_S` (a monotonic clock: this is an adapter)."""

    def __init__(self, *paths: Path) -> None:
        self.paths = paths
        self.loaded = _file_stamp(*paths)
        self._next_check = time.perf_counter() + RELOAD_CHECK_S

    def changed(self) -> tuple[tuple[int, int, int], ...] | None:
        """The files' new stamp when they changed since the last load, else None."""
        now = time.perf_counter()
        if now < self._next_check:
            return None
        self._next_check = now + RELOAD_CHECK_S
        stamp = _file_stamp(*self.paths)
        if stamp is None or stamp == self.loaded:
            return None
        return stamp


def _plain_server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def _plain_client_context(ca_file: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=ca_file)
    return context


class _ReloadingContext(ssl.SSLContext):
    """An `ssl.SSLContext` that hands every new connection to the context made from its
    files as they are now: at most once per `RELOAD_CHECK_S`, before a connection,
    their mtimes are looked at and, when they changed, a new context is made from
    them; connections already open keep theirs.

    asyncio makes every connection's TLS object with ``wrap_bio`` (``wrap_socket`` for
    blocking sockets): both go to the current context. Files that do not load (a
    certificate renewed but its key not yet, a CA file half written) leave the
    current context in use, log a WARNING and are tried again at the next check.
    """

    _paths: tuple[Path, ...]
    _watch: _FileWatch
    _current: ssl.SSLContext | None

    def _make(self) -> ssl.SSLContext:
        raise NotImplementedError

    def _describe(self) -> str:
        raise NotImplementedError

    def _start_watching(self, *paths: Path) -> None:
        self._paths = paths
        self._watch = _FileWatch(*paths)
        self._current = None  # None: this context itself (loaded at start)

    def reload_if_changed(self) -> bool:
        """Make a new context if the files changed; True when one is now in use."""
        stamp = self._watch.changed()
        if stamp is None:
            return False
        try:
            fresh = self._make()
        except (OSError, ssl.SSLError) as err:
            log.warning(
                "%s changed but does not load (%s); the previous one stays in use until it does",
                self._describe(),
                err,
            )
            return False
        self._current = fresh
        self._watch.loaded = stamp
        log.info("%s read again: new connections use it", self._describe())
        return True

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        """`ssl.SSLContext.wrap_bio` of the current context, after a look at the files."""
        self.reload_if_changed()
        if self._current is not None:
            return self._current.wrap_bio(*args, **kwargs)
        return super().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        """`ssl.SSLContext.wrap_socket` of the current context, after a look."""
        self.reload_if_changed()
        if self._current is not None:
            return self._current.wrap_socket(*args, **kwargs)
        return super().wrap_socket(*args, **kwargs)


class ReloadingServerContext(_ReloadingContext):
    """A TLS 1.2+ server context whose certificate chain and key are read again when
    their files change on disk (a renewal by certbot, an operator's ``cp``): the next
    handshake presents the new certificate, no restart needed."""

    def setup(self, cert: Path, key: Path) -> None:
        """Load the pair the first time (`SecurityConfigError` when it does not load)."""
        self.minimum_version = ssl.TLSVersion.TLSv1_2
        self._start_watching(Path(cert), Path(key))
        try:
            self.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as err:
            raise SecurityConfigError(
                f"cannot load the TLS certificate {cert} with key {key}: {err}"
            ) from None

    def _make(self) -> ssl.SSLContext:
        return _plain_server_context(*self._paths)

    def _describe(self) -> str:
        return f"the TLS certificate {self._paths[0]} with key {self._paths[1]}"


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context from PEM files that follows their renewal on disk
    (`ReloadingServerContext`); `SecurityConfigError` if unreadable."""
    context = ReloadingServerContext(ssl.PROTOCOL_TLS_SERVER)
    context.setup(cert, key)
    return context


class ReloadingClientContext(_ReloadingContext):
    """A verifying client context (the system's CAs plus one CA file, hostname checked)
    that reads its CA file again when it changes on disk: a CA added is trusted, and
    one removed distrusted, from the next connection on."""

    def setup(self, ca_file: Path | None) -> None:
        """Load the system's CAs and ``ca_file`` (`SecurityConfigError` if unreadable)."""
        self.load_default_certs(ssl.Purpose.SERVER_AUTH)
        self._start_watching(*(() if ca_file is None else (ca_file,)))
        if ca_file is not None:
            try:
                self.load_verify_locations(cafile=ca_file)
            except (OSError, ssl.SSLError) as err:
                raise SecurityConfigError(f"cannot load the CA file {ca_file}: {err}") from None

    def reload_if_changed(self) -> bool:
        """Read the CA file again if it changed (no file: nothing to do)."""
        return bool(self._paths) and super().reload_if_changed()

    def _make(self) -> ssl.SSLContext:
        return _plain_client_context(self._paths[0])

    def _describe(self) -> str:
        return f"the CA file {self._paths[0]}"


def client_ssl_context(ca_file: Path | str | None = None) -> ssl.SSLContext:
    """A verifying client context: the system's CAs plus ``ca_file`` (or the file named
    by ``PRESSRUN_CA_FILE``), hostname checked, the CA file read again when it changes
    (`ReloadingClientContext`). One shared context per CA file: making one reads every
    system CA (about 0.1 s), too slow for each connection pool."""
    extra = ca_file if ca_file is not None else os.environ.get(CA_FILE_ENV) or None
    return _client_context(None if extra is None else str(extra))


@functools.lru_cache(maxsize=8)
def _client_context(extra: str | None) -> ssl.SSLContext:
    context = ReloadingClientContext(ssl.PROTOCOL_TLS_CLIENT)
    context.setup(None if extra is None else Path(extra))
    return context


def client_connector(ca_file: Path | str | None = None, **kwargs: object) -> aiohttp.TCPConnector:
    """An aiohttp connector that verifies TLS with `client_ssl_context` (keyword
    arguments go to ``TCPConnector``)."""
    return aiohttp.TCPConnector(ssl=client_ssl_context(ca_file), **kwargs)  # type: ignore[arg-type]


def add_security_arguments(parser: argparse.ArgumentParser, *, token: bool = True) -> None:
    """Add ``--tls-cert``, ``--tls-key`` and (with ``token``) ``--operator-token``."""
    parser.add_argument(
        "--tls-cert", type=Path, default=None, metavar="PEM", help="serve HTTPS with this cert"
    )
    parser.add_argument(
        "--tls-key", type=Path, default=None, metavar="PEM", help="private key of --tls-cert"
    )
    if token:
        parser.add_argument(
            "--operator-token",
            default=None,
            metavar="TOKEN",
            help=f"bearer token of the operator endpoints (default: ${TOKEN_ENV}; "
            "unset: those endpoints answer 401)",
        )


def security_from_args(args: argparse.Namespace) -> ServiceSecurity:
    """The `ServiceSecurity` of parsed `add_security_arguments` flags (env fallback)."""
    token = getattr(args, "operator_token", None) or os.environ.get(TOKEN_ENV) or None
    return ServiceSecurity(args.tls_cert, args.tls_key, token)


def operator_middleware(
    token: str | None,
    protected: Collection[str],
    *,
    refuse: Callable[[str], web.StreamResponse] | None = None,
) -> Middleware:
    """An aiohttp middleware guarding the routes whose resource pattern (e.g.
    ``/v1/swarms/{info_hash}``) is in ``protected``: 401 unless the request carries
    ``Authorization: Bearer <token>``. With ``token`` None they always answer 401.

    ``refuse`` builds the refusal from its message, for a service whose errors have a
    shape of their own (it should answer 401 with `UNAUTHORIZED_HEADERS`); default
    ``{"error": message}``."""
    expected = token.encode() if token is not None else None
    guarded = frozenset(protected)
    unauthorized = refuse or _unauthorized

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route
        resource = route.resource
        if resource is None or resource.canonical not in guarded:
            return await handler(request)
        if expected is None:
            return unauthorized(
                "this operator endpoint is closed: the service was started without an "
                f"operator token (--operator-token or ${TOKEN_ENV})"
            )
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), expected):
            return unauthorized(
                "this operator endpoint needs the header 'Authorization: Bearer <token>'"
            )
        return await handler(request)

    return guard


#: the headers of every 401 the operator guard answers
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="pressrun operator"'}


def _unauthorized(message: str) -> web.Response:
    return web.json_response({"error": message}, status=401, headers=UNAUTHORIZED_HEADERS)


def bearer(token: str) -> dict[str, str]:
    """The request header an operator client sends."""
    return {"Authorization": f"Bearer {token}"}


class BodyTooLarge(Exception):
    """A body read from the network passed its size limit (reading stopped there)."""

    def __init__(self, what: str, limit: int, declared: int | None = None) -> None:
        size = f"declares {declared} bytes" if declared is not None else "is"
        super().__init__(f"{what} {size}: more than {limit} bytes (the limit); cut off")
        self.what = what
        self.limit = limit


async def read_body_limited(
    resp: aiohttp.ClientResponse,
    limit: int,
    what: str,
    *,
    chunk_bytes: int = 65536,
    on_chunk: Callable[[int], None] | None = None,
) -> bytes:
    """The whole body of ``resp``, or `BodyTooLarge` as soon as it passes ``limit``
    bytes (a ``Content-Length`` above the limit is refused before reading).
    ``on_chunk``: called with each chunk's size as it arrives (progress)."""
    declared = resp.content_length
    if declared is not None and declared > limit:
        resp.close()
        raise BodyTooLarge(what, limit, declared)
    chunks: list[bytes] = []
    size = 0
    while chunk := await resp.content.read(chunk_bytes):
        size += len(chunk)
        if size > limit:
            resp.close()
            raise BodyTooLarge(what, limit)
        chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(len(chunk))
    return b"".join(chunks)


async def read_request_limited(request: web.Request, limit: int, what: str) -> bytes:
    """The whole body of a request a service reads, or `BodyTooLarge` as soon as it
    passes ``limit`` bytes (a ``Content-Length`` above it is refused before reading).

    ``request.content.read(n)`` answers what is buffered, which is the whole body only
    when it came in one segment: a body sent in two (a slow client, chunked encoding)
    was cut."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(what, limit, declared)
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(what, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def private_file(path: Path | str) -> Path:
    """Make ``path`` a file only its owner can read: its missing folders are created
    ``0700``, the file ``0600`` from its first byte (an empty file when missing), and an
    existing file readable by others, with SQLite's ``-wal``/``-shm``/``-journal``
    files beside it, is narrowed to ``0600`` (a WARNING says so).

    Call it before ``sqlite3.connect``: SQLite gives the files it creates beside a
    database the database file's mode. ``:memory:`` and ``""`` are left alone."""
    p = Path(path)
    if str(path) in (":memory:", ""):
        return p
    missing: list[Path] = []
    parent = p.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for f in (p, *(p.with_name(p.name + s) for s in ("-wal", "-shm", "-journal"))):
        try:
            mode = stat.S_IMODE(os.stat(f).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            os.chmod(f, 0o600)
            log.warning("%s was readable by other users (mode %o): now 0600", f, mode)
    return p
