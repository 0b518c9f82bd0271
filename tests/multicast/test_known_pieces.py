"""A receiver that holds pieces of the issue already (from the swarm, before it left it
for the carousel) takes from the carousel only what it lacks (issue 28, session 18).

The receive loop's decoder completes each block from K symbols; before, the pieces a
client held did not count toward them, so the carousel brought the whole object
whatever it held: in flash-crowd-50 at 297117b (28 Nov 18:12, /work/runs/fc50-s17c)
readers that left the swarm with 23-48% of the file took as long on the carousel as
readers with nothing (lossy-10: 51-57 s against 53-58 s). Now `receive_carousel`'s
``known`` names the bytes held (a file and its byte ranges), and the binding takes every
source symbol wholly inside them as if it had arrived. A real carousel on 127.0.0.1."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pressrun.multicast.config import CarouselConfig, LayeringConfig

from .conftest import Shelf, receive_issue

PIECE = 16384  # the shelf's piece size


async def test_pieces_held_are_not_brought_again(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    """Every piece of a 2 MB issue held but one in the middle of its first block (the
    file's bytes of that piece garbage): the object completes once the missing piece's
    symbols, or as many of the block's repair symbols, came (well under K packets),
    and decodes bit-exact (the garbage is never taken). On the code before the
    receiver needed K symbols of every block from the network."""
    data = shelf.publish("held", 2_000_000)
    pieces = -(-len(data) // PIECE)
    missing = 30  # bytes 491,520-507,904: symbols 372-384 of block 0 (K = 758)
    partial = tmp_path / "partial"
    garbage = bytearray(data)
    start, end = missing * PIECE, (missing + 1) * PIECE
    garbage[start:end] = random.Random(7).randbytes(end - start)
    partial.write_bytes(bytes(garbage))
    ranges = [
        (i * PIECE, min(len(data), (i + 1) * PIECE) - i * PIECE)
        for i in range(pieces)
        if i != missing
    ]
    sender = await senders(shelf, CarouselConfig(channels=1, rate_bps=10e6))
    await sender.start_carousel("held", sender.config.carousel)
    result = await receive_issue(
        shelf,
        sender.config.control_group,
        "held",
        tmp_path / "rx",
        layering=LayeringConfig(max_channels=1),
        known=(partial, ranges),
    )
    assert result.completed, result.reason
    assert result.path.read_bytes() == data
    symbols = result.plan.source_symbols
    assert result.known_symbols >= 0.95 * symbols, (result.known_symbols, symbols)
    # the missing symbols sit near the middle of the cycle's source part, block 0's
    # repair symbols after it: whatever the phase the receiver joined at, a few
    # hundred to about 800 packets, where a receiver holding nothing needs >= K
    assert result.object_packets <= 0.75 * symbols, (result.object_packets, symbols)


async def test_a_receiver_holding_nothing_is_as_before(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    """``known`` with no range, or a file that cannot be read, takes nothing: the
    carousel brings every symbol and the object still decodes."""
    data = shelf.publish("none-held", 600_000)
    sender = await senders(shelf, CarouselConfig(channels=1, rate_bps=10e6))
    await sender.start_carousel("none-held", sender.config.carousel)
    result = await receive_issue(
        shelf,
        sender.config.control_group,
        "none-held",
        tmp_path / "rx",
        known=(tmp_path / "missing", [(0, len(data))]),
    )
    assert result.completed, result.reason
    assert result.path.read_bytes() == data
    assert result.known_symbols == 0
    assert result.object_packets >= result.plan.source_symbols
