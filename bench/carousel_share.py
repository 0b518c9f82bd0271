"""What joining the swarm while receiving costs a carousel reader (issue 28).

--readers readers, each its own ``pressrun get`` process, receive one issue of --mb MB
at once from a carousel on 127.0.0.1 (--channels channels of --mbps Mbit/s, RaptorQ),
beside --busy busy loops, through a balancer that answers ``multicast`` with the
issue's swarm (a tracker on 127.0.0.1) beside the carousel. Rounds alternate between
readers that may seed (``--max-seed-s`` --seed-s: they join the swarm as they start
receiving and share while they receive, docs/client.md "In the swarm while it
receives") and readers that may not (``--max-seed-s 0``: they never join). Printed per
round: each reader's receive seconds (the multicast note's: from the first join to
the object's end) and what it offered and uploaded while receiving; then the median
receive seconds of each mode and their ratio.

    .venv/bin/python bench/carousel_share.py [--readers 4] [--busy 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import MulticastInfo, OriginSpec
from pressrun.content.keys import generate_keypair, load_public_key, load_signing_key
from pressrun.content.publish import publish
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.net import free_udp_port
from pressrun.multicast.sender import MulticastSender, SenderServiceConfig
from pressrun.origin import OriginConfig, start_origin
from pressrun.peer.loopback import OPERATOR_TOKEN
from pressrun.security import ServiceSecurity
from pressrun.tracker.aio import TrackerService
from pressrun.tracker.config import TrackerConfig
from pressrun.tracker.core import TrackerCore
from pressrun.tracker.sqlite_store import SqliteStore

ISSUE = "bench-share-01"
TOKEN = "bench-token-0123456789"
#: every request is multicast (one request is demand enough)
PEAK_AT_ONCE = DemandConfig(
    enter_downloaders=1000.0,
    leave_downloaders=0.0,
    min_dwell_s=0.0,
    multicast_enter_downloaders=1.0,
    multicast_leave_downloaders=0.5,
)
NOTE = re.compile(r"(\d+) channel\(s\), ([\d.]+) s")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def reader(balancer: str, library: Path, key_hex: str, seed_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pressrun.cli", "--log-level", "WARNING", "get", ISSUE,
         "--balancer", balancer, "--library", str(library), "--publisher-key", key_hex,
         "--multicast-interface", "127.0.0.1", "--multicast-deadline-s", "120",
         "--max-seed-s", f"{seed_s:g}", "--json", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


async def one_round(
    args: argparse.Namespace, balancer: str, root: Path, key_hex: str, seed_s: float, n: int
) -> list[tuple[float, str]]:
    """Each reader's receive seconds and the note's sharing part."""
    procs = [
        reader(balancer, root / f"library-{n}-{i}", key_hex, seed_s) for i in range(args.readers)
    ]
    out: list[tuple[float, str]] = []
    for proc in procs:
        stdout, _ = await asyncio.to_thread(proc.communicate)
        doc = json.loads(stdout.strip().splitlines()[-1])
        note = doc.get("multicast_note") or ""
        found = NOTE.search(note)
        if found is None:
            raise SystemExit(f"no receive in the note: {note!r}")
        shared = note.rsplit("; ", 1)[-1] if "shared while receiving" in note else "not shared"
        out.append((float(found.group(2)), shared))
    return out


async def main(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-carousel-share-"))
    secret, public = generate_keypair(root / "publisher.key")
    source = root / "source" / f"{ISSUE}.pdf"
    source.parent.mkdir()
    source.write_bytes(random.Random(1).randbytes(int(args.mb * 1e6)))
    content = root / "content"
    publish(source, issue_id=ISSUE, title="Bench", key_path=secret, content_dir=content,
            web_seeds=[], piece_size=131072)  # fmt: skip
    key_hex = load_public_key(public).hex()
    manifest = json.loads((content / ISSUE / "manifest.json").read_bytes())["manifest"]
    origin = await start_origin(OriginConfig(content_dir=content, name="origin-a"))
    tracker = TrackerService(
        TrackerCore(TrackerConfig(interval_s=2, min_interval_s=1), random.Random(7)),
        SqliteStore(root / "tracker.db", flush_interval_s=0.05),
        security=ServiceSecurity(operator_token=OPERATOR_TOKEN),
    )
    tracker_url = f"http://127.0.0.1:{await tracker.start('127.0.0.1', 0)}/announce"
    rng = random.Random()
    a, b = rng.randrange(1, 255), rng.randrange(1, 200)
    control = (f"239.255.{a}.{b}", free_udp_port())
    sender = MulticastSender(
        SenderServiceConfig(
            content_dir=content,
            control_group=control,
            signing_key=load_signing_key(secret),
            token=TOKEN,
            carousel=CarouselConfig(channels=args.channels, rate_bps=args.mbps * 1e6),
            group_base=f"239.255.{a}.{b + 1}",
            announce_interval_s=0.2,
            announcement_ttl_s=2.0,
        )
    )
    await sender.start()
    await sender.start_carousel(ISSUE, sender.config.carousel)
    policy = DemandPolicy(
        PEAK_AT_ONCE,
        {ISSUE: swarm_info_for(origin.url, tracker_url, ISSUE, manifest["info_hash"])},
        {ISSUE: MulticastInfo("{}:{}".format(*control), "127.0.0.1")},
    )
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("origin-a", origin.url),),
            balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=1.0),
            seed=1,
        ),
        mode_policy=policy,
    )
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    receive: dict[str, list[float]] = {"sharing": [], "not sharing": []}
    try:
        await balancer.wait_until_up(1, timeout_s=10.0)
        print(f"{args.readers} readers, {args.mb:g} MB, {args.channels} x {args.mbps:g} Mbit/s, "
              f"{args.busy} busy loops; load {loadavg()}")  # fmt: skip
        for n in range(2 * args.rounds):
            mode = "sharing" if n % 2 == 0 else "not sharing"
            started = time.perf_counter()
            got = await one_round(
                args, balancer.url, root, key_hex, args.seed_s if mode == "sharing" else 0.0, n
            )
            receive[mode] += [s for s, _ in got]
            print(f"round {n + 1} ({mode}, {time.perf_counter() - started:.1f} s): "
                  + ", ".join(f"{s:.2f} s" for s, _ in got)
                  + ("" if mode != "sharing" else f"; {got[0][1]}"))  # fmt: skip
        share, plain = (statistics.median(receive[k]) for k in ("sharing", "not sharing"))
        print(f"receive median: sharing {share:.2f} s, not sharing {plain:.2f} s "
              f"({share / plain:.2f}x); load {loadavg()}")  # fmt: skip
    finally:
        for proc in busy:
            proc.kill()
        await balancer.stop()
        await sender.close()
        await tracker.close()
        await origin.stop()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--mbps", type=float, default=10.0)
    parser.add_argument("--seed-s", type=float, default=2.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
