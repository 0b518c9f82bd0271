"""``publish --encrypt`` for a real readership (issue 25), and the wrap crowd (issue 35).

**publish** (the default):
A real ``pressrun serve subscriptions`` process on 127.0.0.1 holds N subscribers (put
straight into its SQLite file before it starts, in one transaction: adding 50,000 one
PUT at a time would only time the bench), then ``pressrun publish --encrypt`` runs as
a process against it, as a publisher runs it. Printed: the publish's wall time, how
long the wraps took (sealing the content key to each subscriber, from publish's own
log line) and storing them (one PUT of every wrap), the sizes on the wire, that every
subscriber has a wrap, and that one real subscriber among them opens its own.

    flock /work/heavy.lock .venv/bin/python bench/subscriptions.py [--subscribers 50000]

**the wrap crowd** (``--crowd``): the release minute of an embargoed issue, when every
subscriber who pre-positioned the ciphertext asks for its wrap. One real ``pressrun
serve subscriptions`` process holds N subscribers and one wrap each of an issue version
under an embargo (a signed release notice, released a few seconds after the service
starts; a wrap asked for before is checked to be refused). ``wrk`` (one thread, 32
connections) then asks for the N subscribers' wraps, each with its own token, for
``--seconds``; in the same run, the same ``wrk`` against a bare aiohttp handler that
answers a constant body of the same size as a wrap answer. Printed: wraps per second,
their latency p50/p99, every answer a 200, the ratio to the bare handler, the time
50,000 wraps take at that rate; and the challenges per second (``POST /v1/challenge``,
one ``crypto_box_seal`` each), since a subscriber asks one before its wrap. The tokens
are made with the service's own secret read from its database (the bench would
otherwise time its own 50,000 ``crypto_box_seal_open``); one real subscriber does the
whole challenge-wrap-open path through ``SubscriptionsClient``.

    flock /work/heavy.lock .venv/bin/python bench/subscriptions.py --crowd [--subscribers 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nacl.public
import nacl.signing

from pressrun.content.bundle import Bundle
from pressrun.content.encryption import open_wrap
from pressrun.content.keys import generate_keypair
from pressrun.content.release import ReleaseNotice, SignedRelease, sign_release, utc_text
from pressrun.subscriptions.client import Embargoed, SubscriptionsClient
from pressrun.subscriptions.codec import WRAP_BYTES, make_token
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "bench-subscriptions-operator-token"
ISSUE = "weekly-bench"
WRAPS_LINE = re.compile(
    r"wraps stored for (\d+) subscribers \(wrapped in ([\d.]+) s, stored in ([\d.]+) s\)"
)


def fill(db: Path, n: int, reader: nacl.public.PrivateKey, devices: int = 1) -> None:
    """N subscribers in the service's SQLite file, the real reader the last one; each
    with ``devices`` devices (their own key, and random linked ones: issue 31)."""
    store = SubscriptionStore(db)
    keys = [os.urandom(32) for _ in range(n - 1)] + [bytes(reader.public_key)]
    with store.db:
        store.db.execute("BEGIN IMMEDIATE")
        store.db.executemany(
            "INSERT INTO subscribers (public_key, name, added_at) VALUES (?, ?, ?)",
            [(k, f"subscriber-{i}", "2026-11-28T00:00:00Z") for i, k in enumerate(keys)],
        )
        store.db.executemany(
            "INSERT INTO devices (public_key, subscriber, name, added_at) VALUES (?, ?, ?, ?)",
            [
                (k if d == 0 else os.urandom(32), k, f"device-{d}", "2026-11-28T00:00:00Z")
                for k in keys
                for d in range(devices)
            ],
        )
    store.close()


def serve(db: Path) -> tuple[subprocess.Popen[str], str]:
    """``pressrun serve subscriptions`` on an ephemeral port: the process and its URL."""
    env = {**os.environ, "PRESSRUN_SUBSCRIPTIONS_TOKEN": TOKEN}
    command = [sys.executable, "-m", "pressrun.cli", "serve", "subscriptions"]
    proc = subprocess.Popen(
        [*command, "--port", "0", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    match = re.search(r"https?://[\d.]+:\d+", proc.stdout.readline())
    if match is None:
        proc.kill()
        raise SystemExit("the subscription service did not start")
    return proc, match.group(0)


async def check(url: str, reader: nacl.public.PrivateKey, bundle: Path) -> tuple[int, int]:
    """(the size of the subscriber list on the wire, the real reader's opened key size)."""
    enc = Bundle.load(bundle).manifest.encryption
    assert enc is not None
    async with aiohttp.ClientSession() as http:
        wrap = await SubscriptionsClient(url, http).fetch_wrap(ISSUE, enc.version, reader)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(f"{url}/v1/subscribers", headers=headers) as resp:
            list_bytes = len(await resp.read())
    return list_bytes, len(open_wrap(wrap, reader, enc.key_check))


# wrk's script: each thread walks its own share of LINES (one request per line)
CROWD_LUA = r"""
local lines = {}
local index, stride = 0, 1
local mode = os.getenv("CROWD_MODE")
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("first", counter)
end
function init(args)
  for l in io.lines(os.getenv("CROWD_FILE")) do lines[#lines + 1] = l end
  index = first
  stride = tonumber(os.getenv("CROWD_THREADS"))
end
function request()
  local line = lines[index]
  index = index + stride
  if index > #lines then index = first end
  if mode == "challenge" then
    return wrk.format("POST", "/v1/challenge", {["Content-Type"] = "application/json"},
      '{"subscriber": "' .. line .. '"}')
  end
  local path, token = line:match("^(%S+) (%S+)$")
  return wrk.format("GET", path, {["Authorization"] = "Bearer " .. token})
end
"""

EMBARGO_S = 3  # the release, this long after the embargo is put
WRK_THREADS = 1
WRK_CONNECTIONS = 32


@dataclass(frozen=True)
class WrkRun:
    """What one ``wrk`` run measured."""

    requests_per_s: float
    requests: int
    p50_ms: float
    p99_ms: float
    not_ok: int

    @classmethod
    def parse(cls, out: str) -> WrkRun:
        """From ``wrk --latency`` output."""

        def ms(label: str) -> float:
            m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
            if m is None:
                raise SystemExit(f"no {label}% latency in wrk's output:\n{out}")
            return float(m[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m[2]]

        rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
        total = re.search(r"(\d+) requests in", out)
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        errors = re.search(
            r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
        )
        if rate is None or total is None:
            raise SystemExit(f"wrk's output is not what was expected:\n{out}")
        not_ok = (0 if bad is None else int(bad[1])) + (
            0 if errors is None else sum(int(errors[i]) for i in range(1, 5))
        )
        return cls(float(rate[1]), int(total[1]), ms("50"), ms("99"), not_ok)


def wrk(url: str, lines_file: Path, mode: str, seconds: float, lua: Path) -> WrkRun:
    """One ``wrk`` run of ``seconds`` against ``url`` with the crowd script."""
    env = {
        **os.environ,
        "CROWD_FILE": str(lines_file),
        "CROWD_MODE": mode,
        "CROWD_THREADS": str(WRK_THREADS),
    }
    command = ["wrk", f"-t{WRK_THREADS}", f"-c{WRK_CONNECTIONS}", f"-d{seconds:g}s"]
    command += ["--latency", "-s", str(lua), url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"wrk failed: {done.stderr.strip()[-400:]}")
    return WrkRun.parse(done.stdout)


def bare_server(body_bytes: int) -> None:
    """A bare aiohttp app answering every GET with a constant JSON body of that size."""
    from aiohttp import web

    body = b'{"pad": "' + b"x" * max(0, body_bytes - 11) + b'"}'

    async def constant(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", constant)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(f"bare listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def start_bare(body_bytes: int) -> tuple[subprocess.Popen[str], str]:
    """The bare handler in its own process (as the service is): the process, its URL."""
    command = [sys.executable, __file__, "--bare-server", str(body_bytes)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    match = re.search(r"http://[\d.]+:\d+", proc.stdout.readline())
    if match is None:
        proc.kill()
        raise SystemExit("the bare aiohttp handler did not start")
    return proc, match.group(0)


def embargo(version: int, release_at_unix: float) -> SignedRelease:
    """The issue version's release notice, signed by a new publisher key."""
    signer = nacl.signing.SigningKey.generate()
    notice = ReleaseNotice(
        issue_id=ISSUE,
        version=version,
        release_at=utc_text(release_at_unix),
        revoked=False,
        sequence=1,
        publisher_key=bytes(signer.verify_key).hex(),
        signed_at=utc_text(time.time()),
    )
    return sign_release(notice, signer)


def fill_crowd(db: Path, keys: list[bytes], version: int) -> None:
    """The subscribers and one (random: the service never opens it) wrap each."""
    store = SubscriptionStore(db)
    with store.db:
        store.db.execute("BEGIN IMMEDIATE")
        store.db.executemany(
            "INSERT INTO subscribers (public_key, name, added_at) VALUES (?, ?, ?)",
            [(k, f"subscriber-{i}", "2026-11-28T00:00:00Z") for i, k in enumerate(keys)],
        )
        store.db.executemany(  # each subscriber's own key: their one device
            "INSERT INTO devices (public_key, subscriber, name, added_at) VALUES (?, ?, ?, ?)",
            [(k, k, "first device", "2026-11-28T00:00:00Z") for k in keys],
        )
        store.db.executemany(
            "INSERT INTO wraps (issue_id, version, public_key, wrap) VALUES (?, ?, ?, ?)",
            [(ISSUE, version, k, os.urandom(WRAP_BYTES)) for k in keys],
        )
    store.close()


def crowd(n: int, seconds: float) -> None:
    """The wrap crowd (module docstring)."""
    version = 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        reader = nacl.public.PrivateKey.generate()
        keys = [os.urandom(32) for _ in range(n - 1)] + [bytes(reader.public_key)]
        started = time.perf_counter()
        fill_crowd(root / "subs.db", keys, version)
        prepare_s = time.perf_counter() - started
        lua = root / "crowd.lua"
        lua.write_text(CROWD_LUA)
        proc, url = serve(root / "subs.db")
        bare, bare_url = None, ""
        try:
            store = SubscriptionStore(root / "subs.db")
            secret = store.token_secret()
            store.close()
            expires = int(time.time()) + 3600
            path = f"/v1/issues/{ISSUE}/versions/{version}/wrap"
            wrap_lines = root / "wraps.txt"
            wrap_lines.write_text(
                "".join(f"{path} {make_token(secret, k, expires).hex()}\n" for k in keys)
            )
            challenge_lines = root / "challenges.txt"
            real = [bytes(nacl.public.PrivateKey.generate().public_key) for _ in range(2000)]
            challenge_lines.write_text("".join(f"{k.hex()}\n" for k in real))
            # the embargo, set through the operator route once all is ready: the
            # release a few seconds on, a wrap asked before it refused
            release_at = int(time.time()) + EMBARGO_S
            refused = asyncio.run(
                refused_before(url, reader, version, embargo(version, release_at))
            )
            time.sleep(max(0.0, release_at - time.time()))
            opened = asyncio.run(open_one(url, reader, version))
            answer_bytes = len(
                json.dumps(
                    {
                        "issue_id": ISSUE,
                        "version": version,
                        "subscriber": "0" * 64,
                        "wrap": "0" * 160,
                    }
                )
            )
            bare, bare_url = start_bare(answer_bytes)
            wraps = wrk(url, wrap_lines, "wrap", seconds, lua)
            plain = wrk(bare_url, wrap_lines, "wrap", seconds, lua)
            challenges = wrk(url, challenge_lines, "challenge", min(seconds, 10.0), lua)
        finally:
            for p in (proc, bare):
                if p is not None:
                    p.terminate()
                    p.wait(10)
    with open("/proc/loadavg") as f:
        load = f.read().strip()
    print(f"the wrap crowd: {n:,} subscribers, one wrap each, one service process")
    print(f"  subscribers and wraps put into SQLite beforehand in {prepare_s:.2f} s")
    print(f"  before the release: the real subscriber's wrap refused with the time: {refused}")
    print(f"  from the release: challenge, wrap, opened: {opened}")
    print(
        f"  wraps: {wraps.requests_per_s:,.0f}/s ({wraps.requests:,} in {seconds:g} s, "
        f"{wraps.not_ok} not 200), latency p50 {wraps.p50_ms:.2f} ms p99 {wraps.p99_ms:.2f} ms "
        f"(wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS})"
    )
    print(
        f"  bare aiohttp handler, constant {answer_bytes}-byte body: "
        f"{plain.requests_per_s:,.0f}/s, p50 {plain.p50_ms:.2f} ms p99 {plain.p99_ms:.2f} ms"
    )
    print(f"  ratio wraps / bare: {wraps.requests_per_s / plain.requests_per_s:.2f}")
    print(f"  50,000 wraps at that rate: {50_000 / wraps.requests_per_s:.1f} s (target: < 60 s)")
    print(
        f"  challenges: {challenges.requests_per_s:,.0f}/s ({challenges.not_ok} not 200), "
        f"p50 {challenges.p50_ms:.2f} ms p99 {challenges.p99_ms:.2f} ms; challenge + wrap "
        f"per subscriber: {1 / (1 / challenges.requests_per_s + 1 / wraps.requests_per_s):,.0f}/s"
    )
    print(f"  load average: {load}")
    if wraps.not_ok or plain.not_ok or challenges.not_ok or not opened or not refused:
        raise SystemExit("not every request was answered 200")


async def refused_before(
    url: str, reader: nacl.public.PrivateKey, version: int, release: SignedRelease
) -> bool:
    """The embargo is put; the real subscriber asks before the release: refused, with
    the release time."""
    async with aiohttp.ClientSession() as http:
        await SubscriptionsClient(url, http, operator_token=TOKEN).put_release(release)
        try:
            await SubscriptionsClient(url, http).fetch_wrap(ISSUE, version, reader)
        except Embargoed as err:
            return err.retry_after_s > 0 and bool(err.release_at)
    return False


async def open_one(url: str, reader: nacl.public.PrivateKey, version: int) -> bool:
    """The real subscriber's whole path: challenge, open, wrap (its wrap is random)."""
    async with aiohttp.ClientSession() as http:
        wrap = await SubscriptionsClient(url, http).fetch_wrap(ISSUE, version, reader)
    return len(wrap) == WRAP_BYTES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, default=50_000)
    parser.add_argument("--size-mib", type=float, default=8.0, help="the issue's size")
    parser.add_argument("--crowd", action="store_true", help="the wrap crowd (docstring)")
    parser.add_argument("--seconds", type=float, default=15.0, help="each wrk run (--crowd)")
    parser.add_argument(
        "--devices", type=int, default=1, help="devices per subscriber (a wrap each)"
    )
    parser.add_argument("--bare-server", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server is not None:
        bare_server(args.bare_server)
        return
    if args.crowd:
        crowd(args.subscribers, args.seconds)
        return
    n = args.subscribers
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        reader = nacl.public.PrivateKey.generate()
        started = time.perf_counter()
        fill(root / "subs.db", n, reader, args.devices)
        filled_s = time.perf_counter() - started
        proc, url = serve(root / "subs.db")
        try:
            key, _ = generate_keypair(root / "publisher.key")
            source = root / "issue.pdf"
            source.write_bytes(os.urandom(int(args.size_mib * (1 << 20))))
            env = {**os.environ, "PRESSRUN_SUBSCRIPTIONS_TOKEN": TOKEN}
            command = [sys.executable, "-m", "pressrun.cli", "--log-level", "INFO", "publish"]
            command += [str(source), "--issue", ISSUE, "--title", "Bench", "--key", str(key)]
            command += ["--content", str(root / "content"), "--encrypt", "--subscriptions", url]
            began = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            publish_s = time.perf_counter() - began
            if done.returncode != 0:
                raise SystemExit(f"publish --encrypt failed: {done.stderr.strip()[-600:]}")
            match = WRAPS_LINE.search(done.stderr)
            if match is None:
                raise SystemExit(f"no wraps line in publish's log: {done.stderr[-600:]}")
            stored, wrap_s, store_s = int(match[1]), float(match[2]), float(match[3])
            list_bytes, opened = asyncio.run(check(url, reader, root / "content" / ISSUE))
        finally:
            proc.terminate()
            proc.wait(10)
        db = SubscriptionStore(root / "subs.db")
        (in_db,) = db.db.execute("SELECT count(*) FROM wraps").fetchone()
        db.close()
    # the PUT's body as SubscriptionsClient.put_wraps encodes it: '"<key hex>": "<wrap
    # hex>", ' per subscriber
    m = n * args.devices  # one wrap per device
    wraps_bytes = m * (2 + 64 + 4 + 160 + 2)
    print(
        f"publish --encrypt for {n:,} subscribers, {args.devices} device(s) each "
        f"({m:,} wraps; {args.size_mib:g} MiB issue)"
    )
    print(f"  subscribers put into SQLite beforehand in {filled_s:.2f} s (one transaction)")
    print(
        f"  publish wall time {publish_s:.2f} s: wraps {wrap_s:.2f} s "
        f"({wrap_s / m * 1e6:.0f} µs each), stored in {store_s:.2f} s "
        f"(one PUT of about {wraps_bytes / 1e6:.1f} MB; the list read was about "
        f"{list_bytes / 1e6:.1f} MB)"
    )
    print(
        f"  wraps stored: {stored:,} (publish's count), {in_db:,} rows in the service's "
        f"database; one real subscriber opened its wrap: {opened == 32}"
    )
    with open("/proc/loadavg") as f:
        print(f"  load average: {f.read().strip()}")
    if stored != m or in_db != m or opened != 32:
        raise SystemExit("not every subscriber has a wrap")


if __name__ == "__main__":
    main()
