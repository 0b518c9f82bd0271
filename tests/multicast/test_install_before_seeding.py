"""A carousel reader's copy is in the library before it seeds the swarm (issue 28's
seeding after the carousel lasts up to the profile's 30 min on a desktop): the reader
opens the issue at once, and the seeding's end only removes the partial folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from pressrun.balancer.demand import DemandPolicy, swarm_info_for
from pressrun.balancer.events import MulticastInfo
from pressrun.multicast.config import CarouselConfig
from pressrun.origin import OriginConfig, start_origin

from .conftest import ISSUE, PEAK_AT_ONCE, Published, fetch_through_balancer, multicast_client

SIZE = 600_000 + 17


async def test_the_carousel_copy_is_installed_before_it_seeds(
    published: Callable[[int], Published],
    sender_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("libtorrent")
    import pressrun.clients.aio
    from pressrun.multicast.net import free_udp_port

    pub = published(SIZE)
    library = pub.root / "library"
    sender = await sender_factory(pub, CarouselConfig(channels=2, rate_bps=20e6))
    await sender.start_carousel(ISSUE, sender.config.carousel)
    origin = await start_origin(
        OriginConfig(content_dir=pub.content, name="origin-a", stats_interval_s=0.2)
    )
    at_seeding: list[bytes | None] = []  # the library's copy when the seeding started
    seed = pressrun.clients.aio.seed_after_carousel

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        copies = list(library.glob(f"{ISSUE}/*.pdf"))
        at_seeding.append(copies[0].read_bytes() if copies else None)
        return await seed(*args, **kwargs)

    monkeypatch.setattr(pressrun.clients.aio, "seed_after_carousel", recorded)
    info_hash = json.loads(pub.manifest_json)["manifest"]["info_hash"]
    # no tracker answers there: the seed has no peer and seeds for its second
    tracker = f"http://127.0.0.1:{free_udp_port()}/announce"
    group = "{}:{}".format(*sender.config.control_group)
    policy = DemandPolicy(
        PEAK_AT_ONCE,
        {ISSUE: swarm_info_for(origin.url, tracker, ISSUE, info_hash)},
        {ISSUE: MulticastInfo(group, "127.0.0.1")},
    )
    result = await fetch_through_balancer(
        ISSUE, origin, policy, multicast_client(swarm_max_seed_s=1.0), publisher=pub
    )
    assert result.mode == "multicast" and result.bytes_from_multicast == SIZE
    assert at_seeding == [pub.data]  # the code before installed it after the seeding
    assert result.seeding_s > 0.5 and result.ready_s is not None
    assert result.ready_s < result.seconds - 0.5
    assert result.path.read_bytes() == pub.data
    assert not (library / ".partial" / ISSUE).exists()
