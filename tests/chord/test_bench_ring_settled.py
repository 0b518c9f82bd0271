"""bench/swarm.py's supernodes' worker starts the crowd on a settled ring
(`bench/swarm_procs.ring_settled`): a supernode that had just joined answered for no
piece key until its predecessor notified it (up to ``stabilize_interval_s`` later), and
the bench's crowd started inside that window (docs/results/2026-11-28-swarm-limit.md,
section 14). The core now takes its predecessor from its join's lookup
(tests/chord/test_core.py); the bench still waits for one owner a key."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from pressrun.chord.aio import Supernode
from pressrun.peer.loopback import loopback_swarm

BENCH = Path(__file__).resolve().parents[2] / "bench"


def swarm_procs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("swarm_procs", BENCH / "swarm_procs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("swarm_procs", module)
    spec.loader.exec_module(module)
    return module


def answering(sns: list[Supernode]) -> list[int]:
    """For each piece key, how many supernodes answer for it."""
    return [sum(1 for sn in sns if sn.node.answers_for(k)) for k in sns[0].keys]  # type: ignore[union-attr]


async def test_the_crowd_starts_once_every_key_has_one_supernode(tmp_path: Path) -> None:
    procs = swarm_procs()
    async with loopback_swarm(
        tmp_path, size_bytes=2 << 20, origin_cap_mbps=(16.0,), piece_size=64 * 1024
    ) as swarm:
        assert swarm.tracker is not None
        swarm.tracker.ring.expected_supernodes = 3
        sns = []
        try:
            for i in range(3):
                sn = Supernode(
                    tracker_base=swarm.tracker_base,
                    info_hash=swarm.manifest.info_hash,
                    num_pieces=swarm.manifest.num_pieces,
                    seed=i,
                )
                sns.append(sn)
                await sn.start()
                await sn.wait_on_ring()
            waited = await procs.ring_settled(sns)
            assert waited < procs.RING_SETTLE_S
            assert answering(sns) == [1] * swarm.manifest.num_pieces
            # each supernode answers for its share (the tracker's placement), none idle
            shares = [sum(1 for k in sn.keys if sn.node.answers_for(k)) for sn in sns]  # type: ignore[union-attr]
            assert min(shares) > 0
        finally:
            for sn in sns:
                await sn.close()
