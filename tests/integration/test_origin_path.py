"""The origin path end to end on loopback: origins, the balancer, real clients."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pressrun.clients.aio import FetchError, FetchResult, fetch_issue
from pressrun.clients.codec import ResumeState
from pressrun.content.keys import generate_keypair, load_signing_key
from pressrun.content.manifest import SignedManifest, sign_manifest
from pressrun.demo.testbed import OriginShape, Testbed

from .conftest import FAST, ISSUE, PIECE, SIZE, Keys, config, sha256

FILE = f"{ISSUE}.pdf"


class Recorder:
    """A `Progress` that keeps what it was told."""

    def __init__(self) -> None:
        self.notices: list[str] = []
        self.total = 0
        self.resumed = 0
        self.last = 0

    def started(self, issue_id: str, total_bytes: int, done_bytes: int) -> None:
        self.total, self.resumed = total_bytes, done_bytes

    def advanced(self, done_bytes: int, origin: str | None) -> None:
        self.last = done_bytes

    def notice(self, text: str) -> None:
        self.notices.append(text)


def assert_in_library(library: Path, data: bytes) -> None:
    path = library / ISSUE / FILE
    assert path.read_bytes() == data
    assert (library / ISSUE / ".manifest.json").exists()
    assert not (library / ".partial" / ISSUE).exists()


def assert_nothing_in_library(library: Path) -> None:
    assert not (library / ISSUE).exists()
    assert not list(library.glob(f"{ISSUE}*")) if library.exists() else True


async def wait_stopped(pid: int) -> None:
    """Until the process is in the stopped state (SIGSTOP is delivered asynchronously)."""
    for _ in range(500):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def bytes_written(pid: int) -> int:
    """The bytes the process has handed the kernel in write-like calls (wchar)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "wchar":
            return int(value)
    raise AssertionError(f"/proc/{pid}/io has no wchar")


async def stats(bed: Testbed, name: str) -> dict[str, Any]:
    return await bed.stats(name)


# --------------------------------------------------------------------- (a)


