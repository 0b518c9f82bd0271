"""What a carousel reader keeps of a decoded object: every piece checked against the
signed manifest (`copy_verified_pieces`). A copy whose every piece matches and whose
size is the manifest's is not hashed whole again: the signed manifest's piece hashes
(SHA-256) already fix every byte of it, and the whole-file hash in the same signed
document adds only a check of the publisher against itself (docs/multicast.md,
"The decoded copy's check"); it was half the check's CPU.

The receive (`pressrun.multicast.receiver.receive_carousel`) does not trust the decoded
file; the client (`pressrun.clients.multicast_receive`) hands it here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pressrun.content.codec import Manifest, piece_ok


@dataclass(frozen=True, slots=True)
class KeptPieces:
    """What `copy_verified_pieces` kept of a decoded object."""

    #: the pieces that verified, now in the partial file
    good: list[int]
    #: the decoded file became the partial file (every piece verified and the size the
    #: manifest's: the copy is the manifest's file): nothing copied
    moved: bool


def copy_verified_pieces(manifest: Manifest, decoded: Path, partial: Path) -> KeptPieces:
    """Check the decoded object piece by piece against the signed manifest; when every
    piece verifies and the size is the manifest's, the decoded file takes the partial
    file's place (a rename: the object is not written a second time), else every
    piece that verifies is written into the partial file at its offset.
    A poisoned symbol corrupts the pieces of its source block; the others are kept.
    On a host short of CPU and disk (flash-crowd-50, 37 readers finishing within
    seconds of each other) the copy and a third read of the file cost seconds of each
    reader's download."""
    good: list[int] = []
    size = os.path.getsize(decoded)
    with open(decoded, "rb") as src:
        for index in range(manifest.num_pieces):
            offset, length = manifest.piece_span(index)
            src.seek(offset)
            data = src.read(length)
            if piece_ok(manifest, index, data):
                good.append(index)
        if len(good) == manifest.num_pieces and size == manifest.size_bytes:
            os.fsync(src.fileno())
            os.replace(decoded, partial)
            return KeptPieces(good, True)
        with open(partial, "r+b") as dst:
            for index in good:
                offset, length = manifest.piece_span(index)
                src.seek(offset)
                dst.seek(offset)
                dst.write(src.read(length))
            dst.flush()
            os.fsync(dst.fileno())
    return KeptPieces(good, False)
