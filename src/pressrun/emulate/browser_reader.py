"""A browser reader in a container: the web reader in Debian's headless Chromium at a
phone's size, held at the start line like a desktop client (issue 26).

``python3 -m pressrun.emulate.browser_reader --release-dir DIR --name N --reader-url URL
--issue ID --sha256 HEX`` (after the entrypoint shaped the link, a phone's) starts
Chromium through Playwright (`pressrun.reader.browser`: the flags and the phone
profile the reader's tests use), opens the app as a phone whose app is already open,
with the app's "download new issues automatically" setting off, writes ``DIR/N.ready``
and waits for ``DIR/N.go`` (`pressrun.emulate.held`'s protocol; ``DIR/N.started``
records the release). Then the app downloads the issue with its own ``startDownload``
(the balancer's directive, the swarm through the WebSocket tracker and WebRTC when the
directive names it, the origins as web seeds, every piece checked against the signed
manifest), and the stored file's SHA-256 is computed in the page.

Why the setting is off while the phone waits: the app looks for new issues when it
opens and downloads a fresh one at once (app.js ``checkForIssues``). The issue is
published before the crowd, so with the setting on every phone asked the balancer for
its directive when its app opened, before any reader had arrived (``origin``), and
took its copy from the origins during the wait: in flash-crowd-50 at 53e51eb all 10
phones were told origin, 6 of 10 (8 of 10 in the twin) had finished before their
release and reported the resumed download's 0 B in 0.6-1.9 s, and the others' result
was the early download's. Now the directive is asked at the reader's arrival, as a
reader who opens the app (or taps Download) then does; a phone whose app holds the
issue at its release reports that as its error.

The page stays open while the app shares the issue, until the app's own leave rule
lets it go or ``--seed-s`` passed (a phone closing the app).

The last line on stdout is one JSON object shaped like ``pressrun get --json``'s
(``kind``: ``browser``; ``verified``, ``sha256``, ``mode``, ``seconds``, ``download_s``,
``seeding_s``, ``bytes_from_origins`` with ``bytes_by_origin`` and
``bytes_from_web_seeds``, ``bytes_from_peers``, ``uploaded_bytes``, ``leave_rule``,
``peers_seen``, and ``told``: ``swarm`` when the app started a swarm fetch from its
directive, else ``origin``), so the emulation's report reads both kinds alike.
``download_s`` means what a desktop's does, the reader's wait: the app's own seconds
from its start to the file stored and checked against the manifest's SHA-256
(download.js), nothing after it; ``seconds`` adds the sharing after it (``seeding_s``),
and a page has no ``leave_s`` (its leave is the app's, not timed here). Exit code 0 when the
issue was stored and verified.

In a container the page is at ``http://reader:8443``, not a secure context, so
Chromium is told to treat that origin as one (OPFS and WebCrypto need it), and WebRTC's
host candidates are the container's own address rather than mDNS names (no mDNS
responder runs in the containers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pressrun.emulate.held import POLL_S, go_path, ready_path, started_path

#: what the app does on the page: download and wait for its result or error
DOWNLOAD_JS = """async (issue) => {
    await window.pressrun.startDownload(issue);
    const result = window.pressrun.results[issue];
    return result ?? {error: window.pressrun.errors[issue] ?? 'no result and no error'};
}"""
#: the stored issue's SHA-256 (hex) and its record's sharing figures, read back from
#: the page's storage as the reader's tests do
STORED_JS = """async (issue) => {
    const store = await import('./js/store.js');
    const db = await import('./js/db.js');
    const r = await db.getRecord('issues', issue);
    const blob = await store.issueBlob(issue, r.num_pieces, 'application/pdf');
    const d = await crypto.subtle.digest('SHA-256', await blob.arrayBuffer());
    return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, '0')).join('');
}"""
#: the issue's record: ``uploaded_bytes`` and ``leave_rule`` appear once the app's
#: sharing ended (its fair-exit rule)
RECORD_JS = """async (issue) => {
    const db = await import('./js/db.js');
    const r = await db.getRecord('issues', issue);
    return {uploaded_bytes: r?.uploaded_bytes ?? null, leave_rule: r?.leave_rule ?? null};
}"""
#: how often the record is read while the app shares the issue
SEED_POLL_S = 1.0
#: the app's "download new issues automatically" setting, turned off from a page of the
#: reader's origin before the app opens (the app reads it when it finds a new issue)
AUTO_DOWNLOAD_OFF_JS = """async (dbUrl) => {
    const db = await import(dbUrl);
    await db.putSetting('auto_download', false);
    return await db.getSetting('auto_download', true);
}"""
#: whether the app holds anything of the issue (a library record) or is fetching it
#: through the swarm: at the release, nothing; after the download, whether the
#: directive sent it to the swarm (the app's swarm figures, set when the swarm starts)
HELD_JS = """async (issue) => {
    const db = await import('./js/db.js');
    const r = await db.getRecord('issues', issue);
    return {record: r ? (r.status ?? 'new') : null,
            swarm: (window.pressrun.swarm?.() ?? {})[issue] ?? null,
            result: window.pressrun.results[issue] ?? null};
}"""


def chromium_args(reader_url: str) -> list[str]:
    """The reader's tests' Chromium flags, plus what a container needs: the reader's
    plain-HTTP origin treated as secure, host candidates by address (not mDNS), and
    shared memory in /tmp (a container's /dev/shm is 64 MB)."""
    from pressrun.reader.browser import CHROMIUM_ARGS

    parts = urlsplit(reader_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    return [
        *CHROMIUM_ARGS,
        f"--unsafely-treat-insecure-origin-as-secure={origin}",
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        "--disable-dev-shm-usage",
    ]


def _byte_map(value: object) -> dict[str, int]:
    """A ``{name: bytes}`` object from the page, its numbers as ints (anything else:
    empty; at most 16 names, the page's maps have 4-6)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, int] = {}
    for k, v in list(value.items())[:16]:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[str(k)[:32]] = int(v)
    return out


def outcome_doc(
    result: dict[str, Any],
    *,
    sha256: str | None,
    want_sha256: str,
    seeding_s: float,
    record: dict[str, Any] | None,
    error: str | None = None,
    told: str | None = None,
) -> dict[str, Any]:
    """The JSON outcome (``pressrun get --json``'s shape) from the app's result
    document, the page's SHA-256 of the stored file and its sharing record; ``told``:
    the directive's mode as the app took it (``swarm`` when it started a swarm fetch,
    else ``origin``; None when unknown)."""
    by_origin = {str(k): int(v) for k, v in (result.get("bytes_by_origin") or {}).items()}
    web_seeds = int(result.get("bytes_from_web_seeds") or 0)
    peers = int(result.get("bytes_from_peers") or 0)
    download_s = result.get("seconds")
    verified = error is None and result.get("status") == "complete" and sha256 == want_sha256
    return {
        "kind": "browser",
        "verified": verified,
        "sha256": sha256,
        # the app follows the directive: with a swarm it counts web seeds and peers
        # (none known when the download failed)
        "mode": None
        if not result
        else str(result.get("mode") or ("swarm" if peers or web_seeds else "origin")),
        "download_s": None if download_s is None else round(float(download_s), 2),
        "seconds": None if download_s is None else round(float(download_s) + seeding_s, 2),
        "seeding_s": round(seeding_s, 1),
        "bytes_from_origins": sum(by_origin.values()) + web_seeds,
        "bytes_by_origin": by_origin,
        "bytes_from_web_seeds": web_seeds,
        # the web seeds' bytes by why the app offered the piece to them, and by the
        # web-seed rule's state then (swarm.js; egress_causes sums them)
        "web_seed_bytes_by_offer": _byte_map(result.get("web_seed_bytes_by_offer")),
        "web_seed_bytes_by_rule": _byte_map(result.get("web_seed_bytes_by_rule")),
        "bytes_from_peers": peers,
        "bytes_from_multicast": 0,
        "peers_seen": result.get("peers_seen"),
        "told": told,
        "uploaded_bytes": (record or {}).get("uploaded_bytes"),
        "leave_rule": (record or {}).get("leave_rule"),
        "error": error,
    }


async def _bounded(what: str, step: Any, timeout_s: float) -> Any:
    try:
        async with asyncio.timeout(timeout_s):
            return await step
    except TimeoutError:
        raise RuntimeError(f"{what}: no answer in {timeout_s:g} s") from None


async def auto_download_off(page: Any, reader_url: str, timeout_s: float) -> None:
    """Turn the app's automatic download of new issues off in this browser context,
    from the reader's ``config.json`` (a page of its origin that is not the app, so the
    app has not looked for issues yet); opened again while the reader service starts."""
    from urllib.parse import urljoin

    base = reader_url if reader_url.endswith("/") else reader_url + "/"
    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            resp = await page.goto(urljoin(base, "config.json"))
            if resp is None or not resp.ok:
                raise RuntimeError(f"config.json: HTTP {None if resp is None else resp.status}")
            value = await page.evaluate(AUTO_DOWNLOAD_OFF_JS, urljoin(base, "js/db.js"))
            if value is not False:
                raise RuntimeError(f"the auto_download setting reads {value!r} after it was set")
            return
        except Exception:  # playwright's errors: the service not up yet, a cut load
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(1.0)


async def read_issue(opts: argparse.Namespace) -> dict[str, Any]:
    """Start Chromium and the app, wait at the start line, download, share; the
    outcome document (an error in it once the page ran, never an exception)."""
    from playwright.async_api import async_playwright

    from pressrun.reader.browser import CHROMIUM, PHONE, open_app

    release_dir: Path = opts.release_dir
    console: list[str] = []
    async with async_playwright() as playwright:
        browser = await _bounded(
            "Chromium's start",
            playwright.chromium.launch(
                executable_path=CHROMIUM, args=chromium_args(opts.reader_url)
            ),
            opts.step_timeout_s,
        )
        try:
            context = await browser.new_context(**PHONE)
            context.set_default_timeout(opts.step_timeout_s * 1000)
            page = await context.new_page()
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            # the app is open on the phone before the reader's arrival: its start
            # (the page, the reader's configuration) is not the download's time; it
            # must not download the issue by itself meanwhile (the module's docstring)
            await auto_download_off(page, opts.reader_url, opts.step_timeout_s)
            await open_app(page, opts.reader_url, opts.step_timeout_s)
            await _bounded("the app's start", page.evaluate("window.pressrun.ready"),
                           opts.step_timeout_s)  # fmt: skip
            ready = time.clock_gettime(time.CLOCK_MONOTONIC)
            ready_path(release_dir, opts.name).write_text(f"{ready:.3f}\n")
            go = go_path(release_dir, opts.name)
            while not go.exists():
                await asyncio.sleep(POLL_S)
            released = time.clock_gettime(time.CLOCK_MONOTONIC)
            started_path(release_dir, opts.name).write_text(
                json.dumps({"ready": round(ready, 3), "released": round(released, 3)})
            )
            held = await _bounded(
                "the app's library", page.evaluate(HELD_JS, opts.issue), opts.step_timeout_s
            )
            if held["record"] is not None or held["result"] is not None:
                why = (
                    f"the app held the issue before its reader arrived (record "
                    f"{held['record']!r}): its download was not asked at the arrival"
                )
                return outcome_doc({}, sha256=None, want_sha256=opts.sha256, seeding_s=0.0,
                                   record=None, error=why)  # fmt: skip
            try:
                result = await _bounded(
                    "the download", page.evaluate(DOWNLOAD_JS, opts.issue), opts.timeout_s
                )
            except RuntimeError as err:  # say where the app was: its last notices
                notices = await _bounded(
                    "the app's notices",
                    page.evaluate("window.pressrun.notices.slice(-3).map((n) => n.text)"),
                    30.0,
                )
                why = (
                    f"{err}; the app's last notices: {notices} (console: {'; '.join(console[-3:])})"
                )
                return outcome_doc({}, sha256=None, want_sha256=opts.sha256, seeding_s=0.0,
                                   record=None, error=why)  # fmt: skip
            if "error" in result:
                return outcome_doc({}, sha256=None, want_sha256=opts.sha256, seeding_s=0.0,
                                   record=None, error=str(result["error"]))  # fmt: skip
            sha = await _bounded(
                "the stored issue's SHA-256",
                page.evaluate(STORED_JS, opts.issue),
                opts.step_timeout_s,
            )
            after = await _bounded(
                "the app's swarm figures", page.evaluate(HELD_JS, opts.issue), 30.0
            )
            told = "swarm" if after["swarm"] is not None else "origin"
            # share while the app does (its fair-exit rule), at most --seed-s
            seeding_from = time.perf_counter()
            record: dict[str, Any] | None = None
            while time.perf_counter() - seeding_from < opts.seed_s:
                record = await _bounded(
                    "the issue's record", page.evaluate(RECORD_JS, opts.issue), 30.0
                )
                if record.get("leave_rule"):
                    break
                await asyncio.sleep(SEED_POLL_S)
            seeding_s = time.perf_counter() - seeding_from
            if record is None or not record.get("leave_rule"):
                record = {"leave_rule": "app_closed"}
            return outcome_doc(result, sha256=sha, want_sha256=opts.sha256,
                               seeding_s=seeding_s, record=record, told=told)  # fmt: skip
        except Exception as err:  # the page failed: the outcome says how
            tail = "; ".join(console[-3:])
            detail = f"{type(err).__name__}: {err}" + (f" (console: {tail})" if tail else "")
            return outcome_doc({}, sha256=None, want_sha256=opts.sha256, seeding_s=0.0,
                               record=None, error=detail)  # fmt: skip
        finally:
            await _bounded("Chromium's close", browser.close(), 30.0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The container's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m pressrun.emulate.browser_reader",
        description="a phone: the web reader in headless Chromium, released by the host",
    )
    parser.add_argument("--release-dir", type=Path, required=True)
    parser.add_argument("--name", required=True, help="this reader's name in the folder")
    parser.add_argument("--reader-url", required=True, help="the reader service's page")
    parser.add_argument("--issue", required=True)
    parser.add_argument("--sha256", required=True, help="the published file's SHA-256")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="the download's end")
    parser.add_argument("--seed-s", type=float, default=60.0,
                        help="the most seconds the app stays open after the download")  # fmt: skip
    parser.add_argument("--step-timeout-s", type=float, default=120.0,
                        help="each other step's end (Chromium's start, the app's)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    """Run one browser reader; 0 when its issue was stored and verified."""
    opts = parse_args(argv)
    doc = asyncio.run(read_issue(opts))
    print(json.dumps(doc), flush=True)
    return 0 if doc["verified"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