async def test_ten_clients_one_origin_killed_mid_run(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    # 16 Mbit/s = 2 MB/s per origin: 10 x 2 MiB take a few seconds, room for a kill
    shapes = tuple(OriginShape(f"origin-{x}", 16.0, 16.0) for x in "abc")
    bed: Testbed = await bed_factory(shapes, processes=True)
    assert bed.balancer is not None
    clients = [
        asyncio.create_task(
            fetch_issue(
                ISSUE,
                balancer_url=bed.balancer.url,
                library=tmp_path / f"lib{n}",
                config=config(section_bytes=8 * PIECE),
                trusted_keys=keys.trusted,
            )
        )
        for n in range(10)
    ]
    # kill origin-a once it is in the middle of serving
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        doc = await stats(bed, "origin-a")
        if doc["active_transfers"] > 0 and doc["bytes_sent_total"] > 4 * PIECE:
            break
        assert loop.time() < deadline, "origin-a never served"
        await asyncio.sleep(0.05)
    # Freeze origin-a, then take the bound: once it is stopped it hands the kernel no
    # more bytes, so every byte a client can still receive from it is counted in its
    # /proc/<pid>/io wchar (the bytes it wrote: bodies through sendfile, plus its
    # headers, /stats answers and log lines). Reading /stats and then killing would
    # leave a gap in which it sends more (the race this replaces).
    frozen = bed.origin_processes["origin-a"].proc
    frozen.send_signal(signal.SIGSTOP)
    await wait_stopped(frozen.pid)
    written = bytes_written(frozen.pid)
    sent_before_kill = doc["bytes_sent_total"]
    assert sent_before_kill <= written
    await bed.kill_origin("origin-a")
    results: list[FetchResult] = await asyncio.wait_for(asyncio.gather(*clients), 60)
    assert len(results) == 10
    for n, result in enumerate(results):
        assert result.verified
        assert_in_library(tmp_path / f"lib{n}", data)
    served_by_a = sum(r.bytes_by_origin.get("origin-a", 0) for r in results)
    assert 0 < served_by_a <= written
    # the clients cut off by the kill reported it and carried on elsewhere
    assert sum(r.failures for r in results) >= 1
    assert any(set(r.origins_used) - {"origin-a"} and "origin-a" in r.origins_used for r in results)


async def test_stalled_origin_is_failed_and_the_download_moves_on(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    # origin-a is frozen (SIGSTOP) mid-transfer: its connections stay open, no byte comes
    shapes = (OriginShape("origin-a", 8.0, 8.0), OriginShape("origin-b", 8.0, 8.0))
    bed: Testbed = await bed_factory(shapes, processes=True)
    assert bed.balancer is not None
    progress = Recorder()
    task = asyncio.create_task(
        fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=tmp_path / "lib",
            config=config(stall_timeout_s=1.0, concurrency=2, section_bytes=6 * PIECE),
            trusted_keys=keys.trusted,
            progress=progress,
        )
    )
    frozen = bed.origin_processes["origin-a"].proc
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while (await stats(bed, "origin-a"))["active_transfers"] == 0:
        assert loop.time() < deadline and not task.done()
        await asyncio.sleep(0.02)
    frozen.send_signal(signal.SIGSTOP)
    try:
        result = await asyncio.wait_for(task, 30)
    finally:
        frozen.send_signal(signal.SIGCONT)
    assert_in_library(tmp_path / "lib", data)
    assert result.failures >= 1
    assert any("origin-a failed" in n and "stalled" in n for n in progress.notices)


# --------------------------------------------------------------------- (b)


def tamper_title(manifest_path: Path) -> None:
    doc = json.loads(manifest_path.read_bytes())
    doc["manifest"]["title"] = "Forged"
    manifest_path.write_text(json.dumps(doc))


async def test_tampered_manifest_is_rejected_and_nothing_saved(
    bed_factory: Any, tmp_path: Path, keys: Keys
) -> None:
    bed: Testbed = await bed_factory((OriginShape("origin-a"), OriginShape("origin-b")))
    assert bed.balancer is not None
    tamper_title(bed.content_dir / ISSUE / "manifest.json")
    library = tmp_path / "lib"
    with pytest.raises(FetchError, match="signature does not match") as err:
        await fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=library,
            config=FAST,
            trusted_keys=keys.trusted,
        )
    assert "\n" not in str(err.value)
    assert_nothing_in_library(library)
    assert not (library / ".partial" / ISSUE).exists()


async def test_manifest_signed_by_another_key_is_rejected(
    bed_factory: Any, tmp_path: Path, keys: Keys
) -> None:
    bed: Testbed = await bed_factory((OriginShape("origin-a"),))
    assert bed.balancer is not None
    # a forger re-signs a changed manifest with their own key: self-consistent, not trusted
    other, _ = generate_keypair(tmp_path / "forger.key")
    path = bed.content_dir / ISSUE / "manifest.json"
    m = SignedManifest.from_json_bytes(path.read_bytes()).manifest
    forger = load_signing_key(other)
    from dataclasses import replace

    forged = replace(m, title="Forged", publisher_key=bytes(forger.verify_key).hex())
    path.write_bytes(sign_manifest(forged, forger).to_json_bytes())
    library = tmp_path / "lib"
    with pytest.raises(FetchError, match="not a trusted publisher"):
        await fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=library,
            config=FAST,
            trusted_keys=keys.trusted,
        )
    assert_nothing_in_library(library)


