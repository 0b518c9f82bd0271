"""The peer core's messages in and effects out: frozen dataclasses and Enums, pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LeaveRule(Enum):
    """Which rule let a peer leave its swarm (the fair-exit rule of
    004_3e4b985b4cf14853.txt, III.A, and its escape hatches; docs/swarm.md).

    ``tracker_value`` is what the peer puts in the ``leave_rule`` parameter of its
    ``stopped`` announce (docs/tracker.md knows ratio, not_needed, max_seed_time, user).
    """

    RATIO = "ratio"  # uploaded >= ratio x downloaded
    NOT_NEEDED = "not_needed"  # the tracker's counts: nobody needs this seed any more
    MAX_SEED_TIME = "max_seed_time"  # seeded for the longest time the profile allows
    METERED = "metered"  # the mobile profile on a metered link never seeds
    USER = "user"  # the user (or the program using the peer) stopped it

    @property
    def tracker_value(self) -> str:
        """The tracker's name for this rule (a metered departure is the user's choice)."""
        return "user" if self is LeaveRule.METERED else self.value

    @property
    def fair(self) -> bool:
        """True for the rules the tracker counts as leaving fairly."""
        return self in (LeaveRule.RATIO, LeaveRule.NOT_NEEDED)


class PeerPhase(Enum):
    """Where a peer stands: downloading, checking its copy, seeding, gone."""

    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    SEEDING = "seeding"
    LEFT = "left"


# --- messages in -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    """One status snapshot of the torrent (libtorrent's state_update_alert).

    done_bytes: verified payload on disk; wanted_bytes: the file's size.
    uploaded_bytes / downloaded_bytes: payload totals over every session of this
        download (libtorrent's all_time_upload / all_time_download, kept in the
        resume data), the figures of the fair-exit rule.
    connected_peers: BitTorrent peers connected now (web seeds not counted).
    web_seed_bytes: payload received from the origins' web seeds so far.
    tradable_pieces: pieces this peer lacks that a connected peer holds (None:
        unknown); 0 while downloading means only the origins can help.
    owed_pieces: pieces the uploader policy gave this peer to bring into the swarm
        (top priority) that it lacks and no connected peer holds: only the origins
        have them, and this peer is the one meant to fetch them.
    coming_pieces: of those, the pieces the Chord ring answers for (another peer brings
        them in): the stall guard waits ``web_seed_ring_stall_s`` for them.
    sole_pieces: (seeding) pieces no connected BitTorrent peer holds while some
        connected peer still downloads: this peer is their last holder among its
        peers, so a fair-exit rule lets it go only once they have a second holder.
    upload_bps: the payload upload rate over the last two seconds (0: not known yet).
    upload_capacity_bps: what this peer can upload, its limit, else the fastest it
        uploaded (0: not known).
    """

    done_bytes: int
    wanted_bytes: int
    pieces_have: int
    pieces_total: int
    uploaded_bytes: int
    downloaded_bytes: int
    connected_peers: int
    web_seed_bytes: int = 0
    tradable_pieces: int | None = None
    owed_pieces: int = 0
    coming_pieces: int = 0
    sole_pieces: int = 0
    upload_bps: int = 0
    upload_capacity_bps: int = 0


@dataclass(frozen=True, slots=True)
class SwarmCounts:
    """The tracker's counts for the swarm (scrape / announce ``complete``, ``incomplete``)."""

    seeds: int
    leechers: int


# --- effects out -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PollStatus:
    """Ask the torrent for a status snapshot now (answered with a `Progress`)."""


@dataclass(frozen=True, slots=True)
class AskSwarmCounts:
    """Ask the tracker for the swarm's counts (a scrape)."""


@dataclass(frozen=True, slots=True)
class DropWebSeeds:
    """Remove the origins' web seeds: this peer holds its share, peers do the rest."""


@dataclass(frozen=True, slots=True)
class RestoreWebSeeds:
    """Put every origin web seed back (a stall guard, or a web seed libtorrent disabled)."""


@dataclass(frozen=True, slots=True)
class SaveResumeData:
    """Save libtorrent's resume data now (pieces finished since the last save)."""


@dataclass(frozen=True, slots=True)
class Stalled:
    """No download progress for ``idle_s``: the client should fall back to origins."""

    idle_s: float
    pieces_have: int


@dataclass(frozen=True, slots=True)
class Leave:
    """Leave the swarm now, by this rule (announce ``stopped`` with it)."""

    rule: LeaveRule
    ratio: float | None  # uploaded / downloaded at that moment; None if nothing came down


Effect = (
    PollStatus | AskSwarmCounts | DropWebSeeds | RestoreWebSeeds | SaveResumeData | Stalled | Leave
)
