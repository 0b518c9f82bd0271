"""A swarm peer's status core (`pressrun.peer.status.SwarmStatus`) with its origin feed
on a fake libtorrent handle (six pieces unless told), the policy's plan among N
leechers (`plan_among`), libtorrent's torrent status as it reads it (`torrent_status`)
and a connected peer's fake peer info, for the tests of the feed's rules
(tests/peer/test_sources.py, test_sources_window.py, test_sources_unheld.py,
test_sources_unheld_due.py, test_status_origins_held.py). The tests read and set
the feed as ``status._feed``."""

from __future__ import annotations

import types
from typing import Any

import libtorrent as lt

from pressrun.peer.feed import OwedPieceFeed
from pressrun.peer.status import SwarmStatus
from pressrun.peer.uploader import SwarmView, UploaderPolicy

#: the pieces' size (bytes): the publisher's 128 KiB
PIECE = 131_072


def six_piece_status(
    handle: object,
    policy: UploaderPolicy,
    *,
    web_seed: str = "http://origin",
    upload_limit_bps: int = 0,
    num_pieces: int = 6,
) -> SwarmStatus:
    """The status core of peer ``"ab" * 20`` of a six-piece issue (``num_pieces``) on
    ``handle`` (what the tests' fake libtorrent handle answers), with ``policy`` and one
    web seed; an upload limit as the bench's peers have (``upload_limit_bps``) or none."""
    manifest = types.SimpleNamespace(
        num_pieces=num_pieces, info_hash="12" * 20, piece_size_bytes=PIECE
    )
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


def plan_among(
    status: SwarmStatus,
    handle: Any,
    policy: UploaderPolicy,
    have: tuple[bool, ...],
    leechers: int,
) -> Any:
    """``policy``'s plan for peer ``"ab" * 20`` holding ``have``, connected to
    ``leechers`` downloading peers (the pieces held as ``handle`` says), kept as the
    status core's last plan (None where the policy has none); the plan."""
    view = SwarmView(
        peer_id="ab" * 20,
        info_hash="12" * 20,
        have=have,
        connected_peers=leechers,
        leecher_ids=tuple(f"{i:040x}" for i in range(leechers)),
        holders=tuple(handle.piece_availability()),
    )
    plan = policy.plan(view, now=0.0)
    status.last_plan = plan.piece_priorities if plan is not None else None
    return plan


def torrent_status(
    have: list[bool],
    *,
    up_bps: int,
    down_bps: int,
    leechers: int,
    uploaded: int,
    downloaded: int,
    peers: int,
    wanted_done: int | None = None,
) -> Any:
    """libtorrent's torrent status as the status core reads it (``status.read``): the
    peer holds ``have`` of pieces of `PIECE` bytes, uploads ``up_bps`` and downloads
    ``down_bps`` now, ``uploaded``/``downloaded`` payload so far, with ``leechers``
    downloading peers in the tracker's count and ``peers`` connected; the bytes wanted
    and done are the pieces held unless ``wanted_done`` says otherwise."""
    held = sum(have)
    return types.SimpleNamespace(
        pieces=have,
        is_seeding=False,
        upload_payload_rate=up_bps,
        download_payload_rate=down_bps,
        num_incomplete=leechers,
        total_payload_upload=uploaded,
        total_payload_download=downloaded,
        num_pieces=held,
        total_wanted_done=held * PIECE if wanted_done is None else wanted_done,
        total_wanted=len(have) * PIECE,
        all_time_upload=0,
        all_time_download=0,
        num_peers=peers,
    )


def connected_peer(i: int, *, down_bps: int, num_pieces: int = 6) -> Any:
    """A connected BitTorrent peer's peer info (``get_peer_info``), as the tally reads
    it: a downloading peer with id ``bytes([i]) * 20`` sending ``down_bps`` to this one,
    holding none of ``num_pieces``."""
    return types.SimpleNamespace(
        connection_type=lt.peer_info.standard_bittorrent,
        flags=0,
        pid=types.SimpleNamespace(to_bytes=lambda: bytes([i]) * 20),
        payload_down_speed=down_bps,
        ip=(f"198.18.20.{i}", 6881),
        total_download=0,
        pieces=[False] * num_pieces,
    )