async def test_trust_on_first_use_records_the_key_then_pins_it(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    bed: Testbed = await bed_factory((OriginShape("origin-a"),))
    assert bed.balancer is not None
    library = tmp_path / "lib"
    # no trust on first use by default: no key given, none in the library, a clear error
    with pytest.raises(FetchError, match=r"no trusted publisher key .*`pressrun trust add KEY"):
        await fetch_issue(
            ISSUE, balancer_url=bed.balancer.url, library=library, config=FAST, trusted_keys=None
        )
    assert_nothing_in_library(library)
    progress = Recorder()
    await fetch_issue(
        ISSUE,
        balancer_url=bed.balancer.url,
        library=library,
        config=FAST,
        trusted_keys=None,
        progress=progress,
        trust_on_first_use=True,
    )
    assert_in_library(library, data)
    assert any("trusting publisher key" in n for n in progress.notices)
    assert keys.public.read_text().strip() in (library / "trusted-publishers").read_text()
    # a manifest from another publisher is now refused by that library
    other, _ = generate_keypair(tmp_path / "other.key")
    path = bed.content_dir / ISSUE / "manifest.json"
    m = SignedManifest.from_json_bytes(path.read_bytes()).manifest
    from dataclasses import replace

    signer = load_signing_key(other)
    path.write_bytes(
        sign_manifest(
            replace(m, publisher_key=bytes(signer.verify_key).hex()), signer
        ).to_json_bytes()
    )
    with pytest.raises(FetchError, match="not a trusted publisher"):
        await fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=library,
            config=FAST,
            trusted_keys=None,
            trust_on_first_use=True,
        )


# --------------------------------------------------------------------- (c)


async def test_corrupted_byte_on_one_origin_is_refetched_elsewhere(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    # rr over sorted names: the manifest's directive picks origin-a, section 0's
    # picks origin-b, whose copy has a flipped byte in piece 0
    shapes = (
        OriginShape("origin-a", content_dir=tmp_path / "content-a"),
        OriginShape("origin-b", content_dir=tmp_path / "content-b"),
    )
    bed: Testbed = await bed_factory(shapes, algorithm="rr")
    assert bed.balancer is not None
    bad = tmp_path / "content-b" / ISSUE / FILE
    raw = bytearray(bad.read_bytes())
    raw[1000] ^= 0xFF
    bad.write_bytes(bytes(raw))
    library = tmp_path / "lib"
    progress = Recorder()
    result = await fetch_issue(
        ISSUE,
        balancer_url=bed.balancer.url,
        library=library,
        config=config(concurrency=1, section_bytes=8 * PIECE),
        trusted_keys=keys.trusted,
        progress=progress,
    )
    assert_in_library(library, data)
    assert sha256(result.path) == hashlib.sha256(data).hexdigest()
    # origin-b did send the bad piece, which was discarded and fetched from origin-a
    assert (await stats(bed, "origin-b"))["bytes_sent_total"] >= 1001
    assert result.bytes_by_origin.get("origin-b", 0) == 0
    assert result.bytes_by_origin["origin-a"] == SIZE
    assert result.failures >= 1
    assert any("origin-b" in n and "SHA-256" in n for n in progress.notices)


# --------------------------------------------------------------------- (d)


async def test_bad_range_416_fails_the_origin_and_the_download_goes_on(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    # origin-a's copy is cut short: a section starting past its end gets 416
    shapes = (
        OriginShape("origin-a", content_dir=tmp_path / "content-a"),
        OriginShape("origin-b", content_dir=tmp_path / "content-b"),
    )
    bed: Testbed = await bed_factory(shapes, algorithm="rr")
    assert bed.balancer is not None
    short = tmp_path / "content-a" / ISSUE / FILE
    with open(short, "r+b") as f:
        f.truncate(100)
    url = f"{bed.origins['origin-a'].url}/content/{ISSUE}/{FILE}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers={"Range": f"bytes={8 * PIECE}-{16 * PIECE - 1}"}) as resp,
    ):
        assert resp.status == 416  # the set-up is what the test says
    library = tmp_path / "lib"
    progress = Recorder()
    result = await fetch_issue(
        ISSUE,
        balancer_url=bed.balancer.url,
        library=library,
        config=config(concurrency=1, section_bytes=8 * PIECE),
        trusted_keys=keys.trusted,
        progress=progress,
    )
    assert_in_library(library, data)
    assert result.bytes_by_origin.get("origin-a", 0) == 0
    assert result.failures >= 1
    assert any("416" in n for n in progress.notices)


# --------------------------------------------------------------------- (e)


async def test_unknown_issue_is_a_clear_error(bed_factory: Any, tmp_path: Path, keys: Keys) -> None:
    bed: Testbed = await bed_factory((OriginShape("origin-a"),))
    assert bed.balancer is not None
    library = tmp_path / "lib"
    with pytest.raises(FetchError, match="'no-such-issue' is unknown to the balancer"):
        await fetch_issue(
            "no-such-issue",
            balancer_url=bed.balancer.url,
            library=library,
            config=FAST,
            trusted_keys=keys.trusted,
        )
    assert not (library / "no-such-issue").exists()
    # the same through the command line: one line on stderr, exit code 1
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pressrun.cli",
        "get",
        "no-such-issue",
        "--balancer",
        bed.balancer.url,
        "--library",
        str(library),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pressrun get: issue 'no-such-issue' is unknown")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_balancer_is_a_clear_error(tmp_path: Path, keys: Keys) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(FetchError, match=f"balancer at {url} is unreachable"):
        await fetch_issue(
            ISSUE, balancer_url=url, library=tmp_path / "lib", config=FAST, trusted_keys=None
        )


async def test_every_origin_failing_gives_up_with_a_reason(
    bed_factory: Any, tmp_path: Path, keys: Keys
) -> None:
    # every origin's copy is cut short: every section gets 416, nothing verifies
    shapes = (
        OriginShape("origin-a", content_dir=tmp_path / "content-a"),
        OriginShape("origin-b", content_dir=tmp_path / "content-b"),
    )
    bed: Testbed = await bed_factory(shapes)
    assert bed.balancer is not None
    for name in ("a", "b"):
        with open(tmp_path / f"content-{name}" / ISSUE / FILE, "r+b") as f:
            f.truncate(10)
    library = tmp_path / "lib"
    with pytest.raises(FetchError, match="gave up after 4 failed attempts") as err:
        await fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=library,
            config=config(max_attempts_without_progress=4),
            trusted_keys=keys.trusted,
        )
    assert "\n" not in str(err.value)
    assert not (library / ISSUE).exists()


