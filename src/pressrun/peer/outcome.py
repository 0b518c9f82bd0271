"""What `pressrun.peer.aio.SwarmPeer` reports, built from its state: the `SwarmResult`
so far (`swarm_result`) and each status poll's `SwarmProgress` (`swarm_progress`)."""

from __future__ import annotations

from pathlib import Path

from pressrun.content.codec import Manifest
from pressrun.peer.core import PeerCore, share_ratio
from pressrun.peer.events import PeerPhase, Progress
from pressrun.peer.results import SwarmProgress, SwarmResult
from pressrun.peer.verify import missing_spans


def swarm_result(
    manifest: Manifest,
    path: Path,
    core: PeerCore,
    progress: Progress | None,
    *,
    stalled: bool,
    started_at: float,
    verified_at: float | None,
    handover_pieces: tuple[int, ...],
    bytes_from_web_seeds: int,
    seeding_s: float | None,
    listen_port: int | None,
) -> SwarmResult:
    """The outcome so far: complete once verified and seeding or left; else the pieces
    kept for the handover (``handover_pieces``) and the spans still missing."""
    up = progress.uploaded_bytes if progress else 0
    down = progress.downloaded_bytes if progress else 0
    completed = core.phase in (PeerPhase.SEEDING, PeerPhase.LEFT) and (verified_at is not None)
    have = tuple(range(manifest.num_pieces)) if completed else handover_pieces
    return SwarmResult(
        issue_id=manifest.issue_id,
        path=path,
        completed=completed,
        stalled=stalled and not completed,
        have_pieces=have,
        missing_spans=() if completed else missing_spans(manifest, have),
        bytes_from_peers=max(0, down - bytes_from_web_seeds),
        bytes_from_web_seeds=bytes_from_web_seeds,
        uploaded_bytes=up,
        downloaded_bytes=down,
        ratio=share_ratio(up, down),
        ratio_at_leave=core.left.ratio if core.left else None,
        leave_rule=core.left.rule if core.left else None,
        download_s=(verified_at - started_at) if verified_at else None,
        seeding_s=seeding_s,
        listen_port=listen_port,
    )


def swarm_progress(
    phase: PeerPhase, progress: Progress, bytes_from_web_seeds: int
) -> SwarmProgress:
    """A status poll's report for a client's progress bar."""
    return SwarmProgress(
        phase=phase,
        done_bytes=progress.done_bytes,
        wanted_bytes=progress.wanted_bytes,
        uploaded_bytes=progress.uploaded_bytes,
        downloaded_bytes=progress.downloaded_bytes,
        bytes_from_web_seeds=bytes_from_web_seeds,
        connected_peers=progress.connected_peers,
    )
