"""When subscribers leave in `pressrun sim swarm`: the real client's fair-exit rules.

``never`` (the default, what the fluid bound assumes): everyone seeds until the last
subscriber has finished. ``fair``: a finished subscriber leaves as soon as one of the
real client's fair rules holds (`pressrun.peer.core.fair_to_leave`): it uploaded at
least what it downloaded (``ratio``), or the other seeds number at least
``NOT_NEEDED_SEEDS_PER_LEECHER`` per leecher and at least ``SEED_FLOOR``
(``not_needed``, the tracker's counts; the floor as the programs run it,
`pressrun.peer.config.profile_config`: it binds only once nobody downloads, so the
last ``SEED_FLOOR`` seeds stay to the end) and it is not in use (its upload lately
under ``BUSY_SHARE`` of its capacity: the client's `PeerConfig.not_needed_busy_share`,
`pressrun.peer.core.seed_in_use`); the seeding bound (``max_seed_time_s``, 1800 s by
default) is longer than any of these runs. ``last-holder``: ``fair``, and a
subscriber allowed to leave stays while it is the last holder of a piece another
subscriber still lacks (the real client's rule, `PeerCore._last_holder`: the fair
rules say a peer *may* leave, not that it must). Every uploader choice leaves by the
same rule.

The tracker's counts are read as one subscriber at a time would see them after the
ones before it left: at most ``seeds - max(2 * leechers, SEED_FLOOR)`` leave by
``not_needed`` in a step (real seeds reading the same stale counts could all go at
once). A seed holds every piece, so a piece whose last holders all want to leave keeps
one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pressrun.peer.config import SEED_FLOOR

LEAVE_RULES = ("never", "fair", "last-holder")
#: `PeerConfig.not_needed_seeds_per_leecher`'s default
NOT_NEEDED_SEEDS_PER_LEECHER = 2.0
#: `PeerConfig.not_needed_busy_share`'s default: a seed uploading at least this share
#: of its capacity lately does not leave by not_needed
BUSY_SHARE = 0.5

Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Departures:
    """Who leaves at the end of a step, and by which rule."""

    by_ratio: Ints
    by_not_needed: Ints
    #: subscribers allowed to leave that stay as the last holder of a needed piece
    held: Ints

    @property
    def leaving(self) -> Ints:
        return np.concatenate((self.by_ratio, self.by_not_needed))


def departures(
    rule: str,
    *,
    seeds: Bools,
    leechers: Bools,
    uploaded: Ints,
    downloaded: Ints,
    have_t: Bools,
    rng: np.random.Generator,
    busy: Bools | None = None,
) -> Departures:
    """Which of the ``seeds`` (finished, still present) leave now under ``rule``.

    ``leechers``: subscribers present and still downloading; ``have_t``: complete
    pieces, piece-major, of everyone present (a subscriber that left holds none);
    ``busy``: seeds in use (their upload lately at least ``BUSY_SHARE`` of their
    capacity), which the counts do not let go while anyone downloads (None: none).
    """
    none = np.zeros(0, dtype=np.int64)
    if rule == "never" or not seeds.any():
        return Departures(none, none, none)
    if rule not in LEAVE_RULES:
        raise ValueError(f"unknown leave rule {rule!r}; choose from {', '.join(LEAVE_RULES)}")
    ratio = seeds & (uploaded >= downloaded)
    by_ratio = np.flatnonzero(ratio)
    # (a seed in use keeps its place while someone downloads; with no leecher left its
    # upload is going nowhere, and the client's falls within its two-second window)
    in_use = busy if busy is not None and leechers.any() else np.zeros_like(seeds)
    rest = np.flatnonzero(seeds & ~ratio & ~in_use)
    # not_needed, one at a time: the k-th to go still sees seeds - 1 >= 2 * leechers,
    # and >= the floor
    left_seeds = int(seeds.sum()) - by_ratio.size
    kept = np.ceil(NOT_NEEDED_SEEDS_PER_LEECHER * int(leechers.sum()))
    room = left_seeds - max(int(kept), SEED_FLOOR)
    by_not_needed = rng.permutation(rest)[:room] if room > 0 and rest.size else none
    held = none
    if rule == "last-holder":
        going = np.zeros(seeds.size, dtype=bool)
        going[by_ratio] = going[by_not_needed] = True
        staying = have_t[:, ~going].any(axis=1)
        needed = ~have_t[:, leechers].all(axis=1)  # some leecher lacks it
        if leechers.any() and (needed & ~staying).any():
            # the pieces' last holders are all leaving: a seed holds every piece, so one
            # of them staying keeps every such piece; the one that owes the most stays
            cand = np.flatnonzero(going)
            keep = cand[np.argmax(downloaded[cand] - uploaded[cand])]
            held = np.array([keep], dtype=np.int64)
            by_ratio = by_ratio[by_ratio != keep]
            by_not_needed = by_not_needed[by_not_needed != keep]
    return Departures(by_ratio, by_not_needed, held)
