"""The tracker's configuration, with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    """How the tracker core answers announces and when it forgets peers.

    interval_s: the ``interval`` announces answer (how often a client re-announces).
    min_interval_s: the ``min interval``; libtorrent honours the larger of this and its
        own ``min_announce_interval`` setting.
    peer_ttl_s: a peer that has not announced for this long is expired (it left by
        the rule ``expired``); default 2.5 x interval_s, so one lost announce is not
        fatal but two are.
    default_numwant: peers handed out when the client does not say ``numwant``
        (BEP 3 suggests 50).
    max_numwant: the cap on ``numwant``; a request for more gets this many.
    ring_supernodes: how many supernodes an issue's Chord ring is expected to have;
        the first that many are placed at the equal-share positions (each answers for
        K/n piece keys, +-1); 0, or any beyond, split the most loaded arc in two
        (docs/chord.md, "Balance").
    record_ttl_s: a peer that left (stopped or expired) is forgotten this long after
        it left, and a swarm with no record left is dropped: what strangers announce
        cannot pile up (default one hour, long enough for ``/v1/swarms`` to show how
        a wave of peers left).
    max_swarms: the most swarms held at once. Only live swarms (an active peer) fill
        it: an announce that would open one more evicts the swarm that died first, and
        is refused (``tracker_full``) only when every swarm held is live. With an
        allowlist the published issues bound it anyway.
    max_records_per_swarm: the most peer records one swarm holds; a new peer beyond it
        makes the swarm forget the record that left first at once (its totals stay),
        so peer ids made up by the thousand cannot fill memory and the store for the
        hour of ``record_ttl_s``. Active peers are never dropped for it (they expire
        after the TTL unless they keep announcing).
    """

    interval_s: int = 30
    min_interval_s: int = 5
    peer_ttl_s: float | None = None
    default_numwant: int = 50
    max_numwant: int = 200
    ring_supernodes: int = 0
    record_ttl_s: float = 3600.0
    max_swarms: int = 10_000
    max_records_per_swarm: int = 100_000

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if not 0 < self.min_interval_s <= self.interval_s:
            raise ValueError("min_interval_s must be positive and at most interval_s")
        if self.peer_ttl_s is not None and self.peer_ttl_s <= self.interval_s:
            raise ValueError("peer_ttl_s must be longer than interval_s")
        if self.max_numwant < 1:
            raise ValueError("max_numwant must be at least 1")
        if self.ring_supernodes < 0:
            raise ValueError("ring_supernodes must not be negative")
        if self.record_ttl_s <= 0:
            raise ValueError("record_ttl_s must be positive")
        if self.max_swarms < 1:
            raise ValueError("max_swarms must be at least 1")
        if self.max_records_per_swarm < 1:
            raise ValueError("max_records_per_swarm must be at least 1")
        if self.default_numwant < 0:
            raise ValueError("default_numwant must not be negative")

    @property
    def ttl_s(self) -> float:
        """The effective peer time-to-live in seconds."""
        return self.peer_ttl_s if self.peer_ttl_s is not None else 2.5 * self.interval_s
