"""`ChordConfig`: timers, list sizes, timeouts of one Chord node (documented defaults).

OpenChord's defaults (successor list 2, stabilisation every 12 s) are for rings that
change slowly; a ring of supernodes for one issue lives minutes, and a dead supernode
must be routed around within one stabilisation round, so ours are shorter and the
successor list longer (r = 8 covers rings to about 2^8 supernodes at log2 N; the
simulator sets r = log2 N for its 50,000-node runs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChordConfig:
    """One node's settings.

    successor_list_size: r, successors kept so lookups survive failures (ToN IV.E.3).
    stabilize_interval_s: how often a node asks its successor for its predecessor and
        successor list, and notifies it.
    fix_fingers_interval_s: how often one finger is refreshed by a lookup.
    check_predecessor_interval_s: how often the predecessor is pinged.
    rpc_timeout_s: how long a request waits for its answer before it is sent again.
    rpc_retries: how many times a request is sent again before its node is taken for
        dead (and routed around).
    lookup_candidates: how many next hops a node offers in a `Closer` answer (best
        first; the asker falls back down the list when one does not answer).
    max_lookup_hops: a lookup that needs more queries than this fails (a safety net
        against routing loops in a ring that is being repaired).
    """

    successor_list_size: int = 8
    stabilize_interval_s: float = 2.0
    fix_fingers_interval_s: float = 1.0
    check_predecessor_interval_s: float = 2.0
    rpc_timeout_s: float = 2.0
    rpc_retries: int = 1
    lookup_candidates: int = 8
    max_lookup_hops: int = 64

    def __post_init__(self) -> None:
        if self.successor_list_size < 1:
            raise ValueError("successor_list_size must be at least 1")
        for name in (
            "stabilize_interval_s",
            "fix_fingers_interval_s",
            "check_predecessor_interval_s",
            "rpc_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.rpc_retries < 0 or self.lookup_candidates < 1 or self.max_lookup_hops < 1:
            raise ValueError("rpc_retries >= 0, lookup_candidates >= 1, max_lookup_hops >= 1")
