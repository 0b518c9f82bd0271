"""The report's fleet views: browser readers beside desktop clients (issue 26), each
carousel receiver's channels against its link (issue 28), a run against its
unicast-only twin; and the browser reader container's outcome document."""

from __future__ import annotations

from typing import Any

import pytest

from pressrun.emulate.browser_reader import chromium_args, outcome_doc
from pressrun.emulate.fleet import (
    by_kind,
    channel_log,
    channels_against_links,
    channels_carried,
    channels_line,
    kinds_line,
    longest_above,
    same_clients_in_twin,
    twin_comparison,
    twin_lines,
    windows_kept_above,
)
from pressrun.emulate.scenario import BROWSER, DESKTOP, parse_scenario
from pressrun.sim.scenario import ScenarioError


def _row(kind: str, mode: str, origins: int, peers: int, download_s: float) -> dict[str, Any]:
    return {"kind": kind, "mode": mode, "verified": True, "bytes_from_origins": origins,
            "bytes_from_peers": peers, "bytes_from_multicast": 0,
            "download_s": download_s}  # fmt: skip


def test_browsers_and_desktops_counted_apart() -> None:
    rows = [
        _row("desktop", "swarm", 10_000_000, 40_000_000, 30.0),
        _row("desktop", "multicast", 0, 0, 50.0),
        _row("browser", "swarm", 20_000_000, 30_000_000, 60.0),
        _row("browser", "swarm", 50_000_000, 0, 80.0),
        {**_row("browser", "None", 0, 0, 0.0), "verified": False, "download_s": None},
    ]
    kinds = by_kind(rows)
    assert kinds["browser"]["clients"] == 3 and kinds["browser"]["verified"] == 2
    assert kinds["browser"]["bytes_from_peers"] == 30_000_000
    assert kinds["browser"]["bytes_from_origins"] == 70_000_000
    assert kinds["browser"]["share_from_peers"] == 0.3
    assert kinds["browser"]["download_s"] == {"min": 60.0, "median": 80.0, "max": 80.0}
    assert kinds["desktop"]["modes"] == {"swarm": 1, "multicast": 1}
    line = kinds_line("emulation", kinds)
    assert (
        "browser 2/3 verified, download median 80 s, 30 MB from peers, 70 MB from origins" in line
    )


def _receiver(client: int, link: str, down: float | None, note: str) -> dict[str, Any]:
    return {"client": client, "link": link, "link_down_mbps": down, "multicast_note": note}


def test_channels_held_against_what_each_link_carries() -> None:
    assert channels_carried(6.0, 5.0) == 1
    assert channels_carried(20.0, 5.0) == 4  # exactly 4 channels' worth
    assert channels_carried(None, 5.0) is None  # unshaped
    rows = [
        _receiver(1, "mobile-6", 6.0, "1 channel(s), 80.1 s, 1 at the end, 0 own socket drops"),
        _receiver(2, "mobile-6", 6.0, "3 channel(s), 90.0 s, 2 at the end, 12 own socket drops"),
        _receiver(3, "dsl-20", 20.0, "4 channel(s), 30.0 s, 4 at the end, 0 own socket drops"),
        _receiver(4, "dsl-20", 20.0, "fell back: deadline"),  # no carousel delivery
        {"client": 5, "link": "dsl-20", "link_down_mbps": 20.0, "multicast_note": None},
    ]
    view = channels_against_links(rows, 5.0)
    assert view["receivers"] == 3
    assert view["over_at_the_end"] == 1 and view["over_at_most"] == 1
    assert view["by_link"]["mobile-6"] == {
        "carries": 1, "receivers": 2, "final": {"1": 1, "2": 1}, "most": {"1": 1, "3": 1}
    }  # fmt: skip
    second = view["per_receiver"][1]
    assert (second["most"], second["final"], second["socket_drops"]) == (3, 2, 12)
    line = channels_line("emulation", view)
    assert "mobile-6 (carries 1): 1 on 1, 1 on 2" in line
    assert "over the link at the end 1, at their most 1" in line


