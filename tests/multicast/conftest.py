"""A published issue and a running multicast sender (in this process, real UDP
multicast on 127.0.0.1), with a random control group and channel groups per test."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pressrun.balancer.aio import BalancerServiceConfig, start_balancer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import OriginSpec
from pressrun.clients.aio import FetchResult, fetch_issue
from pressrun.clients.config import DESKTOP, ClientConfig
from pressrun.content.keys import generate_keypair, load_public_key, load_signing_key
from pressrun.content.publish import publish
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.layering import LayerCore
from pressrun.multicast.net import free_udp_port
from pressrun.origin import OriginConfig, RunningOrigin, start_origin

pytest.importorskip("pressrun_flute", reason="the FLUTE binding is built by `make setup`")

ISSUE = "weekly-2026-47"
TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


#: one request is D = 3 downloaders: multicast from the first request on
PEAK_AT_ONCE = DemandConfig(
    enter_downloaders=1000.0,
    leave_downloaders=0.0,
    min_dwell_s=0.0,
    multicast_enter_downloaders=1.0,
    multicast_leave_downloaders=0.5,
)


def multicast_client(deadline_s: float = 15.0, **changes: Any) -> ClientConfig:
    """A desktop client for these tests: quick retries, the carousel on 127.0.0.1,
    ``deadline_s`` for the carousel, ``changes`` over it."""
    return replace(
        DESKTOP,
        stall_timeout_s=3.0,
        retry_backoff_s=0.05,
        multicast_deadline_s=deadline_s,
        multicast_interface="127.0.0.1",
        **changes,
    )


def random_groups(rng: random.Random) -> tuple[tuple[str, int], str]:
    """A control group and a channel group base, both random in 239.255.0.0/16."""
    a, b = rng.randrange(1, 255), rng.randrange(1, 200)
    return (f"239.255.{a}.{b}", free_udp_port()), f"239.255.{a}.{b + 1}"


@dataclass
class Published:
    root: Path
    content: Path
    key_path: Path
    public_hex: str
    data: bytes
    manifest_json: bytes

    @property
    def manifest_sha256(self) -> str:
        return hashlib.sha256(self.manifest_json).hexdigest()


async def fetch_through_balancer(
    issue_id: str,
    origin: RunningOrigin,
    policy: DemandPolicy,
    config: ClientConfig,
    *,
    publisher: Shelf | Published,
    seed: int | None = 1,
) -> FetchResult:
    """Fetch ``issue_id`` with ``config`` into the publisher's root's ``library``
    through a balancer over the one running ``origin`` (as origin-a), answering modes
    by ``policy``, trusting the publisher's key; the balancer and the origin are
    stopped after, whatever happens."""
    balancer = await start_balancer(
        BalancerServiceConfig(
            origins=(OriginSpec("origin-a", origin.url),),
            balancer=BalancerConfig(poll_interval_s=0.2, stale_after_s=1.0),
            seed=seed,
        ),
        mode_policy=policy,
    )
    try:
        await balancer.wait_until_up(1, timeout_s=10.0)
        return await fetch_issue(
            issue_id,
            balancer_url=balancer.url,
            library=publisher.root / "library",
            config=config,
            trusted_keys={bytes.fromhex(publisher.public_hex)},
        )
    finally:
        await balancer.stop()
        await origin.stop()


async def leave_swarm_for_carousel(
    pub: Published, sender: Any, client: ClientConfig, *, web_seed_mbps: float
) -> FetchResult:
    """Fetch through a balancer that answers ``swarm`` from the first request while
    ``sender`` runs the issue's carousel: the swarm's only source is the origin's web
    seed capped at ``web_seed_mbps`` (no tracker answers there: no peers), and the
    client (``client``, told the carousel's control group, never seeding) leaves the
    swarm for the carousel."""
    await sender.start_carousel(ISSUE, sender.config.carousel)
    origin = await start_origin(
        OriginConfig(
            content_dir=pub.content,
            name="origin-a",
            stats_interval_s=0.2,
            egress_cap_mbps=web_seed_mbps,
        )
    )
    info_hash = json.loads(pub.manifest_json)["manifest"]["info_hash"]
    tracker = f"http://127.0.0.1:{free_udp_port()}/announce"
    swarm_first = DemandConfig(enter_downloaders=1.0, leave_downloaders=0.0, min_dwell_s=0.0)
    policy = DemandPolicy(
        swarm_first, {ISSUE: swarm_info_for(origin.url, tracker, ISSUE, info_hash)}
    )
    group = "{}:{}".format(*sender.config.control_group)
    config = replace(client, carousel_control_group=group, swarm_max_seed_s=0.0)
    return await fetch_through_balancer(ISSUE, origin, policy, config, publisher=pub)


@pytest.fixture
def published(tmp_path: Path) -> Callable[[int], Published]:
    """Publish a random issue of the given size; returns its bundle's facts."""

    def make(size: int) -> Published:
        secret, public = generate_keypair(tmp_path / "publisher.key")
        data = random.Random(size).randbytes(size)
        source = tmp_path / "source" / f"{ISSUE}.pdf"
        source.parent.mkdir(exist_ok=True)
        source.write_bytes(data)
        content = tmp_path / "content"
        publish(
            source,
            issue_id=ISSUE,
            title="Sample",
            key_path=secret,
            content_dir=content,
            web_seeds=[],
            piece_size=65536,
        )
        manifest_json = (content / ISSUE / "manifest.json").read_bytes()
        return Published(
            tmp_path, content, secret, load_public_key(public).hex(), data, manifest_json
        )

    return make


@pytest.fixture
async def sender_factory() -> AsyncIterator[Callable[..., object]]:
    """Start `MulticastSender`s on random groups; all are closed at the end."""
    from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

    started: list[MulticastSender] = []
    rng = random.Random()

    async def start(pub: Published, carousel: CarouselConfig) -> MulticastSender:
        control, base = random_groups(rng)
        sender = MulticastSender(
            SenderServiceConfig(
                content_dir=pub.content,
                control_group=control,
                signing_key=load_signing_key(pub.key_path),
                token=TOKEN,
                carousel=carousel,
                group_base=base,
                announce_interval_s=0.2,
                announcement_ttl_s=2.0,
            )
        )
        started.append(sender)
        await sender.start()
        return sender

    yield start
    for sender in started:
        await sender.close()


@dataclass
class Shelf:
    """A content folder and the publisher's key: issues published on demand."""

    root: Path
    content: Path
    key_path: Path
    public_hex: str

    def publish(self, issue_id: str, size: int, *, seed: int = 0, force: bool = False) -> bytes:
        data = random.Random(f"{issue_id}/{seed}").randbytes(size)
        source = self.root / "source" / f"{issue_id}.pdf"
        source.parent.mkdir(exist_ok=True)
        source.write_bytes(data)
        publish(
            source,
            issue_id=issue_id,
            title=issue_id,
            key_path=self.key_path,
            content_dir=self.content,
            piece_size=16384,
            force=force,
        )
        return data

    def manifest_sha256(self, issue_id: str) -> str:
        return hashlib.sha256((self.content / issue_id / "manifest.json").read_bytes()).hexdigest()


@pytest.fixture
def shelf(tmp_path: Path) -> Shelf:
    secret, public = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    content.mkdir()
    return Shelf(tmp_path, content, secret, load_public_key(public).hex())


@pytest.fixture
async def senders() -> AsyncIterator[Callable[..., Any]]:
    """Start `MulticastSender`s over a `Shelf` on random groups (extra keyword
    arguments go to `SenderServiceConfig`); all are closed at the end."""
    started: list[Any] = []
    rng = random.Random()

    async def start(shelf: Shelf, carousel: CarouselConfig, **extra: Any) -> Any:
        from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

        control, base = random_groups(rng)
        options: dict[str, Any] = {
            "content_dir": shelf.content,
            "control_group": control,
            "signing_key": load_signing_key(shelf.key_path),
            "token": TOKEN,
            "carousel": carousel,
            "group_base": base,
            "announce_interval_s": 0.2,
            "announcement_ttl_s": 2.0,
        }
        options.update(extra)
        sender = MulticastSender(SenderServiceConfig(**options))
        started.append(sender)
        await sender.start()
        return sender

    yield start
    for sender in started:
        await sender.close()


async def receive_issue(
    shelf: Shelf, control_group: tuple[str, int], issue_id: str, work: Path, **options: Any
) -> Any:
    """pressrun's receive path for ``issue_id`` of ``shelf`` from the carousel announced
    on ``control_group`` (a thread of its own; 20 s deadline unless given): the
    `ReceiveResult`."""
    import asyncio

    from pressrun.multicast.receiver import receive_carousel

    work.mkdir(parents=True, exist_ok=True)
    options.setdefault("deadline_s", 20.0)
    return await asyncio.to_thread(
        receive_carousel,
        issue_id,
        shelf.manifest_sha256(issue_id),
        control_group=control_group,
        interface="127.0.0.1",
        trusted_keys={shelf.public_hex},
        work_dir=work,
        **options,
    )


def shaped_link_trace(
    layers: LayerCore,
    *,
    carries_pps: float,
    queue_packets: float,
    until: float,
    stall_s: float = 0.0,
    sent_share: Callable[[float], float] = lambda _t: 1.0,
    leave_latency_s: float = 0.0,
) -> tuple[list[tuple[float, int, int]], int]:
    """Drive ``layers`` as `receive_carousel` does behind a link that carries
    ``carries_pps`` of the channels' 100 packets/s each through a queue of
    ``queue_packets`` (what exceeds the link fills the queue, then is dropped), with
    every change taking ``stall_s`` to apply (the adapter blocked in the join or
    leave; the link gets the new channels only then), and the sender sending
    ``sent_share(t)`` of its announced rate at time t. A channel left keeps coming
    down the link for ``leave_latency_s`` after the leave returned (the network's
    leave latency: an IGMP querier asks the port twice, 1 s apart, before it stops
    forwarding), filling the queue though the receiver no longer counts it. Returns
    the ``(time applied, channels, windows ended)`` log and the windows ended by
    ``until``."""
    started = layers.start(now=0.0)
    layers.handle_applied(now=0.0)
    on_link = len(started)  # the channels the receiver holds and counts
    load = on_link  # the channels the link carries (a left one until its latency ends)
    load_until: float | None = None
    log = [(0.0, on_link, 0)]
    now, queue, step = 0.0, 0.0, 0.01
    while now < until:
        deadline = layers.next_deadline()
        assert deadline is not None
        # a deadline that passed while the adapter was blocked is called at once
        while now < deadline - 1e-9:
            if load_until is not None and now >= load_until - 1e-9:
                load, load_until = on_link, None
            dt = min(step, deadline - now)
            rate = 100.0 * sent_share(now)
            queue += rate * dt * load - carries_pps * dt
            dropped = max(0.0, queue - queue_packets)
            queue = min(max(queue, 0.0), queue_packets)
            for ch in layers.joined[:on_link]:
                sent = rate * dt
                arrived = sent - dropped / load
                # thousandths, so that rounding loses nothing
                layers.handle_packets(ch.index, round(arrived * 1000))
                layers.handle_sequence(
                    ch.index, received=round(arrived * 1000), expected=round(sent * 1000)
                )
            now += dt
        now = max(now, deadline)
        if layers.handle_timer(now=now):
            # blocked in the join or leave: the link keeps the old channels meanwhile
            # (their packets wait in the sockets; what was counted is reset below)
            for _ in range(round(stall_s / step)):
                queue += 100.0 * step * load - carries_pps * step
                queue = min(max(queue, 0.0), queue_packets)
            now += stall_s
            held = len(layers.joined)
            if held < on_link and leave_latency_s > 0:
                load, load_until = max(load, on_link), now + leave_latency_s
            else:
                load = max(held, load if load_until is not None else 0)
            on_link = held
            layers.handle_applied(now=now)
            log.append((now, on_link, layers.windows_ended))
    return log, layers.windows_ended
