"""Messages into and out of the tracker core (frozen dataclasses, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class AnnounceEvent(Enum):
    """The ``event`` parameter of a BEP 3 announce; ``NONE`` is a regular update."""

    NONE = ""
    STARTED = "started"
    COMPLETED = "completed"
    STOPPED = "stopped"


class LeaveRule(Enum):
    """Why a peer left a swarm.

    The first four come from the peer itself in the pressrun extension parameter
    ``leave_rule`` of its ``stopped`` announce (the fair-exit rule of
    004_3e4b985b4cf14853.txt, III.A, and its two escape hatches); the last two are
    the tracker's own: a ``stopped`` without the parameter (third-party clients), a
    peer that stopped announcing and expired, and a fair rule the swarm's own totals
    cannot support (``claim_refused``: e.g. ``ratio`` with more uploaded than the
    other peers could have downloaded; see core.supported_rule).
    """

    RATIO = "ratio"
    NOT_NEEDED = "not_needed"
    MAX_SEED_TIME = "max_seed_time"
    USER = "user"
    UNSPECIFIED = "unspecified"
    EXPIRED = "expired"
    CLAIM_REFUSED = "claim_refused"

    @property
    def fair(self) -> bool:
        """Whether leaving by this rule counts as leaving fairly."""
        return self in (LeaveRule.RATIO, LeaveRule.NOT_NEEDED)


# The values a peer may send in ``leave_rule=`` (the tracker assigns the others).
PEER_LEAVE_RULES = frozenset(
    {LeaveRule.RATIO, LeaveRule.NOT_NEEDED, LeaveRule.MAX_SEED_TIME, LeaveRule.USER}
)


class AddressFamily(Enum):
    """IP version of a peer's address; a peer is keyed by (peer_id, family)."""

    IPV4 = 4
    IPV6 = 6


@dataclass(frozen=True, slots=True)
class AnnounceRequest:
    """One validated ``GET /announce`` (BEP 3), as the codec parsed it.

    ``numwant`` is what the client asked for (``None`` when absent); the core caps it.
    ``ip`` is the ``ip=`` parameter as given; the adapter decides whether to trust it.
    ``key`` is the BEP 7 session key (as hex of the bytes sent), used to tell a
    restarted client from a continuing one. ``leave_rule`` is the pressrun extension on ``stopped``.
    """

    info_hash: bytes
    peer_id: bytes
    port: int
    uploaded: int
    downloaded: int
    left: int
    event: AnnounceEvent = AnnounceEvent.NONE
    compact: bool = True
    numwant: int | None = None
    ip: str | None = None
    key: str | None = None
    leave_rule: LeaveRule | None = None


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """Everything the tracker keeps about one peer in one swarm (one issue).

    A record outlives the peer's presence: after it stops or expires, ``active`` is
    false and its totals and leave rule stay, so a later session accumulates onto
    them and ``/v1/swarms`` can say how it left.

    ``session_uploaded``/``session_downloaded`` are the cumulative counters of the
    client's current session as last announced (BEP 3 counters restart at zero with
    each client session); ``uploaded_total``/``downloaded_total`` accumulate across
    sessions (see accounting.accumulate for the rule). ``last_seen`` is in the same clock
    as the core's ``now``. ``version`` increases with every change, so a shared store
    can refuse a stale write.
    """

    info_hash: bytes
    peer_id: bytes
    family: AddressFamily
    ip: str
    port: int
    left: int
    uploaded_total: int
    downloaded_total: int
    session_uploaded: int
    session_downloaded: int
    session_key: str | None
    active: bool
    session_stopped: bool
    completed_count: int
    first_seen: float
    last_seen: float
    leave_rule: LeaveRule | None = None
    left_at: float | None = None
    version: int = 0

    @property
    def peer_key(self) -> tuple[bytes, AddressFamily]:
        """The key a swarm files this peer under."""
        return (self.peer_id, self.family)

    @property
    def is_seed(self) -> bool:
        """An active peer with nothing left to download."""
        return self.active and self.left == 0


@dataclass(frozen=True, slots=True)
class PeerContact:
    """A peer as handed out in an announce answer."""

    peer_id: bytes
    ip: str
    port: int
    family: AddressFamily


@dataclass(frozen=True, slots=True)
class AnnounceReply:
    """The answer to a good announce (encoded by codec.encode_announce_reply)."""

    interval_s: int
    min_interval_s: int
    complete: int
    incomplete: int
    peers: tuple[PeerContact, ...]
    compact: bool


@dataclass(frozen=True, slots=True)
class SwarmStats:
    """Counts and totals of one swarm, for scrape, ``/v1/swarms`` and metrics."""

    info_hash: bytes
    seeds: int
    leechers: int
    completed: int
    uploaded_bytes: int
    downloaded_bytes: int
    left_by_rule: dict[str, int]
    left_fairly: int
    needs_seeds: bool


@dataclass(frozen=True, slots=True)
class TrackerEvent:
    """A notable announce or expiry, kept in the store's event log."""

    at: float
    info_hash: bytes
    peer_id: bytes
    family: AddressFamily
    event: str
    uploaded_total: int
    downloaded_total: int
    left: int
    leave_rule: LeaveRule | None = None
