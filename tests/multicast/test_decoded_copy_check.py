"""The decoded copy is hashed once, piece by piece against the signed manifest, not
again whole: the manifest's piece hashes (SHA-256, in the signed document) fix every
byte of a copy whose pieces all match and whose size is the manifest's, so the
whole-file hash added only a check of the publisher against itself, at half the
check's CPU (docs/multicast.md, "The decoded copy's check"). A copy with a bad piece
or the wrong size is not taken whole."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pressrun.content.manifest import SignedManifest
from pressrun.multicast.kept_pieces import copy_verified_pieces

from .conftest import Published
from .test_kept_pieces import SIZE, _files


class _Counting:
    """hashlib.sha256 that counts the bytes hashed."""

    def __init__(self) -> None:
        self.hashed = 0
        self._real = hashlib.sha256

    def __call__(self, data: bytes = b"", **kw: Any) -> Any:
        counter = self
        real = self._real(data, **kw)
        counter.hashed += len(data)

        class Wrapped:
            def update(self, more: bytes) -> None:
                counter.hashed += len(more)
                real.update(more)

            def hexdigest(self) -> str:
                return real.hexdigest()

            def digest(self) -> bytes:
                return real.digest()

        return Wrapped()


def test_a_good_copy_is_hashed_once(
    published: Callable[[int], Published], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pub = published(SIZE)
    m = SignedManifest.from_json_bytes(pub.manifest_json).manifest
    decoded, partial = _files(pub, tmp_path, pub.data)
    counting = _Counting()
    monkeypatch.setattr(hashlib, "sha256", counting)
    kept = copy_verified_pieces(m, decoded, partial)
    monkeypatch.undo()
    assert kept.moved and kept.good == list(range(m.num_pieces))
    assert partial.read_bytes() == pub.data
    # every byte once, for its piece (the code before: twice, the whole file again)
    assert counting.hashed == SIZE


def test_a_copy_of_the_wrong_size_is_not_taken_whole(
    published: Callable[[int], Published], tmp_path: Path
) -> None:
    """Bytes past the manifest's size belong to no piece: the pieces all match, but
    the copy is not the manifest's file, so it is not renamed into place (its
    pieces are copied; the final check reads the partial file)."""
    pub = published(SIZE)
    m = SignedManifest.from_json_bytes(pub.manifest_json).manifest
    decoded, partial = _files(pub, tmp_path, pub.data + b"tail")
    kept = copy_verified_pieces(m, decoded, partial)
    assert kept.good == list(range(m.num_pieces)) and not kept.moved
    assert partial.read_bytes() == pub.data
