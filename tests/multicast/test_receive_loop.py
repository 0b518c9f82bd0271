"""The binding's receive loop decodes objects itself (native/pressrun-flute/src/fast.rs):
each symbol copied once into place, a RaptorQ block decoded only once it holds K plus
min(20, K/50) symbols or its symbols repeat. Real UDP on 127.0.0.1, the packets
the crate's own sender made."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pressrun_flute")
import pressrun_flute

from .conftest import Shelf, receive_issue


@contextmanager
def _socket_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        yield rx, tx
    finally:
        rx.close()
        tx.close()


def _waiting(sock: socket.socket) -> bool:
    """True while a datagram waits in ``sock``."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    return True


def _receive(
    receiver: pressrun_flute.Receiver,
    packets: Sequence[bytes],
    *,
    rounds: int = 3,
    drop_probability: float = 0.0,
) -> tuple[list[pressrun_flute.ObjectEvent], int]:
    """Send ``packets`` ``rounds`` times over, 200 at a time (the socket buffer holds
    that), the receive loop reading after each batch; (events, object packets)."""
    pushed = 0
    with _socket_pair() as (rx, tx):
        for _ in range(rounds):
            for start in range(0, len(packets), 200):
                for pkt in packets[start : start + 200]:
                    tx.sendto(pkt, rx.getsockname())
                # read until the socket is empty before the next batch: a call gives
                # back by its timeout, read or not (a starved host), and the next
                # batch would overflow what is left
                while True:
                    _, n, _, _, ended = receiver.receive(
                        [(0, rx.fileno())],
                        0.02,
                        batch_wait_s=0.0,
                        drop_probability=drop_probability,
                        seed=7,
                    )
                    pushed += n
                    if ended:
                        return receiver.take_events(), pushed
                    if not _waiting(rx):
                        break
    return receiver.take_events(), pushed


def _encode(data: bytes, fec: str, repair: int, toi: int = 2) -> pressrun_flute.EncodedObject:
    return pressrun_flute.encode_object(
        data,
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=3,
        toi=toi,
        fec=fec,
        max_source_block_length=256,
        repair_symbols_per_block=repair,
    )


