"""Under an egress cap, piece fetches at once end one after another (issue 29).

A real origin (`start_origin`, in this loop) with a 2 Mbit/s cap (250 kB/s) and eight
concurrent 128 KiB range requests, as eight web seeds asking for a piece each. Each
client notes the origin's bytes sent (its own `TrafficMeter`) when its answer has come
whole. With turns of 256 KiB the first answer is whole after about its own bytes; with
turns of one 64 KiB write (the code before) every answer's first half went out before
any second half but the first asked's. The assertions are on bytes, not seconds: a
loaded host delays the clients' reads, and at 250 kB/s the origin sends one more piece
for each 0.52 s of it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp

from pressrun.origin import OriginConfig, start_origin

ISSUE = "weekly-2026-47"
PIECE = 128 * 1024
FETCHES = 8


async def _sent_when_whole(content: Path, turn_bytes: int) -> list[int]:
    """The origin's bytes sent when each of the eight answers had come whole, sorted."""
    origin = await start_origin(
        OriginConfig(content_dir=content, port=0, egress_cap_mbps=2.0, cap_turn_bytes=turn_bytes)
    )
    url = f"{origin.url}/content/{ISSUE}/issue.bin"
    try:
        async with aiohttp.ClientSession() as http:

            async def fetch(i: int) -> int:
                first, last = i * PIECE, (i + 1) * PIECE - 1
                async with http.get(url, headers={"Range": f"bytes={first}-{last}"}) as resp:
                    assert resp.status == 206
                    assert len(await resp.read()) == PIECE
                return origin.service.meter.bytes_sent_total

            return sorted(await asyncio.gather(*[fetch(i) for i in range(FETCHES)]))
    finally:
        await origin.stop()


async def test_piece_fetches_at_once_end_one_after_another(tmp_path: Path) -> None:
    content = tmp_path / "content"
    (content / ISSUE).mkdir(parents=True)
    (content / ISSUE / "issue.bin").write_bytes(os.urandom(FETCHES * PIECE))

    turns = await _sent_when_whole(content, 256 * 1024)
    # the k-th whole after k pieces and at most two more (1 s of a late read)
    assert all(sent <= (k + 3) * PIECE for k, sent in enumerate(turns)), turns
    assert turns[-1] == FETCHES * PIECE

    one_write_a_turn = await _sent_when_whole(content, 64 * 1024)
    # besides the first asked (both its writes taken before the others asked, the
    # bucket's burst), every first half (8 x 64 KiB) out before a second half
    assert one_write_a_turn[1] >= FETCHES * PIECE // 2 + 64 * 1024, one_write_a_turn
