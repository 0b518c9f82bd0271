"""Where a run's origin egress went, by the rule that sent each byte to an origin
(issue 28: the carousel's run is judged by its origin egress against the unicast-only
twin's, and the bytes left are spread over several rules).

From the report's per-client rows (`report.client_rows`) and the origins' own egress:

- ``origin_mode``: desktop clients the balancer answered ``origin`` (the first readers
  before the swarm, or a run without one), their whole copy;
- ``swarm_web_seeds``: desktop swarm clients' web seed bytes (the peer's own fetches
  from the origins included: the ring's bring-ins, the feed);
- ``swarm_fallback_sections``: desktop swarm clients' origin sections (a stalled swarm);
- ``before_carousel_web_seeds``: what clients that left the swarm for the carousel had
  taken from the web seeds before they left;
- ``carousel_fallback_sections``: carousel readers' origin sections (pieces the
  carousel did not bring within its deadline, or that failed their check);
- ``browser_web_seeds`` / ``browser_origin``: the browser readers' web seed bytes and
  origin path;
- ``other``: the origins' egress not in any client's bytes (manifests, torrents, the
  directives' small requests, bytes of requests cut short);

and the clients with the most bytes from the origins (``top_clients``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CAUSES", "causes_line", "origin_egress_by_cause"]

CAUSES = (
    "origin_mode",
    "swarm_web_seeds",
    "swarm_fallback_sections",
    "before_carousel_web_seeds",
    "carousel_fallback_sections",
    "browser_web_seeds",
    "browser_origin",
    "other",
)
#: clients listed in ``top_clients``
TOP = 5


def _int(row: Mapping[str, Any], key: str) -> int:
    value = row.get(key)
    return int(value) if isinstance(value, (int, float)) else 0


def _summed(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, int]:
    """The ``{name: bytes}`` maps under ``key`` summed over ``rows`` (missing: none)."""
    out: dict[str, int] = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, Mapping):
            for name, b in value.items():
                if isinstance(b, int):
                    out[str(name)] = out.get(str(name), 0) + b
    return dict(sorted(out.items()))


def origin_egress_by_cause(
    rows: Sequence[Mapping[str, Any]], origin_egress_total: int
) -> dict[str, Any]:
    """Bytes per cause (`CAUSES`), the total, and the `TOP` clients by bytes from the
    origins (client, kind, link, mode, left the swarm for the carousel, start, bytes)."""
    out = dict.fromkeys(CAUSES, 0)
    for row in rows:
        web = _int(row, "bytes_from_web_seeds")
        sections = max(0, _int(row, "bytes_from_origins") - web)
        if row.get("kind") == "browser":
            out["browser_web_seeds"] += web
            out["browser_origin"] += sections
        elif row.get("mode") == "origin":
            out["origin_mode"] += web + sections
        elif row.get("mode") == "multicast":
            out["before_carousel_web_seeds"] += web
            out["carousel_fallback_sections"] += sections
        else:
            out["swarm_web_seeds"] += web
            out["swarm_fallback_sections"] += sections
    clients = sum(_int(row, "bytes_from_origins") for row in rows)
    out["other"] = max(0, origin_egress_total - clients)
    top = sorted(rows, key=lambda r: _int(r, "bytes_from_origins"), reverse=True)[:TOP]
    browsers = [row for row in rows if row.get("kind") == "browser"]
    return {
        "bytes": out,
        "total_bytes": origin_egress_total,
        # the browser readers' web-seed bytes by why the app offered each piece to the
        # web seeds and by its web-seed rule's state then (swarm-web-seeds.js)
        "browser_web_seeds_by_offer": _summed(browsers, "web_seed_bytes_by_offer"),
        "browser_web_seeds_by_rule": _summed(browsers, "web_seed_bytes_by_rule"),
        "top_clients": [
            {
                "client": row.get("client"),
                "kind": row.get("kind"),
                "link": row.get("link"),
                "mode": row.get("mode"),
                "left_swarm_for_carousel": bool(row.get("left_swarm_for_carousel")),
                "started_s": row.get("started_s"),
                "bytes_from_origins": _int(row, "bytes_from_origins"),
            }
            for row in top
            if _int(row, "bytes_from_origins") > 0
        ],
    }


def causes_line(name: str, causes: Mapping[str, Any]) -> str:
    """One console line: the origin egress by cause (those above 0), in MB."""
    parts = [
        f"{cause.replace('_', ' ')} {b / 1e6:.1f}" for cause, b in causes["bytes"].items() if b > 0
    ]
    line = f"{name}: origin egress {causes['total_bytes'] / 1e6:.1f} MB by cause: " + (
        ", ".join(parts) or "none"
    )
    for what in ("offer", "rule"):
        split = causes.get(f"browser_web_seeds_by_{what}") or {}
        if split:
            line += f"; the browsers' web seeds by {what}: " + ", ".join(
                f"{k.replace('_', ' ')} {b / 1e6:.1f}" for k, b in split.items()
            )
    return line
