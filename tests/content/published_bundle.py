"""A published bundle for content tests, and reproducible issue files."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

PIECE = 65536  # small pieces so a few-MB file has many of them


@dataclass(frozen=True)
class Published:
    """A bundle made by publish() and what went into it."""

    content: Path
    bundle: Path
    source: Path
    key: Path
    pub: Path
    data: bytes

    @property
    def manifest_path(self) -> Path:
        return self.bundle / "manifest.json"

    @property
    def copy(self) -> Path:
        return self.bundle / self.source.name


def make_issue(path: Path, size: int, seed: int = 47) -> bytes:
    """Write ``size`` reproducible pseudo-random bytes to ``path``."""
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data
