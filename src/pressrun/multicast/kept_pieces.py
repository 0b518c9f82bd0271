"""What a carousel reader keeps of a decoded object: every piece checked against the
signed manifest, and the whole SHA-256 on the same read (`copy_verified_pieces`).

The receive (`pressrun.multicast.receiver.receive_carousel`) does not trust the decoded
file; the client (`pressrun.clients.multicast_receive`) hands it here."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from pressrun.content.codec import Manifest, piece_ok


@dataclass(frozen=True, slots=True)
class KeptPieces:
    """What `copy_verified_pieces` kept of a decoded object."""

    #: the pieces that verified, now in the partial file
    good: list[int]
    #: the SHA-256 of the decoded object read whole (None when it was not the
    #: manifest's size)
    sha256: str | None
    #: the decoded file became the partial file (every piece verified): nothing copied
    moved: bool


def copy_verified_pieces(manifest: Manifest, decoded: Path, partial: Path) -> KeptPieces:
    """Check the decoded object piece by piece against the signed manifest, and its
    whole SHA-256 on the same read; when every piece verifies, the decoded file takes
    the partial file's place (a rename: the object is not written a second time),
    else every piece that verifies is written into the partial file at its offset.
    A poisoned symbol corrupts the pieces of its source block; the others are kept.
    On a host short of CPU and disk (flash-crowd-50, 37 readers finishing within
    seconds of each other) the copy and a third read of the file cost seconds of each
    reader's download."""
    good: list[int] = []
    whole = hashlib.sha256()
    size = os.path.getsize(decoded)
    with open(decoded, "rb") as src:
        for index in range(manifest.num_pieces):
            offset, length = manifest.piece_span(index)
            src.seek(offset)
            data = src.read(length)
            whole.update(data)
            if piece_ok(manifest, index, data):
                good.append(index)
        if len(good) == manifest.num_pieces and size == manifest.size_bytes:
            os.fsync(src.fileno())
            os.replace(decoded, partial)
            return KeptPieces(good, whole.hexdigest(), True)
        with open(partial, "r+b") as dst:
            for index in good:
                offset, length = manifest.piece_span(index)
                src.seek(offset)
                dst.seek(offset)
                dst.write(src.read(length))
            dst.flush()
            os.fsync(dst.fileno())
    return KeptPieces(good, whole.hexdigest() if size == manifest.size_bytes else None, False)
