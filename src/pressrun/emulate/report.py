"""The emulation's report: a JSON summary, PNG plots and a console table.

Per client: its link, when it started, how long its download took (to the verified
file) and how long it then seeded until its leave rule (swarm mode), the mode it ended
in, bytes from origins (sections and web seeds), from peers and by multicast, and
whether the file is the issue byte for byte. Per origin: egress over time (from its
``/stats``). Per run: the origins' total egress, the balancer's directives by mode over
time (when each mode first took over), and with a unicast-only twin the ratio of the
two.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pressrun.emulate.balancer_kill import (
    ONE_BALANCER,
    balancers_line,
    carousel_start_demand,
    compare_modes,
    mode_change_clients,
    mode_change_demand,
)
from pressrun.emulate.cpu_use import (
    AMT_READERS,
    MODE_COMPONENTS,
    NO_RESULT,
    PHONES,
    components_line,
    cpu_summary,
)
from pressrun.emulate.demand_series import demand_lines, demand_summary
from pressrun.emulate.egress_causes import causes_line, origin_egress_by_cause
from pressrun.emulate.embargo import (
    NO_EMBARGO,
    release_comparison,
    release_line,
    release_summary,
)
from pressrun.emulate.fleet import (
    by_kind,
    channels_against_links,
    channels_line,
    kinds_line,
    twin_comparison,
    twin_lines,
)
from pressrun.emulate.issue import PublishedIssue
from pressrun.emulate.link import parse_rate_bps
from pressrun.emulate.outcomes import VariantResult
from pressrun.emulate.probes import trackers_agree
from pressrun.emulate.scenario import AMT, BROWSER, DESKTOP, EmulationScenario

#: the compose file's carousel channel rate when a scenario does not set one
DEFAULT_CHANNEL_MBPS = 40.0

MODE_COLOURS = {"origin": "tab:blue", "swarm": "tab:orange", "multicast": "tab:green"}


def client_rows(result: VariantResult, sha256: str) -> list[dict[str, Any]]:
    """One dict per client for the JSON summary."""
    rows = []
    for o in result.clients:
        doc = o.doc or {}
        rows.append(
            {
                "client": o.plan.number,
                "kind": o.plan.kind,
                "link": o.plan.link.name,
                "link_down_mbps": (
                    None
                    if o.plan.link.down_rate is None
                    else parse_rate_bps(o.plan.link.down_rate, "down_rate") / 1e6
                ),
                "profile": o.plan.link.profile,
                "planned_start_s": round(o.plan.at_s, 2),
                "started_s": None if o.started_s is None else round(o.started_s, 2),
                "start_lag_s": None if o.started_s is None else round(o.started_s - o.plan.at_s, 2),
                "ready_s": None if o.ready_s is None else round(o.ready_s, 1),
                "exited_s": None if o.exited_s is None else round(o.exited_s, 1),
                "seconds": doc.get("seconds"),
                "download_s": _download_s(doc),
                "seeding_s": doc.get("seeding_s"),
                # a swarm client's leave after its seeding (in `seconds`, not in
                # `download_s`) and its steps; None: a browser, or an older client
                "leave_s": doc.get("leave_s"),
                "leave_steps": doc.get("leave_steps"),
                "mode": doc.get("mode"),
                "told": doc.get("told"),  # a phone: its directive's mode (browser_reader)
                "left_swarm_for_carousel": bool(doc.get("left_swarm_for_carousel")),
                "swarm_stalled": doc.get("swarm_stalled"),
                "leave_rule": doc.get("leave_rule"),
                "swarm_note": doc.get("swarm_note"),
                "uploader_policy": doc.get("uploader_policy"),
                "ring": doc.get("ring"),
                "multicast_note": doc.get("multicast_note"),
                "bytes_from_origins": doc.get("bytes_from_origins", 0),
                "bytes_by_origin": doc.get("bytes_by_origin", {}),
                "bytes_from_web_seeds": doc.get("bytes_from_web_seeds", 0),
                # a browser reader's web-seed bytes by the app's offer and rule state
                "web_seed_bytes_by_offer": doc.get("web_seed_bytes_by_offer"),
                "web_seed_bytes_by_rule": doc.get("web_seed_bytes_by_rule"),
                "bytes_from_peers": doc.get("bytes_from_peers", 0),
                "bytes_from_multicast": doc.get("bytes_from_multicast", 0),
                # the wall time the issue was readable (the release minute, issue 35)
                "opened_at": doc.get("opened_at"),
                "verified": o.verified(sha256),
                "exit_code": o.exit_code,
                # the host's (a container that never ended) or the client's own (a
                # browser reader's outcome says why it failed)
                "error": o.error or doc.get("error"),
            }
        )
    return rows


#: the ring client's counters summed over a run's clients (`ring_by_policy`)
RING_COUNTERS = ("requests", "uploaders", "connects", "first", "bring_in", "waits",
                 "lookups", "supernode_failures")  # fmt: skip


def ring_by_policy(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per uploader policy the swarm clients used: how many clients, and for those
    whose peer asked the Chord ring, the ring's answers summed over them with the
    spread of ``uploaders`` per client and the supernodes they found dead."""
    out: dict[str, Any] = {}
    for row in rows:
        policy = row.get("uploader_policy")
        if policy is None:
            continue
        entry = out.setdefault(str(policy), {"clients": 0, "with_ring": 0})
        entry["clients"] += 1
        ring = row.get("ring")
        if not ring:
            continue
        entry["with_ring"] += 1
        for key in RING_COUNTERS:
            entry[key] = entry.get(key, 0) + int(ring.get(key, 0))
        entry.setdefault("uploaders_per_client", []).append(int(ring.get("uploaders", 0)))
        failed = set(entry.get("failed_supernodes", [])) | set(ring.get("failed_supernodes", []))
        entry["failed_supernodes"] = sorted(failed)
    for entry in out.values():
        if "uploaders_per_client" in entry:
            entry["uploaders_per_client"] = _spread(entry["uploaders_per_client"])
    return out


