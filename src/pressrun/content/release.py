"""The embargo of an encrypted issue version: signed release notices (issue 35).

``pressrun publish --encrypt --release-at TIME`` writes the release time into the
signed manifest (``encryption.release_at``) and gives the subscription service a
*release notice* signed with the same publisher key; the service hands out no wrap of
that version before the notice's time (docs/protocols.md, "Encrypted issues",
"Embargo"). ``pressrun release move`` / ``revoke`` sign a later notice: a notice
replaces only one of the same issue version with a lower ``sequence``, signed by the
same publisher key.

The notice's JSON (``release`` below) is signed over its canonical bytes, the same
``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` rule
as the manifest::

    {"release": {"type": "pressrun-release-v1", "issue_id": "weekly-2026-48",
                 "version": 3, "release_at": "2026-11-28T06:00:00Z" | null,
                 "revoked": false, "sequence": 1, "publisher_key": "<64 hex>",
                 "signed_at": "2026-11-28T02:00:00Z"},
     "signature": "<128 hex>"}

A revoked notice has ``revoked: true`` and ``release_at: null``: no wrap of that
version is handed out until a later notice sets a time again.

Pure but for Ed25519 (PyNaCl): the wall-clock time comes in as ``now_unix``.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import nacl.signing

from pressrun.content.codec import (
    CREATED_AT_RE,
    ManifestError,
    canonical_json,
    is_hex,
    valid_issue_id,
)
from pressrun.content.manifest import verify_signature

__all__ = [
    "RELEASE_TYPE",
    "ReleaseError",
    "ReleaseNotice",
    "SignedRelease",
    "parse_release_time",
    "sign_release",
    "unix_of",
    "utc_text",
]

RELEASE_TYPE = "pressrun-release-v1"
_FIELDS = (
    "type",
    "issue_id",
    "version",
    "release_at",
    "revoked",
    "sequence",
    "publisher_key",
    "signed_at",
)
_DURATION = re.compile(r"\+(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ReleaseError(ManifestError):
    """A release notice or release time that cannot be used (one line for a person)."""


def utc_text(unix: float) -> str:
    """``2026-11-28T06:00:00Z`` for Unix seconds (whole seconds, rounded down)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(unix)))


def unix_of(text: str) -> int:
    """Unix seconds of a ``2026-11-28T06:00:00Z`` time; ReleaseError if not one."""
    if not CREATED_AT_RE.fullmatch(text):
        raise ReleaseError(f"{text[:40]!r} is not a UTC time like 2026-11-28T06:00:00Z")
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        raise ReleaseError(f"{text!r} is not a real date and time") from None


def parse_release_time(text: str, *, now_unix: float) -> str:
    """A ``--release-at`` value as the manifest's UTC text.

    Accepted: ``2026-11-28T06:00:00Z``, the same with an offset
    (``2026-11-28T07:00:00+01:00``; seconds optional), or a delay from now
    (``+90s``, ``+30m``, ``+2h``, ``+1d``). ReleaseError with an example if not.
    """
    text = text.strip()
    m = _DURATION.fullmatch(text)
    if m is not None:
        return utc_text(now_unix + float(m[1]) * _UNIT_S[m[2]])
    iso = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})(:\d{2})?(Z|[+-]\d{2}:?\d{2})", text)
    if iso is None:
        raise ReleaseError(
            f"release time {text[:40]!r} is neither a time with its zone "
            "(2026-11-28T06:00:00Z, 2026-11-28T07:00+01:00) nor a delay (+2h, +30m, +90s)"
        )
    day, hm, sec, zone = iso[1], iso[2], iso[3] or ":00", iso[4]
    base = unix_of(f"{day}T{hm}{sec}Z")
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        base -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return utc_text(base)