def test_how_long_a_receiver_held_more_than_its_link_from_its_change_log() -> None:
    # the note's log: a probe to 2 channels undone within 0.6 s, then 2 held 5 s
    note = ("1 channel(s), 30.0 s, 1 at the end, 0 own socket drops, efficiency 0.990; "
            "channels over time 0.0:1 4.0:2 4.6:1 10.0:2 15.0:1")  # fmt: skip
    assert channel_log(note) == [(0.0, 1), (4.0, 2), (4.6, 1), (10.0, 2), (15.0, 1)]
    assert longest_above(channel_log(note), 1, 30.0) == 5.0
    assert longest_above([(0.0, 1), (20.0, 3)], 2, 30.0) == 10.0  # above until the end
    assert channel_log("2 channel(s), 3.0 s, 2 at the end, 0 own socket drops") == []
    rows = [
        _receiver(1, "mobile-6", 6.0, note),
        _receiver(2, "mobile-6", 6.0, note.replace("10.0:2 15.0:1", "10.0:1")),
    ]
    view = channels_against_links(rows, 5.0)
    assert view["allowance_s"] == 0.8  # LayeringConfig: settle 0.3 s + window 0.5 s
    assert [r["longest_above_s"] for r in view["per_receiver"]] == [5.0, 0.6]
    assert view["over_longer_than_allowance"] == 1 and view["with_log"] == 2
    assert "for longer than 0.8 s 1 (of 2 with a change log;" in channels_line("e", view)


def test_a_probe_is_allowed_the_layerings_one_window_after_settling() -> None:
    """The check counts LayerCore's windows: a probe to 2 channels on a link that
    carries 1, left by the first window that ended after its join (one window ended
    in the stretch) is within, whatever the timer's lateness made it in seconds; one
    kept past a window's end is over, as is one still held at the end after a window
    ended; an older note without window counts is judged by the clock (0.8 s)."""
    head = (
        "1 channel(s), 30.0 s, 1 at the end, 0 own socket drops, layering timer late at most 40 ms"
    )
    first = f"{head}, 40 windows ended; channels over time 0.00:1:0 4.00:2:7 4.88:1:8"
    kept = f"{head}, 40 windows ended; channels over time 0.00:1:0 4.00:2:7 5.38:1:9"
    open_end = f"{head}, 8 windows ended; channels over time 0.00:1:0 4.00:2:7"
    old = "1 channel(s), 30.0 s, 1 at the end, 0 own socket drops"
    old += "; channels over time 0.0:1 4.0:2 4.9:1"
    rows = [_receiver(i, "mobile-6", 6.0, n) for i, n in enumerate((first, kept, open_end, old))]
    assert windows_kept_above(first, 1) == 0 and windows_kept_above(kept, 1) == 1
    assert windows_kept_above(open_end, 1) == 1 and windows_kept_above(old, 1) is None
    assert windows_kept_above(open_end.replace("8 windows", "7 windows"), 1) == 0
    assert channel_log(first) == [(0.0, 1), (4.0, 2), (4.88, 1)]
    view = channels_against_links(rows, 5.0)
    assert [r["windows_kept_above"] for r in view["per_receiver"]] == [0, 1, 1, None]
    assert view["over_longer_than_allowance"] == 3  # kept, open_end, and old by the clock
    # in seconds every one is above 0.8 s (the first by its timer's lateness)
    assert view["over_nominal"] == 4 and view["timer_late_max_s"] == 0.04


def _variant(median: float, by_mode: dict[str, float], egress: int) -> dict[str, Any]:
    return {
        "download_s": {"median": median},
        "download_s_by_mode": {m: {"median": v} for m, v in by_mode.items()},
        "origin_egress_total_bytes": egress,
    }


def test_the_run_against_its_unicast_twin() -> None:
    variants = {
        "emulation": _variant(60.0, {"multicast": 75.0, "swarm": 50.0}, 300),
        "unicast-only": _variant(70.0, {"origin": 70.0}, 7_500),
    }
    twin = twin_comparison(variants)
    assert twin is not None
    assert twin["carousel_readers"] == {"median_s": 75.0, "twin_median_s": 70.0,
                                        "at_most_twin": False}  # fmt: skip
    assert twin["swarm_clients"]["at_most_twin"] is True
    assert twin["origin_egress_ratio"] == 0.04 and twin["origin_egress_at_most_5pct"] is True
    assert twin_comparison({"emulation": variants["emulation"]}) is None
    assert twin["carousel_readers_in_twin"]["clients"] == 0  # no per-client rows


