"""What libtorrent's download queue says of the pieces a peer is fetching, and what each
connection gives it: the feed's rules for pieces libtorrent asked of a peer
(`pressrun.peer.feed`; the pieces' sources and the origins' room are
`pressrun.peer.sources`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import libtorrent as lt

from pressrun.peer.sources import PEERS_WINDOW_S, CounterRate

#: libtorrent's block states in its download queue: asked of a peer or web seed, and
#: received (being written, or on disk)
_BLOCK_REQUESTED = 1
_BLOCK_RECEIVED = (2, 3)
#: a connection's rate is known once its bytes were counted over at least this long
#: (libtorrent's own per-peer rate is a moving average over seconds: a fast peer just
#: connected read 47 kB/s while it sent 2.5 MB/s, and its pieces were taken again)
CONNECTION_RATE_AFTER_S = 1.0


class ConnectionRates:
    """Each connection's download rate from it, from its byte counter read now and
    then (``get_peer_info``'s ``total_download``, a `CounterRate` each): over the last
    `PEERS_WINDOW_S`, or over `CONNECTION_RATE_AFTER_S` at least while it is younger
    (not since it was first seen: a peer's first burst does not speak for it seconds
    later). Written against the small emulation's last swarm client, 220 kB/s a
    connection over its first 1.4 s and 73 kB/s over the next 1.5 s, a fall the
    emulation's bridge caused (the carousel flooded down its link: fixed in 2f4756f,
    docs/results/2026-11-29-small-scenario-querier.md). Pure: reads come with ``now``;
    connections no longer listed are forgotten (bounded by the peers connected)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, int], CounterRate] = {}

    def update(self, now: float, peers: Sequence[Any]) -> dict[tuple[str, int], int | None]:
        """The known rates (bytes/s) by (address, port), a web seed's None (the
        origins: a piece it is fetching is never taken again); a connection not known
        yet is left out (`CounterRate.rate_over`: no read old enough, or nothing from
        it then)."""
        rates: dict[tuple[str, int], int | None] = {}
        counters: dict[tuple[str, int], CounterRate] = {}
        for pi in peers:
            key = (str(pi.ip[0]), int(pi.ip[1]))
            if pi.connection_type != lt.peer_info.standard_bittorrent:
                rates[key] = None
                continue
            counter = self._counters.get(key) or CounterRate(keep_s=PEERS_WINDOW_S)
            counter.add(now, int(pi.total_download))  # (a lower total: a new connection)
            counters[key] = counter
            rate = counter.rate_over(PEERS_WINDOW_S)
            if rate is None:
                rate = counter.rate_over(CONNECTION_RATE_AFTER_S)
            if rate is not None:
                rates[key] = rate
        self._counters = counters
        return rates


def fetching(queue: Sequence[Any]) -> set[int]:
    """The pieces in libtorrent's download queue (``get_download_queue``) it is
    fetching: a block asked of a connected peer or web seed, or every block received
    (being written and checked). A piece whose blocks left are asked of nobody (the
    peer it asked left: libtorrent keeps the partial piece, with the blocks it got) is
    not: in the small emulation a swarm client whose seeds left waited 1.6 s on such a
    last piece, which the feed skipped as busy until libtorrent's web seeds came back."""
    out: set[int] = set()
    for entry in queue:
        states = [int(b["state"]) for b in entry["blocks"]]
        if _BLOCK_REQUESTED in states or all(st in _BLOCK_RECEIVED for st in states):
            out.add(int(entry["piece_index"]))
    return out


def stranded(queue: Sequence[Any]) -> set[int]:
    """The partial pieces in libtorrent's download queue (``get_download_queue``) it
    asks nobody for: a block of it received, none asked of a peer or web seed, not
    every one received. libtorrent leaves such a piece for its end game: on a loopback
    pair, a piece whose priority went to 0 with 4 of its 8 blocks asked (the `chord`
    policy holds a piece one connected peer holds off for up to 4 s), and back once
    they came, stayed at 4 of 8 for 6 s while libtorrent fetched 9 other pieces. A
    partial piece whose peer left is one too (`fetching`). (The small emulation's last
    swarm arrivals, for which this was written, had pieces first asked of a peer
    2.4-3.7 s before they passed: their own links were flooded by the emulation's bridge,
    fixed in 2f4756f; the loopback pair above is the rule's reason.)"""
    out: set[int] = set()
    for entry in queue:
        states = [int(b["state"]) for b in entry["blocks"]]
        received = [st in _BLOCK_RECEIVED for st in states]
        if _BLOCK_REQUESTED not in states and any(received) and not all(received):
            out.add(int(entry["piece_index"]))
    return out


