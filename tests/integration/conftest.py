"""Fixtures: a publisher key, sample issue bytes, and a running test bed."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from pressrun.clients.config import DESKTOP, ClientConfig
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.demo.testbed import OriginShape, Testbed

ISSUE = "weekly-2026-47"
PIECE = 64 * 1024
SIZE = 2 * 1024 * 1024 + 4321  # 33 pieces, the last one short

#: fast failure detection for tests on loopback
FAST = replace(DESKTOP, stall_timeout_s=3.0, retry_backoff_s=0.05, retry_backoff_max_s=0.5)


@dataclass
class Keys:
    secret: Path
    public: Path

    @property
    def trusted(self) -> set[bytes]:
        return {load_public_key(self.public)}


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    return Keys(secret, public)


@pytest.fixture
def data() -> bytes:
    return random.Random(47).randbytes(SIZE)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


BedFactory = Callable[..., "AsyncIterator[Testbed]"]


@pytest.fixture
async def bed_factory(
    tmp_path: Path, keys: Keys, data: bytes
) -> AsyncIterator[Callable[..., object]]:
    """``await make(shapes, algorithm=...)``: a test bed with the issue published and
    the balancer up; all of them are closed at the end of the test."""
    beds: list[Testbed] = []

    async def make(
        shapes: tuple[OriginShape, ...],
        *,
        algorithm: str = "alg2",
        size: int | None = None,
        processes: bool = False,
    ) -> Testbed:
        bed = Testbed(
            tmp_path / f"bed{len(beds)}",
            shapes,
            poll_interval_s=0.3,
            poll_timeout_s=1.0,
            processes=processes,
        )
        beds.append(bed)
        await bed.__aenter__()
        payload = data if size is None else random.Random(48).randbytes(size)
        await bed.publish(payload, issue_id=ISSUE, key_path=keys.secret, piece_size=PIECE)
        await bed.start_balancer(algorithm)
        return bed

    yield make
    for bed in beds:
        await bed.close()


def config(**changes: object) -> ClientConfig:
    return replace(FAST, **changes)  # type: ignore[arg-type]
