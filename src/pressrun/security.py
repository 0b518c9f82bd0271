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
- **Body limits.** Every body read from the network goes through
  :func:`read_body_limited`, which stops reading at the limit and raises
  `BodyTooLarge` with a message that names what was too large.
"""

from __future__ import annotations

import argparse
import functools
import hmac
import os
import ssl
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

TOKEN_ENV = "PRESSRUN_OPERATOR_TOKEN"
CA_FILE_ENV = "PRESSRUN_CA_FILE"
#: a token shorter than this is refused at start-up (guessable)
MIN_TOKEN_CHARS = 16

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
        token = self.operator_token
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise SecurityConfigError(
                f"the operator token must be at least {MIN_TOKEN_CHARS} characters "
                "(e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'`)"
            )

    @property
    def scheme(self) -> str:
        """``https`` with TLS, ``http`` without."""
        return "https" if self.tls_cert is not None else "http"

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The listening socket's TLS context, or None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return server_ssl_context(self.tls_cert, self.tls_key)


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context from PEM files; `SecurityConfigError` if unreadable."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise SecurityConfigError(
            f"cannot load the TLS certificate {cert} with key {key}: {err}"
        ) from None
    return context


def client_ssl_context(ca_file: Path | str | None = None) -> ssl.SSLContext:
    """A verifying client context: the system's CAs plus ``ca_file`` (or the file named
    by ``PRESSRUN_CA_FILE``), hostname checked. One shared context per CA file: making
    one reads every system CA (about 0.1 s), too slow for each connection pool."""
    extra = ca_file if ca_file is not None else os.environ.get(CA_FILE_ENV) or None
    return _client_context(None if extra is None else str(extra))


@functools.lru_cache(maxsize=8)
def _client_context(extra: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if extra is not None:
        try:
            context.load_verify_locations(cafile=extra)
        except (OSError, ssl.SSLError) as err:
            raise SecurityConfigError(f"cannot load the CA file {extra}: {err}") from None
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