def client_components(r: VariantResult) -> dict[str, str]:
    """Each client container's component in the CPU split: the phones, the AMT readers,
    and the desktop clients by the mode they ended in."""
    out = {}
    for o in r.clients:
        mode = None if o.doc is None else o.doc.get("mode")
        if o.plan.kind == BROWSER:
            out[o.container] = PHONES
        elif o.plan.kind == AMT:
            out[o.container] = AMT_READERS
        else:
            out[o.container] = MODE_COMPONENTS.get(str(mode), NO_RESULT)
    return out


def _download_s(doc: dict[str, Any]) -> float | None:
    """Seconds to the verified file: the client's own figure (a desktop's: until its
    verified copy was in the library, ``ready_s``; a browser's: until the app stored
    and checked it), else, for a document without one, its time without the seeding
    (which counts the leave after it)."""
    if doc.get("download_s") is not None:
        return float(doc["download_s"])
    if doc.get("seconds") is None:
        return None
    return max(0.0, float(doc["seconds"]) - float(doc.get("seeding_s") or 0.0))


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    """min, median and max (None for none)."""
    v = sorted(values)
    if not v:
        return {"min": None, "median": None, "max": None}
    return {"min": round(v[0], 1), "median": round(v[len(v) // 2], 1), "max": round(v[-1], 1)}


def modes_first_s(directives: Sequence[tuple[float, dict[str, int]]]) -> dict[str, float]:
    """When the balancer first answered each mode (seconds since the first client)."""
    first: dict[str, float] = {}
    for t, counts in directives:
        for mode, n in counts.items():
            if n > 0 and mode not in first:
                first[mode] = round(t, 1)
    return first


def origin_egress(result: VariantResult) -> dict[str, int]:
    """Bytes each origin sent during the run (last sample minus first)."""
    out = {}
    for name, series in result.egress.items():
        out[name] = series[-1][1] - series[0][1] if len(series) >= 2 else 0
    return out


def summarize(
    scenario: EmulationScenario, issue: PublishedIssue, results: Sequence[VariantResult]
) -> dict[str, Any]:
    """The JSON summary of every run of the scenario."""
    variants: dict[str, Any] = {}
    channel_mbps = float(scenario.env.get("PRESSRUN_MULTICAST_RATE_MBPS", DEFAULT_CHANNEL_MBPS))
    for r in results:
        every = client_rows(r, issue.sha256)
        # the run's figures are the desktop clients' (as before browser readers were
        # added, so runs compare); the browser readers have theirs in by_kind
        rows = [row for row in every if row["kind"] == DESKTOP]
        egress = origin_egress(r)
        modes: dict[str, int] = {}
        for row in rows:
            modes[str(row["mode"])] = modes.get(str(row["mode"]), 0) + 1
        variants[r.variant] = {
            "clients": len(rows),
            "verified": sum(1 for row in rows if row["verified"]),
            "modes": modes,
            "seconds": _spread([row["seconds"] for row in rows if row["seconds"] is not None]),
            "download_s": _spread(
                [row["download_s"] for row in rows if row["download_s"] is not None]
            ),
            "download_s_by_mode": {
                mode: _spread(
                    [
                        row["download_s"]
                        for row in rows
                        if row["mode"] == mode and row["download_s"] is not None
                    ]
                )
                for mode in sorted(modes)
            },
            "left_swarm_for_carousel": sum(1 for row in rows if row["left_swarm_for_carousel"]),
            "seeding_s": _spread([row["seeding_s"] for row in rows if row["seeding_s"]]),
            "leave_s": _spread([row["leave_s"] for row in rows if row["leave_s"]]),
            "start_lag_s": _spread(
                [row["start_lag_s"] for row in rows if row["start_lag_s"] is not None]
            ),
            "ready_s": _spread([row["ready_s"] for row in rows if row["ready_s"] is not None]),
            "series_source": r.series_source,
            "modes_first_s": modes_first_s(r.directives),
            "directives_series": r.directives,
            "ring_at_start": r.ring_at_start,
            "ring_by_policy": ring_by_policy(rows),
            "origin_egress_bytes": egress,
            "origin_egress_total_bytes": sum(egress.values()),
            "origin_egress_by_cause": origin_egress_by_cause(every, sum(egress.values())),
            "bytes_from_origins": sum(row["bytes_from_origins"] for row in rows),
            "bytes_from_peers": sum(row["bytes_from_peers"] for row in rows),
            "bytes_from_multicast": sum(row["bytes_from_multicast"] for row in rows),
            "multicast_sender_bytes": (
                r.sender[-1][1] - r.sender[0][1] if len(r.sender) >= 2 else 0
            ),
            "sender_series": r.sender,
            "wall_s": round(r.wall_s, 1),
            "prepared_s": None if r.prepared_s is None else round(r.prepared_s, 1),
            "cpu": cpu_summary(r.cpu, client_components(r)),
            "faults": r.faults,
            "balancers": {
                "mode_change_clients": mode_change_clients(rows),
                "mode_change_demand": mode_change_demand(r.directives),
                "carousel_counts": r.carousel_counts,
                "directives_by": r.directives_by,
                "carousel_start_demand": carousel_start_demand(r.directives, r.balancer_events),
                "events": r.balancer_events,
                # the demand policy's view (the series: <variant>-demand.json)
                "demand": None if r.demand is None else demand_summary(r.demand),
            },
            "trackers": r.trackers,
            "trackers_agree": trackers_agree(r.trackers),
            "supernodes_at_start": r.supernodes_at_start,
            "supernodes_at_end": r.supernodes_at_end,
            "egress_series": {n: s for n, s in r.egress.items()},
            "by_kind": by_kind(every),
            "release": _release(r, every),
            "channels": channels_against_links(every, channel_mbps),
            "per_client": every,
        }
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "description": scenario.description,
        "issue": {"id": issue.issue_id, "size_bytes": issue.size_bytes, "sha256": issue.sha256},
        "variants": variants,
    }
    if "emulation" in variants and ONE_BALANCER in variants:
        # the crowd's mode changes over two balancers (one killed) and over one
        summary["one_balancer_comparison"] = compare_modes(
            variants["emulation"]["balancers"], variants[ONE_BALANCER]["balancers"]
        )
    with_embargo, without = (variants.get(n, {}).get("release") for n in ("emulation", NO_EMBARGO))
    if with_embargo and without:
        summary["release_comparison"] = release_comparison(with_embargo, without)
    twin = twin_comparison(variants)
    if twin is not None:
        summary["twin_comparison"] = twin
    if "emulation" in variants and "unicast-only" in variants:
        unicast = variants["unicast-only"]["origin_egress_total_bytes"]
        if unicast:
            summary["origin_egress_ratio"] = round(
                variants["emulation"]["origin_egress_total_bytes"] / unicast, 4
            )
    return summary


def _release(r: VariantResult, rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's release-minute figures (`pressrun.emulate.embargo`), or None."""
    if r.release is None:
        return None
    return release_summary(
        rows, r.egress, release_s=r.release["release_s"], release_wall=r.release["release_wall"],
        open_within_s=r.release["open_within_s"], wrap_buckets=r.release.get("wrap_buckets", {}),
    )  # fmt: skip


def write_report(
    out: Path,
    scenario: EmulationScenario,
    issue: PublishedIssue,
    results: Sequence[VariantResult],
) -> dict[str, Any]:
    """summary.json and the PNG plots in ``out``; returns the summary."""
    summary = summarize(scenario, issue, results)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for r in results:
        if r.demand is not None:  # the balancers' demand series, whole (issue 28)
            (out / f"{r.variant}-demand.json").write_text(json.dumps(r.demand) + "\n")
    plot(out, summary)
    return summary


def plot(out: Path, summary: dict[str, Any]) -> None:
    """egress.png (origin egress over time per run) and clients.png (each client's
    start, duration and mode; bytes by source)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = summary["variants"]
    names = list(variants)
    fig, axes = plt.subplots(len(names), 2, figsize=(15, 3.4 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        _plot_modes(axes[row, 1], name, variants[name])
    for ax, name in zip(axes[:, 0], names, strict=True):
        for origin, series in variants[name]["egress_series"].items():
            if len(series) < 2:
                continue
            ts = [t for t, _ in series]
            rates = [0.0] + [
                (b2 - b1) * 8 / 1e6 / max(t2 - t1, 1e-3)
                for (t1, b1), (t2, b2) in itertools.pairwise(series)
            ]
            ax.plot(ts, rates, label=origin)
        sender = variants[name]["sender_series"]
        if len(sender) >= 2:
            ts = [t for t, _ in sender]
            rates = [0.0] + [
                (b2 - b1) * 8 / 1e6 / max(t2 - t1, 1e-3)
                for (t1, b1), (t2, b2) in itertools.pairwise(sender)
            ]
            ax.plot(ts, rates, label="multicast sender", linestyle="--")
        release = variants[name].get("release")
        if release:  # the release minute (issue 35): when the wraps were handed out
            ax.axvline(release["release_s"], color="black", linestyle="--", linewidth=0.8,
                       label="release")  # fmt: skip
        for f in variants[name]["faults"]:
            ax.axvline(f["at_s"], color="grey", linestyle=":")
            ax.text(f["at_s"], ax.get_ylim()[1] * 0.9, f" {f['action']} {f['service']}",
                    fontsize=7)  # fmt: skip
        total = variants[name]["origin_egress_total_bytes"] / 1e6
        sent = variants[name]["multicast_sender_bytes"] / 1e6
        ax.set_title(
            f"{name}: origin egress (total {total:.0f} MB), multicast sender {sent:.0f} MB"
        )
        ax.set_xlabel("seconds since the first client")
        ax.set_ylabel("Mbit/s")
        if ax.get_legend_handles_labels()[0]:  # a run with no series has nothing to name
            ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "egress.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(len(names), 2, figsize=(12, 3.4 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        clients = variants[name]["per_client"]
        ax = axes[row, 0]
        for c in clients:
            if c["started_s"] is None or c["seconds"] is None:
                ax.plot([c["planned_start_s"]], [c["client"]], "rx")
                continue
            colour = MODE_COLOURS.get(str(c["mode"]), "black")
            done = c["started_s"] + (c["download_s"] if c["download_s"] is not None else 0.0)
            ax.plot([c["started_s"], done], [c["client"]] * 2, color=colour, linewidth=1.5)
            if c["seeding_s"]:
                ax.plot([done, done + c["seeding_s"]], [c["client"]] * 2, color="lightgrey",
                        linewidth=0.8)  # fmt: skip
        for mode, colour in MODE_COLOURS.items():
            ax.plot([], [], color=colour, label=f"{mode} (download)")
        ax.plot([], [], color="lightgrey", label="seeding after it")
        ax.set_title(f"{name}: each client's download (by mode), then its seeding")
        ax.set_xlabel("seconds since the first client")
        ax.set_ylabel("client")
        ax.legend(loc="lower right", fontsize=8)
        ax = axes[row, 1]
        xs = [c["client"] for c in clients]
        origin = [c["bytes_from_origins"] / 1e6 for c in clients]
        peers = [c["bytes_from_peers"] / 1e6 for c in clients]
        mcast = [c["bytes_from_multicast"] / 1e6 for c in clients]
        ax.bar(xs, origin, color=MODE_COLOURS["origin"], label="origins", width=1.0)
        ax.bar(xs, peers, bottom=origin, color=MODE_COLOURS["swarm"], label="peers", width=1.0)
        base = [a + b for a, b in zip(origin, peers, strict=True)]
        ax.bar(xs, mcast, bottom=base, color=MODE_COLOURS["multicast"], label="multicast",
               width=1.0)  # fmt: skip
        ax.set_title(f"{name}: MB per client by source")
        ax.set_xlabel("client (in start order)")
        ax.set_ylabel("MB")
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "clients.png", dpi=100)
    plt.close(fig)


def _plot_modes(ax: Any, name: str, variant: dict[str, Any]) -> None:
    """Directives per second the balancer answered, by mode: the modes taking over."""
    series = variant.get("directives_series") or []
    for mode, colour in MODE_COLOURS.items():
        points = [(t, counts.get(mode, 0)) for t, counts in series]
        if len(points) < 2 or points[-1][1] == 0:
            continue
        ts = [t for t, _ in points]
        rates = [0.0] + [
            (n2 - n1) / max(t2 - t1, 1e-3) for (t1, n1), (t2, n2) in itertools.pairwise(points)
        ]
        ax.plot(ts, rates, color=colour, label=mode)
    first = variant.get("modes_first_s") or {}
    for mode, at in first.items():
        ax.axvline(at, color=MODE_COLOURS.get(mode, "black"), linestyle=":", linewidth=0.8)
    ax.set_title(
        f"{name}: directives/s by mode (first: "
        + ", ".join(f"{m} {s:g} s" for m, s in sorted(first.items(), key=lambda kv: kv[1]))
        + ")"
    )
    ax.set_xlabel("seconds since the first client")
    ax.set_ylabel("directives/s")
    if series:
        ax.legend(loc="upper right", fontsize=8)


def print_summary(summary: dict[str, Any], out: Path) -> None:
    """The console table of each run."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"emulation {summary['scenario']}: {summary['issue']['id']} "
                  f"({summary['issue']['size_bytes'] / 1e6:.0f} MB)")  # fmt: skip
    for col in ("run", "clients", "verified", "modes", "download s median / max",
                "seeding s median", "leave s median / max", "origin egress MB",
                "from peers MB", "multicast MB", "sender MB"):  # fmt: skip
        table.add_column(col)
    for name, v in summary["variants"].items():
        modes = ", ".join(f"{m} {n}" for m, n in sorted(v["modes"].items()))
        secs = v["download_s"]
        seeding = v["seeding_s"]["median"]
        leave = v.get("leave_s") or {"median": None, "max": None}  # (older summaries)
        table.add_row(
            name,
            str(v["clients"]),
            str(v["verified"]),
            modes,
            "-" if secs["median"] is None else f"{secs['median']:.1f} / {secs['max']:.1f}",
            "-" if seeding is None else f"{seeding:.1f}",
            "-" if leave["median"] is None else f"{leave['median']:.1f} / {leave['max']:.1f}",
            f"{v['origin_egress_total_bytes'] / 1e6:.0f}",
            f"{v['bytes_from_peers'] / 1e6:.0f}",
            f"{v['bytes_from_multicast'] / 1e6:.0f}",
            f"{v['multicast_sender_bytes'] / 1e6:.0f}",
        )
    console.print(table)
    for name, v in summary["variants"].items():
        first = sorted(v["modes_first_s"].items(), key=lambda kv: kv[1])
        console.print(
            f"{name}: the balancer first answered "
            + (", ".join(f"{mode} at {at:g} s" for mode, at in first) or "nothing")
        )
        by_mode = v.get("download_s_by_mode", {})
        if by_mode:
            console.print(
                f"{name}: download s (min / median / max) by mode: "
                + "; ".join(
                    f"{mode} {t['min']:g} / {t['median']:g} / {t['max']:g}"
                    for mode, t in by_mode.items()
                    if t["median"] is not None
                )
                + (
                    f"; {v['left_swarm_for_carousel']} left the swarm for the carousel"
                    if v.get("left_swarm_for_carousel")
                    else ""
                )
            )
        lag = v["start_lag_s"]
        if lag["median"] is not None:
            console.print(
                f"{name}: clients began {lag['min']:g} / {lag['median']:g} / {lag['max']:g} s "
                "(min / median / max) after their scheduled time"
            )
        agree = v["trackers_agree"]
        if agree["instances"]:
            console.print(
                f"{name}: the tracker instances list "
                + ("the same swarm" if agree["swarm"] else "different swarms")
                + " and "
                + ("the same ring of supernodes" if agree["ring"] else "different rings")
            )
        cpu = v.get("cpu") or {}
        if cpu.get("busy_cores") is not None:
            took = cpu.get("containers_cores")
            console.print(
                f"{name}: the host's CPU during the run: {cpu['busy_cores']:g} of "
                f"{cpu['cores']:g} cores busy on average"
                + (f", the emulation's containers {took:g}" if took is not None else "")
            )
            if cpu.get("by_component"):
                console.print(components_line(name, cpu))
        if len(v.get("by_kind", {})) > 1:
            console.print(kinds_line(name, v["by_kind"]))
        if v.get("origin_egress_by_cause"):
            console.print(causes_line(name, v["origin_egress_by_cause"]))
        if v.get("release"):
            console.print(release_line(name, v["release"]))
        if v.get("channels", {}).get("receivers"):
            console.print(channels_line(name, v["channels"]))
        if v.get("ring_by_policy"):
            console.print(f"{name}: the swarm clients' uploader policy: " + policies_line(v))
        if v.get("supernodes_at_end"):
            console.print(f"{name}: supernodes at the end: " + supernodes_line(v))
        if "one_balancer_comparison" in summary:
            console.print(balancers_line(name, v))
        for line in demand_lines(name, v["balancers"].get("demand") or {}):
            console.print(line)
    if "origin_egress_ratio" in summary:
        console.print(
            f"origin egress with swarm/multicast on: {summary['origin_egress_ratio']:.1%} "
            "of the unicast-only run's"
        )
    release = summary.get("release_comparison")
    if release is not None and release["ratio"] is not None:
        console.print(
            f"origins from the release: {release['origin_bytes_from_release'] / 1e6:.0f} MB "
            f"with the embargo, {release['no_embargo_origin_bytes_from_release'] / 1e6:.0f} MB "
            f"in the flash crowd without it ({release['ratio']:.1%})"
        )
    for line in twin_lines(summary.get("twin_comparison")):
        console.print(line)
    console.print(f"report: {out / 'summary.json'}, {out / 'egress.png'}, {out / 'clients.png'}")


def policies_line(variant: dict[str, Any]) -> str:
    """The swarm clients by uploader policy and, for those on the Chord ring, what the
    ring answered them (the clients' own count)."""
    parts = []
    for policy, entry in sorted(variant.get("ring_by_policy", {}).items()):
        text = f"{policy} {entry['clients']} clients"
        if entry.get("with_ring"):
            per = entry["uploaders_per_client"]
            dead = entry.get("failed_supernodes") or []
            text += (
                f" ({entry['with_ring']} on the ring: {entry.get('uploaders', 0)} uploaders "
                f"named, {per['min']:g} / {per['median']:g} / {per['max']:g} per client, "
                f"{entry.get('connects', 0)} connected, {entry.get('bring_in', 0)} pieces to "
                f"bring in, {entry.get('waits', 0)} waits, {entry.get('requests', 0)} requests"
                + (f"; found dead: {', '.join(dead)}" if dead else "")
                + ")"
            )
        parts.append(text)
    return "; ".join(parts)


def supernodes_line(variant: dict[str, Any]) -> str:
    """Each supernode at the end of a run: its phase, the uploaders it chose for peers
    (``uploader_answers``: the `chord` policy's questions it answered) and the ring
    nodes it found dead and routed around; or that it did not answer."""
    parts = []
    for name, state in sorted(variant.get("supernodes_at_end", {}).items()):
        if "unreachable" in state:
            parts.append(f"{name} does not answer")
            continue
        failed = state.get("nodes_failed") or []
        around = f"routed around {', '.join(sorted(set(failed)))}" if failed else "none dead"
        parts.append(
            f"{name} {state.get('phase', '?')}, {state.get('uploader_answers', 0)} uploader "
            f"answers, {state.get('holders', 0)} holders known, {around}"
        )
    return "; ".join(parts)
