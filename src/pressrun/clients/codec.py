"""Bytes <-> the client's messages: the balancer's directive JSON and the resume state.

Pure: json only. The directive is docs/protocols.md ("Balancer HTTP"); the resume
state is the client's own sidecar file, ``LIBRARY/.partial/<issue>/state.json``:

```json
{"format": 1, "issue_id": "...", "file_name": "...", "sha256": "<whole-file hash>",
 "size_bytes": 41943040, "piece_size_bytes": 262144, "verified": [0, 1, 2]}
```

It names the manifest it belongs to by the whole-file hash, so a partial download of
an older version of an issue is never mixed with a newer one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pressrun.multicast.codec import AnnouncementFormatError, decode_carousel
from pressrun.multicast.events import CarouselPlan

STATE_FORMAT = 1


class DirectiveFormatError(ValueError):
    """The balancer's answer is not the directive JSON of docs/protocols.md."""


@dataclass(frozen=True, slots=True)
class DirectiveOrigin:
    """One origin of a directive: its name and base URL."""

    name: str
    url: str


@dataclass(frozen=True, slots=True)
class DirectiveSwarm:
    """The ``swarm`` object of a ``swarm`` directive."""

    torrent_url: str
    tracker_url: str
    info_hash: str


@dataclass(frozen=True, slots=True)
class DirectiveMulticast:
    """The ``multicast`` object of a ``multicast`` directive: where the carousel's
    signed announcements are (``GROUP:PORT``), the interface to join on, the sender's
    address (``source``: a source-specific control group is joined by it) and the AMT
    relays (``HOST[:PORT]``) a reader without a multicast route takes it through.

    ``plan``: the carousel's plan as the balancer had it from the sender (channels,
    TSI, object), which the reader joins at once. It is not signed: the first signed
    announcement confirms or replaces it (`pressrun.multicast.receiver`), and the copy
    is checked against the signed manifest whatever brought it. ``plan_error``: why a
    plan the directive carried was not taken (malformed); the reader then waits for
    the announcement, as without one."""

    control_group: str
    interface: str | None = None
    source: str | None = None
    relays: tuple[str, ...] = ()
    plan: CarouselPlan | None = None
    plan_error: str | None = None


@dataclass(frozen=True, slots=True)
class ClientDirective:
    """What the client uses of a directive: the mode and the origins, best first;
    ``swarm`` for a ``swarm`` directive (None otherwise); ``seed_swarm``: the
    issue's swarm an ``origin`` directive names, which the copy from the origins
    seeds (`pressrun.clients.origin_seed`; None otherwise)."""

    issue_id: str
    mode: str
    origins: tuple[DirectiveOrigin, ...]
    expires_in_s: float
    swarm: DirectiveSwarm | None = None
    multicast: DirectiveMulticast | None = None
    seed_swarm: DirectiveSwarm | None = None


