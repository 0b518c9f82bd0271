"""Messages into and out of the balancer core (frozen dataclasses, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from pressrun.multicast.events import CarouselPlan


@dataclass(frozen=True, slots=True)
class OriginSpec:
    """An origin the operator configured: its name, base URL and static weight."""

    name: str
    url: str
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class OriginStatus:
    """One report of an origin's status agent (000_9aae53f3113e9bd8.txt, section 4).

    Fractions are 0..1 of the resource in use; bandwidths are bytes per second.
    """

    name: str
    cpu_fraction: float
    ram_fraction: float
    out_bytes_per_s: float
    capacity_bytes_per_s: float
    active_transfers: int = 0
    issues: frozenset[str] = frozenset()
    cached_issues: frozenset[str] = frozenset()
    mean_transfer_bytes_per_s: float | None = None
    mean_transfer_bytes_per_s_by_issue: Mapping[str, float] = field(default_factory=dict)
    #: active transfers per issue (empty when the agent does not report them)
    active_transfers_by_issue: Mapping[str, int] = field(default_factory=dict)
    #: transfers started since the origin started (a counter; None when the agent does
    #: not report it), and per issue: how many picks have reached the origin since a
    #: status
    transfers_total: int | None = None
    transfers_total_by_issue: Mapping[str, int] = field(default_factory=dict)


class DeliveryMode(Enum):
    """How a client is told to fetch an issue (ARCHITECTURE.md, the directive)."""

    ORIGIN = "origin"
    SWARM = "swarm"
    MULTICAST = "multicast"


class RequestClass(Enum):
    """What a request is for, which decides how the balancer places it and how an
    origin serves it (docs/balancer.md, "Request classes"; the content-aware classes
    of LVS-CAD, 001_524169374db25375.txt)."""

    #: small, latency-bound objects: manifests, torrents, covers, subscription wraps
    SMALL = "small"
    #: the new issue, asked for by a crowd at once (bulk, with a deadline)
    CROWD = "crowd"
    #: the back catalogue: issues only some origins hold and a few readers ask for
    CATALOGUE = "catalogue"


@dataclass(frozen=True, slots=True)
class RankedOrigin:
    """An origin in a directive, with the score it had when ranked."""

    name: str
    url: str
    score: float


@dataclass(frozen=True, slots=True)
class SwarmInfo:
    """What a client needs to join an issue's swarm."""

    torrent_url: str
    tracker_url: str
    info_hash: str
    #: the issue's file name (the manifest's), for web-seed URLs; None: not known
    file_name: str | None = None
    #: for a browser reader (``peer=webrtc``): the tracker's WebSocket route and the
    #: origins as web seeds (docs/protocols.md); None / empty for everyone else
    webtorrent_url: str | None = None
    web_seeds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MulticastInfo:
    """What a client needs to receive an issue's carousel: the control group
    (``GROUP:PORT``) whose signed announcements name the channels, the interface
    hint to join on, the sender's address (``source``: a source-specific control
    group, 232/8, is joined by it) and the AMT relays (``HOST[:PORT]``, RFC 7450) that
    readers without a multicast route take the carousel through (docs/multicast.md).
    ``plan``: the carousel's plan as the sender's control API listed it last (its
    channels, TSI and object, no packet counters); the directive carries it so the
    reader joins at once, not at the next announcement. None while not known."""

    control_group: str
    interface: str | None = None
    source: str | None = None
    relays: tuple[str, ...] = ()
    plan: CarouselPlan | None = None


@dataclass(frozen=True, slots=True)
class Directive:
    """The balancer's answer: how to fetch an issue, in preference order."""

    issue_id: str
    mode: DeliveryMode
    origins: tuple[RankedOrigin, ...]
    swarm: SwarmInfo | None
    fallbacks: tuple[DeliveryMode, ...]
    expires_in_s: float
    algorithm: str
    multicast: MulticastInfo | None = None
    #: the class the request was placed as
    request_class: RequestClass = RequestClass.CROWD


class Refusal(Enum):
    """Why no directive could be given."""

    UNKNOWN_ISSUE = "unknown_issue"
    NO_ORIGIN_UP = "no_origin_up"
    ALL_FULL = "all_full"
    #: no room now, a later start reserved: come back then (`NoDirective.reservation`)
    RESERVED = "reserved"


@dataclass(frozen=True, slots=True)
class NoDirective:
    """A refusal: the reason, a one-line message for a person, when to retry.

    With `reservation` (reason `Refusal.RESERVED`), the balancer holds room for the
    client from `retry_after_s` from now: it comes back then and names the reservation
    (`DirectiveRequested.reservation`), and is placed on the reserved origin
    (docs/balancer.md, "Reserved starts")."""

    issue_id: str
    reason: Refusal
    message: str
    retry_after_s: float
    reservation: str | None = None


# --- inputs -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusReceived:
    """A poll of an origin's /stats answered."""

    status: OriginStatus


@dataclass(frozen=True, slots=True)
class PollFailed:
    """A poll of an origin's /stats failed (timeout, refused, malformed)."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClientHint:
    """What a downloading client tells the balancer of itself (``have=``, ``size=``,
    ``rate=`` of a directive request, docs/protocols.md): the bytes of the issue's file
    it already holds (it resumes where it stopped), the file's size, and its own recent
    download rate (bytes/s, the best it measured lately: what its link carries).

    `have_bytes` <= `size_bytes`; `size_bytes` is None when the client does not know
    it yet (no manifest), and `rate_bytes_per_s` None when it has no measure.
    """

    have_bytes: int = 0
    size_bytes: int | None = None
    rate_bytes_per_s: float | None = None
    elapsed_s: float | None = None


@dataclass(frozen=True, slots=True)
class DirectiveRequested:
    """A client asks how to fetch an issue; `failed` names origins it could not use;
    `client` is what it told of itself (None: nothing); `address` is where the request
    came from as the adapter saw it (None: unknown, e.g. in the simulator);
    `request_class` what the request is for (``class=``; None: the core classifies it,
    `BalancerCore.classify`)."""

    issue_id: str
    failed: frozenset[str] = frozenset()
    client: ClientHint | None = None
    address: str | None = None
    request_class: RequestClass | None = None
    #: the client is a browser reader that trades pieces over WebRTC (``peer=webrtc``)
    webrtc: bool = False
    #: the reservation a refusal gave it (``reservation=``; None: none)
    reservation: str | None = None


# --- effects ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PollOrigin:
    """Effect: fetch this origin's status now and feed the answer back."""

    name: str
    url: str


@dataclass(frozen=True, slots=True)
class OriginWentDown:
    """Notification: an origin left the rotation."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class OriginCameBack:
    """Notification: an origin answered again and is back in rotation."""

    name: str


Effect = PollOrigin | OriginWentDown | OriginCameBack