def sooner_from_origins(
    queue: Sequence[Any],
    free: set[int],
    rates: dict[tuple[str, int], int | None],
    *,
    piece_bytes: int,
    origins_bps: int,
) -> int | None:
    """Of the ``free`` pieces in libtorrent's download queue (``get_download_queue``),
    the one the origins would deliver whole (``piece_bytes`` at ``origins_bps``)
    soonest before its peers deliver the rest; None if the peers are sooner for every
    one, a rate is not known yet, or ``origins_bps`` is not known. Its peers deliver
    the rest once each connection one of its blocks is asked of has sent every byte
    asked of it (its blocks not received yet, of every piece in the queue), at its
    known rate (``rates``: `ConnectionRates`): the queue does not say in which order a
    connection's requests go out, and a piece's own bytes alone made a piece behind
    several others on the same connection look a fraction of a second away (the small
    emulation at f61cd5b: pieces queued on a peer at +0.6-1.0 s, passed +3.7-3.8 s, its
    connections 300-350 kB/s, passed over against the origins' 180-210 kB/s; those
    waits were the emulation's bridge flooding the carousel down that client's link,
    fixed in 2f4756f, docs/results/2026-11-29-small-scenario-querier.md, while the
    arithmetic holds for any connection with several pieces asked of it).
    A piece a web seed is fetching is
    never taken: the origins would send it twice. libtorrent does not take back
    requests it sent: a peer sends a taken piece anyway, so a piece the peers would
    bring sooner is only fetched twice (a loopback pair staggered like the small
    emulation's first two swarm clients: the second took three pieces its fast peer
    had already sent, `take_busy` before this rule)."""
    if origins_bps <= 0:
        return None
    from_origins = piece_bytes / origins_bps
    asked = _asked_bytes(queue)
    best: tuple[float, int, int] | None = None
    for entry in queue:
        piece = int(entry["piece_index"])
        if piece not in free:
            continue
        left = 0
        peers: set[tuple[str, int]] = set()
        known = True
        for block in entry["blocks"]:
            if int(block["state"]) in _BLOCK_RECEIVED:
                continue
            left += int(block["block_size"]) - int(block["bytes_progress"])
            key = _asked_of(block)
            if key is None:
                continue  # not asked of anyone yet
            if key not in rates or rates[key] is None:
                known = False  # a web seed's, or a rate not known yet
                break
            peers.add(key)
        if not known or left <= 0:
            continue
        # (blocks asked of nobody: no connection brings them)
        from_peers = max(
            (asked[k] / rate if (rate := rates[k]) else float("inf") for k in peers),
            default=float("inf"),
        )
        gain = from_peers - from_origins
        # (of the pieces on the same connections, the one with the most left first)
        if gain > 0 and (best is None or (gain, left) > best[:2]):
            best = (gain, left, piece)
    return None if best is None else best[2]


def _asked_of(block: Any) -> tuple[str, int] | None:
    """The (address, port) of the connection a block of the download queue is asked
    of (None: asked of nobody)."""
    at = block.get("peer")
    if int(block["state"]) != _BLOCK_REQUESTED:
        return None
    if not (isinstance(at, tuple) and len(at) == 2) or int(at[1]) == 0:
        return None
    return (str(at[0]), int(at[1]))


def _asked_bytes(queue: Sequence[Any]) -> dict[tuple[str, int], int]:
    """The bytes not received yet of every block asked of each connection, over the
    whole download queue (`sooner_from_origins`)."""
    out: dict[tuple[str, int], int] = {}
    for entry in queue:
        for block in entry["blocks"]:
            key = _asked_of(block)
            if key is not None:
                left = int(block["block_size"]) - int(block["bytes_progress"])
                out[key] = out.get(key, 0) + left
    return out
