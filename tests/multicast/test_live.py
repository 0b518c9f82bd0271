"""Real UDP multicast on 127.0.0.1: the sender's carousels and pressrun's receivers.

Loss in these tests is the receive-path drop filter (``drop_probability``); the
nftables variant in a network namespace is in test_netns.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import nacl.signing

from pressrun.content.keys import load_signing_key
from pressrun.multicast.config import CarouselConfig, LayeringConfig
from pressrun.multicast.control import sign_announcement
from pressrun.multicast.events import Announcement
from pressrun.multicast.net import receiver_socket, sender_socket
from pressrun.multicast.receiver import ReceiveResult, receive_carousel
from pressrun.multicast.sender import MulticastSender

from .conftest import ISSUE, TOKEN, Published

SIZE = 1_500_000


async def receive(
    sender: MulticastSender,
    pub: Published,
    work: Path,
    *,
    delay_s: float = 0.0,
    drop: float = 0.0,
    layering: LayeringConfig | None = None,
    seed: int = 0,
    deadline_s: float = 30.0,
) -> ReceiveResult:
    await asyncio.sleep(delay_s)
    work.mkdir(parents=True, exist_ok=True)
    return await asyncio.to_thread(
        receive_carousel,
        ISSUE,
        pub.manifest_sha256,
        control_group=sender.config.control_group,
        interface="127.0.0.1",
        trusted_keys={pub.public_hex},
        work_dir=work,
        deadline_s=deadline_s,
        layering=layering,
        drop_probability=drop,
        seed=seed,
    )


def exact(result: ReceiveResult, pub: Published) -> bool:
    return result.path is not None and result.path.read_bytes() == pub.data


class CycleClock:
    """The carousel's cycle as actually sent: on a loaded host the send thread may
    fall behind its schedule (the rate is a ceiling), and a cycle then lasts longer
    than planned; "within one cycle" means within one cycle of what was sent."""

    def __init__(self, sender: MulticastSender) -> None:
        running = sender.thread.get(ISSUE)
        assert running is not None
        self.schedule = running.schedule
        self.cycle_packets = running.schedule.cycle_length(0)
        self.sent0 = self.schedule.sent(0)
        self.t0 = time.perf_counter()

    def cycle_s(self) -> float:
        rate = (self.schedule.sent(0) - self.sent0) / (time.perf_counter() - self.t0)
        return self.cycle_packets / rate


async def test_five_receivers_verified_one_joining_mid_carousel(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=16e6))
    plan = await sender.start_carousel(ISSUE, sender.config.carousel)
    one = LayeringConfig(max_channels=1)
    late = 0.5 * plan.cycle_s
    clock = CycleClock(sender)
    results = await asyncio.gather(
        *(receive(sender, pub, tmp_path / f"r{i}", layering=one) for i in range(4)),
        receive(sender, pub, tmp_path / "late", delay_s=late, layering=one),
    )
    assert all(r.completed and exact(r, pub) for r in results), [r.reason for r in results]
    # the late joiner joined mid-cycle and still finished in about one cycle
    cycle_s = clock.cycle_s()
    # timed by the kernel's arrival stamps: a busy test host delays the reading, not
    # the packets
    late_s = results[-1].arrival_seconds
    assert late_s is not None and late_s <= 1.2 * cycle_s, (late_s, cycle_s, plan.cycle_s)
    assert all(r.efficiency is not None and r.efficiency >= 0.95 for r in results)


async def test_ten_percent_loss_every_receiver_within_a_cycle_and_a_fifth(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=1, rate_bps=16e6))
    plan = await sender.start_carousel(ISSUE, sender.config.carousel)
    clock = CycleClock(sender)
    results = await asyncio.gather(
        *(
            receive(sender, pub, tmp_path / f"r{i}", drop=0.10, seed=i, delay_s=0.13 * i)
            for i in range(5)
        )
    )
    cycle_s = clock.cycle_s()
    for r in results:
        assert r.completed and exact(r, pub), r.reason
        assert r.dropped > 0
        assert r.arrival_seconds is not None
        assert r.arrival_seconds <= 1.2 * cycle_s, (r.arrival_seconds, cycle_s, plan.cycle_s)


async def test_two_channels_finish_in_about_half_the_time(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    pub = published(3_000_000)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=12e6))
    await sender.start_carousel(ISSUE, sender.config.carousel)
    one, two = await asyncio.gather(
        receive(sender, pub, tmp_path / "one", layering=LayeringConfig(max_channels=1)),
        # this one stays on both channels: the test is about what two channels carry,
        # not about layering (which leaves a channel when the sender falls behind)
        receive(
            sender,
            pub,
            tmp_path / "two",
            layering=LayeringConfig(start_channels=2, max_channels=2, leave_above_loss=1.0),
        ),
    )
    assert one.completed and two.completed and exact(one, pub) and exact(two, pub)
    assert one.most_channels == 1 and two.most_channels == 2
    assert one.arrival_seconds is not None and two.arrival_seconds is not None
    ratio = two.arrival_seconds / one.arrival_seconds
    assert 0.35 <= ratio <= 0.7, (one.arrival_seconds, two.arrival_seconds)


async def test_forged_stale_and_replayed_announcements_are_ignored(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=1, rate_bps=8e6))
    await sender.start_carousel(ISSUE, sender.config.carousel)
    group = sender.config.control_group
    # capture a genuine announcement to replay it later
    listen = receiver_socket(*group, "127.0.0.1")
    listen.setblocking(True)
    listen.settimeout(5)
    genuine = await asyncio.to_thread(listen.recv, 65536)
    listen.close()
    doc = json.loads(genuine)
    plan_doc = doc["announcement"]["carousels"][0]
    # forged: the real announcement's channel moved to another group, old signature
    doc["announcement"]["carousels"][0]["channels"][0]["group"] = "239.1.2.3"
    tampered = json.dumps(doc).encode()
    # signed by a key nobody trusts
    intruder = nacl.signing.SigningKey.generate()
    ann = Announcement(
        bytes(intruder.verify_key).hex(),
        10**15,
        sender.clock(),
        sender.clock() + 60,
        (sender.thread.running()[0].plan,),
    )
    foreign = sign_announcement(ann, intruder)
    # the publisher's own key but long expired (with a huge sequence number)
    stale = sign_announcement(
        Announcement(pub.public_hex, 10**15, 1000.0, 1005.0, (sender.thread.running()[0].plan,)),
        load_signing_key(pub.key_path),
    )
    assert plan_doc["issue_id"] == ISSUE
    out = sender_socket("127.0.0.1")

    async def inject() -> None:
        for _ in range(15):
            for datagram in (tampered, foreign, stale, genuine):
                out.sendto(datagram, group)
            await asyncio.sleep(0.05)

    result, _ = await asyncio.gather(receive(sender, pub, tmp_path / "r"), inject())
    out.close()
    assert result.completed and exact(result, pub)
    verdicts = result.verdicts
    assert verdicts.get("unsigned or badly signed", 0) >= 1
    assert verdicts.get("signed by a key that is not a trusted publisher", 0) >= 1
    assert verdicts.get("expired", 0) >= 1
    assert verdicts.get("replayed (sequence number not above the last one accepted)", 0) >= 1
    assert verdicts["accepted"] >= 1


async def test_control_api_token_metrics_and_stop(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    pub = published(300_000)
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=4e6))
    url = sender.url
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/carousels", json={"issue_id": ISSUE}) as resp:
            assert resp.status == 401
        async with http.post(
            f"{url}/v1/carousels", json={"issue_id": ISSUE}, headers={"Authorization": "Bearer x"}
        ) as resp:
            assert resp.status == 401
        # every API route is behind the shared operator guard (pressrun.security)
        for method, path in [
            ("GET", "/v1/carousels"),
            ("GET", f"/v1/carousels/{ISSUE}"),
            ("DELETE", f"/v1/carousels/{ISSUE}"),
        ]:
            async with http.request(method, f"{url}{path}") as resp:
                assert resp.status == 401, (method, path)
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                assert "Authorization: Bearer <token>" in (await resp.json())["error"]
        for path in ("/healthz", "/metrics"):
            async with http.get(f"{url}{path}") as resp:
                assert resp.status == 200, path
        async with http.post(
            f"{url}/v1/carousels", json={"issue_id": "nope"}, headers=auth
        ) as resp:
            assert resp.status == 404 and "no issue nope" in (await resp.json())["error"]
        async with http.post(
            f"{url}/v1/carousels", json={"issue_id": ISSUE, "channels": 99}, headers=auth
        ) as resp:
            assert resp.status == 400 and "channels" in (await resp.json())["error"]
        async with http.post(
            f"{url}/v1/carousels", json={"issue_id": ISSUE, "fec": "none"}, headers=auth
        ) as resp:
            assert resp.status == 201
            plan = await resp.json()
        assert plan["fec"] == "none" and len(plan["channels"]) == 2
        async with http.post(f"{url}/v1/carousels", json={"issue_id": ISSUE}, headers=auth) as resp:
            assert resp.status == 200  # already running: kept
        await asyncio.sleep(0.5)
        async with http.get(f"{url}/v1/carousels/{ISSUE}", headers=auth) as resp:
            status = await resp.json()
        assert all(ch["packets"] > 0 for ch in status["sent"])
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
        assert f'pressrun_multicast_packets_sent_total{{channel="0",issue="{ISSUE}"}}' in text
        assert "pressrun_multicast_announcements_sent_total" in text
        async with http.delete(f"{url}/v1/carousels/{ISSUE}", headers=auth) as resp:
            assert resp.status == 200
        async with http.delete(f"{url}/v1/carousels/{ISSUE}", headers=auth) as resp:
            assert resp.status == 404
        async with http.get(f"{url}/v1/carousels", headers=auth) as resp:
            assert (await resp.json())["carousels"] == []


async def test_a_standard_flute_receiver_takes_a_no_fec_carousel_bit_exact(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    """PyPI ``flute-alc`` (the crate's own Python bindings, not pressrun's code) on one
    channel of a ``--fec none`` carousel: the file it writes is the issue, bit-exact."""
    from flute import receiver as alc  # flute-alc

    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(fec="none", channels=1, rate_bps=16e6))
    plan = await sender.start_carousel(ISSUE, sender.config.carousel)
    ch = plan.channels[0]
    out = tmp_path / "flute-alc"
    out.mkdir()
    want = hashlib.sha256(pub.data).hexdigest()
    target = out / ISSUE / f"{ISSUE}.pdf"

    def standard_receiver() -> bool:
        sock = receiver_socket(ch.group, ch.port, "127.0.0.1")
        sock.setblocking(True)
        sock.settimeout(0.5)
        rx = alc.MultiReceiver(alc.ObjectWriterBuilder(str(out)), alc.Config())
        endpoint = alc.UDPEndpoint(ch.group, ch.port)
        try:
            for _ in range(20 * int(plan.cycle_s * 5000)):
                try:
                    data = sock.recv(4096)
                except TimeoutError:
                    continue
                rx.push(endpoint, data)
                # a file existing is not completion (FIELD-NOTES): compare the bytes
                if (
                    target.exists()
                    and target.stat().st_size == len(pub.data)
                    and hashlib.sha256(target.read_bytes()).hexdigest() == want
                ):
                    return True
            return False
        finally:
            sock.close()

    assert await asyncio.wait_for(asyncio.to_thread(standard_receiver), 60)


def test_receiver_socket_binds_the_group_not_the_wildcard() -> None:
    """Two groups on one port: a channel socket hears only its own group."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    a = receiver_socket("239.255.250.1", port, "127.0.0.1")
    b = receiver_socket("239.255.250.2", port, "127.0.0.1")
    out = sender_socket("127.0.0.1")
    try:
        out.sendto(b"to-a", ("239.255.250.1", port))
        a.setblocking(True)
        a.settimeout(2)
        assert a.recv(100) == b"to-a"
        b.setblocking(True)
        b.settimeout(0.3)
        try:
            got = b.recv(100)
        except TimeoutError:
            got = b""
        assert got == b""
    finally:
        a.close()
        b.close()
        out.close()


