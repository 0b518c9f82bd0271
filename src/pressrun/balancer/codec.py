"""JSON <-> balancer messages, pure.

- :func:`decode_status`: an origin's ``/stats`` JSON (docs/protocols.md) -> `OriginStatus`,
  percents turned into fractions. Validation is strict: a wrong type, a missing field, a
  negative or non-finite number, a bad issue id raise :class:`StatusFormatError` naming
  the field, and the adapter feeds the origin a `PollFailed` with that reason. A
  malformed status must never reach the scoring algorithms: one NaN in a heap of scores
  breaks every comparison after it.
- :func:`encode_status`: the inverse, for ``/v1/origins`` (same units as ``/stats``).
- :func:`encode_directive` / :func:`encode_refusal`: `Directive` / `NoDirective` -> the
  JSON dicts of docs/protocols.md ("Balancer HTTP").
- :func:`parse_failed`: the ``failed=`` list of a directive request.
- :func:`parse_client_hint`: ``have=``, ``size=``, ``rate=`` of a directive request.

No I/O, no clock.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from pressrun.balancer.events import (
    ClientHint,
    Directive,
    MulticastInfo,
    NoDirective,
    OriginStatus,
    RequestClass,
    SwarmInfo,
)
from pressrun.multicast.codec import carousel_to_dict

#: issue ids and file names (docs/protocols.md, "Issue bundle on disk")
# (\Z, not $: "$" also matches before a trailing newline)
ISSUE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
#: origin names in `failed=` lists (same alphabet as issue ids)
ORIGIN_NAME_RE = ISSUE_ID_RE


class StatusFormatError(ValueError):
    """An origin's /stats answer is not what docs/protocols.md says.

    `field` names the offending field ("" for the document as a whole).
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        where = f"field {field!r} " if field else ""
        super().__init__(f"malformed /stats: {where}{problem}")


class RequestFormatError(ValueError):
    """A client's request is malformed (answered 400)."""


def _number(doc: Mapping[str, Any], key: str, *, positive: bool = False) -> float:
    if key not in doc:
        raise StatusFormatError(key, "is missing")
    value = doc[key]
    # bool is an int subclass: `true` is not a number of bytes.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StatusFormatError(key, f"must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise StatusFormatError(key, "must be finite")
    if number < 0:
        raise StatusFormatError(key, f"must not be negative (got {number:g})")
    if positive and number == 0:
        raise StatusFormatError(key, "must be positive")
    return number


def _optional_number(doc: Mapping[str, Any], key: str, *, positive: bool = False) -> float | None:
    if doc.get(key) is None:
        return None
    return _number(doc, key, positive=positive)


def _percent(doc: Mapping[str, Any], key: str) -> float:
    value = _number(doc, key)
    if value > 100.0:
        raise StatusFormatError(key, f"must be a percentage 0..100 (got {value:g})")
    return value / 100.0


