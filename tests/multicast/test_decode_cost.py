"""The receive loop's decode split into the `raptorq` crate's share and the binding's
(issue 28: bench/multicast.py sets the crate's decode beside the bare recvmmsg loop):
``crate_decode_cpu_s`` times the crate's ``decode`` call alone inside the receive path,
and ``redecode`` times the crate's decode again on the blocks this receiver decoded,
given the same ESIs, without the receive loop around it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("pressrun_flute")
import pressrun_flute

from .test_receive_loop import _encode, _receive


def test_the_crates_decode_is_timed_alone_and_again_on_the_same_blocks(tmp_path: Path) -> None:
    """A receiver that lost 20% decodes every block; the crate's ``decode`` calls are a
    part of the decode's CPU, and ``redecode`` decodes each recorded block again from
    the same ESIs to the file's bytes, with a CPU of the same order."""
    data = random.Random(11).randbytes(1_000_000)
    enc = _encode(data, "raptorq", 300)
    packets = [*enc.fdt_packets, *enc.packets]
    random.Random(12).shuffle(packets)
    receiver = pressrun_flute.Receiver(tmp_path, record_decodes=True)
    events, _ = _receive(receiver, packets, drop_probability=0.2)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    blocks = len(enc.block_source_symbols)
    assert receiver.decodes >= blocks
    assert 0.0 < receiver.crate_decode_cpu_s <= receiver.decode_cpu_s
    redone, cpu_s, bit_exact = receiver.redecode()
    assert (redone, bit_exact) == (blocks, True)
    # K = 256 symbols of 1320 bytes: hundreds of us a block, never seconds
    assert 1e-5 * blocks < cpu_s < 5.0


def test_without_recording_nothing_is_kept_to_decode_again(tmp_path: Path) -> None:
    """By default (``pressrun get``) no ESIs are kept: ``redecode`` has nothing to do,
    while the crate's share of the decode is still counted."""
    data = random.Random(13).randbytes(400_000)
    enc = _encode(data, "raptorq", 300)
    packets = [*enc.fdt_packets, *enc.packets]
    random.Random(14).shuffle(packets)
    receiver = pressrun_flute.Receiver(tmp_path)
    events, _ = _receive(receiver, packets, drop_probability=0.2)
    assert [e.kind for e in events] == ["completed"]
    assert receiver.decodes >= 1 and receiver.crate_decode_cpu_s > 0.0
    assert receiver.redecode() == (0, 0.0, True)


def test_the_recorded_decodes_are_bounded(tmp_path: Path) -> None:
    """An object of 80 small blocks, every one decoded from repair symbols: the
    receiver keeps the inputs of 64 block decodes and no more (the ESIs come from the
    network), and ``redecode`` decodes those 64 bit-exact."""
    data = random.Random(15).randbytes(80 * 8 * 1320)
    enc = pressrun_flute.encode_object(
        data,
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=3,
        toi=2,
        fec="raptorq",
        encoding_symbol_length=1320,
        max_source_block_length=8,
        repair_symbols_per_block=12,
    )
    assert len(enc.block_source_symbols) >= 70
    # each block loses its first source symbol: decoded from the rest and repairs
    packets = [p for p, esi in zip(enc.packets, enc.esis, strict=True) if esi != 0]
    receiver = pressrun_flute.Receiver(tmp_path, record_decodes=True)
    events, _ = _receive(receiver, [*enc.fdt_packets, *packets], rounds=1)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    # one decode a block; an attempt the crate could not finish yet is a retry
    assert receiver.decodes - receiver.decode_retries == len(enc.block_source_symbols)
    redone, _, bit_exact = receiver.redecode()
    assert (redone, bit_exact) == (64, True)
