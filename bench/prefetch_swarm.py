"""The origins' bytes before an embargoed issue's release, with and without the
prefetchers' swarm (issue 35).

N ``get --prefetch`` clients (`pressrun.clients.prefetch.prefetch_issue`, one
libtorrent session each, in this process) pre-position one encrypted issue published
``--lead`` seconds before its release: two origin processes and the balancer
(`pressrun.demo.Testbed`), pressrun's tracker on SQLite, the subscription service,
all on 127.0.0.1. The balancer's prefetch budget is ``--budget-mbps`` (the pacing of
`pressrun.balancer.prefetch`, renewed every 5 s). Each mode runs once in the same
call, on a fresh bed: ``swarm`` (the torrent names the tracker: the prefetchers trade
pieces) and ``origins`` (the same without the swarm: every prefetcher takes the whole
ciphertext from the origins).

Printed per mode: the origins' bytes of the issue before the release and after it
(read from each origin's own ``pressrun_origin_sent_bytes_total{issue}`` at the
release and at the end; the issue's ciphertext size is one copy), the peers' bytes,
how many prefetchers held the whole ciphertext before the release (the others finish
from the origins at the release), and the time from the release to the last opened
issue.

    flock /work/heavy.lock .venv/bin/python bench/prefetch_swarm.py [--prefetchers 10] [--mb 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import nacl.public

from pressrun.balancer.prefetch import PrefetchConfig, PrefetchPacer
from pressrun.clients.aio import FetchResult
from pressrun.clients.config import DESKTOP
from pressrun.clients.prefetch import prefetch_issue
from pressrun.content.keys import generate_keypair, load_public_key
from pressrun.content.publish import publish
from pressrun.content.release import utc_text
from pressrun.demo.testbed import OriginShape, Testbed
from pressrun.security import ServiceSecurity
from pressrun.subscriptions.aio import SubscriptionService
from pressrun.subscriptions.client import HttpSubscriberDirectory
from pressrun.subscriptions.store import SubscriptionStore
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

TOKEN = "bench-prefetch-swarm-token"
ISSUE = "weekly-bench-prefetch"


async def origin_bytes(urls: list[str], issue: str) -> int:
    """The bytes of ``issue`` the origins sent so far, from their /metrics."""
    total = 0.0
    async with aiohttp.ClientSession() as http:
        for url in urls:
            async with http.get(f"{url}/metrics") as resp:
                text = await resp.text()
            for line in text.splitlines():
                if line.startswith("pressrun_origin_sent_bytes_total{") and f'"{issue}"' in line:
                    total += float(line.rsplit(" ", 1)[1])
    return int(total)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def run_mode(args: argparse.Namespace, root: Path, *, swarm: bool) -> dict[str, object]:
    """One bed, one publication, N prefetchers; the figures of the run."""
    secret, public = generate_keypair(root / "publisher.key")
    tracker = TrackerService(
        TrackerCore(TrackerConfig(interval_s=2, min_interval_s=1), random.Random(35)),
        SqliteStore(root / "tracker.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=TOKEN),
    )
    tracker_port = await tracker.start("127.0.0.1", 0)
    bed = Testbed(
        root / "bed",
        (OriginShape("origin-a"), OriginShape("origin-b")),
        poll_interval_s=0.5,
        poll_timeout_s=2.0,
    )
    await bed.__aenter__()
    service = SubscriptionService(SubscriptionStore(root / "subs.db"), operator_token=TOKEN)
    port = await service.start("127.0.0.1", 0)
    try:
        readers = [nacl.public.PrivateKey.generate() for _ in range(args.prefetchers)]
        for n, reader in enumerate(readers):
            service.store.add_subscriber(bytes(reader.public_key), f"r{n}", "2026-11-01T00:00:00Z")
        data = os.urandom(args.mb * 1_000_000)
        source = root / "issue.pdf"
        source.write_bytes(data)
        release_unix = math.ceil(time.time()) + args.lead
        bundle = await asyncio.to_thread(
            publish,
            source,
            issue_id=ISSUE,
            title="Bench",
            key_path=secret,
            content_dir=bed.content_dir,
            web_seeds=list(bed.urls.values()),
            trackers=[f"http://127.0.0.1:{tracker_port}/announce"] if swarm else [],
            piece_size=args.piece_kib * 1024,
            encrypt_for=HttpSubscriberDirectory(f"http://127.0.0.1:{port}", TOKEN),
            release_at=utc_text(release_unix),
        )
        size = int(json.loads((bundle / "manifest.json").read_text())["manifest"]["size_bytes"])
        balancer = await bed.start_balancer()
        budget = args.budget_mbps * 1e6 / 8
        balancer.service.prefetch = PrefetchPacer(
            PrefetchConfig(
                share=budget / 250e6, min_rate_bytes_per_s=32_000, renew_s=5.0, hold_s=15.0
            )
        )
        config = replace(DESKTOP, stall_timeout_s=10.0)
        origins = list(bed.urls.values())

        async def at_release() -> tuple[int, str]:
            await asyncio.sleep(max(0.0, release_unix - time.time()))
            return await origin_bytes(origins, ISSUE), loadavg()

        sample = asyncio.create_task(at_release())
        results: list[FetchResult] = await asyncio.gather(
            *(
                prefetch_issue(
                    ISSUE,
                    balancer_url=balancer.url,
                    library=root / f"library-{n}",
                    config=config,
                    trusted_keys={load_public_key(public)},
                    subscriber_key=reader,
                    client_id=f"p{n}",
                    swarm=swarm,
                    listen_interfaces="127.0.0.1:0",
                )
                for n, reader in enumerate(readers)
            )
        )
        last_open = time.time()
        before_release, load_at_release = await sample
        total = await origin_bytes(origins, ISSUE)
        for r in results:
            assert r.path.read_bytes() == data, "a prefetcher's issue is not the published one"
        before = [r for r in results if r.mode == "prefetch"]
        after = [r for r in results if r.mode != "prefetch"]
        return {
            "mode": "swarm" if swarm else "origins",
            "prefetchers": args.prefetchers,
            "ciphertext_bytes": size,
            "origin_bytes_before_release": before_release,
            "origin_copies_before_release": round(before_release / size, 3),
            "origin_bytes_after_release": total - before_release,
            "peer_bytes": sum(r.bytes_from_peers for r in results),
            "whole_before_release": len(before),
            "finished_at_release_from_origins": len(after),
            "last_open_after_release_s": round(last_open - release_unix, 2),
            "load_at_release": load_at_release,
        }
    finally:
        await service.close()
        await bed.close()
        await tracker.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefetchers", type=int, default=10)
    parser.add_argument("--mb", type=int, default=16, help="the issue's size, MB")
    parser.add_argument("--piece-kib", type=int, default=256)
    parser.add_argument("--budget-mbps", type=float, default=40.0, help="prefetch budget, Mbit/s")
    parser.add_argument("--lead", type=int, default=40, help="publication to release, s")
    parser.add_argument("--only", choices=("swarm", "origins"), default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    modes = [m for m in ("swarm", "origins") if args.only in (None, m)]
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="bench-prefetch-") as tmp:
            load = loadavg()
            figures = await run_mode(args, Path(tmp), swarm=mode == "swarm")
            figures["load_before"] = load
            figures["load_after"] = loadavg()
            print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