@dataclass(frozen=True)
class ReleaseNotice:
    """When the wraps of one issue version may be handed out (module docstring)."""

    issue_id: str
    version: int
    release_at: str | None  # UTC text; None only when revoked
    revoked: bool
    sequence: int  # >= 1; a notice replaces only a lower one of the same version
    publisher_key: str  # 64 hex, Ed25519
    signed_at: str

    def __post_init__(self) -> None:
        if not valid_issue_id(self.issue_id):
            raise ReleaseError(f"{self.issue_id[:80]!r} is not an issue id")
        if not 1 <= self.version < 1 << 63 or not 1 <= self.sequence < 1 << 63:
            raise ReleaseError("release version and sequence must be integers from 1")
        if self.revoked != (self.release_at is None):
            raise ReleaseError("a release notice has a time, or is revoked, not both")
        if self.release_at is not None:
            unix_of(self.release_at)
        unix_of(self.signed_at)
        if not is_hex(self.publisher_key, 64):
            raise ReleaseError("release publisher_key must be 64 lower-case hex characters")

    @functools.cached_property
    def release_at_unix(self) -> int | None:
        """The release time in Unix seconds (None when revoked); parsed once, since
        the service asks it on every wrap request."""
        return None if self.release_at is None else unix_of(self.release_at)

    def to_dict(self) -> dict[str, Any]:
        """The ``release`` object of the JSON."""
        return {
            "type": RELEASE_TYPE,
            "issue_id": self.issue_id,
            "version": self.version,
            "release_at": self.release_at,
            "revoked": self.revoked,
            "sequence": self.sequence,
            "publisher_key": self.publisher_key,
            "signed_at": self.signed_at,
        }

    def canonical_bytes(self) -> bytes:
        """The bytes the signature covers."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, d: object) -> ReleaseNotice:
        """Validate a ``release`` object; ReleaseError (one line) if it is not one."""
        if not isinstance(d, dict):
            raise ReleaseError("a release notice must be a JSON object")
        if sorted(d) != sorted(_FIELDS):
            raise ReleaseError(f"a release notice has exactly the fields {', '.join(_FIELDS)}")
        if d["type"] != RELEASE_TYPE:
            raise ReleaseError(f"release notice type {str(d['type'])[:40]!r} is not supported")
        ints = (d["version"], d["sequence"])
        if any(not isinstance(v, int) or isinstance(v, bool) for v in ints):
            raise ReleaseError("release version and sequence must be integers")
        if not isinstance(d["revoked"], bool):
            raise ReleaseError("release revoked must be true or false")
        texts = (d["issue_id"], d["publisher_key"], d["signed_at"])
        if any(not isinstance(v, str) for v in texts) or not (
            d["release_at"] is None or isinstance(d["release_at"], str)
        ):
            raise ReleaseError("release issue_id, publisher_key, signed_at must be strings")
        return cls(
            issue_id=d["issue_id"],
            version=d["version"],
            release_at=d["release_at"],
            revoked=d["revoked"],
            sequence=d["sequence"],
            publisher_key=d["publisher_key"],
            signed_at=d["signed_at"],
        )


@dataclass(frozen=True)
class SignedRelease:
    """A release notice and its Ed25519 signature."""

    notice: ReleaseNotice
    signature: bytes

    def to_json(self) -> dict[str, Any]:
        """``{"release": {...}, "signature": hex}``."""
        return {"release": self.notice.to_dict(), "signature": self.signature.hex()}

    @classmethod
    def from_json(cls, doc: object) -> SignedRelease:
        """Parse (not verify) ``{"release": ..., "signature": ...}``; ReleaseError if bad."""
        if not isinstance(doc, dict) or sorted(doc) != ["release", "signature"]:
            raise ReleaseError('a signed release is {"release": {...}, "signature": "<hex>"}')
        sig = doc["signature"]
        if not isinstance(sig, str) or not is_hex(sig, 128):
            raise ReleaseError("a release signature is 128 lower-case hex characters")
        return cls(ReleaseNotice.from_dict(doc["release"]), bytes.fromhex(sig))

    def verify(self, trusted_keys: Collection[bytes] | None = None) -> ReleaseNotice:
        """Check the signature against the notice's publisher key (and, if given, that
        the key is one of ``trusted_keys``); the notice, or ReleaseError."""
        key = bytes.fromhex(self.notice.publisher_key)
        try:
            verify_signature(self.notice.canonical_bytes(), self.signature, key)
        except ManifestError:
            raise ReleaseError(
                "the release notice's signature does not match it (tampered, or signed "
                "with another key)"
            ) from None
        if trusted_keys is not None and key not in {bytes(k) for k in trusted_keys}:
            raise ReleaseError(
                f"the release notice is signed by {self.notice.publisher_key[:16]}..., "
                "which is not a trusted publisher"
            )
        return self.notice


def sign_release(notice: ReleaseNotice, signing_key: nacl.signing.SigningKey) -> SignedRelease:
    """Sign a notice with the publisher's key (which the notice must name)."""
    if bytes(signing_key.verify_key).hex() != notice.publisher_key:
        raise ReleaseError("the release notice names another publisher key than the signer's")
    return SignedRelease(notice, bytes(signing_key.sign(notice.canonical_bytes()).signature))