def _count(doc: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    if key not in doc:
        if required:
            raise StatusFormatError(key, "is missing")
        return None
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise StatusFormatError(key, f"must be an integer, not {type(value).__name__}")
    if value < 0:
        raise StatusFormatError(key, f"must not be negative (got {value})")
    return value


def _issue_set(doc: Mapping[str, Any], key: str) -> frozenset[str]:
    if key not in doc:
        raise StatusFormatError(key, "is missing")
    value = doc[key]
    if not isinstance(value, list):
        raise StatusFormatError(key, f"must be a list of issue ids, not {type(value).__name__}")
    for item in value:
        if not isinstance(item, str) or not ISSUE_ID_RE.match(item):
            raise StatusFormatError(key, f"holds an invalid issue id {item!r}")
    return frozenset(value)


def _rates_by_issue(doc: Mapping[str, Any], key: str) -> dict[str, float]:
    if key not in doc:
        raise StatusFormatError(key, "is missing")
    value = doc[key]
    if not isinstance(value, dict):
        raise StatusFormatError(key, f"must be an object, not {type(value).__name__}")
    rates: dict[str, float] = {}
    for issue in value:
        if not ISSUE_ID_RE.match(issue):
            raise StatusFormatError(key, f"has an invalid issue id {issue!r}")
        try:
            rates[issue] = _number(value, issue)
        except StatusFormatError as err:
            raise StatusFormatError(f"{key}.{issue}", err.problem) from None
    return rates


def _counts_by_issue(doc: Mapping[str, Any], key: str) -> dict[str, int]:
    """An optional object of issue id -> non-negative integer ({} when absent)."""
    if key not in doc:
        return {}
    value = doc[key]
    if not isinstance(value, dict):
        raise StatusFormatError(key, f"must be an object, not {type(value).__name__}")
    counts: dict[str, int] = {}
    for issue in value:
        if not isinstance(issue, str) or not ISSUE_ID_RE.match(issue):
            raise StatusFormatError(key, f"has an invalid issue id {issue!r}")
        try:
            count = _count(value, issue)
        except StatusFormatError as err:
            raise StatusFormatError(f"{key}.{issue}", err.problem) from None
        assert count is not None  # required=True
        counts[issue] = count
    return counts


def decode_status(payload: bytes | str | Mapping[str, Any], *, origin_name: str) -> OriginStatus:
    """An origin's ``/stats`` answer as an `OriginStatus`, or `StatusFormatError`.

    The status is filed under `origin_name`, the balancer's name for the origin (the
    origin's own ``name`` field is checked to be a string but may differ: the operator
    names origins on the balancer's command line).
    """
    if isinstance(payload, bytes | str):
        try:
            doc = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as err:
            raise StatusFormatError("", f"not JSON ({err})") from None
    else:
        doc = payload
    if not isinstance(doc, Mapping):
        raise StatusFormatError("", f"must be a JSON object, not {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str):
        raise StatusFormatError("name", "must be a string")
    # Fields the balancer does not score with are still checked when present.
    _optional_number(doc, "interval_s", positive=True)
    _optional_number(doc, "egress_cap_bytes_per_s", positive=True)
    _count(doc, "bytes_sent_total", required=False)
    started = _count(doc, "transfers_total", required=False)
    active = _count(doc, "active_transfers")
    assert active is not None  # required=True
    active_by_issue = _counts_by_issue(doc, "active_transfers_by_issue")
    if sum(active_by_issue.values()) > active:
        raise StatusFormatError(
            "active_transfers_by_issue",
            f"adds up to {sum(active_by_issue.values())}, more than active_transfers ({active})",
        )
    started_by_issue = _counts_by_issue(doc, "transfers_total_by_issue")
    _counts_by_issue(doc, "bytes_sent_by_issue")
    return OriginStatus(
        name=origin_name,
        cpu_fraction=_percent(doc, "cpu_percent"),
        ram_fraction=_percent(doc, "ram_percent"),
        out_bytes_per_s=_number(doc, "out_bytes_per_s"),
        capacity_bytes_per_s=_number(doc, "capacity_bytes_per_s", positive=True),
        active_transfers=active,
        issues=_issue_set(doc, "issues"),
        cached_issues=_issue_set(doc, "cached_issues"),
        mean_transfer_bytes_per_s=_optional_number(doc, "mean_transfer_bytes_per_s"),
        mean_transfer_bytes_per_s_by_issue=_rates_by_issue(
            doc, "mean_transfer_bytes_per_s_by_issue"
        ),
        active_transfers_by_issue=active_by_issue,
        transfers_total=started,
        transfers_total_by_issue=started_by_issue,
    )


def encode_status(status: OriginStatus) -> dict[str, Any]:
    """An `OriginStatus` in the units of ``/stats`` (percent, bytes/s); sorted lists;
    ``transfers_total`` only when the agent reported it."""
    started = {} if status.transfers_total is None else {"transfers_total": status.transfers_total}
    return {
        "name": status.name,
        "cpu_percent": status.cpu_fraction * 100.0,
        "ram_percent": status.ram_fraction * 100.0,
        "out_bytes_per_s": status.out_bytes_per_s,
        "capacity_bytes_per_s": status.capacity_bytes_per_s,
        "active_transfers": status.active_transfers,
        "issues": sorted(status.issues),
        "cached_issues": sorted(status.cached_issues),
        "mean_transfer_bytes_per_s": status.mean_transfer_bytes_per_s,
        "mean_transfer_bytes_per_s_by_issue": dict(
            sorted(status.mean_transfer_bytes_per_s_by_issue.items())
        ),
        "active_transfers_by_issue": dict(sorted(status.active_transfers_by_issue.items())),
        **started,
        "transfers_total_by_issue": dict(sorted(status.transfers_total_by_issue.items())),
    }


def json_score(score: float | None) -> float | None:
    """A score as JSON can carry it: JSON has no infinities or NaN."""
    if score is None or not math.isfinite(score):
        return None
    return score


def encode_directive(directive: Directive) -> dict[str, Any]:
    """A `Directive` as the JSON object of docs/protocols.md."""
    swarm = directive.swarm
    return {
        "issue_id": directive.issue_id,
        "mode": directive.mode.value,
        "origins": [
            {"name": o.name, "url": o.url, "score": json_score(o.score)} for o in directive.origins
        ],
        "swarm": None if swarm is None else _encode_swarm(swarm),
        "multicast": None
        if directive.multicast is None
        else _encode_multicast(directive.multicast),
        "fallbacks": [mode.value for mode in directive.fallbacks],
        "expires_in_s": directive.expires_in_s,
        "algorithm": directive.algorithm,
    }


def _encode_multicast(multicast: MulticastInfo) -> dict[str, Any]:
    """A directive's ``multicast`` object; ``plan`` (the carousel's channels and object,
    the announcement's form without packet counters) only when the balancer knows it."""
    doc: dict[str, Any] = {
        "control_group": multicast.control_group,
        "interface": multicast.interface,
        "source": multicast.source,
        "relays": list(multicast.relays),
    }
    if multicast.plan is not None:
        plan = carousel_to_dict(multicast.plan)
        plan.pop("sent_packets", None)
        doc["plan"] = plan
    return doc


def _encode_swarm(swarm: SwarmInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "torrent_url": swarm.torrent_url,
        "tracker_url": swarm.tracker_url,
        "info_hash": swarm.info_hash,
    }
    if swarm.webtorrent_url is not None:
        # a browser reader's directive only (peer=webrtc): the others' are unchanged
        doc["webtorrent_url"] = swarm.webtorrent_url
        doc["web_seeds"] = list(swarm.web_seeds)
    return doc


def parse_peer(query: Mapping[str, str]) -> bool:
    """Whether the client trades pieces over WebRTC (``peer=webrtc``: a browser
    reader, docs/protocols.md); any other ``peer=`` value is a `RequestFormatError`."""
    value = query.get("peer")
    if value is None:
        return False
    if value != "webrtc":
        raise RequestFormatError(f"peer= must be webrtc, not {value[:40]!r}")
    return True


def encode_refusal(refusal: NoDirective) -> dict[str, Any]:
    """A `NoDirective` as the error JSON of docs/protocols.md: ``{"error": ...}``, and
    for a reserved start ``"reservation"`` (the token to name when asking again) and
    ``"retry_after_s"`` (when, unrounded; the header says it in whole seconds)."""
    doc: dict[str, Any] = {"error": refusal.message}
    if refusal.reservation is not None:
        doc["reservation"] = refusal.reservation
        doc["retry_after_s"] = round(refusal.retry_after_s, 3)
    return doc


#: a reservation token (``reservation=``): what `NoDirective.reservation` gives out
RESERVATION_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}\Z")


def parse_reservation(query: Mapping[str, str]) -> str | None:
    """The reservation a client names (``reservation=``, from a 503 with a reserved
    start; docs/protocols.md), None when it names none; a malformed one is a
    `RequestFormatError`."""
    value = query.get("reservation")
    if value is None:
        return None
    if not RESERVATION_RE.match(value):
        raise RequestFormatError(
            f"reservation= must be the token a refusal gave, not {value[:40]!r}"
        )
    return value


def parse_failed(values: list[str]) -> frozenset[str]:
    """The origin names of ``failed=a,b`` (the parameter may repeat).

    An empty value names nothing; an empty item inside a list (``a,,b``) or a name
    outside the id alphabet is a `RequestFormatError`.
    """
    names: set[str] = set()
    for value in values:
        if not value:
            continue
        for name in value.split(","):
            if not ORIGIN_NAME_RE.match(name):
                raise RequestFormatError(
                    f"failed= must list origin names separated by commas; {name!r} is not one"
                )
            names.add(name)
    return frozenset(names)


def parse_request_class(query: Mapping[str, str]) -> RequestClass | None:
    """The class a request names (``class=small``, ``crowd`` or ``catalogue``;
    docs/balancer.md, "Request classes"), None when it names none; any other value is
    a `RequestFormatError`."""
    value = query.get("class")
    if value is None:
        return None
    try:
        return RequestClass(value)
    except ValueError:
        names = ", ".join(c.value for c in RequestClass)
        raise RequestFormatError(f"class= must be one of {names}, not {value[:40]!r}") from None


#: ``rate=`` is clamped to this range (bytes/s): 1 kB/s to 100 Gbit/s
MIN_RATE_BYTES_PER_S = 1e3
MAX_RATE_BYTES_PER_S = 12.5e9
#: ``elapsed=`` is clamped to a day (s)
MAX_ELAPSED_S = 86400.0
#: the largest ``have=`` / ``size=`` taken (bytes, 2**53: exact as a float)
MAX_SIZE_BYTES = 2**53
_BYTES_RE = re.compile(r"^[0-9]{1,20}\Z")


def parse_client_hint(query: Mapping[str, str]) -> ClientHint | None:
    """What a downloading client tells of itself in a directive request (docs/protocols.md):
    ``have=BYTES`` (of the issue's file it already holds), ``size=BYTES`` (the file's
    size), ``rate=BYTES_PER_S`` (its recent download rate), ``elapsed=SECONDS`` (since
    it first asked for the issue). None when it names none.

    ``have`` and ``size`` are decimal integers, ``have`` only with ``size`` and at most
    it; ``rate`` a positive and ``elapsed`` a non-negative decimal number. Anything
    else is a `RequestFormatError` (answered 400). Absurd values are clamped: sizes to
    2**53, the rate to 1 kB/s .. 12.5 GB/s (100 Gbit/s), ``elapsed`` to a day.
    """
    have_s, size_s, rate_s = query.get("have"), query.get("size"), query.get("rate")
    elapsed_s = query.get("elapsed")
    if have_s is None and size_s is None and rate_s is None and elapsed_s is None:
        return None
    size = None if size_s is None else _bytes_param("size", size_s)
    have = 0 if have_s is None else _bytes_param("have", have_s)
    if have_s is not None and size is None:
        raise RequestFormatError("have= needs size= (the file's size in bytes)")
    if size is not None:
        if size == 0:
            raise RequestFormatError("size= must be at least 1 byte")
        if have > size:
            raise RequestFormatError(f"have={have} is more than size={size}")
    rate = None
    if rate_s is not None:
        try:
            rate = float(rate_s)
        except ValueError:
            raise RequestFormatError(
                f"rate= must be bytes per second, a positive number; {rate_s[:40]!r} is not"
            ) from None
        if not (math.isfinite(rate) and rate > 0):
            raise RequestFormatError(
                f"rate= must be bytes per second, a positive number; {rate_s[:40]!r} is not"
            )
        rate = min(max(rate, MIN_RATE_BYTES_PER_S), MAX_RATE_BYTES_PER_S)
    elapsed = None
    if elapsed_s is not None:
        problem = f"elapsed= must be seconds, a number >= 0; {elapsed_s[:40]!r} is not"
        try:
            elapsed = float(elapsed_s)
        except ValueError:
            raise RequestFormatError(problem) from None
        if not (math.isfinite(elapsed) and elapsed >= 0):
            raise RequestFormatError(problem)
        elapsed = min(elapsed, MAX_ELAPSED_S)
    return ClientHint(have, size, rate, elapsed)


def _bytes_param(key: str, value: str) -> int:
    """A ``have=`` or ``size=`` value: a decimal count of bytes, clamped to 2**53."""
    if _BYTES_RE.match(value) is None:
        raise RequestFormatError(
            f"{key}= must be a number of bytes (digits); {value[:40]!r} is not"
        )
    return min(int(value), MAX_SIZE_BYTES)
