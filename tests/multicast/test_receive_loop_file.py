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
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pressrun_flute")
import pressrun_flute

from .test_receive_loop import _encode, _receive

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
    enc = _encode(data, "raptorq", 40)
    rows = list(zip(enc.packets, enc.sbns, enc.esis, strict=True))
    half = enc.block_source_symbols[0] // 2
    first = [p for p, sbn, esi in rows if sbn == 0 and esi < half]
    rest = [p for p, sbn, esi in rows if not (sbn == 0 and esi < half)]
    receiver = pressrun_flute.Receiver(tmp_path)
    events, _ = _receive(receiver, [*enc.fdt_packets, *first], rounds=1)
    assert events == []
    path = tmp_path / "2.object"
    held = os.stat(path)
    assert held.st_size == 0
    assert held.st_blocks * 512 >= len(data)
    events, _ = _receive(receiver, rest, rounds=1)
    assert [e.kind for e in events] == ["completed"]
    assert events[0].path == path
    assert path.stat().st_size == len(data)
    assert path.read_bytes() == data
