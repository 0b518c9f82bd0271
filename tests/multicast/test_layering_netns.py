"""Receiver-driven layering over real links: two network namespaces joined by a veth
pair, the sender (``pressrun serve multicast``, 4 channels of 5 Mbit/s, RaptorQ) in
one, a receiver (`receive_carousel`, default layering) in the other. The link from
the sender is shaped with ``tc tbf`` (6 or 50 Mbit/s), and one variant also drops 10%
of the receiver's UDP packets with nftables.

- behind 6 Mbit/s the receiver ends on the one channel its link carries (a try of a
  second channel is left at the end of its first measuring window after settling:
  no window of `LayerCore` ends with it kept, the report's check) and the issue
  decodes bit-exact; with 10% random loss on top, the same;
- behind 50 Mbit/s it joins all four;
- a receiver whose socket buffer is tiny (its own queue overflows: the kernel's
  SO_RXQ_OVFL count) does not take its drops for path loss: it leaves no channel.

Skipped, with the reason, where it cannot run (not root, no ``ip``, ``tc`` or ``nft``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netns import add_namespace, delete_namespace, need_root_and
from pressrun.emulate.fleet import kept_above

from .conftest import ISSUE, TOKEN, Published

pytestmark = pytest.mark.root

RECEIVER = r"""
import json, sys, tempfile
from pathlib import Path
from pressrun.multicast.config import LayeringConfig
from pressrun.multicast.receiver import receive_carousel
issue, group, port, manifest_sha, key, source, interface, start, rcvbuf = sys.argv[1:10]
result = receive_carousel(
    issue, manifest_sha, control_group=(group, int(port)), interface=interface,
    trusted_keys={key}, work_dir=Path(tempfile.mkdtemp()), deadline_s=float(sys.argv[10]),
    layering=LayeringConfig(start_channels=int(start)), receive_buffer_bytes=int(rcvbuf),
)
ok = result.path is not None and result.path.read_bytes() == Path(source).read_bytes()
print(json.dumps({"completed": result.completed, "exact": ok, "reason": result.reason,
                  "seconds": result.seconds, "most": result.most_channels,
                  "final": result.final_channels, "log": result.channel_log,
                  "losses": result.losses, "socket_drops": result.socket_drops,
                  "overflow_windows": result.overflow_windows,
                  "windows": result.channel_log_windows, "windows_ended": result.windows_ended,
                  "timer_late_max_s": result.timer_late_max_s,
                  "change_apply_max_s": result.change_apply_max_s,
                  "read_behind_max_s": result.read_behind_max_s}))