def test_the_carousel_readers_against_the_same_clients_in_the_twin() -> None:
    def row(client: int, link: str, mode: str, s: float | None) -> dict[str, Any]:
        return {"client": client, "kind": "desktop", "link": link, "mode": mode, "download_s": s}

    run = [row(1, "fibre", "multicast", 20.0), row(2, "fibre", "multicast", 18.0),
           row(3, "mobile", "multicast", 90.0), row(4, "dsl", "swarm", 30.0),
           row(5, "dsl", "multicast", None),  # not verified: left out
           {**row(6, "fibre", "multicast", 5.0), "kind": "browser"}]  # fmt: skip
    twin = [row(1, "fibre", "origin", 15.0), row(2, "fibre", "origin", 19.0),
            row(3, "mobile", "origin", 70.0), row(4, "dsl", "origin", 22.0),
            row(5, "dsl", "origin", 23.0)]  # fmt: skip
    same = same_clients_in_twin(run, twin)
    assert same["clients"] == 3 and same["faster_than_twin"] == 1
    assert (same["median_s"], same["twin_median_s"]) == (20.0, 19.0)
    assert same["by_link"] == {"fibre": [2, 20.0, 19.0], "mobile": [1, 90.0, 70.0]}
    summary = {
        "all_clients": {"median_s": 25.0, "twin_median_s": 22.0},
        "carousel_readers": {"median_s": 20.0},
        "swarm_clients": {"median_s": 30.0},
        "carousel_readers_in_twin": same,
    }
    lines = twin_lines(summary)
    assert lines[0].startswith("download median against the unicast-only twin's (22.0 s)")
    assert lines[1] == (
        "the 3 carousel readers: median 20.0 s, the same clients in the twin 19.0 s "
        "(1 faster than there); by link fibre 2: 20.0 s against 19.0 s; mobile 1: 90.0 s "
        "against 70.0 s"
    )
    assert twin_lines(None) == []


BROWSERS = """
name = "t"
issue_mb = 2
[[links]]
name = "dsl"
rate = "20mbit"
share = 3
[[links]]
name = "phone"
down_rate = "6mbit"
up_rate = "2mbit"
profile = "mobile"
[[arrivals]]
kind = "burst"
count = 4
at_s = 0
spread_s = 4
"""


def test_browser_readers_come_after_the_desktop_fleet_on_their_link() -> None:
    plain = parse_scenario(BROWSERS).clients()
    scenario = parse_scenario(
        BROWSERS + "[browser_readers]\nseed_s = 30\n[[browser_readers.arrivals]]\n"
        'kind = "burst"\ncount = 3\nat_s = 10\nspread_s = 20\n'
    )
    clients = scenario.clients()
    assert clients[:4] == plain  # the desktop fleet is the same with phones added
    phones = clients[4:]
    assert [p.number for p in phones] == [5, 6, 7]
    assert {p.kind for p in phones} == {BROWSER} and {p.kind for p in plain} == {DESKTOP}
    assert {p.link.name for p in phones} == {"phone"}  # the first mobile link by default
    assert scenario.browsers is not None and scenario.browsers.seed_s == 30
    assert scenario.last_arrival_s() == max(p.at_s for p in phones) > plain[-1].at_s
    with pytest.raises(ScenarioError, match=r"browser_readers\.link: no \[\[links\]\] named"):
        parse_scenario(BROWSERS + '[browser_readers]\nlink = "cable"\n'
                       '[[browser_readers.arrivals]]\n'
                       'kind = "burst"\ncount = 1\nat_s = 0\n')  # fmt: skip
    with pytest.raises(ScenarioError, match=r"browser_readers\.arrivals"):
        parse_scenario(BROWSERS + "[browser_readers]\nseed_s = 3\n")


def test_a_browser_readers_outcome_reads_like_pressrun_gets() -> None:
    result = {"status": "complete", "seconds": 41.5, "bytes_by_origin": {"origin-a": 1_000},
              "bytes_from_web_seeds": 9_000, "bytes_from_peers": 40_000,
              "peers_seen": 3}  # fmt: skip
    doc = outcome_doc(result, sha256="ab", want_sha256="ab", seeding_s=12.0,
                      record={"uploaded_bytes": 50_000, "leave_rule": "ratio"})  # fmt: skip
    assert doc["verified"] and doc["kind"] == "browser" and doc["mode"] == "swarm"
    assert doc["download_s"] == 41.5 and doc["seconds"] == 53.5 and doc["seeding_s"] == 12.0
    assert doc["bytes_from_origins"] == 10_000 and doc["bytes_from_peers"] == 40_000
    assert doc["uploaded_bytes"] == 50_000 and doc["leave_rule"] == "ratio"
    # a file that does not match the published one is not verified
    assert not outcome_doc(result, sha256="cd", want_sha256="ab", seeding_s=0, record=None)[
        "verified"
    ]
    failed = outcome_doc({}, sha256=None, want_sha256="ab", seeding_s=0, record=None, error="x")
    assert not failed["verified"] and failed["error"] == "x" and failed["download_s"] is None
    assert failed["mode"] is None  # not "origin": nothing is known of a failed download
    args = chromium_args("http://reader:8443/")
    assert "--unsafely-treat-insecure-origin-as-secure=http://reader:8443" in args
    assert "--no-sandbox" in args
