"""A small emulation end to end: the images, the compose project, six client
containers on shaped links (one kind lossy), the report. Runs where a container engine can
start (root, docker.io installed) and skips with the reason otherwise; the engine is
this module's fixture, stopped by its finaliser on every way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pressrun.emulate.cli import cache_dir, project_root
from pressrun.emulate.engine import engine_session, why_no_engine
from pressrun.peer.uploader import make_uploader_policy, uploader_policy_names

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def engine_host() -> Iterator[str]:
    """The engine the emulation runs on: ``DOCKER_HOST``'s, or pressrun's own, started
    here and stopped by this fixture's finaliser whatever the test did (the emulation
    under test gets it through ``DOCKER_HOST``)."""
    given = os.environ.get("DOCKER_HOST")
    if given:
        yield given
        return
    reason = why_no_engine()
    if reason is not None:
        pytest.skip(f"no container engine can start here: {reason}")
    with engine_session(cache_dir(project_root())) as engine:
        yield engine.host


def run_emulate(args: list[str], host: str, timeout_s: float) -> tuple[int, str, str]:
    """``pressrun emulate ARGS`` on ``host``; at the timeout it gets SIGTERM (its
    teardown runs) and, if it does not end, SIGKILL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "emulate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DOCKER_HOST": host},
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"pressrun emulate took more than {timeout_s:g} s: {out[-2000:]}{err[-2000:]}")
    return proc.returncode, out, err


def test_small_emulation_delivers_every_file_verified(tmp_path: Path, engine_host: str) -> None:
    out = tmp_path / "report"
    code, stdout, stderr = run_emulate(
        ["--scenario", "small", "--out", str(out)], engine_host, timeout_s=420
    )
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    run = summary["variants"]["emulation"]
    assert run["clients"] == 6
    assert run["verified"] == 6
    clients = run["per_client"]
    assert {c["link"] for c in clients} <= {"dsl-20", "lossy-8"}
    assert all(c["seconds"] > 0 and c["exit_code"] == 0 for c in clients)
    # the download (to the verified copy in the library), and the seeding and the swarm
    # peer's leave after it, apart: a client that neither seeded nor left took its
    # download's time in all
    assert all(0 < c["download_s"] <= c["seconds"] + 1e-6 for c in clients)
    assert all(
        (c["seeding_s"] or 0.0) + (c["leave_s"] or 0.0) <= c["seconds"] + 1e-3 for c in clients
    )
    assert all(
        abs(c["download_s"] - c["seconds"]) < 1e-3
        for c in clients
        if not c["seeding_s"] and not c["leave_s"]
    )
    # both supernodes registered with tracker-1 before the first client, and tracker-2
    # listed the same ring from the store the instances share
    assert len(run["ring_at_start"]["supernodes"]) == 2
    by_tracker = run["ring_at_start"]["by_tracker"]
    assert by_tracker["tracker-1"] == by_tracker["tracker-2"], by_tracker
    # every client was held at the start line and released at its time: each began
    # (its own clock) no earlier than scheduled
    assert all(c["started_s"] is not None and c["start_lag_s"] >= -0.1 for c in clients)
    # the balancer's directives by mode were sampled: the origin mode came first
    assert run["modes_first_s"].get("origin") is not None, run["modes_first_s"]
    # demand passed the balancer's low thresholds: later clients were sent to the swarm
    # or, past the multicast threshold once the swarm's 3 s dwell was over, the carousel
    # (which of the two depends on how fast the containers start on this host)
    assert run["modes"].get("origin", 0) >= 1, run["modes"]
    assert run["modes"].get("swarm", 0) + run["modes"].get("multicast", 0) >= 3, run["modes"]
    # each client that used the swarm says with which uploader policy, and one that
    # asks the Chord ring what the ring answered it (pressrun get --json's `ring`)
    swarm_clients = [c for c in clients if c["mode"] == "swarm" or c["left_swarm_for_carousel"]]
    ring_requests = []
    for c in swarm_clients:
        assert c["uploader_policy"] in uploader_policy_names(), c
        asks_ring = bool(getattr(make_uploader_policy(c["uploader_policy"]), "uses_ring", False))
        assert (c["ring"] is not None) == asks_ring, c
        if asks_ring:
            ring_requests.append(c["ring"]["requests"])
    # the ring answered the swarm's clients; not necessarily each of them: one whose
    # first rounds came before its torrent's status or the ring's list, and that had
    # the 4 MB issue from its peers and the web seeds by the next, never asked (CI run
    # of 27 Nov: a verified lossy-8 client with 0 requests)
    if ring_requests:
        assert sum(ring_requests) >= 1, swarm_clients
    # the report's per-policy summary counts exactly the clients that named a policy
    # (a client that tried the swarm and finished from the origins names one too), and
    # those of them the ring answered
    by_policy = run["ring_by_policy"]
    used = Counter(c["uploader_policy"] for c in clients if c["uploader_policy"] is not None)
    assert {p: e["clients"] for p, e in by_policy.items()} == dict(used), by_policy
    ringed = Counter(c["uploader_policy"] for c in clients if c["ring"])
    assert {p: e["with_ring"] for p, e in by_policy.items() if e["with_ring"]} == dict(ringed), (
        by_policy
    )
    # the host's CPU was sampled all along, and what the engine's containers took of it
    cpu = run["cpu"]
    assert len(cpu["series"]) >= 2 and cpu["cores"] >= 1, cpu
    assert 0 < cpu["busy_cores"] <= cpu["cores"] + 0.1, cpu
    if Path("/sys/fs/cgroup/cpuacct/pressrun-emulate").is_dir():  # cgroup v1, our engine
        assert 0 < cpu["containers_cores"] <= cpu["busy_cores"] + 0.1, cpu
    # every origin was polled during the run and together they sent at least one copy
    assert set(run["origin_egress_bytes"]) == {"origin-a", "origin-b", "origin-c"}
    assert run["origin_egress_total_bytes"] >= summary["issue"]["size_bytes"]
    # the two tracker instances answer from the one Redis: the same swarm
    views = run["trackers"]
    swarm = [
        (v.get("http_status"), v.get("completed"), len(v.get("peers", [])))
        for v in (views["tracker-1"], views["tracker-2"])
    ]
    assert swarm[0] == swarm[1], views
    # at the end too, both list the same swarm and the same ring of supernodes
    assert run["trackers_agree"] == {"instances": True, "swarm": True, "ring": True}, views
    if run["modes"].get("swarm"):
        assert (swarm[0][1] or 0) >= 1, views
    assert (out / "egress.png").stat().st_size > 10_000
    assert (out / "clients.png").stat().st_size > 10_000
    # the multicast sender was polled all along (its bytes are in the report), and it
    # had encoded the issue when it saw it published, before the first client
    assert len(run["sender_series"]) >= 2
    assert run["prepared_s"] is not None
    assert "[emulation] tearing down" in stdout
    assert (out / "emulation-services.log").stat().st_size > 0
