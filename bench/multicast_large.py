"""An issue larger than one RaptorQ pass of the old default blocks (367 MB): publish,
encode, carousel and receive it on 127.0.0.1, and compare the bytes.

    flock /work/heavy.lock .venv/bin/python bench/multicast_large.py --size-mb 700 \
        [--fixed-cache]

``--fixed-cache`` gives the receiver the fixed 512 MiB cache it had before it grew with
the issue (docs/multicast.md, "Large issues"). It needs about 8 x the size in memory
(the file, the pass of 2 channels, the receiver's cache, the decoded copy).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import resource
import tempfile
import time
from pathlib import Path

from pressrun.content.keys import generate_keypair, load_public_key, load_signing_key
from pressrun.content.publish import publish
from pressrun.multicast.config import CarouselConfig, LayeringConfig
from pressrun.multicast.net import free_udp_port
from pressrun.multicast.receiver import receive_carousel
from pressrun.multicast.sender import MulticastSender, SenderServiceConfig


async def run(size: int, root: Path, rate_mbps: float) -> None:
    secret, public = generate_keypair(root / "publisher.key")
    source = root / "big.pdf"
    rng = random.Random(1)
    with open(source, "wb") as out:
        left = size
        while left:
            n = min(left, 1 << 24)
            out.write(rng.randbytes(n))
            left -= n
    content = root / "content"
    publish(source, issue_id="big", title="big", key_path=secret, content_dir=content)
    manifest_sha = hashlib.sha256((content / "big" / "manifest.json").read_bytes()).hexdigest()
    carousel = CarouselConfig(channels=2, rate_bps=rate_mbps * 1e6)
    sender = MulticastSender(
        SenderServiceConfig(
            content_dir=content,
            control_group=("239.255.201.1", free_udp_port()),
            signing_key=load_signing_key(secret),
            token="bench-token-0123456789",
            carousel=carousel,
            group_base="239.255.201.2",
            prepare_issues=0,
        )
    )
    await sender.start()
    try:
        began = time.perf_counter()
        plan = await sender.start_carousel("big", carousel)
        encode_s = time.perf_counter() - began
        running = sender.thread.get("big")
        assert running is not None
        print(
            f"{size} bytes: encoded in {encode_s:.1f} s, blocks of "
            f"{running.prepared.encoding[2]} symbols, cycle {plan.cycle_s:.1f} s",
            flush=True,
        )
        work = root / "received"
        work.mkdir()
        began = time.perf_counter()
        result = await asyncio.to_thread(
            receive_carousel,
            "big",
            manifest_sha,
            control_group=sender.config.control_group,
            interface="127.0.0.1",
            trusted_keys={load_public_key(public).hex()},
            work_dir=work,
            deadline_s=max(120.0, 5 * plan.cycle_s),
            layering=LayeringConfig(start_channels=2, max_channels=2, leave_above_loss=1.0),
        )
        receive_s = time.perf_counter() - began
        exact = result.path is not None and (
            hashlib.sha256(result.path.read_bytes()).hexdigest()
            == hashlib.sha256(source.read_bytes()).hexdigest()
        )
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"received: completed={result.completed} bit-exact={exact} in {receive_s:.1f} s "
            f"({result.reason}); peak RSS {peak:.0f} MiB",
            flush=True,
        )
    finally:
        await sender.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=400.0, help="issue size, MB (400)")
    parser.add_argument("--rate-mbps", type=float, default=300.0, help="per channel (300)")
    parser.add_argument(
        "--fixed-cache", action="store_true", help="the receiver's cache fixed at 512 MiB"
    )
    args = parser.parse_args()
    if args.fixed_cache:
        from pressrun.multicast import receiver

        receiver.cache_bytes_for = lambda plan: receiver.MAX_CACHE_BYTES
    with open("/proc/loadavg") as f:
        print("load average", f.read().strip())
    with tempfile.TemporaryDirectory(prefix="pressrun-large-") as tmp:
        asyncio.run(run(int(args.size_mb * 1e6), Path(tmp), args.rate_mbps))
    with open("/proc/loadavg") as f:
        print("load average", f.read().strip())


if __name__ == "__main__":
    main()
