"""pressrun's PyO3 binding over the Rust crate flute, on its own: one pass of an
object encoded by the crate's sender and decoded by the crate's receiver in process."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

pressrun_flute = pytest.importorskip(
    "pressrun_flute", reason="the binding is built by `make setup` (native/pressrun-flute)"
)

SIZE = 1_500_000 + 17


def _data() -> bytes:
    return random.Random(11).randbytes(SIZE)


def test_raptorq_pass_layout() -> None:
    enc = pressrun_flute.encode_object(
        _data(),
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=9,
        toi=3,
        fec="raptorq",
        max_source_block_length=512,
        repair_symbols_per_block=100,
    )
    assert enc.toi == 3 and enc.tsi == 9 and enc.fec == "raptorq"
    assert enc.transfer_length == SIZE
    blocks = len(enc.block_source_symbols)
    assert blocks == -(-enc.source_symbols // 512)
    assert enc.source_symbols * enc.encoding_symbol_length >= SIZE
    # each block: its K source symbols (ESI 0..K-1) then exactly 100 repair symbols
    assert len(enc.packets) == enc.source_symbols + 100 * blocks
    for sbn, k in enumerate(enc.block_source_symbols):
        esis = sorted(e for s, e in zip(enc.sbns, enc.esis, strict=True) if s == sbn)
        assert esis == list(range(k + 100))
    assert enc.fdt_packets


def test_raptorq_decodes_from_about_k_symbols_under_loss(tmp_path: Path) -> None:
    data = _data()
    enc = pressrun_flute.encode_object(
        data,
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=1,
        toi=1,
        fec="raptorq",
        repair_symbols_per_block=1024,
    )
    receiver = pressrun_flute.Receiver(tmp_path)
    for pkt in enc.fdt_packets:
        assert receiver.push(pkt) == 0
    rng = random.Random(5)
    order = list(range(len(enc.packets)))
    rng.shuffle(order)
    pushed = 0
    events = []
    for i in order:
        if rng.random() < 0.2:  # 20% random loss
            continue
        assert receiver.push(enc.packets[i]) == 1
        pushed += 1
        events = receiver.take_events()
        if events:
            break
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path is not None
    got = Path(events[0].path).read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    # RaptorQ decodes from about the number of source symbols (a few extra per block)
    assert pushed <= enc.source_symbols + 3 * len(enc.block_source_symbols)
    # the object is received once: the same packets again give no second event
    for pkt in enc.packets[:50]:
        receiver.push(pkt)
    assert receiver.take_events() == []


def test_no_code_pass_is_the_source_in_order(tmp_path: Path) -> None:
    data = _data()
    enc = pressrun_flute.encode_object(
        data,
        content_location="file:///a/weekly.pdf",
        content_type="application/pdf",
        tsi=2,
        toi=8,
        fec="none",
    )
    assert len(enc.packets) == enc.source_symbols == -(-SIZE // enc.encoding_symbol_length)
    receiver = pressrun_flute.Receiver(tmp_path, md5_check=True)
    for pkt in [*enc.fdt_packets, *enc.packets]:
        receiver.push(pkt)
    (event,) = receiver.take_events()
    assert event.kind == "completed" and event.content_location == "file:///a/weekly.pdf"
    assert event.content_length == SIZE
    assert event.path is not None and Path(event.path).read_bytes() == data


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    common = {"content_location": "file:///x", "content_type": "x/y", "tsi": 1}
    with pytest.raises(ValueError, match="unknown fec"):
        pressrun_flute.encode_object(b"abc" * 100, toi=1, fec="rs", **common)
    with pytest.raises(ValueError, match="TOI 0"):
        pressrun_flute.encode_object(b"abc" * 100, toi=0, fec="none", **common)
    with pytest.raises(ValueError, match="no repair"):
        pressrun_flute.encode_object(
            b"abc" * 100, toi=1, fec="none", repair_symbols_per_block=3, **common
        )
    with pytest.raises(OSError, match="not a directory"):
        pressrun_flute.Receiver(tmp_path / "missing")
    receiver = pressrun_flute.Receiver(tmp_path)
    assert receiver.push(b"not a FLUTE packet") is None
    assert receiver.rejected == 1 and receiver.packets == 1


def test_poisoned_symbols_complete_with_wrong_bytes_unless_md5_checked(tmp_path: Path) -> None:
    """The crate's RaptorQ decoder cannot see changed bytes; the FDT's Content-MD5 can
    (pressrun checks its signed manifest instead, piece by piece)."""
    data = _data()
    enc = pressrun_flute.encode_object(
        data,
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=1,
        toi=1,
        fec="raptorq",
        repair_symbols_per_block=0,
    )
    poisoned = bytearray(enc.packets[10])
    poisoned[-1] ^= 0xFF
    packets = [*enc.fdt_packets, *enc.packets[:10], bytes(poisoned), *enc.packets[11:]]
    for md5_check, kind in ((False, "completed"), (True, "error")):
        folder = tmp_path / str(md5_check)
        folder.mkdir()
        receiver = pressrun_flute.Receiver(folder, md5_check=md5_check)
        for pkt in packets:
            receiver.push(pkt)
        (event,) = receiver.take_events()
        assert event.kind == kind
        if kind == "completed":
            assert event.path is not None and Path(event.path).read_bytes() != data


def test_packet_buffer_sends_the_indices_given_on_the_callers_socket() -> None:
    import socket

    packets = [bytes([i]) * (100 + i) for i in range(5)]
    buffer = pressrun_flute.PacketBuffer(packets)
    assert len(buffer) == 5 and buffer.packet(3) == packets[3]
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2)
        port = rx.getsockname()[1]
        sent, nbytes, failures, error = buffer.send(tx.fileno(), [4, 0, 4], "127.0.0.1", port)
        assert (sent, nbytes, failures, error) == (3, 104 + 100 + 104, 0, None)
        assert [rx.recv(1000) for _ in range(3)] == [packets[4], packets[0], packets[4]]
        # the socket is still the caller's: usable after the call
        tx.sendto(b"after", ("127.0.0.1", port))
        assert rx.recv(100) == b"after"
        with pytest.raises(ValueError, match="out of range"):
            buffer.send(tx.fileno(), [5], "127.0.0.1", port)
        with pytest.raises(ValueError, match="not an IPv4 address"):
            buffer.send(tx.fileno(), [0], "localhost", port)


def test_channel_sequence_extension_is_skipped_by_a_standard_receiver(tmp_path: Path) -> None:
    """Every packet numbered with the channel sequence extension (HET 250) still
    decodes in the crate's receiver, which knows nothing of it (RFC 5651: unknown
    header extensions are skipped); the numbers read back, mod 2^24."""
    data = random.Random(5).randbytes(200_000)
    enc = pressrun_flute.encode_object(
        data,
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=4,
        toi=2,
        fec="none",
    )
    first = (1 << 24) - 3  # the numbers wrap while the pass is sent
    numbered = [
        pressrun_flute.add_channel_sequence(p, first + k)
        for k, p in enumerate([*enc.fdt_packets, *enc.packets])
    ]
    assert [pressrun_flute.channel_sequence(p) for p in numbered[:5]] == [
        (1 << 24) - 3,
        (1 << 24) - 2,
        (1 << 24) - 1,
        0,
        1,
    ]
    assert pressrun_flute.channel_sequence(enc.packets[0]) is None
    plain = [*enc.fdt_packets, *enc.packets]
    assert all(len(n) == len(p) + 4 for n, p in zip(numbered, plain, strict=True))
    receiver = pressrun_flute.Receiver(tmp_path)
    for pkt in numbered:
        receiver.push(pkt)
    (event,) = receiver.take_events()
    assert event.kind == "completed" and event.path is not None
    assert Path(event.path).read_bytes() == data
    assert receiver.rejected == 0
    with pytest.raises(ValueError):
        pressrun_flute.add_channel_sequence(b"\x00", 1)


def test_sequence_counts_per_channel_measure_the_gaps(tmp_path: Path) -> None:
    """push_channel counts, per channel, the packets with a number and how far the
    numbers moved on: gaps are loss, a late packet is no gap, a sender restarted
    from 0 starts the count over, and a forgotten channel starts from its next packet."""
    enc = pressrun_flute.encode_object(
        random.Random(6).randbytes(100_000),
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=4,
        toi=2,
        fec="none",
    )
    pkt = enc.packets[0]
    receiver = pressrun_flute.Receiver(tmp_path)
    for seq in [100, 101, 103, 102, 110]:  # 104..109 lost, 102 late
        receiver.push_channel(0, pressrun_flute.add_channel_sequence(pkt, seq))
    for seq in range(50, 60):
        receiver.push_channel(1, pressrun_flute.add_channel_sequence(pkt, seq))
    assert receiver.take_sequence_counts() == [(0, 5, 11), (1, 10, 10)]
    assert receiver.take_sequence_counts() == [(0, 0, 0), (1, 0, 0)]
    receiver.push_channel(0, pressrun_flute.add_channel_sequence(pkt, 99))  # late
    receiver.forget_channel(1)
    receiver.push_channel(1, pressrun_flute.add_channel_sequence(pkt, 5000))
    for seq in (9000, 3, 4):  # far back: the sender restarted its numbers
        receiver.push_channel(3, pressrun_flute.add_channel_sequence(pkt, seq))
    assert receiver.take_sequence_counts() == [(0, 1, 0), (1, 1, 1), (3, 3, 3)]
    receiver.push_channel(2, pkt)  # no number: nothing counted
    assert all(ch != 2 for ch, _, _ in receiver.take_sequence_counts())
