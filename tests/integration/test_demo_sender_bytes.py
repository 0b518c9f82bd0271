"""The demo's multicast sender row: the bytes the sender sent, read during the run.

`pressrun demo` read the sender's ``/metrics`` once, after the crowd; by then the
balancer had stopped the carousel and the sender had dropped its per-channel series,
so the report said 0.0 MB sent beside 268.6 MB the clients took from the carousel
(docs/demo.md). A real sender on 127.0.0.1 (real UDP multicast), a carousel started
and stopped through its API, as the demo's balancer does.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp

from pressrun.content.keys import generate_keypair, load_signing_key
from pressrun.content.publish import publish
from pressrun.demo.sender_bytes import (
    SenderBytes,
    parse_bytes_sent,
    read_sender_bytes,
    sender_bytes_watched,
)
from pressrun.multicast.config import CarouselConfig
from pressrun.multicast.net import free_udp_port

TOKEN = "demo-sender-bytes-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_series_that_vanish_and_come_back_are_summed() -> None:
    a = (("channel", "0"), ("issue", "w"))
    b = (("channel", "1"), ("issue", "w"))
    sent = SenderBytes()
    sent.observe({a: 100.0, b: 50.0})
    sent.observe({a: 300.0, b: 50.0})
    sent.observe({})  # the carousel stopped: its series are gone
    assert sent.total == 350.0
    sent.observe({a: 40.0})  # started again: a new series from zero
    assert sent.total == 390.0


async def test_the_sender_row_counts_a_carousel_stopped_before_the_end(tmp_path: Path) -> None:
    from pressrun.multicast.sender import MulticastSender, SenderServiceConfig

    key, _ = generate_keypair(tmp_path / "publisher.key")
    content = tmp_path / "content"
    content.mkdir()
    source = tmp_path / "weekly-s.pdf"
    source.write_bytes(random.Random(5).randbytes(200_000))
    publish(source, issue_id="weekly-s", title="s", key_path=key, content_dir=content)
    rng = random.Random()
    a, b = rng.randrange(1, 255), rng.randrange(1, 200)
    sender = MulticastSender(
        SenderServiceConfig(
            content_dir=content,
            control_group=(f"239.255.{a}.{b}", free_udp_port()),
            signing_key=load_signing_key(key),
            token=TOKEN,
            carousel=CarouselConfig(channels=1, rate_bps=8e6),
            group_base=f"239.255.{a}.{b + 1}",
            interface="127.0.0.1",
        )
    )
    await sender.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with sender_bytes_watched(sender.url, interval_s=0.1) as sent:
                async with http.post(
                    f"{sender.url}/v1/carousels", json={"issue_id": "weekly-s"}, headers=AUTH
                ) as resp:
                    assert resp.status == 201, await resp.text()
                for _ in range(100):  # until it has sent for a while (about 1 MB/s)
                    if sent.total >= 500_000:
                        break
                    await asyncio.sleep(0.05)
                async with http.delete(f"{sender.url}/v1/carousels/weekly-s", headers=AUTH) as resp:
                    assert resp.status == 200, await resp.text()
                for _ in range(40):  # the send thread drops the stopped carousel's series
                    async with http.get(f"{sender.url}/metrics") as resp:
                        if not parse_bytes_sent(await resp.text()):
                            break
                    await asyncio.sleep(0.05)
            # one read now, as the demo did: nothing left to read
            at_end = SenderBytes()
            await read_sender_bytes(http, sender.url, at_end)
        assert at_end.total == 0.0
        assert sent.total >= 500_000
    finally:
        await sender.close()