def test_raptorq_under_loss_decodes_bit_exact_from_about_k_symbols(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(1_000_000)
    enc = _encode(data, "raptorq", 300)
    packets = [*enc.fdt_packets, *enc.packets]
    random.Random(2).shuffle(packets)
    receiver = pressrun_flute.Receiver(tmp_path)
    events, pushed = _receive(receiver, packets, drop_probability=0.2)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    assert events[0].content_length == len(data)
    assert receiver.rejected == 0
    blocks = len(enc.block_source_symbols)
    # every block waits for K + 5 symbols (K = 256); the shuffled order spreads the
    # last ones over the blocks
    assert pushed <= enc.source_symbols + 25 * blocks + 200
    # nothing but the object's own file in the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.object"]


def test_no_code_object_is_placed_symbol_by_symbol(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(300_001)  # a short last symbol
    enc = _encode(data, "none", 0)
    packets = [*enc.fdt_packets, *enc.packets]
    random.Random(4).shuffle(packets)
    receiver = pressrun_flute.Receiver(tmp_path)
    events, _ = _receive(receiver, packets)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data


def test_a_block_short_of_what_it_waits_for_decodes_when_its_symbols_repeat(
    tmp_path: Path,
) -> None:
    """Blocks of K = 256 wait for K + 5; a sender with 5 repair symbols per block, 3
    source symbols of each lost, never gives that: the block is decoded once its
    symbols come round again (the carousel's next cycle)."""
    data = random.Random(5).randbytes(400_000)
    enc = _encode(data, "raptorq", 5)
    # the first 3 source symbols of every block never arrive: repair is needed
    kept = [p for p, esi in zip(enc.packets, enc.esis, strict=True) if esi >= 3]
    receiver = pressrun_flute.Receiver(tmp_path)
    events, _ = _receive(receiver, [*enc.fdt_packets, *kept], rounds=2)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data


def test_strangers_objects_are_bounded_and_leave_no_files(tmp_path: Path) -> None:
    """Packets of ten other objects (TOIs 10..19) before the real one: at most four
    followed at once, an evicted one's file removed, the real one still completes."""
    rng = random.Random(6)
    strangers = [
        _encode(rng.randbytes(50_000), "raptorq", 10, toi=10 + i).packets[:5] for i in range(10)
    ]
    data = rng.randbytes(200_000)
    enc = _encode(data, "raptorq", 50)
    receiver = pressrun_flute.Receiver(tmp_path)
    packets = [p for batch in strangers for p in batch] + [*enc.fdt_packets, *enc.packets]
    events, _ = _receive(receiver, packets, rounds=1)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "2.object" in left and len(left) <= 4
    del receiver  # the incomplete objects' files go with it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.object"]


def test_md5_checking_receiver_keeps_the_crates_session(tmp_path: Path) -> None:
    """With md5_check the crate's session decodes (it checks the FDT's Content-MD5),
    and the event names the FDT's Content-Location, as `push` does."""
    data = random.Random(8).randbytes(100_000)
    enc = _encode(data, "raptorq", 50)
    receiver = pressrun_flute.Receiver(tmp_path, md5_check=True)
    events, _ = _receive(receiver, [*enc.fdt_packets, *enc.packets])
    assert [(e.kind, e.content_location) for e in events] == [("completed", "file:///weekly.pdf")]


async def test_a_receive_that_fails_drops_the_binding_in_its_own_thread(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """`receive_carousel` raising after it made the binding's Receiver (here: a channel
    port held by a socket without SO_REUSEADDR): the exception's traceback kept the
    Receiver alive into the event loop's thread, where PyO3 refuses to drop an
    unsendable object ("is unsendable, but is being dropped on another thread", seen
    in tests/multicast/test_client.py) and leaks it. It is dropped in the receive
    thread now."""
    import asyncio
    import gc
    import sys

    from pressrun.multicast.config import CarouselConfig

    shelf.publish("weekly-busy", 50_000)
    carousel = CarouselConfig(channels=1, rate_bps=4e6)
    sender = await senders(shelf, carousel)
    plan = await sender.start_carousel("weekly-busy", carousel)
    ch = plan.channels[0]
    squatter = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # no SO_REUSEADDR
    unraisable: list[str] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        squatter.bind((ch.group, ch.port))
        with pytest.raises(OSError):
            await receive_issue(shelf, sender.config.control_group, "weekly-busy", tmp_path / "r")
        await asyncio.sleep(0)
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
        squatter.close()
    assert not [u for u in unraisable if "unsendable" in u], unraisable


def test_the_decodes_cpu_is_counted_and_only_for_blocks_that_lacked_sources(
    tmp_path: Path,
) -> None:
    """``decodes`` / ``decode_cpu_s`` (bench/multicast.py prints the decode's share of
    the receive path's CPU from them): a receiver that got every source symbol
    decodes nothing; one that lost 20% decodes each block (RaptorQ) and the CPU it
    took is counted."""
    data = random.Random(6).randbytes(1_000_000)
    enc = _encode(data, "raptorq", 300)
    sources = [
        p
        for p, sbn, esi in zip(enc.packets, enc.sbns, enc.esis, strict=True)
        if esi < enc.block_source_symbols[sbn]
    ]
    (tmp_path / "whole").mkdir()
    (tmp_path / "lossy").mkdir()
    whole = pressrun_flute.Receiver(tmp_path / "whole")
    events, _ = _receive(whole, [*enc.fdt_packets, *sources], rounds=1)
    assert [e.kind for e in events] == ["completed"]
    assert (whole.decodes, whole.decode_cpu_s) == (0, 0.0)

    packets = [*enc.fdt_packets, *enc.packets]
    random.Random(7).shuffle(packets)
    lossy = pressrun_flute.Receiver(tmp_path / "lossy")
    events, _ = _receive(lossy, packets, drop_probability=0.2)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    blocks = len(enc.block_source_symbols)
    assert blocks <= lossy.decodes <= blocks + lossy.decode_retries
    # a RaptorQ decode of K = 256 symbols of 1320 bytes takes hundreds of us
    assert 1e-5 * blocks < lossy.decode_cpu_s < 5.0


def test_each_block_is_in_the_file_once_it_is_complete(tmp_path: Path) -> None:
    """A completed block goes to the object's file at its offset at once (from the
    decoder's output when it was decoded), not all at the end: block 0 whole from its
    source symbols, block 1 decoded from repair symbols, both in the file while block
    2 is still missing; ``write_cpu_s`` counts the writes' CPU."""
    data = random.Random(8).randbytes(1_000_000)
    enc = _encode(data, "raptorq", 40)
    k = enc.block_source_symbols
    assert len(k) >= 3
    size = enc.encoding_symbol_length
    rows = list(zip(enc.packets, enc.sbns, enc.esis, strict=True))
    block0 = [p for p, sbn, _ in rows if sbn == 0]
    # block 1 loses its first 5 source symbols: decoded from K + 5 symbols
    block1 = [p for p, sbn, esi in rows if sbn == 1 and esi >= 5]
    receiver = pressrun_flute.Receiver(tmp_path)
    events, _ = _receive(receiver, [*enc.fdt_packets, *block0, *block1], rounds=1)
    assert events == []
    assert receiver.decodes == 1
    written = (tmp_path / "2.object").read_bytes()
    end1 = (k[0] + k[1]) * size
    assert written[:end1] == data[:end1]
    assert receiver.write_cpu_s > 0.0


def test_the_objects_memory_is_brought_in_as_its_symbols_reach_it_and_counted(
    tmp_path: Path,
) -> None:
    """The object's buffer is brought in 256 kB at a time as its symbols first reach
    it (one MADV_POPULATE_WRITE each, fast.rs `Mapping::touch`), and ``memory_cpu_s``
    counts that CPU (bench/multicast.py prints it: fresh memory is a receiver's
    largest cost beyond the bare loop and the decode). Nothing before an object
    comes; after only block 0's source symbols of a 4 MB object (12 blocks), less than a whole
    object's worth (block 0 is a twelfth of it); then the rest, bit-exact, the
    object's last symbol 1 byte long (the mapping's end is not on a page)."""
    data = random.Random(10).randbytes(1400 * 2996 + 1)
    enc = _encode(data, "raptorq", 40)
    assert len(data) % enc.encoding_symbol_length == 1
    rows = list(zip(enc.packets, enc.sbns, enc.esis, strict=True))
    k = enc.block_source_symbols
    assert len(k) == 12
    block0 = [p for p, sbn, esi in rows if sbn == 0 and esi < k[0]]
    rest = [p for p, sbn, esi in rows if sbn != 0 and esi < k[sbn]]
    receiver = pressrun_flute.Receiver(tmp_path)
    assert receiver.memory_cpu_s == 0.0
    events, _ = _receive(receiver, [*enc.fdt_packets, *block0], rounds=1)
    assert events == []
    part = receiver.memory_cpu_s
    events, _ = _receive(receiver, rest, rounds=1)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    whole = receiver.memory_cpu_s
    # populating 4 MB (zeroing it) takes well over 20 us on any host;
    # a populate the kernel refused would leave the count at one failed call's cost
    assert whole > 2e-5
    assert 0.0 < part < whole


def test_repair_symbols_held_in_the_slots_of_missing_sources_decode_bit_exact(
    tmp_path: Path,
) -> None:
    """A receiver that joins after the source symbols keeps its repair symbols in the
    object's buffer, in the slots of source symbols that have not come (fast.rs); a
    source symbol that comes later (the next cycle) moves the repair symbol in its
    slot out first. Each block here: K - 30 repair symbols (slots 0.. taken), then
    source symbols 0..19 (onto those slots), then 20 more repair symbols;
    the object's last symbol is 1 byte long (its slot takes no repair symbol)."""
    data = random.Random(9).randbytes(700_001)
    enc = _encode(data, "raptorq", 300)
    k = enc.block_source_symbols
    assert len(k) == 2 and len(data) % enc.encoding_symbol_length == 1
    rows = list(zip(enc.packets, enc.sbns, enc.esis, strict=True))
    order: list[bytes] = []
    for sbn, kb in enumerate(k):
        repairs = [p for p, b, esi in rows if b == sbn and esi >= kb]
        order += repairs[: kb - 30]
        order += [p for p, b, esi in rows if b == sbn and esi < 20]
        # 20 more: K + 10 symbols in all, K - 10 if the 20 moved out were lost
        order += repairs[kb - 30 : kb - 10]
    receiver = pressrun_flute.Receiver(tmp_path)
    events, _ = _receive(receiver, [*enc.fdt_packets, *order], rounds=1)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None and Path(events[0].path).read_bytes() == data
    # both blocks were decoded (from repair symbols), none completed from sources
    assert receiver.decodes >= 2
