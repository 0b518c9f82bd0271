"""Pieces as keys: who answers for which piece, and who uploads it to a newcomer.

004_3e4b985b4cf14853.txt, III.A, with hosts and content swapped: every supernode of a
central Chord ring answers for pieces; a joining node gets every piece's key from the
central administration (the tracker), and the supernode that answers for a piece's key
decides which node uploads that piece to the newcomer. A node that has uploaded as
much as it downloaded may leave (the fair-exit rule of `pressrun.peer.core`).

**Balance: the tracker places the supernodes' ids.** Key k belongs to its Chord
successor, as always; what the central administration adds is *where* supernodes sit.
With few keys (an issue has tens to hundreds of pieces) and few supernodes, SHA-1 ids
leave some supernodes with several times their share (measured: docs/chord.md, and a
prototype had 2 to 15 of 80 pieces per node with 64 virtual nodes). The tracker knows
every key and every supernode of the issue, so `place_supernodes` puts the j-th of n
supernodes at the key that ends the j-th n-quantile of the sorted keys: each answers
for floor(K/n) or ceil(K/n) keys, lookups and the ring's invariants stay plain Chord.
A supernode that registers later is placed in the middle of the most loaded arc; one
that fails hands its arc to its successor (up to twice a share) until the tracker
places the next.

The directory a supernode keeps of who holds its pieces, and the uploader choice,
are `pressrun.chord.directory`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from pressrun.chord.ids import RING, distance, piece_key


def piece_keys(info_hash_hex: str, num_pieces: int) -> list[int]:
    """The keys of every piece of an issue, in piece order."""
    return [piece_key(info_hash_hex, k) for k in range(num_pieces)]


def successor_of(node_ids_sorted: Sequence[int], key: int) -> int:
    """The node (by sorted id list) that key belongs to in Chord."""
    i = bisect.bisect_left(node_ids_sorted, key)
    return node_ids_sorted[i % len(node_ids_sorted)]


def responsibility(node_ids: Iterable[int], keys: Iterable[int]) -> dict[int, int]:
    """How many of ``keys`` each node answers for (nodes with none included)."""
    ids = sorted(set(node_ids))
    counts = dict.fromkeys(ids, 0)
    for k in keys:
        counts[successor_of(ids, k)] += 1
    return counts


def place_supernodes(keys: Sequence[int], count: int) -> list[int]:
    """Ids for ``count`` supernodes so each answers for floor or ceil of K/count keys."""
    if count < 1:
        raise ValueError("at least one supernode")
    ks = sorted(set(keys))
    if not ks:
        return [(RING // count) * j for j in range(count)]
    ids: list[int] = []
    for j in range(count):
        end = ((j + 1) * len(ks)) // count  # keys [.., end) go to supernode j
        # (fewer keys than supernodes: the spare ones sit just before the first key)
        cand = ks[end - 1] if end > 0 else (ks[0] - (count - j)) % RING
        while cand in ids:
            cand = (cand - 1) % RING
        ids.append(cand)
    return ids


def place_one_more(existing: Sequence[int], keys: Sequence[int]) -> int:
    """An id for a newcomer: the middle key of the most loaded arc (splits it in two)."""
    ids = sorted(existing)
    if not ids:
        return place_supernodes(keys, 1)[0]
    arcs: dict[int, list[int]] = {i: [] for i in ids}
    for k in sorted(set(keys)):
        arcs[successor_of(ids, k)].append(k)
    owner = max(ids, key=lambda i: (len(arcs[i]), i))
    pred = ids[(ids.index(owner) - 1) % len(ids)]
    # from just after pred (a lone owner is its own pred: its own id sorts last)
    arc = sorted(arcs[owner], key=lambda k: (k - pred - 1) % RING)
    # (an arc of fewer than two keys: halfway between the predecessor and its owner)
    cand = arc[len(arc) // 2 - 1] if len(arc) >= 2 else (pred + distance(pred, owner) // 2) % RING
    while cand in ids:
        cand = (cand - 1) % RING
    return cand


def spread(counts: dict[int, int]) -> tuple[int, int, float]:
    """(min, max, max / mean) of per-node key counts."""
    vals = list(counts.values())
    mean = sum(vals) / len(vals) if vals else 0.0
    return min(vals, default=0), max(vals, default=0), (max(vals) / mean if mean else 0.0)