# --------------------------------------------------------------------- (f)


def verified_on_disk(library: Path) -> frozenset[int]:
    state_path = library / ".partial" / ISSUE / ".state.json"
    if not state_path.exists():
        return frozenset()
    state = ResumeState.from_json_bytes(state_path.read_bytes())
    return state.verified if state is not None else frozenset()


async def test_cancelled_download_resumes_without_refetching_verified_pieces(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    # 4 Mbit/s = 0.5 MB/s: a 2 MiB issue takes about 4 s
    bed: Testbed = await bed_factory((OriginShape("origin-a", 4.0, 4.0),))
    assert bed.balancer is not None
    library = tmp_path / "lib"
    first = asyncio.create_task(
        fetch_issue(
            ISSUE,
            balancer_url=bed.balancer.url,
            library=library,
            config=FAST,
            trusted_keys=keys.trusted,
        )
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while len(verified_on_disk(library)) < 5:
        assert loop.time() < deadline and not first.done()
        await asyncio.sleep(0.05)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    kept = verified_on_disk(library)
    assert 5 <= len(kept) < 33
    assert not (library / ISSUE).exists()  # not in the library until complete
    progress = Recorder()
    result = await fetch_issue(
        ISSUE,
        balancer_url=bed.balancer.url,
        library=library,
        config=FAST,
        trusted_keys=keys.trusted,
        progress=progress,
    )
    assert_in_library(library, data)
    kept_bytes = sum(min(PIECE, SIZE - i * PIECE) for i in kept)
    assert result.resumed_bytes == kept_bytes == progress.resumed
    # the second run fetched exactly what was missing: no verified piece again
    assert sum(result.bytes_by_origin.values()) == SIZE - kept_bytes


async def test_killed_get_process_resumes(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    bed: Testbed = await bed_factory((OriginShape("origin-a", 4.0, 4.0),))
    assert bed.balancer is not None
    library = tmp_path / "lib"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pressrun.cli",
            "get",
            ISSUE,
            "--balancer",
            bed.balancer.url,
            "--library",
            str(library),
            "--publisher-key",
            str(keys.public),
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(verified_on_disk(library)) < 5:
            assert loop.time() < deadline and proc.poll() is None
            await asyncio.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    kept = verified_on_disk(library)
    assert 5 <= len(kept) < 33
    result = await fetch_issue(
        ISSUE,
        balancer_url=bed.balancer.url,
        library=library,
        config=FAST,
        trusted_keys=keys.trusted,
    )
    assert_in_library(library, data)
    assert result.resumed_bytes >= sum(min(PIECE, SIZE - i * PIECE) for i in kept)
    assert sum(result.bytes_by_origin.values()) == SIZE - result.resumed_bytes


# ----------------------------------------------------------------- the command


async def run_get(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pressrun.cli",
        "get",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_get_command_mobile_profile_in_sections(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    bed: Testbed = await bed_factory((OriginShape("origin-a"), OriginShape("origin-b")))
    assert bed.balancer is not None
    library = tmp_path / "lib"
    code, out, err = await run_get(
        ISSUE,
        "--balancer",
        bed.balancer.url,
        "--library",
        str(library),
        "--profile",
        "mobile",
        "--section-mb",
        "0.5",
        "--publisher-key",
        str(keys.public),
    )
    assert code == 0, err
    assert_in_library(library, data)
    # not a terminal: no bar, one summary line
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(str(library / ISSUE / FILE))
    assert f"{SIZE / 1e6:.1f} MB verified" in lines[0]
    # bad flags: exit code 2, one line
    for bad in (["--section-mb", "0"], ["--publisher-key", "not-a-key"]):
        code, _, err = await run_get(
            ISSUE, "--balancer", bed.balancer.url, "--library", str(library), *bad
        )
        assert code == 2 and len(err.strip().splitlines()) == 1


async def test_a_section_stuck_on_a_slow_origin_moves_to_a_fast_one(
    bed_factory: Any, tmp_path: Path, keys: Keys, data: bytes
) -> None:
    # rr over sorted names: manifest from origin-a, section 0 (the first MiB) from
    # origin-b, capped at 0.5 MB/s, section 1 from origin-a at full speed. Once
    # origin-a's section has shown what the link can do, origin-b's section is left
    # mid-way (its worker moves it, or origin-a's idle worker takes over its back half)
    shapes = (OriginShape("origin-a"), OriginShape("origin-b", 4.0, 4.0))
    bed: Testbed = await bed_factory(shapes, algorithm="rr")
    assert bed.balancer is not None
    progress = Recorder()
    result = await fetch_issue(
        ISSUE,
        balancer_url=bed.balancer.url,
        library=tmp_path / "lib",
        config=config(
            concurrency=2, section_bytes=16 * PIECE, steal_after_s=0.5, steal_min_elapsed_s=0.3
        ),
        trusted_keys=keys.trusted,
        progress=progress,
    )
    assert_in_library(tmp_path / "lib", data)
    assert any(
        n.startswith("took over") or n.startswith("origin origin-b is slow")
        for n in progress.notices
    ), progress.notices
    # origin-b delivered only part of its section; the rest came from origin-a
    assert 0 < result.bytes_by_origin["origin-b"] < 16 * PIECE
    assert result.bytes_by_origin["origin-a"] == SIZE - result.bytes_by_origin["origin-b"]
    assert result.handoffs >= 2
    assert result.failures == 0  # slow is not failed
