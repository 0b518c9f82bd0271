"""What a swarm fetch reports: its progress, its result, its error.

Kept apart from the libtorrent adapter (`pressrun.peer.aio`) so a client can name them
without importing libtorrent."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pressrun.peer.events import LeaveRule, PeerPhase


class SwarmError(Exception):
    """The swarm download cannot go on (bad torrent, a copy that fails the manifest)."""


@dataclass(frozen=True, slots=True)
class SwarmProgress:
    """A progress report for a client's progress bar."""

    phase: PeerPhase
    done_bytes: int
    wanted_bytes: int
    uploaded_bytes: int
    downloaded_bytes: int
    bytes_from_web_seeds: int
    connected_peers: int


@dataclass(frozen=True, slots=True)
class SwarmResult:
    """How a swarm fetch ended.

    completed: the file at ``path`` is the issue, checked against the manifest
        (SHA-256 of every piece and of the whole file).
    stalled: no progress for ``stall_after_s``; ``have_pieces`` (each checked against
        the manifest) are in ``path`` at their offsets, ``missing_spans`` are the byte
        ranges [start, end) still to fetch from origins.
    bytes_from_peers / bytes_from_web_seeds: payload downloaded from BitTorrent peers /
        from the origins' web seeds (counted per connection at each status poll: the
        last fraction of a second of a connection that closed between polls is counted
        as from peers; the origins' own counters are exact).
    uploaded_bytes / downloaded_bytes / ratio: all-time payload totals of this
        download (across restarts), ratio = uploaded / downloaded (None if nothing
        came down).
    ratio_at_leave: uploaded / downloaded when a rule let the peer go, the figure the
        rule judged (None if it never left). The totals above are read after the
        leave and can include a few KiB that were in flight: a peer let go by
        `LeaveRule.RATIO` at 1.0 can show ``ratio`` 0.9997.
    leave_rule: the rule that let the peer go (None if it never left, e.g. an error).
    leave_s: seconds from the end of its seeding (or its stall) until the peer was out
        of the swarm and its session closed (None: it never left); ``leave_steps``
        splits it (`pressrun.peer.leave.LeaveSequence.steps`, and ``close``).
    """

    issue_id: str
    path: Path
    completed: bool
    stalled: bool
    have_pieces: tuple[int, ...]
    missing_spans: tuple[tuple[int, int], ...]
    bytes_from_peers: int
    bytes_from_web_seeds: int
    uploaded_bytes: int
    downloaded_bytes: int
    ratio: float | None
    ratio_at_leave: float | None
    leave_rule: LeaveRule | None
    download_s: float | None
    seeding_s: float | None
    listen_port: int | None
    leave_s: float | None = None
    leave_steps: dict[str, float] = field(default_factory=dict)
