"""The peer core's status polls until its first piece: at libtorrent's tick (100 ms),
then at ``status_interval_s`` (docs/swarm.md, "Where the loopback swarm loses time").

In a swarm's first seconds every peer's upload is idle until it holds a piece, and what
it can do about it (ask the ring about a piece one connected peer holds, take a piece
once its hold is lifted, report its own first piece) happens at a status poll: at
0.5 s each level of a piece's tree waited up to half a second (bench/swarm_trace.py,
N = 20: the first piece in the swarm, brought in at 0.21 s, was first asked about at
0.76 s, and its holder's upload sat idle until 1.0 s).
"""

from __future__ import annotations

import itertools

from pressrun.peer.config import desktop_profile
from pressrun.peer.core import FIRST_PIECE_STATUS_INTERVAL_S, PeerCore
from pressrun.peer.events import PollStatus, Progress

MB = 1_000_000


def _progress(pieces: int) -> Progress:
    return Progress(pieces * MB, 100 * MB, pieces, 100, 0, pieces * MB, 5, 0, 10)


def _polls(core: PeerCore, start: float, until: float) -> list[float]:
    """The times a status poll was due, the clock stepped by 10 ms from ``start``."""
    times = []
    for k in range(round(start * 100), round(until * 100) + 1):
        now = k / 100
        if any(isinstance(e, PollStatus) for e in core.handle_timer(now=now)):
            times.append(now)
    return times


def test_a_peer_holding_no_piece_polls_at_libtorrents_tick() -> None:
    core = PeerCore(desktop_profile(status_interval_s=0.5), now=0.0, fetches_owed=True)
    core.handle_progress(_progress(0), now=0.0)
    polls = _polls(core, 0.0, 1.0)
    # every 100 ms, not every 500 ms: on the code before, [0.0, 0.5, 1.0]
    assert FIRST_PIECE_STATUS_INTERVAL_S == 0.1
    # (the 10 ms steps of the clock round each due time up by at most a step)
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    assert len(polls) >= 10 and max(gaps) <= 0.11 + 1e-9, polls


def test_with_a_piece_held_it_polls_at_the_status_interval() -> None:
    core = PeerCore(desktop_profile(status_interval_s=0.5), now=0.0, fetches_owed=True)
    core.handle_progress(_progress(0), now=0.0)
    assert _polls(core, 0.0, 0.15) == [0.0, 0.1]
    core.handle_progress(_progress(1), now=0.15)  # its first piece
    # the poll after the first piece is the last fast one; then every 0.5 s
    polls = _polls(core, 0.16, 2.0)
    assert polls == [0.2, 0.7, 1.2, 1.7], polls


def test_a_seed_polls_at_the_status_interval() -> None:
    core = PeerCore(desktop_profile(status_interval_s=0.5), now=0.0)
    core.handle_progress(_progress(100), now=0.0)
    core.handle_download_finished(now=0.0)
    core.handle_verified(now=0.0)
    polls = _polls(core, 0.0, 1.0)
    assert polls == [0.0, 0.5, 1.0], polls
