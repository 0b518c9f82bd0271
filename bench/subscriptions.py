"""``publish --encrypt`` for a real readership: 50,000 subscribers (issue 25).

A real ``pressrun serve subscriptions`` process on 127.0.0.1 holds N subscribers (put
straight into its SQLite file before it starts, in one transaction: adding 50,000 one
PUT at a time would only time the bench), then ``pressrun publish --encrypt`` runs as
a process against it, as a publisher runs it. Printed: the publish's wall time, how
long the wraps took (sealing the content key to each subscriber, from publish's own
log line) and storing them (one PUT of every wrap), the sizes on the wire, that every
subscriber has a wrap, and that one real subscriber among them opens its own.

    flock /work/heavy.lock .venv/bin/python bench/subscriptions.py [--subscribers 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import nacl.public

from pressrun.content.bundle import Bundle
from pressrun.content.encryption import open_wrap
from pressrun.content.keys import generate_keypair
from pressrun.subscriptions.client import SubscriptionsClient
from pressrun.subscriptions.store import SubscriptionStore

TOKEN = "bench-subscriptions-operator-token"
ISSUE = "weekly-bench"
WRAPS_LINE = re.compile(
    r"wraps stored for (\d+) subscribers \(wrapped in ([\d.]+) s, stored in ([\d.]+) s\)"
)


def fill(db: Path, n: int, reader: nacl.public.PrivateKey) -> None:
    """N subscribers in the service's SQLite file, the real reader the last one."""
    store = SubscriptionStore(db)
    keys = [os.urandom(32) for _ in range(n - 1)] + [bytes(reader.public_key)]
    with store.db:
        store.db.execute("BEGIN IMMEDIATE")
        store.db.executemany(
            "INSERT INTO subscribers (public_key, name, added_at) VALUES (?, ?, ?)",
            [(k, f"subscriber-{i}", "2026-11-28T00:00:00Z") for i, k in enumerate(keys)],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, default=50_000)
    parser.add_argument("--size-mib", type=float, default=8.0, help="the issue's size")
    args = parser.parse_args()
    n = args.subscribers
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        reader = nacl.public.PrivateKey.generate()
        started = time.perf_counter()
        fill(root / "subs.db", n, reader)
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
    wraps_bytes = n * (2 + 64 + 4 + 160 + 2)
    print(f"publish --encrypt for {n:,} subscribers ({args.size_mib:g} MiB issue)")
    print(f"  subscribers put into SQLite beforehand in {filled_s:.2f} s (one transaction)")
    print(
        f"  publish wall time {publish_s:.2f} s: wraps {wrap_s:.2f} s "
        f"({wrap_s / n * 1e6:.0f} µs each), stored in {store_s:.2f} s "
        f"(one PUT of about {wraps_bytes / 1e6:.1f} MB; the list read was about "
        f"{list_bytes / 1e6:.1f} MB)"
    )
    print(
        f"  wraps stored: {stored:,} (publish's count), {in_db:,} rows in the service's "
        f"database; one real subscriber opened its wrap: {opened == 32}"
    )
    with open("/proc/loadavg") as f:
        print(f"  load average: {f.read().strip()}")
    if stored != n or in_db != n or opened != 32:
        raise SystemExit("not every subscriber has a wrap")


if __name__ == "__main__":
    main()
