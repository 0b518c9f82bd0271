"""A carousel across restarts and republishing, and a sender with many carousels: real
senders on 127.0.0.1 with real UDP multicast, restarted by closing and starting them
again on the same addresses."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from pressrun.multicast.codec import ANNOUNCEMENT_PART_BYTES
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.control import check_datagram
from pressrun.multicast.core import AnnouncementGate
from pressrun.multicast.events import AnnouncementVerdict, CarouselPlan
from pressrun.multicast.net import receiver_socket
from pressrun.multicast.plans import derived_tsi

from .conftest import AUTH, Shelf, random_groups, receive_issue

SLOW = CarouselConfig(channels=2, rate_bps=200e3)


def addresses(plan: CarouselPlan) -> list[tuple[str, int, int]]:
    return [(ch.group, ch.port, ch.tsi) for ch in plan.channels]


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def lct_tsi(packet: bytes) -> int:
    """The TSI of an ALC/LCT packet (RFC 5651 section 5.1: S and H give its length)."""
    c = (packet[0] >> 2) & 0x3
    s, h = packet[1] >> 7, (packet[1] >> 4) & 0x1
    start = 4 + 4 * (c + 1)
    return int.from_bytes(packet[start : start + 4 * s + 2 * h], "big")


async def test_a_restarted_sender_puts_each_carousel_where_it_was(
    shelf: Shelf, senders: Any
) -> None:
    """Before: groups were handed out in start order from the base and ports were
    free ports, so after a restart the same issue came back elsewhere."""
    for issue in ("weekly-a", "weekly-b"):
        shelf.publish(issue, 20_000)
    control, base = random_groups(random.Random())
    where = {"control_group": control, "group_base": base, "prepare_issues": 0}
    first = await senders(shelf, SLOW, **where)
    a = await first.start_carousel("weekly-a", SLOW)
    b = await first.start_carousel("weekly-b", SLOW)
    await first.close()
    again = await senders(shelf, SLOW, **where)
    # the other order this time
    b2 = await again.start_carousel("weekly-b", SLOW)
    a2 = await again.start_carousel("weekly-a", SLOW)
    assert addresses(a2) == addresses(a) and addresses(b2) == addresses(b)
    assert a.channels[0].tsi == derived_tsi("weekly-a")
    assert {ch.group for ch in a.channels}.isdisjoint(ch.group for ch in b.channels)


async def test_the_tsi_is_set_through_the_api_and_kept_in_the_state_file(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    data = shelf.publish("weekly-t", 60_000)
    control, base = random_groups(random.Random())
    where = {
        "control_group": control,
        "group_base": base,
        "prepare_issues": 0,
        "state_file": tmp_path / "carousels.json",
        "port": free_tcp_port(),
    }
    carousel = CarouselConfig(channels=1, rate_bps=4e6)
    first = await senders(shelf, carousel, **where)
    async with aiohttp.ClientSession() as http:
        for bad in (0, -1, "7", 1 << 48, True):
            async with http.post(
                f"{first.url}/v1/carousels", json={"issue_id": "weekly-t", "tsi": bad}, headers=AUTH
            ) as resp:
                assert resp.status == 400 and "tsi" in (await resp.json())["error"], bad
        async with http.post(
            f"{first.url}/v1/carousels", json={"issue_id": "weekly-t", "tsi": 4242}, headers=AUTH
        ) as resp:
            assert resp.status == 201
            plan = await resp.json()
    assert [ch["tsi"] for ch in plan["channels"]] == [4242]
    # the packets on the wire carry it
    ch = plan["channels"][0]
    sock = receiver_socket(ch["group"], ch["port"], "127.0.0.1")
    sock.setblocking(True)
    sock.settimeout(2)
    try:
        assert lct_tsi(await asyncio.to_thread(sock.recv, 4200)) == 4242
    finally:
        sock.close()
    await first.close()
    # restarted, asked without a TSI (as the balancer does): the one set is kept
    again = await senders(shelf, carousel, **where)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{again.url}/v1/carousels", json={"issue_id": "weekly-t"}, headers=AUTH) as resp,
    ):
        assert resp.status == 201
        plan2 = await resp.json()
    assert plan2["channels"] == plan["channels"]
    result = await receive_issue(shelf, control, "weekly-t", tmp_path / "r")
    assert result.completed and result.path is not None and result.path.read_bytes() == data


async def test_a_plan_moved_off_a_taken_group_survives_a_restart(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    from pressrun.multicast.plans import ChannelPlanner

    # two issues whose ids hash to the same group of a range of two
    probe = ChannelPlanner(group_base="239.255.9.1", group_count=2)
    first_group = probe.plan("weekly-0", 1, tsi=None, taken=()).groups[0]
    other = next(
        f"weekly-{i}"
        for i in range(1, 100)
        if probe.plan(f"weekly-{i}", 1, tsi=None, taken=()).groups[0] == first_group
    )
    for issue in ("weekly-0", other):
        shelf.publish(issue, 10_000)
    control, base = random_groups(random.Random())
    one = CarouselConfig(channels=1, rate_bps=200e3)
    where = {
        "control_group": control,
        "group_base": base,
        "group_count": 2,
        "prepare_issues": 0,
        "state_file": tmp_path / "carousels.json",
    }
    first = await senders(shelf, one, **where)
    a = await first.start_carousel("weekly-0", one)
    b = await first.start_carousel(other, one)
    assert a.channels[0].group != b.channels[0].group  # moved off the taken one
    await first.close()
    again = await senders(shelf, one, **where)
    b2 = await again.start_carousel(other, one)  # alone now, but it stays where it was
    assert addresses(b2) == addresses(b)


async def test_a_republished_issue_is_carried_in_its_new_version(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """Before: the running carousel kept the old pass, and every receiver that had
    verified the new manifest refused it."""
    shelf.publish("weekly-r", 80_000)
    carousel = CarouselConfig(channels=1, rate_bps=4e6)
    sender = await senders(shelf, carousel, prepare_interval_s=0.1)
    old = await sender.start_carousel("weekly-r", carousel)
    new_data = shelf.publish("weekly-r", 90_000, seed=1, force=True)
    new_sha = shelf.manifest_sha256("weekly-r")
    for _ in range(200):
        running = sender.thread.get("weekly-r")
        if running is not None and running.plan.manifest_sha256 == new_sha:
            break
        await asyncio.sleep(0.05)
    assert running is not None and running.plan.manifest_sha256 == new_sha
    new = running.plan
    assert addresses(new) == addresses(old) and new.toi != old.toi
    result = await receive_issue(shelf, sender.config.control_group, "weekly-r", tmp_path / "r")
    assert result.completed and result.path is not None, result.reason
    assert result.path.read_bytes() == new_data


async def test_130_carousels_keep_their_announcements_flowing(
    shelf: Shelf, senders: Any, tmp_path: Path
) -> None:
    """At about 126 carousels of 2 channels one announcement passed 60,000 bytes; the
    announcement loop died on the error and every carousel lost its announcements.
    Rounds are now cut into datagrams of at most ANNOUNCEMENT_PART_BYTES."""
    count = 132
    issues = [f"weekly-{i:03d}" for i in range(count)]
    data = {issue: shelf.publish(issue, 2_000) for issue in issues}
    slow = CarouselConfig(channels=2, rate_bps=20e3)
    sender = await senders(shelf, slow, prepare_issues=0)
    for issue in issues[:-1]:
        await sender.start_carousel(issue, slow)
    last = issues[-1]
    await sender.start_carousel(last, replace(slow, rate_bps=2e6))
    group = sender.config.control_group

    def listen(seconds: float) -> list[bytes]:
        sock = receiver_socket(*group, "127.0.0.1")
        sock.setblocking(True)
        sock.settimeout(0.2)
        heard: list[bytes] = []
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                try:
                    heard.append(sock.recv(65536))
                except TimeoutError:
                    continue
        finally:
            sock.close()
        return heard

    heard, result = await asyncio.gather(
        asyncio.to_thread(listen, 1.5), receive_issue(shelf, group, last, tmp_path / "r")
    )
    assert heard and max(len(d) for d in heard) <= ANNOUNCEMENT_PART_BYTES
    gate = AnnouncementGate({shelf.public_hex})
    named: set[str] = set()
    for datagram in heard:
        ann, verdict, _ = check_datagram(datagram, gate, now_unix=time.time())
        assert verdict is AnnouncementVerdict.ACCEPTED and ann is not None
        named.update(c.issue_id for c in ann.carousels)
    assert named == set(issues)
    assert sender._announcer is not None and not sender._announcer.done()
    # the receiver of the last one never took another part of the round for "stopped"
    assert result.completed and result.path is not None, result.reason
    assert result.path.read_bytes() == data[last]
