"""RaptorQ source blocks: what their size costs and what it saves a reader that held
pieces from the swarm (issue 28; docs/multicast.md, "Source blocks").

For each block size K given (``--block-symbols``, `CarouselConfig.
max_source_block_symbols`):

1. **The sender's pass.** `prepare_pass` of a ``--mb`` MB issue on ``--channels``
   channels (the emulation's plan: 10), in a fresh process: seconds and CPU seconds,
   the process's peak resident memory (MB) and the pass's packets.
2. **A receiver's packets.** A real carousel on 127.0.0.1 (`MulticastSender`, 4
   channels of ``--rate-mbps``) of a ``--rx-mb`` MB issue; receivers on all four
   channel sockets with the binding's `Receiver` (as the receive loop runs it),
   alternately holding nothing and a random third of the issue's 128 KiB pieces
   (`Receiver.set_known`, as a reader that leaves the swarm for the carousel):
   object packets until the issue completed, the receive thread's CPU per packet,
   and the RaptorQ decode's CPU at the end (``decode_cpu_s``: every block completes
   at about the same time). The ratio of the medians (a third held against nothing)
   is what the pieces saved: 2/3 if they counted in full.

The `raptorq` crate's encode and decode of one block alone, per K:
``native/pressrun-flute/examples/block_size_cost.rs``.

    flock /work/heavy.lock .venv/bin/python bench/multicast_blocks.py \\
        [--block-symbols 1024 8192 56403] [--mb 50] [--channels 10] [--rx-mb 20] \\
        [--rate-mbps 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pressrun.content.keys import generate_keypair, load_signing_key
from pressrun.content.publish import publish
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.events import CarouselPlan
from pressrun.multicast.net import free_udp_port, leave_and_close, receiver_socket
from pressrun.multicast.prepare import prepare_pass
from pressrun.multicast.receiver import cache_bytes_for
from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

ISSUE = "blocks-issue"
TOKEN = "bench-token-0123456789"
#: the emulation's piece size for a 50 MB issue (pressrun publish's default)
PIECE = 131072


def one_prepare(mb: float, channels: int, k: int) -> dict[str, float]:
    """`prepare_pass` of a random ``mb`` MB issue in this (fresh) process."""
    data = random.Random(1).randbytes(int(mb * 1e6))
    config = CarouselConfig(channels=channels, max_source_block_symbols=k)
    cpu0, t0 = time.process_time(), time.perf_counter()
    prepared = prepare_pass(
        data,
        issue_id=ISSUE,
        file_name="issue.pdf",
        manifest_sha256="0" * 64,
        tsi=1,
        config=config,
    )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_mb": peak_mb,
        "packets": prepared.object_packets,
        "blocks": -(-prepared.source_symbols // config.source_block_symbols(len(data))),
    }


def sender_pass(args: argparse.Namespace, k: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--one-prepare", str(k), "--mb", str(args.mb)]
    command += ["--channels", str(args.channels)]
    out = subprocess.run(
        command,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def receive_once(
    plan: CarouselPlan, work: Path, known: tuple[Path, list[tuple[int, int]]] | None
) -> tuple[int, float, float, int]:
    """Object packets until complete, thread CPU seconds, decode CPU seconds, decodes."""
    import pressrun_flute

    socks = [receiver_socket(ch.group, ch.port, "127.0.0.1") for ch in plan.channels]
    try:
        flute = pressrun_flute.Receiver(work, max_cache_bytes=cache_bytes_for(plan))
        if known is not None:
            flute.set_known(plan.toi, known[0], known[1])
        channels = [(i, sock.fileno()) for i, sock in enumerate(socks)]
        pushed, ended = 0, False
        t0, cpu0 = time.perf_counter(), time.thread_time()
        while not ended and time.perf_counter() - t0 < 120:
            _, count, _, _, ended = flute.receive(channels, 0.5)
            pushed += count
            flute.take_sequence_counts()
        cpu = time.thread_time() - cpu0
        if not any(e.kind == "completed" for e in flute.take_events()):
            raise RuntimeError(f"did not complete ({pushed} packets)")
        return pushed, cpu, flute.decode_cpu_s, flute.decodes
    finally:
        for sock, ch in zip(socks, plan.channels, strict=True):
            leave_and_close(sock, ch.group, "127.0.0.1")


async def receiver_packets(args: argparse.Namespace, root: Path, k: int) -> dict[str, float]:
    secret, _public = generate_keypair(root / "publisher.key")
    size = int(args.rx_mb * 1e6)
    data = random.Random(2).randbytes(size)
    source = root / "issue.pdf"
    source.write_bytes(data)
    content = root / "content"
    publish(
        source,
        issue_id=ISSUE,
        title="bench",
        key_path=secret,
        content_dir=content,
        web_seeds=[],
        piece_size=PIECE,
        force=True,
    )
    carousel = CarouselConfig(channels=4, rate_bps=args.rate_mbps * 1e6, max_source_block_symbols=k)
    a, b = random.randrange(1, 255), random.randrange(1, 200)
    sender = MulticastSender(
        SenderServiceConfig(
            content_dir=content,
            control_group=(f"239.255.{a}.{b}", free_udp_port()),
            signing_key=load_signing_key(secret),
            token=TOKEN,
            carousel=carousel,
            group_base=f"239.255.{a}.{b + 1}",
            announce_interval_s=0.2,
        )
    )
    await sender.start()
    pieces = -(-size // PIECE)
    runs: dict[bool, list[tuple[int, float, float, int]]] = {False: [], True: []}
    try:
        plan = await sender.start_carousel(ISSUE, carousel)
        await asyncio.sleep(1.0)  # mid-cycle, as a reader joining a running carousel
        for run in range(args.runs):
            for held in (False, True):
                known = None
                if held:
                    rng = random.Random(run)
                    ranges = [
                        (i * PIECE, min(size, (i + 1) * PIECE) - i * PIECE)
                        for i in sorted(rng.sample(range(pieces), pieces // 3))
                    ]
                    known = (source, ranges)
                work = Path(tempfile.mkdtemp(dir=root))
                runs[held].append(await asyncio.to_thread(receive_once, plan, work, known))
    finally:
        await sender.close()
    none = statistics.median(r[0] for r in runs[False])
    third = statistics.median(r[0] for r in runs[True])
    every = runs[False] + runs[True]
    return {
        "source_symbols": plan.source_symbols,
        "packets_none": none,
        "packets_third": third,
        "ratio": third / none,
        "us_per_packet": statistics.median(1e6 * r[1] / r[0] for r in every),
        "decode_ms": statistics.median(1e3 * r[2] for r in every),
        "decodes": statistics.median(r[3] for r in every),
    }


async def main(args: argparse.Namespace) -> int:
    print(
        f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load "
        f"{Path('/proc/loadavg').read_text().split()[0]}",
        flush=True,
    )
    for k in args.block_symbols:
        s = sender_pass(args, k)
        print(
            f"K {k}: the sender's pass of {args.mb:g} MB on {args.channels} channels: "
            f"{s['blocks']:.0f} blocks, {s['packets']:.0f} packets, {s['seconds']:.1f} s "
            f"({s['cpu_s']:.1f} CPU s), peak memory {s['peak_mb']:.0f} MB",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="pressrun-bench-blocks-") as tmp:
            r = await receiver_packets(args, Path(tmp), k)
        print(
            f"K {k}: a receiver of {args.rx_mb:g} MB ({r['source_symbols']:.0f} source "
            f"symbols), 4 channels: {r['packets_none']:.0f} packets holding nothing, "
            f"{r['packets_third']:.0f} holding a third of the pieces: ratio "
            f"{r['ratio']:.3f} (2/3 if the pieces counted in full); receive "
            f"{r['us_per_packet']:.2f} us/packet, the decode at the end "
            f"{r['decode_ms']:.0f} ms CPU ({r['decodes']:.0f} block decodes), medians of "
            f"{args.runs} (load {Path('/proc/loadavg').read_text().split()[0]})",
            flush=True,
        )
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--block-symbols", type=int, nargs="+", default=[1024, 8192, 56403])
    p.add_argument("--mb", type=float, default=50.0, help="the sender's issue (default 50)")
    p.add_argument("--channels", type=int, default=10, help="the sender's channels (default 10)")
    p.add_argument("--rx-mb", type=float, default=20.0, help="the received issue (default 20)")
    p.add_argument(
        "--rate-mbps", type=float, default=20.0, help="each of the 4 channels (default 20)"
    )
    p.add_argument("--runs", type=int, default=3, help="receives of each kind (default 3)")
    p.add_argument("--one-prepare", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    parsed = parse_args(sys.argv[1:])
    if parsed.one_prepare is not None:
        print(json.dumps(one_prepare(parsed.mb, parsed.channels, parsed.one_prepare)))
        sys.exit(0)
    sys.exit(asyncio.run(main(parsed)))