async def test_an_issue_is_encoded_when_published_and_a_start_costs_no_encoding(
    published: Callable[[int], Published], sender_factory: Any, tmp_path: Path
) -> None:
    pub = published(SIZE)
    sender = await sender_factory(pub, CarouselConfig(channels=1, rate_bps=8e6))

    def encodes() -> float:
        value = sender.metrics.registry.get_sample_value("pressrun_multicast_encodes_total")
        return 0.0 if value is None else value

    # the sender prepares the newest issues of its content folder on its own
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            async with http.get(f"{sender.url}/healthz") as resp:
                if ISSUE in (await resp.json())["prepared"]:
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the issue was not prepared")
    assert encodes() == 1
    plan = await sender.start_carousel(ISSUE, sender.config.carousel)
    assert encodes() == 1  # the start took the prepared pass
    result = await receive(sender, pub, tmp_path / "r")
    assert result.completed and exact(result, pub), result.reason
    assert result.plan is not None and result.plan.channels[0].tsi == plan.channels[0].tsi
    # a restarted carousel sends the same pass (the same TSI), still without encoding
    assert sender.stop_carousel(ISSUE)
    again = await sender.start_carousel(ISSUE, sender.config.carousel)
    assert encodes() == 1 and again.channels[0].tsi == plan.channels[0].tsi
    # other FEC settings need another pass: encoded at the start, then kept
    assert sender.stop_carousel(ISSUE)
    await sender.start_carousel(ISSUE, CarouselConfig(channels=2, rate_bps=8e6))
    assert encodes() == 2
