"""A capped peer sends a fresh connection its pieces at its cap, not a block a tick.

libtorrent reads the blocks a connection asked for into its send buffer only up to a
watermark, the larger of ``send_buffer_low_watermark`` and half of what that connection
sent in its last second: a connection that sent nothing yet holds one 16 KiB block at a
time with libtorrent's default (10 KiB). With an upload limit, a block waits for the
rate limiter's next quota (every ``tick_interval``), so such a connection sent about one
block a tick, 160 kB/s at the peer's 100 ms, whatever its limit, until its second
second. On the loopback bench (1 MB/s a peer) a piece's bringer sent its first piece
to its two named receivers at 160-320 kB/s (0.8-1.1 s for 128 KiB) and 98% of the
ramp's uploading connections held one block or less
(`pressrun.peer.session.SEND_BUFFER_LOW_WATERMARK`; docs/chord.md).

Real libtorrent sessions on 127.0.0.1 with the peer's own settings
(`pressrun.peer.session.session_settings`) against the same with libtorrent's default
watermark: from the leecher's first request, the peer's fresh connection delivers the
first piece in under half the time. (An order between two uploads on the same host at
the same moment, not a wall-clock bound: a loaded host slows both.)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import libtorrent as lt

from pressrun.peer.config import PeerConfig
from pressrun.peer.session import AlertSession, session_settings

PIECE = 128 * 1024
PIECES = 8
#: the seed's upload limit (the loopback bench's peers')
CAP_BPS = 1_000_000
#: libtorrent's own watermark (`lt.default_settings()`)
LIBTORRENT_DEFAULT = int(lt.default_settings()["send_buffer_low_watermark"])


def _torrent(folder: Path, data: bytes) -> Any:
    (folder / "issue.bin").write_bytes(data)
    fs = lt.file_storage()
    lt.add_files(fs, str(folder / "issue.bin"))
    made = lt.create_torrent(fs, PIECE)
    made.set_priv(True)  # (no peer exchange: every connection is one the test makes)
    lt.set_piece_hashes(made, str(folder))
    return lt.torrent_info(lt.bencode(made.generate()))


async def _first_piece_s(tmp: Path, ti: Any, *, watermark: int | None) -> float:
    """Seconds from a leecher's first block request to a fresh seed (capped at
    `CAP_BPS`) until its first piece is whole; ``watermark``: the seed's
    ``send_buffer_low_watermark`` (None: the peer's own). From the request, not the
    connection: the handshake and the unchoke take the same time either way."""
    loop = asyncio.get_running_loop()
    opened: list[AlertSession] = []
    # (libtorrent's own times of the alerts, not when the loop handled them: a loaded
    # host's loop lag is not the seed's sending)
    seen: dict[str, Any] = {}

    def on_alert(alert: Any) -> None:
        if isinstance(alert, lt.block_downloading_alert):
            seen.setdefault("request", alert.timestamp())
        elif isinstance(alert, lt.piece_finished_alert):
            seen.setdefault("piece", alert.timestamp())

    def session(upload_bps: int, extra: dict[str, Any], on: Any) -> Any:
        settings = session_settings(
            PeerConfig(upload_limit_bps=upload_bps), listen_interfaces="127.0.0.1:0"
        )
        # (the block requests' alerts, which a peer asks for only where its timeline
        # is logged: `pressrun.peer.session.alert_mask`)
        settings["alert_mask"] |= int(lt.alert.category_t.block_progress_notification)
        alerts = AlertSession(
            {**settings, **extra}, loop=loop, on_alert=on, after_alerts=lambda: None
        )
        opened.append(alerts)
        return alerts.session

    def add(ses: Any, folder: Path) -> Any:
        params = lt.add_torrent_params()
        params.ti = ti
        params.save_path = str(folder)
        return ses.add_torrent(params)

    try:
        extra = {} if watermark is None else {"send_buffer_low_watermark": watermark}
        seed_ses = session(CAP_BPS, extra, lambda alert: None)
        seed = add(seed_ses, tmp)
        for _ in range(200):
            if seed.status().is_seeding:
                break
            await asyncio.sleep(0.05)
        assert seed.status().is_seeding, "the seed checked its pieces"
        folder = tmp / f"leecher-{watermark}"
        folder.mkdir()
        leecher = add(session(0, {}, on_alert), folder)
        began = time.monotonic()
        leecher.connect_peer(("127.0.0.1", seed_ses.listen_port()))
        while "piece" not in seen:
            assert time.monotonic() - began < 60, "a piece within a minute"
            await asyncio.sleep(0.01)
        return float((seen["piece"] - seen["request"]).total_seconds())
    finally:
        for alerts in opened:
            await alerts.close()


async def test_a_capped_peers_fresh_connection_sends_at_its_cap(tmp_path: Path) -> None:
    ti = _torrent(tmp_path, bytes(range(256)) * (PIECE * PIECES // 256))
    default_s = await _first_piece_s(tmp_path, ti, watermark=LIBTORRENT_DEFAULT)
    ours_s = await _first_piece_s(tmp_path, ti, watermark=None)
    # a piece (128 KiB) at 1 MB/s is 0.13 s; one block a 100 ms tick, 0.7-0.8 s
    assert ours_s * 2 < default_s, (ours_s, default_s)
