"""Messages out of the client's download plan (frozen dataclasses, no I/O).

The plan (:mod:`pressrun.clients.core`) is fed with method calls
(``handle_piece_verified``, ``handle_section_failed``, ...) that carry ``now``; it
answers with these notifications, past tense, which the adapter logs, shows on the
progress bar and turns into the balancer's ``failed=`` parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PlanState(Enum):
    """Where a download stands."""

    DOWNLOADING = "downloading"
    COMPLETE = "complete"
    GAVE_UP = "gave_up"


@dataclass(frozen=True, slots=True)
class Section:
    """A run of whole pieces fetched with one Range request from one origin.

    ``first_piece`` .. ``end_piece - 1`` are the pieces; the bytes are
    ``[start_byte, end_byte)`` (the HTTP Range is ``bytes=start_byte-(end_byte-1)``).
    """

    section_id: int
    origin: str
    first_piece: int
    end_piece: int
    start_byte: int
    end_byte: int

    @property
    def pieces(self) -> range:
        """The piece indices of the section."""
        return range(self.first_piece, self.end_piece)

    @property
    def length_bytes(self) -> int:
        """How many bytes the section asks for."""
        return self.end_byte - self.start_byte

    def range_header(self) -> str:
        """The HTTP ``Range`` header value asking for exactly this section."""
        return f"bytes={self.start_byte}-{self.end_byte - 1}"


@dataclass(frozen=True, slots=True)
class SectionStarted:
    """A section was handed to an origin; ``handed_off_from`` is the origin of the
    previous section when it was a different one (a handoff, 001_524169374db25375.txt)."""

    section: Section
    handed_off_from: str | None


@dataclass(frozen=True, slots=True)
class OriginFailed:
    """An origin could not be used (error, reset, stall, corrupt piece, bad range); it
    is named in ``failed=`` until ``until`` (the WSDM retry rule, 003_fb4a16d3be88866e.txt)."""

    origin: str
    reason: str
    until: float


@dataclass(frozen=True, slots=True)
class OriginSlow:
    """A section left an origin that was too slow for this download; the origin is
    passed over until ``until`` while the balancer offers another."""

    origin: str
    until: float


@dataclass(frozen=True, slots=True)
class PiecesReleased:
    """Pieces of an ended section that were not verified go back to the plan."""

    section_id: int
    pieces: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DownloadComplete:
    """Every piece is verified."""


@dataclass(frozen=True, slots=True)
class DownloadGaveUp:
    """Too many failures in a row without a verified piece; ``reason`` is one line."""

    reason: str


Event = (
    SectionStarted | OriginFailed | OriginSlow | PiecesReleased | DownloadComplete | DownloadGaveUp
)


class LocalProtocolError(Exception):
    """The caller misused the plan (an unknown section, a piece outside its section)."""