"""

#: the layering's defaults (LayeringConfig): settle 0.3 s, windows of 0.5 s
SETTLE_S, WINDOW_S = 0.3, 0.5


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


@dataclass
class Link:
    sender_ns: str
    receiver_ns: str
    sender_ip: str
    receiver_ip: str


@pytest.fixture
def link_factory() -> Iterator[Callable[..., Link]]:
    """Make a sender and a receiver namespace joined by veth, the sender's side
    shaped by tbf at ``rate_mbit``; ``loss_percent`` drops that share of the UDP
    packets arriving in the receiver's namespace (nftables)."""
    need_root_and("ip", "tc", "nft", install="apt-get install iproute2 nftables")
    made: list[str] = []

    def make(rate_mbit: float, loss_percent: int = 0) -> Link:
        tag = f"{random.randrange(1 << 24):06x}"
        snd, rcv = f"pr-ls-{tag}", f"pr-lr-{tag}"
        subnet = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        for ns in (snd, rcv):
            add_namespace(ns)
            made.append(ns)
        vs, vr = f"vs{tag}", f"vr{tag}"
        _run("ip", "link", "add", vs, "netns", snd, "type", "veth", "peer", "name", vr,
             "netns", rcv)  # fmt: skip
        for ns, dev, ip in ((snd, vs, f"{subnet}.1"), (rcv, vr, f"{subnet}.2")):
            ex = ("ip", "netns", "exec", ns)
            _run(*ex, "ip", "link", "set", "lo", "up")
            _run(*ex, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            _run(*ex, "ip", "link", "set", dev, "up")
        try:
            _run("ip", "netns", "exec", snd, "tc", "qdisc", "add", "dev", vs, "root", "tbf",
                 "rate", f"{rate_mbit}mbit", "burst", "32kb", "latency", "100ms")  # fmt: skip
        except subprocess.CalledProcessError as err:
            pytest.skip(f"tc tbf does not work here: {err.stderr.decode().strip()}")
        if loss_percent:
            nft = ("ip", "netns", "exec", rcv, "nft")
            try:
                _run(*nft, "add", "table", "inet", "loss")
                _run(*nft, "add", "chain", "inet", "loss", "input",
                     "{ type filter hook input priority 0 ; }")  # fmt: skip
                _run(*nft, "add", "rule", "inet", "loss", "input", "meta", "l4proto", "udp",
                     "numgen", "random", "mod", "100", "<", str(loss_percent), "drop")  # fmt: skip
            except subprocess.CalledProcessError as err:
                pytest.skip(f"nftables does not work here: {err.stderr.decode().strip()}")
        return Link(snd, rcv, f"{subnet}.1", f"{subnet}.2")

    yield make
    for ns in made:
        delete_namespace(ns)


def _carousel(
    link: Link,
    pub: Published,
    tmp_path: Path,
    *,
    start_channels: int = 1,
    receive_buffer_bytes: int = 8 * 1024 * 1024,
    deadline_s: float = 60.0,
) -> dict[str, Any]:
    """Run the sender (4 x 5 Mbit/s) and one receiver; the receiver's report."""
    rng = random.Random()
    group, port = f"239.255.{rng.randrange(1, 255)}.{rng.randrange(1, 200)}", "5400"
    env = {**os.environ, "PRESSRUN_MULTICAST_TOKEN": TOKEN}
    sender = subprocess.Popen(
        [
            "ip", "netns", "exec", link.sender_ns, sys.executable, "-m", "pressrun.cli",
            "--log-level", "INFO", "serve", "multicast", "--content", str(pub.content),
            "--key", str(pub.key_path), "--interface", link.sender_ip,
            "--control-group", f"{group}:{port}",
            "--group-base", f"239.254.{rng.randrange(1, 255)}.1",
            "--channels", "4", "--rate-mbps", "5", "--start", ISSUE,
            "--announce-interval-s", "0.2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert sender.stderr is not None
        started = False
        deadline = time.monotonic() + 90  # a loaded host starts Python slowly
        while not started and time.monotonic() < deadline:
            line = sender.stderr.readline()
            if not line:
                break
            started = "control API on " in line
        assert started, "the sender did not start"
        source = tmp_path / "source" / f"{ISSUE}.pdf"
        out = subprocess.run(
            [
                "ip", "netns", "exec", link.receiver_ns, sys.executable, "-c", RECEIVER,
                ISSUE, group, port, pub.manifest_sha256, pub.public_hex, str(source),
                link.receiver_ip, str(start_channels), str(receive_buffer_bytes),
                str(deadline_s),
            ],
            capture_output=True,
            text=True,
            timeout=deadline_s + 60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        report: dict[str, Any] = json.loads(out.stdout)
        return report
    finally:
        sender.terminate()
        sender.wait(timeout=10)


def _longest_above(log: list[list[float]], channels: int, end: float) -> float:
    """The longest stretch (s) the receiver held more than ``channels`` channels."""
    longest = 0.0
    for (t, joined), (t_next, _) in zip(log, [*log[1:], [end, 0]], strict=True):
        if joined > channels:
            longest = max(longest, t_next - t)
    return longest


def _settled_on(log: list[list[float]], end: float) -> int:
    """The channels held at the end, not counting a join younger than settling plus
    one measuring window (an RLM probe the receiver has not judged yet; a timer
    call's lateness on a loaded host is allowed for by the window count below)."""
    if len(log) >= 2 and log[-1][1] > log[-2][1] and end - log[-1][0] <= SETTLE_S + 2 * WINDOW_S:
        return int(log[-2][1])
    return int(log[-1][1])


@pytest.mark.parametrize("loss_percent", [0, 10], ids=["tbf", "tbf+10%-loss"])
def test_a_6_mbit_link_ends_on_the_one_channel_it_carries(
    link_factory: Callable[..., Link],
    published: Callable[[int], Published],
    tmp_path: Path,
    loss_percent: int,
) -> None:
    pub = published(3_000_000)
    out = _carousel(link_factory(6, loss_percent), pub, tmp_path)
    facts = (out["reason"], out["log"], out["losses"], out["socket_drops"])
    assert out["completed"] and out["exact"], facts
    # where it settled: a try of another channel still within its first window after
    # settling when the issue completed is a probe, not where the receiver ended
    assert _settled_on(out["log"], out["seconds"]) == 1, facts
    # a try of a second channel is left by the window after it settled: no window
    # ended with it kept (the emulation report's check, fleet.kept_above)
    log = [(int(n), w) for (_, n), w in zip(out["log"], out["windows"], strict=True)]
    assert kept_above(log, out["windows_ended"], 1) == 0, (*facts, out["windows"])
    # in seconds: settling + one window, plus what the receiver measured it waited
    # for: its timer's lateness (a few ms on a quiet host, up to a few hundred at load
    # 30-40), how far behind its channels it read at a window's end (the window is
    # judged once what arrived in it is read) and the leave's own system call (the log
    # stamps its return). CI at cf70e0e, 3 test workers: 0.822 s, 12 ms over the
    # first two alone
    longest = _longest_above(out["log"], 1, out["seconds"])
    waited = 2 * out["timer_late_max_s"] + out["read_behind_max_s"] + out["change_apply_max_s"]
    assert longest <= SETTLE_S + WINDOW_S + waited + 0.01, (longest, *facts, waited)


def test_a_50_mbit_link_joins_every_channel(
    link_factory: Callable[..., Link], published: Callable[[int], Published], tmp_path: Path
) -> None:
    pub = published(6_000_000)
    out = _carousel(link_factory(50), pub, tmp_path)
    assert out["completed"] and out["exact"], out
    assert out["most"] == 4, out["log"]
    joined = [n for _, n in out["log"]]
    assert joined == sorted(joined), out["losses"]  # never left a channel


def test_a_starved_receiver_does_not_take_its_own_drops_for_path_loss(
    link_factory: Callable[..., Link], published: Callable[[int], Published], tmp_path: Path
) -> None:
    """A socket buffer of a few packets, on a link that carries every channel: the
    own queue overflows (SO_RXQ_OVFL), the path loses nothing. The receiver starts on
    two channels and leaves neither; it joins no more while it overflows."""
    pub = published(1_500_000)
    out = _carousel(
        link_factory(50),
        pub,
        tmp_path,
        start_channels=2,
        receive_buffer_bytes=4096,
        deadline_s=20.0,
    )
    assert min(joined for _, joined in out["log"]) == 2, out["log"]  # never left a channel
    assert max(out["losses"]) < 0.25, out["losses"]
    assert out["socket_drops"] > 100, out
    assert out["overflow_windows"] >= 1, out
