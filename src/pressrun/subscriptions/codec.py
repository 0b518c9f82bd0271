"""Pure parts of the subscription service: challenge tokens, request bodies, errors.

A subscriber proves it holds the secret key of its X25519 public key by opening a
challenge sealed to that key (docs/protocols.md, "Subscription service HTTP"). The
challenge carries a token the service can check without remembering it:

    token = public_key (32) || expires_at (u64 big-endian Unix seconds)
            || HMAC-SHA256(secret, "pressrun-wrap-token-v1" || public_key || expires_at)

Pure: hmac, hashlib, struct and json only; the wall-clock time comes in as ``now_unix``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any

from pressrun.content.codec import is_hex, valid_issue_id

TOKEN_CONTEXT = b"pressrun-wrap-token-v1"
GRANT_CONTEXT = b"pressrun-device-grant-v1"
GRANT_NONCE_BYTES = 16
PUBLIC_KEY_BYTES = 32
TOKEN_BYTES = PUBLIC_KEY_BYTES + 8 + 32
WRAP_BYTES = 80
MAX_NAME_CHARS = 200


class RequestError(Exception):
    """A request the service refuses: HTTP status, a machine code and one line;
    ``extra`` fields join the JSON body (an embargo's ``release_at``), ``headers`` the
    answer (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON of the answer."""
        return {**self.extra, **error_body(self.message, self.code)}


def error_body(message: str, code: str) -> dict[str, str]:
    """The JSON of every error answer."""
    return {"error": message, "code": code}


def make_token(secret: bytes, public_key: bytes, expires_at: int) -> bytes:
    """A token for ``public_key`` valid until ``expires_at`` (Unix seconds)."""
    when = struct.pack(">Q", expires_at)
    mac = hmac.new(secret, TOKEN_CONTEXT + public_key + when, hashlib.sha256).digest()
    return public_key + when + mac


def check_token(secret: bytes, token: bytes, *, now_unix: float) -> bytes:
    """The subscriber public key a token was made for; RequestError 401 if it is not good."""
    if len(token) != TOKEN_BYTES:
        raise RequestError(401, "bad_token", f"the token must be {TOKEN_BYTES} bytes")
    public_key, when = token[:PUBLIC_KEY_BYTES], token[PUBLIC_KEY_BYTES : PUBLIC_KEY_BYTES + 8]
    if not hmac.compare_digest(make_token(secret, public_key, struct.unpack(">Q", when)[0]), token):
        raise RequestError(401, "bad_token", "the token was not issued by this service")
    if struct.unpack(">Q", when)[0] <= now_unix:
        raise RequestError(401, "bad_token", "the token has expired; ask for a new challenge")
    return public_key


def make_grant(secret: bytes, device_key: bytes, expires_at: int, nonce: bytes) -> bytes:
    """A link grant (issue 31): ``device_key`` (a subscriber's device, which asked
    with its token) lets one new device register under its subscriber until
    ``expires_at``; ``nonce`` makes it spendable once.

    ``grant = device_key (32) || expires_at (u64) || nonce (16) || HMAC-SHA256(secret,
    GRANT_CONTEXT || the rest)``; it holds no key but public ones.
    """
    body = device_key + struct.pack(">Q", expires_at) + nonce
    return body + hmac.new(secret, GRANT_CONTEXT + body, hashlib.sha256).digest()


def check_grant(secret: bytes, grant: bytes, *, now_unix: float) -> tuple[bytes, int, bytes]:
    """``(device_key, expires_at, nonce)`` of a good grant; RequestError 403 if not."""
    if len(grant) != PUBLIC_KEY_BYTES + 8 + GRANT_NONCE_BYTES + 32:
        raise RequestError(403, "bad_grant", "that is not a link grant of this service")
    device_key = grant[:PUBLIC_KEY_BYTES]
    (expires_at,) = struct.unpack(">Q", grant[PUBLIC_KEY_BYTES : PUBLIC_KEY_BYTES + 8])
    nonce = grant[PUBLIC_KEY_BYTES + 8 : PUBLIC_KEY_BYTES + 8 + GRANT_NONCE_BYTES]
    if not hmac.compare_digest(make_grant(secret, device_key, expires_at, nonce), grant):
        raise RequestError(403, "bad_grant", "the link grant was not issued by this service")
    if expires_at <= now_unix:
        raise RequestError(403, "grant_expired", "the link grant has expired; make a new code")
    return device_key, int(expires_at), nonce


def bearer(header: str | None, what: str) -> str:
    """The credential of an ``Authorization: Bearer X`` header; RequestError 401 if absent."""
    if header is None:
        raise RequestError(401, "bad_token", f"send Authorization: Bearer <{what}>")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise RequestError(401, "bad_token", f"send Authorization: Bearer <{what}>")
    return value.strip()


def parse_public_key(text: object) -> bytes:
    """A subscriber public key from 64 hex characters; RequestError 400 if not."""
    if not isinstance(text, str) or not is_hex(text, 2 * PUBLIC_KEY_BYTES):
        raise RequestError(
            400, "bad_request", "a subscriber key is 64 lower-case hex characters (X25519)"
        )
    return bytes.fromhex(text)


def parse_issue_version(issue_id: str, version: str) -> tuple[str, int]:
    """Validate the ``<issue_id>/versions/<version>`` of a URL."""
    if not valid_issue_id(issue_id):
        raise RequestError(400, "bad_request", f"{issue_id[:80]!r} is not an issue id")
    if not (version.isascii() and version.isdigit()) or not 1 <= int(version) < 1 << 63:
        raise RequestError(400, "bad_request", f"version {version[:40]!r} is not an integer >= 1")
    return issue_id, int(version)


def decode_object(body: bytes) -> dict[str, Any]:
    """A JSON object request body; RequestError 400 if it is not one."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RequestError(400, "bad_request", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise RequestError(400, "bad_request", "the body must be a JSON object")
    return doc


def parse_name(doc: dict[str, Any]) -> str:
    """The ``name`` of a subscriber body (optional, default empty)."""
    name = doc.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise RequestError(
            400, "bad_request", f"name must be printable text of at most {MAX_NAME_CHARS} chars"
        )
    return name


def parse_wraps(doc: dict[str, Any]) -> dict[bytes, bytes]:
    """The ``{"wraps": {public_key: wrap}}`` body of a wrap upload."""
    wraps = doc.get("wraps")
    if not isinstance(wraps, dict):
        raise RequestError(400, "bad_request", 'the body must be {"wraps": {key: wrap, ...}}')
    out: dict[bytes, bytes] = {}
    for key, wrap in wraps.items():
        if not isinstance(wrap, str) or not is_hex(wrap, 2 * WRAP_BYTES):
            raise RequestError(
                400, "bad_request", f"the wrap for {str(key)[:64]} is not {2 * WRAP_BYTES} hex"
            )
        out[parse_public_key(key)] = bytes.fromhex(wrap)
    return out
