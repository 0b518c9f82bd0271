"""The origin egress by cause (`pressrun.emulate.egress_causes`), on rows shaped like
the report's per-client rows: each client's bytes from the origins go to the rule that
sent them there, the origins' egress no client counted is ``other``."""

from __future__ import annotations

from typing import Any

from pressrun.emulate.egress_causes import CAUSES, causes_line, origin_egress_by_cause

MB = 1_000_000


def row(client: int, kind: str, mode: str, web: int, sections: int, **extra: Any) -> dict[str, Any]:
    return {
        "client": client,
        "kind": kind,
        "link": "dsl-20",
        "mode": mode,
        "started_s": float(client),
        "left_swarm_for_carousel": extra.get("left", False),
        "bytes_from_web_seeds": web,
        "bytes_from_origins": web + sections,
    }


def test_each_clients_origin_bytes_go_to_the_rule_that_sent_them() -> None:
    rows = [
        row(1, "desktop", "origin", 0, 50 * MB),
        row(2, "desktop", "swarm", 40 * MB, 0),
        row(3, "desktop", "swarm", 2 * MB, 3 * MB),  # a stalled swarm's sections
        row(4, "desktop", "multicast", MB, 0, left=True),
        row(5, "desktop", "multicast", 0, 4 * MB),  # the carousel's fallback
        row(6, "desktop", "multicast", 0, 0),
        row(51, "browser", "swarm", 9 * MB, 0),
        row(52, "browser", "origin", 0, 50 * MB),
    ]
    out = origin_egress_by_cause(rows, 170 * MB)
    assert set(out["bytes"]) == set(CAUSES)
    assert out["bytes"] == {
        "origin_mode": 50 * MB,
        "swarm_web_seeds": 42 * MB,
        "swarm_fallback_sections": 3 * MB,
        "before_carousel_web_seeds": MB,
        "carousel_fallback_sections": 4 * MB,
        "browser_web_seeds": 9 * MB,
        "browser_origin": 50 * MB,
        "other": 11 * MB,
    }
    assert out["total_bytes"] == 170 * MB
    assert [c["client"] for c in out["top_clients"]] == [1, 52, 2, 51, 3]
    assert causes_line("emulation", out) == (
        "emulation: origin egress 170.0 MB by cause: origin mode 50.0, swarm web seeds 42.0, "
        "swarm fallback sections 3.0, before carousel web seeds 1.0, carousel fallback "
        "sections 4.0, browser web seeds 9.0, browser origin 50.0, other 11.0"
    )


def test_no_client_with_nothing_from_the_origins_is_listed_and_other_is_never_negative() -> None:
    out = origin_egress_by_cause([row(1, "desktop", "multicast", 0, 0)], 0)
    assert out["top_clients"] == [] and out["bytes"]["other"] == 0
    # the origins' counters sampled a little short of the clients' own
    short = origin_egress_by_cause([row(1, "desktop", "origin", 0, MB)], MB - 5)
    assert short["bytes"]["other"] == 0
