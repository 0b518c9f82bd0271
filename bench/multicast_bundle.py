"""bench/multicast.py's issue and its carousel on loopback: the bench issue's bundle, a
sender of it, one receiver of it (also for bench/multicast_mixed_links.py)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from pressrun.content.keys import generate_keypair, load_public_key, load_signing_key
from pressrun.content.publish import publish
from pressrun.multicast.config import CarouselConfig, LayeringConfig
from pressrun.multicast.net import free_udp_port
from pressrun.multicast.receiver import ReceiveResult, receive_carousel
from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

ISSUE = "bench-issue"
TOKEN = "bench-token-0123456789"


class Bundle:
    def __init__(self, root: Path, size: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.secret, public = generate_keypair(root / "publisher.key")
        self.public_hex = load_public_key(public).hex()
        self.content = root / "content"
        source = root / f"{ISSUE}.pdf"
        source.write_bytes(random.Random(size).randbytes(size))
        publish(
            source,
            issue_id=ISSUE,
            title="bench",
            key_path=self.secret,
            content_dir=self.content,
            web_seeds=[],
            piece_size=262144,
        )
        self.manifest_json = (self.content / ISSUE / "manifest.json").read_bytes()


def make_sender(bundle: Bundle, carousel: CarouselConfig, rng: random.Random) -> MulticastSender:
    a, b = rng.randrange(1, 255), rng.randrange(1, 200)
    return MulticastSender(
        SenderServiceConfig(
            content_dir=bundle.content,
            control_group=(f"239.255.{a}.{b}", free_udp_port()),
            signing_key=load_signing_key(bundle.secret),
            token=TOKEN,
            carousel=carousel,
            group_base=f"239.255.{a}.{b + 1}",
            announce_interval_s=0.2,
        )
    )


def sent_bytes_of(sender: MulticastSender) -> float:
    """The sender's bytes counter of channel 0 (its /metrics figure)."""
    value = sender.metrics.registry.get_sample_value(
        "pressrun_multicast_bytes_sent_total", {"issue": ISSUE, "channel": "0"}
    )
    return value or 0.0


def receive_issue(
    bundle: Bundle,
    sender: MulticastSender,
    work: Path,
    *,
    deadline_s: float,
    channels: int,
    drop_probability: float = 0.0,
    seed: int | None = None,
) -> ReceiveResult:
    """One receiver of the bench issue from ``sender``'s carousel on loopback."""
    return receive_carousel(
        ISSUE,
        hashlib.sha256(bundle.manifest_json).hexdigest(),
        control_group=sender.config.control_group,
        interface="127.0.0.1",
        trusted_keys={bundle.public_hex},
        work_dir=work,
        deadline_s=deadline_s,
        layering=LayeringConfig(max_channels=channels),
        drop_probability=drop_probability,
        seed=seed,
    )
