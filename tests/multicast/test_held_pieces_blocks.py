"""The pieces a reader held when it left the swarm for the carousel shorten its
receive in proportion when the issue is one source block (issue 28, session 23;
docs/multicast.md, "Source blocks").

The receiver takes held pieces as known source symbols (test_known_pieces.py), but an
object completes with its last block, and the carousel gives every block symbols at
the same rate: with blocks of 1024 symbols (a 50 MB issue in 37 blocks of about 10
pieces of 128 KiB) a random third of the pieces left some block with almost none, and
that block needed about K symbols from the network. `CarouselConfig.
max_source_block_symbols` now takes up to 56,403 (RFC 6330's largest K; it stopped at
8192), so an issue up to 74 MB can be one block, and each channel's cycle mixes a
block's source and repair symbols evenly (`prepare.pass_order`), so the held source
symbols that come again are wasted only in the pass's proportion wherever a reader
joins. The default stays 1024: one block was slower in the emulated crowd (its decode
and memory at the end of every receive)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.multicast.config import (
    MAX_BLOCK_SYMBOLS,
    MAX_ESI,
    CarouselConfig,
    LayeringConfig,
)
from pressrun.multicast.core import channel_cycles
from pressrun.multicast.prepare import pass_order

from .conftest import Shelf, receive_issue

#: the emulation's piece size for its 50 MB issue (pressrun publish's default)
PIECE = 131072


async def test_a_third_of_the_pieces_held_saves_a_third_of_the_packets(
    shelf: Shelf, senders: Callable[..., Any], tmp_path: Path
) -> None:
    """An 8 MB issue (6,061 symbols, 62 pieces of 128 KiB) in one block on a carousel
    of 10 channels, all joined at once (real UDP on 127.0.0.1, the Rust binding's receive
    loop): a receiver holding a random third of the pieces completes in at most 0.72
    of the object packets of one holding nothing. Why 0.72: it needs the symbols of
    the two thirds it lacks (0.675 of K: a symbol across a piece's edge is not
    held), plus the held source symbols that come again, which are the held share
    (a third) of the carousel's source share (K / (K + R) = 1 / 13.5 with 10
    channels), 2.5% of the packets: 0.675 / 0.975 = 0.692, and the decode's 20
    symbols beyond K are on both sides. In blocks of 1024 (6 blocks of about 10
    pieces; on the code before, blocks stopped at 8192 and each channel sent its
    source symbols first) the ratio was 0.845: the block held least of needed almost
    K symbols."""
    data = shelf.publish("held-third", 8_000_000)
    pieces = -(-len(data) // PIECE)
    held = sorted(random.Random(3).sample(range(pieces), pieces // 3))
    partial = tmp_path / "partial"
    partial.write_bytes(data)
    ranges = [(i * PIECE, min(len(data), (i + 1) * PIECE) - i * PIECE) for i in held]
    one_block = CarouselConfig(
        channels=10, rate_bps=4e6, max_source_block_symbols=MAX_BLOCK_SYMBOLS["raptorq"]
    )
    sender = await senders(shelf, one_block)
    await sender.start_carousel("held-third", sender.config.carousel)
    every = LayeringConfig(start_channels=10)
    results = []
    for known in (None, (partial, ranges)):
        results.append(
            await receive_issue(
                shelf,
                sender.config.control_group,
                "held-third",
                tmp_path / f"rx-{len(results)}",
                layering=every,
                known=known,
            )
        )
    nothing, third = results
    for result in results:
        assert result.completed, result.reason
        assert result.path.read_bytes() == data
    k = third.plan.source_symbols
    assert 0.31 * k <= third.known_symbols <= k / 3, (third.known_symbols, k)
    ratio = third.object_packets / nothing.object_packets
    assert ratio <= 0.72, (third.object_packets, nothing.object_packets, third.known_symbols)
    # and it cannot have done with fewer than the symbols it lacked
    assert third.object_packets >= k - third.known_symbols


def test_each_stretch_of_a_cycle_carries_the_pass_s_share_of_source_symbols() -> None:
    """`pass_order`: one block of K = 1000 with 4 channels x 1.35 (R = 4,400): every
    tenth of each channel's cycle holds K / (K + R) of source symbols (25 of 135),
    where the encoder's order put all of a channel's 250 in its first 250 packets.
    Every packet is in the pass once; ``none`` keeps the encoder's order."""
    k, r, channels = 1000, 4400, 4
    sbns, esis = [0] * (k + r), list(range(k + r))
    order = pass_order("raptorq", sbns, esis, [k])
    assert sorted(order) == list(range(k + r))
    cycles = channel_cycles(
        fec="raptorq",
        sbns=[sbns[i] for i in order],
        esis=[esis[i] for i in order],
        channels=channels,
        fdt_packets=1,
        fdt_every_packets=10**6,
    )
    for cycle in cycles:
        symbols = [esis[order[p - 1]] for p in cycle[1:]]  # the FDT packet first
        assert len(symbols) == (k + r) // channels
        for tenth in range(10):
            stretch = symbols[tenth * 135 : (tenth + 1) * 135]
            assert sum(e < k for e in stretch) == 25, tenth
    assert pass_order("none", [0, 0, 1], [0, 1, 0], [2, 1]) == [0, 1, 2]


def test_one_block_of_up_to_56403_symbols_with_its_repair_symbols() -> None:
    """RaptorQ blocks up to RFC 6330's largest K: a 50 MB issue in one block of 37,879
    symbols, and 10 channels x 1.35 of it are 473,487 repair symbols, past the 16 bits
    the crate's constructor takes (the binding sets the crate's 32-bit field; ESIs are
    24 bits). The default stays 1024; ``none`` keeps its own limit."""
    config = CarouselConfig(channels=10, max_source_block_symbols=MAX_BLOCK_SYMBOLS["raptorq"])
    size = 50_000_000
    k = -(-size // config.symbol_bytes)
    assert config.source_block_symbols(size) >= k
    assert config.repair_symbols_per_block(size) == -(-k * 10 * 135 // 100) - k
    assert CarouselConfig().source_block_symbols(size) == 1024
    for bad in (3, 56404):
        with pytest.raises(ValueError, match="max_source_block_symbols"):
            CarouselConfig(max_source_block_symbols=bad)
    CarouselConfig(fec="none", max_source_block_symbols=65535)


def test_the_binding_encodes_more_than_65535_repair_symbols_a_block() -> None:
    """The binding takes repair symbols per block past 16 bits (ESIs up to 2^24 - 1)
    and refuses a block whose ESIs would not fit."""
    from functools import partial

    import pressrun_flute

    encode = partial(
        pressrun_flute.encode_object,
        content_location="file:///held/issue.pdf",
        content_type="application/octet-stream",
        tsi=1,
        toi=7,
        fec="raptorq",
        encoding_symbol_length=1320,
        max_source_block_length=56403,
    )
    encoded = encode(bytes(range(256)) * 100, repair_symbols_per_block=70_000)
    assert encoded.block_source_symbols == [20]
    assert len(encoded.packets) == 70_020 and max(encoded.esis) == 70_019
    with pytest.raises(ValueError, match="24 bits"):
        encode(b"x" * 2000, repair_symbols_per_block=MAX_ESI)
