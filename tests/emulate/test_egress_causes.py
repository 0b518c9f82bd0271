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


def test_the_browsers_web_seed_bytes_are_summed_by_offer_and_rule() -> None:
    a = row(51, "browser", "swarm", 6 * MB, 0)
    a["web_seed_bytes_by_offer"] = {"owner": 2 * MB, "every_piece": 4 * MB}
    a["web_seed_bytes_by_rule"] = {"held": 2 * MB, "stalled": 4 * MB}
    b = row(52, "browser", "swarm", 3 * MB, 0)
    b["web_seed_bytes_by_offer"] = {"owner": MB, "waited_owner": 2 * MB}
    b["web_seed_bytes_by_rule"] = {"held": 3 * MB}
    c = row(53, "browser", "swarm", 0, 0)  # an older reader: no maps
    d = row(2, "desktop", "swarm", 40 * MB, 0)
    d["web_seed_bytes_by_offer"] = {"owner": MB}  # a desktop's never count here
    out = origin_egress_by_cause([a, b, c, d], 49 * MB)
    assert out["browser_web_seeds_by_offer"] == {
        "every_piece": 4 * MB,
        "owner": 3 * MB,
        "waited_owner": 2 * MB,
    }
    assert out["browser_web_seeds_by_rule"] == {"held": 5 * MB, "stalled": 4 * MB}
    assert causes_line("emulation", out).endswith(
        "; the browsers' web seeds by offer: every piece 4.0, owner 3.0, waited owner 2.0"
        "; the browsers' web seeds by rule: held 5.0, stalled 4.0"
    )


def test_a_browser_readers_outcome_carries_its_web_seed_split() -> None:
    from pressrun.emulate.browser_reader import outcome_doc

    result = {
        "status": "complete",
        "seconds": 40.0,
        "bytes_from_web_seeds": 3_000,
        "web_seed_bytes_by_offer": {"owner": 1_000, "every_piece": 2_000.0, "bad": "x"},
        "web_seed_bytes_by_rule": "not a map",
    }
    doc = outcome_doc(result, sha256="ab", want_sha256="ab", seeding_s=0.0, record=None)
    assert doc["web_seed_bytes_by_offer"] == {"owner": 1_000, "every_piece": 2_000}
    assert doc["web_seed_bytes_by_rule"] == {}
