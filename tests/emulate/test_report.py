"""The report's per-policy view of the swarm clients: how many used each uploader
policy and, for the `chord` ones, what the Chord ring answered them (their own
``pressrun get --json`` counts), summed and spread over the clients."""

from __future__ import annotations

from pressrun.emulate.report import policies_line, ring_by_policy


def _ring(uploaders: int, bring_in: int, failed: list[str]) -> dict[str, object]:
    return {"sessions": 1, "rounds": 5, "requests": 6, "uploaders": uploaders,
            "connects": uploaders // 2, "first": 0, "bring_in": bring_in, "waits": 4, "lookups": 1,
            "supernode_failures": len(failed), "failed_supernodes": failed}  # fmt: skip


def test_ring_answers_summed_per_policy_with_the_dead_supernodes() -> None:
    rows = [
        {"uploader_policy": "chord", "ring": _ring(10, 2, [])},
        {"uploader_policy": "chord", "ring": _ring(30, 0, ["198.18.21.11:7000"])},
        {"uploader_policy": "chord", "ring": _ring(20, 1, ["198.18.21.11:7000"])},
        {"uploader_policy": "stripes", "ring": None},
        {"uploader_policy": None, "ring": None},  # an origin client: no swarm
    ]
    by = ring_by_policy(rows)
    assert set(by) == {"chord", "stripes"}
    chord = by["chord"]
    assert chord["clients"] == 3 and chord["with_ring"] == 3
    assert chord["uploaders"] == 60 and chord["bring_in"] == 3 and chord["requests"] == 18
    assert chord["waits"] == 12
    assert chord["uploaders_per_client"] == {"min": 10, "median": 20, "max": 30}
    assert chord["failed_supernodes"] == ["198.18.21.11:7000"]
    assert by["stripes"] == {"clients": 1, "with_ring": 0}
    line = policies_line({"ring_by_policy": by})
    assert "chord 3 clients (3 on the ring: 60 uploaders named, 10 / 20 / 30 per client" in line
    assert "found dead: 198.18.21.11:7000" in line
    assert line.endswith("stripes 1 clients")
