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
