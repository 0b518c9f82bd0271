"""The receive loop's object file (native/pressrun-flute/src/fast.rs `preallocate`):
its disk blocks come at once when the object's first packet does (fallocate with
FALLOC_FL_KEEP_SIZE), so each completed block is written into blocks the file has;
its size still grows only as blocks are written. Real UDP on 127.0.0.1, the packets
the crate's own sender made."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import socket
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pressrun_flute")
import pressrun_flute

FALLOC_FL_KEEP_SIZE = 1


def _preallocates_here(folder: Path) -> str | None:
    """Why the binding does not preallocate in ``folder``, or None when it does: not
    on tmpfs (its blocks are memory) nor where the file system refuses fallocate."""
    kind = subprocess.run(
        ["stat", "-f", "-c", "%T", str(folder)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if kind == "tmpfs":
        return "the binding does not preallocate on tmpfs"
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    probe = folder / "probe"
    with probe.open("wb") as f:
        refused = libc.fallocate(f.fileno(), FALLOC_FL_KEEP_SIZE, 0, 1 << 20) != 0
    probe.unlink()
    return f"{kind} refuses fallocate" if refused else None


def test_the_objects_file_has_its_blocks_from_the_first_packet(tmp_path: Path) -> None:
    """After the FDT and half of block 0's source symbols (no block complete), the
    object's file is empty but holds the object's disk blocks (before: none until a
    block was written); once complete, the file is the object, its size the
    object's, bit-exact."""
    why_not = _preallocates_here(tmp_path)
    if why_not:
        pytest.skip(why_not)
    data = random.Random(12).randbytes(1_000_000)
    enc = pressrun_flute.encode_object(
        data,
        content_location="file:///weekly.pdf",
        content_type="application/pdf",
        tsi=3,
        toi=2,
        fec="raptorq",
        max_source_block_length=256,
        repair_symbols_per_block=40,
    )
    rows = list(zip(enc.packets, enc.sbns, enc.esis, strict=True))
    k0 = enc.block_source_symbols[0]
    first = [p for p, sbn, esi in rows if sbn == 0 and esi < k0 // 2]
    rest = [p for p, sbn, esi in rows if not (sbn == 0 and esi < k0 // 2)]
    receiver = pressrun_flute.Receiver(tmp_path)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)

        def send(packets: list[bytes]) -> bool:
            ended = False
            for start in range(0, len(packets), 200):
                for pkt in packets[start : start + 200]:
                    tx.sendto(pkt, rx.getsockname())
                *_, ended = receiver.receive([(0, rx.fileno())], 0.02, batch_wait_s=0.0)
                if ended:
                    break
            return ended

        assert not send([*enc.fdt_packets, *first])
        path = tmp_path / "2.object"
        held = os.stat(path)
        assert held.st_size == 0
        assert held.st_blocks * 512 >= len(data)
        assert send(rest)
    finally:
        rx.close()
        tx.close()
    events = receiver.take_events()
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path == path
    assert path.stat().st_size == len(data)
    assert path.read_bytes() == data
