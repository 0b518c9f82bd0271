"""What a carousel reader does with the decoded object: every piece checked against the
signed manifest on one read (no whole-file hash: the pieces fix it); a good object becomes the
partial file by a rename (not written again), a poisoned one gives its good pieces.

In flash-crowd-50 (28 Nov, 2181bec) the readers' downloads ended 4-7 s after their
receive ended, on a host short of CPU and disk: the object was read to check its
pieces, copied into the partial file, fsynced, then read twice more (the pieces and
the whole SHA-256) by the final check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pressrun.content.manifest import SignedManifest
from pressrun.multicast.kept_pieces import copy_verified_pieces

from .conftest import Published

SIZE = 300_000  # 5 pieces of 64 KiB


def _files(pub: Published, tmp_path: Path, decoded_data: bytes) -> tuple[Path, Path]:
    decoded = tmp_path / "work" / "object"
    decoded.parent.mkdir()
    decoded.write_bytes(decoded_data)
    partial = tmp_path / "partial"
    partial.write_bytes(bytes(SIZE))
    return decoded, partial


def test_a_good_object_becomes_the_partial_file(
    published: Callable[[int], Published], tmp_path: Path
) -> None:
    pub = published(SIZE)
    m = SignedManifest.from_json_bytes(pub.manifest_json).manifest
    decoded, partial = _files(pub, tmp_path, pub.data)
    kept = copy_verified_pieces(m, decoded, partial)
    assert kept.good == list(range(m.num_pieces))
    assert kept.moved
    assert partial.read_bytes() == pub.data
    assert not decoded.exists()  # renamed, not copied


def test_a_poisoned_object_gives_its_good_pieces_only(
    published: Callable[[int], Published], tmp_path: Path
) -> None:
    pub = published(SIZE)
    m = SignedManifest.from_json_bytes(pub.manifest_json).manifest
    bad = bytearray(pub.data)
    offset, length = m.piece_span(2)
    bad[offset + length // 2] ^= 0x5A
    decoded, partial = _files(pub, tmp_path, bytes(bad))
    kept = copy_verified_pieces(m, decoded, partial)
    assert kept.good == [i for i in range(m.num_pieces) if i != 2]
    assert not kept.moved
    got = partial.read_bytes()
    assert got[offset : offset + length] == bytes(length)  # piece 2 left to others
    assert (
        got[:offset] == pub.data[:offset] and got[offset + length :] == pub.data[offset + length :]
    )
    assert decoded.exists()
