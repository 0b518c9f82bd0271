"""A swarm peer's status core (`pressrun.peer.status.SwarmStatus`) with its origin feed
on a fake libtorrent handle of six pieces, for the tests of the feed's rules
(tests/peer/test_sources.py, test_sources_window.py, test_sources_unheld.py,
test_status_origins_held.py). The tests read and set the feed as ``status._feed``."""

from __future__ import annotations

import types

from pressrun.peer.feed import OwedPieceFeed
from pressrun.peer.status import SwarmStatus
from pressrun.peer.uploader import UploaderPolicy

#: the pieces' size (bytes): the publisher's 128 KiB
PIECE = 131_072


def six_piece_status(
    handle: object,
    policy: UploaderPolicy,
    *,
    web_seed: str = "http://origin",
    upload_limit_bps: int = 0,
) -> SwarmStatus:
    """The status core of peer ``"ab" * 20`` of a six-piece issue on ``handle`` (what
    the tests' fake libtorrent handle answers), with ``policy`` and one web seed; an
    upload limit as the bench's peers have (``upload_limit_bps``) or none."""
    manifest = types.SimpleNamespace(num_pieces=6, info_hash="12" * 20, piece_size_bytes=PIECE)
    feed = OwedPieceFeed(
        manifest=manifest,  # type: ignore[arg-type]
        web_seeds=[web_seed],
        retry_s=1.0,
        handle=lambda: handle,
        running=lambda: True,
    )
    return SwarmStatus(
        manifest=manifest,  # type: ignore[arg-type]
        policy=policy,
        feed=feed,
        handle=lambda: handle,
        peer_id=lambda: "ab" * 20,
        on_pieces_changed=lambda: None,
        upload_limit_bps=upload_limit_bps,
    )