def decode_directive(data: bytes) -> ClientDirective:
    """Parse a 200 directive answer; DirectiveFormatError on anything malformed."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DirectiveFormatError(f"the directive is not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise DirectiveFormatError("the directive is not a JSON object")
    issue_id, mode, origins = doc.get("issue_id"), doc.get("mode"), doc.get("origins")
    if not isinstance(issue_id, str) or not isinstance(mode, str):
        raise DirectiveFormatError("the directive lacks issue_id or mode")
    if not isinstance(origins, list):
        raise DirectiveFormatError("the directive's origins is not a list")
    parsed: list[DirectiveOrigin] = []
    for item in origins:
        if not isinstance(item, dict):
            raise DirectiveFormatError("an origin of the directive is not an object")
        name, url = item.get("name"), item.get("url")
        if not isinstance(name, str) or not isinstance(url, str) or not name:
            raise DirectiveFormatError("an origin of the directive lacks name or url")
        if not url.startswith(("http://", "https://")):
            raise DirectiveFormatError(f"origin {name!r} has no http(s) URL: {url!r}")
        parsed.append(DirectiveOrigin(name, url.rstrip("/")))
    expires = doc.get("expires_in_s", 0.0)
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise DirectiveFormatError("the directive's expires_in_s is not a number")
    swarm: DirectiveSwarm | None = None
    # a multicast directive may carry the swarm too: its first fallback
    if mode == "swarm" or (mode == "multicast" and doc.get("swarm") is not None):
        swarm = _decode_swarm(doc.get("swarm"))
    # an origin directive may name the issue's swarm: the origin copy seeds it
    seed_swarm = (
        _decode_swarm(doc["swarm"]) if mode == "origin" and doc.get("swarm") is not None else None
    )
    multicast: DirectiveMulticast | None = None
    if mode == "multicast":
        raw = doc.get("multicast")
        if not isinstance(raw, dict) or not isinstance(raw.get("control_group"), str):
            raise DirectiveFormatError("a multicast directive lacks multicast.control_group")
        interface = raw.get("interface")
        if interface is not None and not isinstance(interface, str):
            raise DirectiveFormatError("the directive's multicast.interface is not a string")
        source, relays = raw.get("source"), raw.get("relays") or []
        if source is not None and not isinstance(source, str):
            raise DirectiveFormatError("the directive's multicast.source is not a string")
        if not isinstance(relays, list) or not all(isinstance(r, str) for r in relays):
            raise DirectiveFormatError("the directive's multicast.relays is not a list of strings")
        plan, plan_error = _decode_plan(raw.get("plan"))
        multicast = DirectiveMulticast(
            raw["control_group"], interface, source, tuple(relays), plan, plan_error
        )
    return ClientDirective(
        issue_id, mode, tuple(parsed), float(expires), swarm, multicast, seed_swarm
    )


def _decode_plan(raw: object) -> tuple[CarouselPlan | None, str | None]:
    """A multicast directive's ``plan`` (the announcement's carousel object): the plan,
    or None and why it is not taken (a malformed plan costs the reader only the wait
    for the announcement, so it does not fail the directive)."""
    if raw is None:
        return None, None
    try:
        return decode_carousel(raw), None
    except AnnouncementFormatError as err:
        return None, f"the directive's multicast.plan is malformed ({err})"


def _decode_swarm(raw: object) -> DirectiveSwarm:
    """A directive's ``swarm`` object; DirectiveFormatError when malformed."""
    if not isinstance(raw, dict):
        raise DirectiveFormatError("a swarm directive lacks its swarm object")
    fields = [raw.get(k) for k in ("torrent_url", "tracker_url", "info_hash")]
    if not all(isinstance(v, str) and v for v in fields):
        raise DirectiveFormatError(
            "the directive's swarm lacks torrent_url, tracker_url or info_hash"
        )
    torrent_url, tracker_url, info_hash = (str(v) for v in fields)
    if not torrent_url.startswith(("http://", "https://")):
        raise DirectiveFormatError(f"the swarm's torrent_url is not http(s): {torrent_url!r}")
    return DirectiveSwarm(torrent_url, tracker_url, info_hash)


def decode_error(data: bytes) -> str | None:
    """The one-line message of an ``{"error": "..."}`` answer, or None."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return " ".join(str(doc["error"]).split())[:500]
    return None


#: a reservation token as the balancer gives it (docs/protocols.md, "Reserved starts")
_RESERVATION_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}\Z")


def decode_reservation(data: bytes) -> str | None:
    """The ``reservation`` of a 503 answer (a start the balancer reserved for this
    client: ask again after Retry-After naming it), or None."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    token = doc.get("reservation") if isinstance(doc, dict) else None
    if isinstance(token, str) and _RESERVATION_RE.match(token):
        return token
    return None


@dataclass(frozen=True, slots=True)
class ResumeState:
    """The sidecar of a partial download: which pieces of which file are verified."""

    issue_id: str
    file_name: str
    sha256: str
    size_bytes: int
    piece_size_bytes: int
    verified: frozenset[int]

    def to_json_bytes(self) -> bytes:
        """The state file's bytes."""
        doc: dict[str, Any] = {
            "format": STATE_FORMAT,
            "issue_id": self.issue_id,
            "file_name": self.file_name,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "piece_size_bytes": self.piece_size_bytes,
            "verified": sorted(self.verified),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> ResumeState | None:
        """Parse a state file; None when it is unreadable (start afresh, then)."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            return None
        try:
            verified = doc["verified"]
            state = cls(
                issue_id=str(doc["issue_id"]),
                file_name=str(doc["file_name"]),
                sha256=str(doc["sha256"]),
                size_bytes=int(doc["size_bytes"]),
                piece_size_bytes=int(doc["piece_size_bytes"]),
                verified=frozenset(int(i) for i in verified if type(i) is int),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return state

    def matches(self, issue_id: str, file_name: str, sha256: str, size: int, piece: int) -> bool:
        """True if this state belongs to exactly that manifest."""
        return (self.issue_id, self.file_name, self.sha256, self.size_bytes) == (
            issue_id,
            file_name,
            sha256,
            size,
        ) and self.piece_size_bytes == piece
