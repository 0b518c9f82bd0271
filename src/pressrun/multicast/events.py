"""The multicast messages: the channel plan, the control-channel announcement, and
the effects of the cores (frozen dataclasses, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """One channel of a carousel: where it is sent and how fast."""

    group: str  # IPv4 multicast group
    port: int
    tsi: int  # LCT Transport Session Identifier
    rate_bps: float  # UDP payload bits/s
    packets_per_s: float  # the same rate in packets (what a receiver expects)


@dataclass(frozen=True, slots=True)
class CarouselPlan:
    """One issue's carousel as announced: what it carries and on which channels.

    ``manifest_sha256`` is the SHA-256 of the issue's signed ``manifest.json``; a
    receiver takes the file only from a carousel naming the manifest it verified.
    ``cycle_s`` is the time one channel takes to send its whole cycle; a receiver on
    one channel completes within about one cycle at the loss the plan allows.
    """

    issue_id: str
    manifest_sha256: str
    size_bytes: int
    toi: int
    fec: str
    symbol_bytes: int  # encoding symbol length
    source_symbols: int
    cycle_s: float
    channels: tuple[ChannelSpec, ...]
    #: packets each channel has sent since the carousel started, when the
    #: announcement was issued (receivers measure their loss against it)
    sent_packets: tuple[int, ...] = ()
    #: the sender's address, the S of the (S, G) a receiver joins when the channels'
    #: groups are source-specific (232.0.0.0/8, RFC 4607); None for any-source groups
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Announcement:
    """A control-channel announcement: every running carousel of one sender.

    ``seq`` grows by one per announcement of a sender (its ``publisher_key``);
    ``issued_at`` and ``expires_at`` are Unix times (seconds): receivers on other
    machines compare them with their own clock. A sender with more carousels than one
    datagram holds announces them in ``parts`` datagrams a round, part ``part``
    numbered ``seq - part + part``: the round is ``seq - part`` (`round_seq`).
    """

    publisher_key: str  # hex Ed25519 public key
    seq: int
    issued_at: float
    expires_at: float
    carousels: tuple[CarouselPlan, ...]
    part: int = 0
    parts: int = 1

    @property
    def round_seq(self) -> int:
        """The sequence number of the round's first part."""
        return self.seq - self.part

    def plan_for(self, issue_id: str) -> CarouselPlan | None:
        """The carousel of ``issue_id``, if this announcement has one."""
        return next((c for c in self.carousels if c.issue_id == issue_id), None)


@dataclass(frozen=True, slots=True)
class SendBatch:
    """Effect of the carousel schedule: send these packets on this channel now.

    ``packets`` index the pass's packet list (`PassLayout`: FDT packets first, then
    the object's packets)."""

    channel: int
    packets: tuple[int, ...]


class AnnouncementVerdict(Enum):
    """What a receiver made of an announcement."""

    ACCEPTED = "accepted"
    UNSIGNED = "unsigned or badly signed"
    UNTRUSTED = "signed by a key that is not a trusted publisher"
    STALE = "expired"
    FUTURE = "issued in the future"
    REPLAYED = "replayed (sequence number not above the last one accepted)"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class JoinChannel:
    """Effect of the layering core: join channel ``index`` of the plan."""

    index: int


@dataclass(frozen=True, slots=True)
class LeaveChannel:
    """Effect of the layering core: leave channel ``index`` of the plan, at the path
    loss ``loss`` of the window that decided it, for the reason ``why``."""

    index: int
    loss: float
    why: str = "path loss"


LayerEffect = JoinChannel | LeaveChannel
