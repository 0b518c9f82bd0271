"""The report's views across a run's fleet: desktop clients beside browser readers
(issue 26), each carousel receiver's channels against its link (issue 28), and the
run against its unicast-only twin (issues 28 and 29).

Pure functions of the report's per-client rows (`pressrun.emulate.report.client_rows`)
and run summaries; nothing here reads a clock or a socket.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: ``pressrun get --json``'s ``multicast_note`` after a carousel delivered the issue
#: (`pressrun.clients.multicast_receive`): the most channels held, the receive time,
#: the channels at the end, the packets its own socket dropped
_NOTE = re.compile(
    r"(?P<most>\d+) channel\(s\), (?P<s>[\d.]+) s, (?P<final>\d+) at the end, "
    r"(?P<drops>\d+) own socket drops"
)
#: the note's tail: each change of the channels held, ``seconds:channels``
_LOG = re.compile(r"channels over time (?P<log>[\d.: ]*)")
#: how late the receiver's layering timer calls came after their deadlines, at most,
#: and the layering's measuring windows ended by the receive's end
_LATE = re.compile(r"layering timer late at most (?P<ms>\d+) ms")
_WINDOWS = re.compile(r", (?P<n>\d+) windows ended")


def _log_entries(note: str) -> list[tuple[float, int, int | None]]:
    """The note's change log: ``(seconds, channels, windows ended by then)``, the last
    None in an older note that does not say."""
    match = _LOG.search(note)
    if match is None:
        return []
    out: list[tuple[float, int, int | None]] = []
    for item in match["log"].split():
        t, n, *w = item.split(":")
        out.append((float(t), int(n), int(w[0]) if w else None))
    return out


def channel_log(note: str) -> list[tuple[float, int]]:
    """The ``(seconds since the first join, channels)`` changes a note lists (none when
    the client's note has no log)."""
    return [(t, n) for t, n, _ in _log_entries(note)]


def windows_kept_above(note: str, carries: int) -> int | None:
    """The most measuring windows of the layering (`LayerCore.windows_ended`) that
    ended while the receiver held more than ``carries`` channels and did not bring
    it back within them: 0 when every such stretch was undone at the end of its
    first window after settling (the window that judged it), None when the note
    does not count windows. A stretch still open at the end counts every window
    ended in it."""
    entries = _log_entries(note)
    end = _WINDOWS.search(note)
    if not entries or end is None:
        return None
    log: list[tuple[int, int]] = []
    for _, n, w in entries:
        if w is None:
            return None
        log.append((n, w))
    return kept_above(log, int(end["n"]), carries)


def kept_above(log: Sequence[tuple[int, int]], windows_at_end: int, carries: int) -> int:
    """`windows_kept_above` from a receiver's ``(channels, windows ended)`` at each
    change of the channels held and its windows ended by the end."""
    kept = 0
    above_from: int | None = None
    for n, w in [*log, (0, windows_at_end + 1)]:
        if n > carries and above_from is None:
            above_from = w
        elif n <= carries and above_from is not None:
            # the window that ended the stretch judged it; the others kept it
            kept = max(kept, w - above_from - 1)
            above_from = None
    return kept


def longest_above(log: Sequence[tuple[float, int]], carries: int, end_s: float) -> float:
    """The longest stretch (seconds) in which more channels than ``carries`` were held,
    from the change log up to ``end_s`` (the receive's end)."""
    longest = 0.0
    above_since: float | None = None
    for t, n in [*log, (end_s, 0)]:
        if n > carries and above_since is None:
            above_since = t
        elif n <= carries and above_since is not None:
            longest = max(longest, t - above_since)
            above_since = None
    return round(longest, 2)


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    """min, median (the upper one of an even count, as the report's) and max."""
    v = sorted(values)
    if not v:
        return {"min": None, "median": None, "max": None}
    return {"min": round(v[0], 1), "median": round(v[len(v) // 2], 1), "max": round(v[-1], 1)}


#: the carousel's bytes by path (`pressrun.emulate.amt.multicast_path`)
MULTICAST_PATHS = ("native", "relay", "unattributed")


def by_kind(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per kind of client (``desktop``: ``pressrun get``; ``browser``: the web reader in
    Chromium; ``amt``: ``pressrun get`` behind an AMT relay): how many, verified, modes,
    download time, and the bytes they took from peers, from origins (their own
    tallies; web seeds count as origins) and from the carousel, natively or through the
    relay (``bytes_from_multicast_native`` / ``_relay`` / ``_unattributed``), with the
    share from peers; ``told`` (phones only): how many the directive sent to the swarm
    and how many to the origins (the browser reader's ``told``)."""
    from pressrun.emulate.amt import multicast_path

    out: dict[str, Any] = {}
    for row in rows:
        kind = str(row.get("kind") or "desktop")
        entry = out.setdefault(kind, {"clients": 0, "verified": 0, "modes": {},
                                      "bytes_from_origins": 0, "bytes_from_peers": 0,
                                      "bytes_from_multicast": 0,
                                      **{f"bytes_from_multicast_{p}": 0 for p in MULTICAST_PATHS},
                                      "_times": []})  # fmt: skip
        entry["clients"] += 1
        entry["verified"] += 1 if row.get("verified") else 0
        mode = str(row.get("mode"))
        entry["modes"][mode] = entry["modes"].get(mode, 0) + 1
        if row.get("told") is not None:  # a phone: what its directive told the app
            told = entry.setdefault("told", {})
            told[str(row["told"])] = told.get(str(row["told"]), 0) + 1
        for key in ("bytes_from_origins", "bytes_from_peers", "bytes_from_multicast"):
            entry[key] += int(row.get(key) or 0)
        path = multicast_path(row)
        if path is not None:
            entry[f"bytes_from_multicast_{path}"] += int(row.get("bytes_from_multicast") or 0)
        if row.get("download_s") is not None:
            entry["_times"].append(float(row["download_s"]))
    for entry in out.values():
        entry["download_s"] = _spread(entry.pop("_times"))
        total = entry["bytes_from_origins"] + entry["bytes_from_peers"]
        entry["share_from_peers"] = round(entry["bytes_from_peers"] / total, 3) if total else None
    return out


def channels_carried(down_mbps: float | None, channel_mbps: float) -> int | None:
    """How many channels of ``channel_mbps`` a link of ``down_mbps`` carries (None: an
    unshaped link, any number)."""
    if down_mbps is None or channel_mbps <= 0:
        return None
    return math.floor(down_mbps / channel_mbps + 1e-9)


def channels_against_links(
    rows: Sequence[Mapping[str, Any]], channel_mbps: float, allowance_s: float | None = None
) -> dict[str, Any]:
    """Per carousel receiver (a client whose ``multicast_note`` says what it held): its
    link's downstream rate, the channels that link carries, the most channels it held
    and those at the end, and from the note's change log the longest stretch it held
    more than that; and how many held more than their link carries at the end, at
    their most, and for longer than one measuring window after settling.

    That last check counts the layering core's own windows
    (`pressrun.multicast.layering.LayerCore`): after a join the core waits ``settle_s``,
    then measures one window of ``window_s`` and leaves a channel the link cannot
    carry at that window's end. A receiver is over when a stretch above its link
    outlived that window (`windows_kept_above` at least 1: a window ended and the
    receiver stayed above). The windows run on the receiver's timer, each call a
    little after its deadline (``timer_late_max_s`` from its note, at most), so in
    seconds a probe undone by its first window lasts ``allowance_s`` (default
    `LayeringConfig`'s settle_s + window_s, 0.8 s) plus that lateness;
    ``over_nominal`` counts the stretches longer than ``allowance_s`` itself. A note
    without window counts (an older client) is judged in seconds against
    ``allowance_s``."""
    if allowance_s is None:
        from pressrun.multicast.config import LayeringConfig

        layering = LayeringConfig()
        allowance_s = layering.settle_s + layering.window_s
    receivers: list[dict[str, Any]] = []
    for row in rows:
        match = _NOTE.search(str(row.get("multicast_note") or ""))
        if match is None:
            continue
        carries = channels_carried(row.get("link_down_mbps"), channel_mbps)
        log = channel_log(str(row.get("multicast_note")))
        late = _LATE.search(str(row.get("multicast_note")))
        kept = None if carries is None else windows_kept_above(str(row["multicast_note"]), carries)
        receivers.append(
            {
                "client": row.get("client"),
                "link": row.get("link"),
                "link_down_mbps": row.get("link_down_mbps"),
                "carries": carries,
                "most": int(match["most"]),
                "final": int(match["final"]),
                "receive_s": float(match["s"]),
                "socket_drops": int(match["drops"]),
                "longest_above_s": (
                    None
                    if carries is None or not log
                    else longest_above(log, carries, float(match["s"]))
                ),
                "changes": len(log),
                "windows_kept_above": kept,
                "timer_late_max_s": int(late["ms"]) / 1000 if late is not None else None,
            }
        )
    shaped = [r for r in receivers if r["carries"] is not None]
    by_link: dict[str, Any] = {}
    for r in receivers:
        entry = by_link.setdefault(str(r["link"]), {"carries": r["carries"], "receivers": 0,
                                                    "final": {}, "most": {}})  # fmt: skip
        entry["receivers"] += 1
        for key in ("final", "most"):
            entry[key][str(r[key])] = entry[key].get(str(r[key]), 0) + 1
    return {
        "channel_mbps": channel_mbps,
        "receivers": len(receivers),
        "over_at_the_end": sum(1 for r in shaped if r["final"] > r["carries"]),
        "over_at_most": sum(1 for r in shaped if r["most"] > r["carries"]),
        "allowance_s": allowance_s,
        "with_log": sum(1 for r in shaped if r["longest_above_s"] is not None),
        "over_longer_than_allowance": sum(1 for r in shaped if _over(r, allowance_s)),
        "over_nominal": sum(1 for r in shaped if (r["longest_above_s"] or 0.0) > allowance_s),
        "timer_late_max_s": max((r["timer_late_max_s"] or 0.0 for r in shaped), default=0.0),
        "by_link": by_link,
        "per_receiver": receivers,
    }


def _over(receiver: Mapping[str, Any], allowance_s: float) -> bool:
    """Above its link for longer than one measuring window after settling: by the
    layering's windows where the note counts them, else by the clock."""
    if receiver["windows_kept_above"] is not None:
        return bool(receiver["windows_kept_above"] >= 1)
    return bool((receiver["longest_above_s"] or 0.0) > allowance_s)


def twin_comparison(variants: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run against its unicast-only twin: the carousel readers' median download time
    against the twin's median (issue 28: at most), the swarm clients' likewise, every
    desktop client's, and the origins' egress as a share of the twin's (at most 5%)."""
    run, twin = variants.get("emulation"), variants.get("unicast-only")
    if run is None or twin is None:
        return None
    twin_median = twin["download_s"]["median"]

    def against(median: float | None) -> dict[str, Any]:
        ok = None if median is None or twin_median is None else median <= twin_median
        return {"median_s": median, "twin_median_s": twin_median, "at_most_twin": ok}

    by_mode = run.get("download_s_by_mode", {})
    twin_egress = twin["origin_egress_total_bytes"]
    ratio = run["origin_egress_total_bytes"] / twin_egress if twin_egress else None
    return {
        "carousel_readers": against(by_mode.get("multicast", {}).get("median")),
        "carousel_readers_in_twin": same_clients_in_twin(
            run.get("per_client", []), twin.get("per_client", [])
        ),
        "swarm_clients": against(by_mode.get("swarm", {}).get("median")),
        "all_clients": against(run["download_s"]["median"]),
        "origin_egress_ratio": None if ratio is None else round(ratio, 4),
        "origin_egress_at_most_5pct": None if ratio is None else ratio <= 0.05,
    }


def same_clients_in_twin(
    run: Sequence[Mapping[str, Any]], twin: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The carousel readers against the same clients in the twin (the same plan: link
    and arrival): the readers' median download time and theirs in the twin, overall and
    per link (``[readers, median, twin's median]``), and how many were faster. The
    twin's median over all its clients weighs the links as the whole crowd does, the
    readers' as the balancer sent them (all of one link, none of another)."""
    twin_s = {
        r["client"]: r["download_s"]
        for r in twin
        if r.get("kind") == "desktop" and r.get("download_s") is not None
    }
    pairs = [
        (str(r.get("link")), float(r["download_s"]), float(twin_s[r["client"]]))
        for r in run
        if r.get("kind") == "desktop"
        and r.get("mode") == "multicast"
        and r.get("download_s") is not None
        and r.get("client") in twin_s
    ]

    def median(values: Sequence[float]) -> float | None:
        v = sorted(values)
        return None if not v else round(v[len(v) // 2], 1)

    links: dict[str, list[tuple[float, float]]] = {}
    for link, mine, theirs in pairs:
        links.setdefault(link, []).append((mine, theirs))
    return {
        "clients": len(pairs),
        "median_s": median([p[1] for p in pairs]),
        "twin_median_s": median([p[2] for p in pairs]),
        "faster_than_twin": sum(1 for p in pairs if p[1] < p[2]),
        "by_link": {
            link: [len(xs), median([x[0] for x in xs]), median([x[1] for x in xs])]
            for link, xs in sorted(links.items())
        },
    }


def twin_lines(twin: Mapping[str, Any] | None) -> list[str]:
    """The console's lines of `twin_comparison` (none without a twin)."""
    if twin is None:
        return []
    lines = [
        "download median against the unicast-only twin's "
        f"({twin['all_clients']['twin_median_s']} s): carousel readers "
        f"{twin['carousel_readers']['median_s']} s, swarm clients "
        f"{twin['swarm_clients']['median_s']} s, all {twin['all_clients']['median_s']} s"
    ]
    same = twin.get("carousel_readers_in_twin") or {}
    if same.get("clients"):
        lines.append(
            f"the {same['clients']} carousel readers: median {same['median_s']} s, the "
            f"same clients in the twin {same['twin_median_s']} s "
            f"({same['faster_than_twin']} faster than there); by link "
            + "; ".join(
                f"{link} {n}: {a} s against {b} s" for link, (n, a, b) in same["by_link"].items()
            )
        )
    return lines


def kinds_line(name: str, kinds: Mapping[str, Any]) -> str:
    """One console line: each kind's clients, verified, download median and bytes from
    peers and from origins."""
    parts = []
    for kind, e in sorted(kinds.items()):
        med = e["download_s"]["median"]
        share = e["share_from_peers"]
        parts.append(
            f"{kind} {e['verified']}/{e['clients']} verified, download median "
            + ("-" if med is None else f"{med:g} s")
            + f", {e['bytes_from_peers'] / 1e6:.0f} MB from peers, "
            f"{e['bytes_from_origins'] / 1e6:.0f} MB from origins"
            + ("" if share is None else f" ({share:.0%} from peers)")
            + _carousel_part(e)
            + _told_part(e)
        )
    return f"{name}: " + "; ".join(parts)


def _told_part(e: Mapping[str, Any]) -> str:
    """``, told swarm 7, origin 3`` (what the phones' directives said), or nothing."""
    told = e.get("told")
    if not told:
        return ""
    return ", told " + ", ".join(f"{mode} {n}" for mode, n in sorted(told.items()))


def _carousel_part(e: Mapping[str, Any]) -> str:
    """``, N MB by multicast (natively A, through the AMT relay B)``, or nothing."""
    if not e.get("bytes_from_multicast"):
        return ""
    native = e.get("bytes_from_multicast_native", 0) / 1e6
    relay = e.get("bytes_from_multicast_relay", 0) / 1e6
    other = e.get("bytes_from_multicast_unattributed", 0) / 1e6
    return (
        f", {e['bytes_from_multicast'] / 1e6:.0f} MB by multicast (natively {native:.0f}, "
        f"through the AMT relay {relay:.0f}" + (f", unfinished {other:.0f}" if other else "") + ")"
    )


def channels_line(name: str, channels: Mapping[str, Any]) -> str:
    """One console line: the carousel receivers' channels against their links."""
    parts = []
    for link, e in sorted(channels["by_link"].items()):
        final = ", ".join(f"{n} on {c}" for c, n in sorted(e["final"].items()))
        parts.append(f"{link} (carries {e['carries']}): {final}")
    return (
        f"{name}: {channels['receivers']} carousel receivers, channels at the end against "
        f"the link ({channels['channel_mbps']:g} Mbit/s each): "
        + "; ".join(parts)
        + f"; over the link at the end {channels['over_at_the_end']}, "
        f"at their most {channels['over_at_most']}, for longer than "
        f"{channels['allowance_s']:g} s {channels['over_longer_than_allowance']} "
        f"(of {channels['with_log']} with a change log; by the layering's windows, each "
        f"receiver's timer up to {1000 * channels.get('timer_late_max_s', 0.0):.0f} ms "
        f"late; by the clock alone {channels.get('over_nominal', 0)})"
    )
