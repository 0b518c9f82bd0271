"""What a supernode's piece directory keeps and answers (`pressrun.chord.directory`):
the record of one holder (`Holder`), the directory's view of the swarm (`SwarmSample`),
its answer for one piece (`Uploader`), and how much of a claimed upload rate counts
(`credited_bps`).

A claimed upload rate counts, in the uploader choice and the asker order, only up to
the larger of the rate the holder's own uploaded totals showed between two of its
reports and the lower median of the rates its fellow holders claim (`credited_bps`):
a holder saying 10^10 bytes/s was named in 480 of 480 answers (docs/chord.md,
"Strangers").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pressrun.chord.ids import host_of


@dataclass(slots=True)
class Holder:
    """What a supernode knows of one node that reported pieces."""

    peer_id: str
    address: str
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    reported_at: float = 0.0
    left: bool = False
    assigned_at: list[float] = field(default_factory=list)
    brought: int = 0  # pieces it says it brought in from the origins
    asked_at: float = float("-inf")  # when it last asked who uploads a piece
    upload_bps: int = 0  # what it says it can upload, bytes/s (0: not said)
    unchoked: frozenset[str] | None = None  # the peers it unchokes (None: not said)
    #: the upload it left unused lately, bytes/s, as far as it is credible
    #: (`PieceDirectory.handle_report`)
    unused_upload_bps: int = 0
    download_bps: int = 0  # what it says it can download, bytes/s (0: not said)
    missing: int | None = None  # pieces it lacks (None: not said)
    bring_bps: int = 0  # how fast its last piece came from the origins, bytes/s (0: not said)
    reports_at: float = float("-inf")  # its last report (reported_at: also its asking)
    #: the fastest upload its own uploaded totals showed between two of its reports
    measured_bps: int = 0

    @property
    def host(self) -> str:
        """The host its reports come from (the adapter puts it in ``address``)."""
        return host_of(self.address)

    @property
    def owes_bytes(self) -> int:
        return self.downloaded_bytes - self.uploaded_bytes

    @property
    def payback_s(self) -> float:
        """How soon it can pay back what it owes at the upload rate it claims."""
        return self.payback_with(self.upload_bps)

    def payback_with(self, rate_bps: int) -> float:
        """How soon it can pay back what it owes at ``rate_bps``: owed bytes over the
        rate (0 for a holder that owes nothing, infinite when the rate is 0)."""
        if self.owes_bytes <= 0:
            return 0.0
        return self.owes_bytes / rate_bps if rate_bps > 0 else float("inf")

    @property
    def finish_s(self) -> float:
        """Missing pieces over its download rate (0 when either is unknown): the
        directory compares it with the swarm's, the same unit, never as seconds."""
        if not self.missing or self.download_bps <= 0:
            return 0.0
        return self.missing / self.download_bps

    def load(self, now: float, window_s: float) -> int:
        cut = now - window_s
        self.assigned_at = [t for t in self.assigned_at if t > cut]
        return len(self.assigned_at)


@dataclass(slots=True)
class SwarmSample:
    """What one supernode sees of the swarm: the fresh holders reporting to it (a
    sample where the swarm is large; at N = 40 with five supernodes, nearly every
    peer reports to each), plus the origins' upload it was told of."""

    missing: int  # pieces the fresh holders lack, together
    upload_bps: int  # their upload rates together, and the origins'
    median_downloaded: int  # of the recent askers
    median_unused_bps: int  # of the recent askers
    #: recent askers (asked within ``asked_window_s``) not in the last pass
    askers_not_last: int = 0


@dataclass(frozen=True, slots=True)
class Uploader:
    """The directory's answer for one piece: who uploads it (``bring_in``: the asker
    itself fetches it from the origins; ``wait``: nobody yet, ask again)."""

    piece: int
    peer_id: str
    address: str
    bring_in: bool
    wait: bool = False
    #: the asker is one of the piece's first receivers: it takes the piece from its
    #: only source at top priority and passes it on (the others hold off meanwhile)
    first: bool = False


def credited_bps(h: Holder, median_bps: int) -> int:
    """The upload rate a holder's claim counts for: its claimed ``upload_bps`` up to
    the larger of what its own totals showed (`Holder.measured_bps`) and
    ``median_bps``, the lower median of what its fellow holders claim (module
    docstring); 0 when it claimed none."""
    if h.upload_bps <= 0:
        return 0
    return min(h.upload_bps, max(h.measured_bps, median_bps))


def lower_median(values: Iterable[int]) -> int:
    """The lower median of the positive values (rates said), 0 when none."""
    said = sorted(v for v in values if v > 0)
    return said[(len(said) - 1) // 2] if said else 0
