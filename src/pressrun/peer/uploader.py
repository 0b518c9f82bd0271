"""Uploader choice: who uploads which piece to whom. The hook for the Chord ring.

ARCHITECTURE.md: "a tracker and a Chord ring decide who uploads which piece to whom"
(004_3e4b985b4cf14853.txt, III.A: every node of a central ring is responsible for
pieces, and supernodes decide which node uploads a piece). Three policies: the default
`chord` (`chord_policy`: the ring's supernodes say who brings each piece in from the
origins and who uploads it; `stripes` where no ring is reachable), `stripes`
(`stripes_policy`: each downloading peer brings its own stripe of pieces in from the
origins, and libtorrent picks everything else) and `libtorrent` (libtorrent's own
picking, rarest first and tit-for-tat unchoking, untouched). This module is the one
place a policy plugs in, in the house shape of pluggable algorithms (STYLE.md, after
aioquic's congestion controllers): an ABC, a name -> factory registry, one module per
policy.

The contract. The peer adapter (`pressrun.peer.aio`) calls `UploaderPolicy.plan` with
a `SwarmView` after every status poll (``status_interval_s``) and applies what it
returns to its torrent:

- ``PiecePlan.piece_priorities``: libtorrent priorities 0..7 per piece, in piece
  order (``torrent_handle.prioritize_pieces``); a ring policy raises the pieces this
  node is responsible for so it fetches and then serves them first. 0 (``HOLD``,
  "not now") only while some other missing piece stays wanted: a torrent whose
  missing pieces are all 0 is "finished", and two finished peers drop their
  connection and libtorrent waits ``min_reconnect_time`` (60 s) before reconnecting
  (FIELD-NOTES.md). Checked here when the plan is made (`PiecePlan.checked`).
- None: leave libtorrent's choice alone (what `libtorrent` always answers).

A peer *owes* the pieces of top priority in its plan that it lacks and no connected
peer holds (only the origins have them, and this peer is the one meant to bring them
in). With ``fetches_owed_pieces`` the adapter fetches them from the origins itself;
otherwise the peer keeps libtorrent's web seeds while it owes pieces
(`pressrun.peer.core`).

A policy must be pure like a core (no clock, no I/O; ``now`` is passed in), so the
simulator can drive it too. To add one: write ``pressrun/peer/<name>_policy.py`` with
a subclass, and register it with `register_uploader_policy("<name>", Factory)`; the
peer picks it by name (``fetch_via_swarm(..., uploader_policy="<name>")``,
``pressrun seed --uploader-policy``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HOLD_PRIORITY = 0  # not now (libtorrent does not request it): see the module docstring
MIN_PRIORITY = 1
MID_PRIORITY = 4  # libtorrent's default
#: pieces on hold only while at least this many missing pieces stay wanted
HOLD_MARGIN = 3
MAX_PRIORITY = 7


@dataclass(frozen=True, slots=True)
class SwarmView:
    """What a policy may look at: this peer's pieces and who it is.

    peer_id: this peer's 20-byte BitTorrent peer id, hex (its position on a ring).
    info_hash: the swarm's v1 info-hash, hex.
    have: per piece, True if this peer holds it (verified).
    connected_peers: BitTorrent peers connected now (web seeds included).
    leecher_ids: the peer ids (hex, sorted) of the connected BitTorrent peers that
        are still downloading (seeds left out: they hold every piece already).
    holders: per piece, how many connected BitTorrent peers hold it (web seeds not
        counted); empty when unknown.
    """

    peer_id: str
    info_hash: str
    have: tuple[bool, ...]
    connected_peers: int
    leecher_ids: tuple[str, ...] = ()
    holders: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PiecePlan:
    """Piece priorities for this peer's torrent, 1 (lowest) to 7 (highest)."""

    piece_priorities: tuple[int, ...]
    #: the peers this peer's torrent unchokes at most (``torrent_handle.set_max_uploads``;
    #: None: the session's ``unchoke_slots_limit``)
    upload_slots: int | None = None

    def __post_init__(self) -> None:
        bad = [p for p in self.piece_priorities if not HOLD_PRIORITY <= p <= MAX_PRIORITY]
        if bad:
            raise ValueError(
                f"piece priorities must be {HOLD_PRIORITY}..{MAX_PRIORITY}, got {bad[:5]}"
            )

    @classmethod
    def checked(
        cls,
        priorities: Sequence[int],
        have: Sequence[bool],
        upload_slots: int | None = None,
    ) -> PiecePlan:
        """A plan whose pieces on hold (0) go back to the lowest priority unless at
        least `HOLD_MARGIN` missing pieces stay wanted (the module docstring: a torrent
        with only pieces of priority 0 left is finished, and a finished torrent drops
        its seeds; pieces complete between two plans, so one wanted piece is not
        enough). The peer lifts holds on libtorrent's finished alert too."""
        wanted = sum(1 for p, h in zip(priorities, have, strict=True) if not h and p)
        if wanted >= HOLD_MARGIN or HOLD_PRIORITY not in priorities:
            return cls(tuple(priorities), upload_slots)
        return cls(tuple(max(p, MIN_PRIORITY) for p in priorities), upload_slots)


class UploaderPolicy(ABC):
    """Decides which pieces this peer asks for first (and so who serves what)."""

    name: str
    #: True: the peer fetches the pieces it owes (top priority in the plan, held by no
    #: connected peer) from the origins itself, one HTTP range request at a time,
    #: and joins without libtorrent's web seeds, which come back only when the peer
    #: is starved (nothing owed, nothing any peer can give) or stalls.
    fetches_owed_pieces: bool = False

    @abstractmethod
    def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
        """The piece plan for this peer now, or None to leave libtorrent's choice."""


class LibtorrentPicker(UploaderPolicy):
    """libtorrent's own rarest-first picking and tit-for-tat unchoking, nothing else."""

    name = "libtorrent"

    def plan(self, view: SwarmView, *, now: float) -> PiecePlan | None:
        """Always None: libtorrent decides."""
        return None


def _stripes() -> UploaderPolicy:
    # imported when asked for: the policy's module imports this one
    from pressrun.peer.stripes_policy import StripesPolicy

    return StripesPolicy()


def _chord() -> UploaderPolicy:
    from pressrun.peer.chord_policy import ChordPolicy

    return ChordPolicy()


_REGISTRY: dict[str, Callable[[], UploaderPolicy]] = {
    "libtorrent": LibtorrentPicker,
    "stripes": _stripes,
    "chord": _chord,
}

#: measured on the loopback bench (docs/chord.md "Benches", 27 November, three runs
#: each): at N = 40 `chord` 1.27x the fluid bound with 1.00 origin copies, `stripes`
#: 1.29x with 1.09, `libtorrent` 1.76x with 2.44; at N = 20 1.26x / 1.00, 1.25x / 1.02,
#: 1.65x / 2.26. Where no ring is reachable (the tracker lists no supernode) the
#: `chord` policy is `stripes`.
DEFAULT_UPLOADER_POLICY = "chord"


def register_uploader_policy(name: str, factory: Callable[[], UploaderPolicy]) -> None:
    """Make a policy available by name (a later module: the Chord ring's)."""
    if name in _REGISTRY:
        raise ValueError(f"an uploader policy named {name!r} is already registered")
    _REGISTRY[name] = factory


def uploader_policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(_REGISTRY)


def make_uploader_policy(name: str = DEFAULT_UPLOADER_POLICY) -> UploaderPolicy:
    """A new policy by its registered name."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown uploader policy {name!r}; known: {', '.join(uploader_policy_names())}"
        ) from None
    return factory()
