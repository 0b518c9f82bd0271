"""Browser readers (``peer=webrtc``) in the directive: at swarm-level demand, and at
multicast-level demand (a browser cannot join a group), they are sent to the swarm with
the WebSocket tracker, the torrent and the origins as web seeds; they count in the
demand like desktop clients; the directives of everyone else are unchanged."""

from __future__ import annotations

import random

import pytest

from pressrun.balancer.algorithms import make_algorithm
from pressrun.balancer.codec import RequestFormatError, encode_directive, parse_peer
from pressrun.balancer.config import BalancerConfig
from pressrun.balancer.core import BalancerCore
from pressrun.balancer.demand import DemandConfig, DemandPolicy, swarm_info_for
from pressrun.balancer.events import (
    DeliveryMode,
    Directive,
    DirectiveRequested,
    MulticastInfo,
    OriginSpec,
    OriginStatus,
    StatusReceived,
)
from pressrun.tracker.websocket_urls import webtorrent_tracker_url, with_webtorrent_trackers

A, B = "http://127.0.0.1:8001", "http://127.0.0.1:8002"
SWARM = swarm_info_for(A, "http://127.0.0.1:6969/announce", "w", "ab" * 20, "w.pdf")
CAROUSEL = MulticastInfo("239.255.70.1:5400", "127.0.0.1")
CFG = DemandConfig(
    tau_s=10.0,
    typical_download_s=30.0,
    enter_downloaders=20.0,
    leave_downloaders=8.0,
    min_dwell_s=5.0,
    multicast_enter_downloaders=60.0,
    multicast_leave_downloaders=30.0,
)


def core_with(policy: DemandPolicy) -> BalancerCore:
    origins = (OriginSpec("a", A), OriginSpec("b", B))
    core = BalancerCore(
        BalancerConfig(),
        origins,
        make_algorithm("alg2", origins, random.Random(1), None),
        policy,
        now=0.0,
    )
    for name in ("a", "b"):
        status = OriginStatus(name, 0.1, 0.1, 0.0, 1.25e8, issues=frozenset({"w"}))
        core.handle_status_received(StatusReceived(status), now=0.0)
    return core


def ask(core: BalancerCore, now: float, *, webrtc: bool) -> Directive:
    result = core.handle_directive_requested(DirectiveRequested("w", webrtc=webrtc), now=now)
    assert isinstance(result, Directive)
    return result


def test_the_websocket_tracker_follows_from_the_announce_url() -> None:
    assert webtorrent_tracker_url("http://t:6969/announce") == "ws://t:6969/webtorrent"
    assert webtorrent_tracker_url("https://t/x/announce?a=1") == "wss://t/x/webtorrent"
    assert webtorrent_tracker_url("udp://t:6969/announce") is None
    assert webtorrent_tracker_url("http://t:6969/scrape") is None
    assert with_webtorrent_trackers(["http://t:1/announce", "ws://t:1/webtorrent"]) == [
        "http://t:1/announce",
        "ws://t:1/webtorrent",
    ]


def test_peer_parameter() -> None:
    assert parse_peer({}) is False and parse_peer({"peer": "webrtc"}) is True
    with pytest.raises(RequestFormatError, match="peer= must be webrtc"):
        parse_peer({"peer": "tcp"})


def test_at_low_demand_a_browser_gets_the_origins_like_anyone() -> None:
    core = core_with(DemandPolicy(CFG, {"w": SWARM}, {}))
    d = ask(core, 0.0, webrtc=True)
    assert d.mode is DeliveryMode.ORIGIN and d.swarm is None


def test_at_swarm_demand_a_browser_gets_the_websocket_tracker_and_web_seeds() -> None:
    core = core_with(DemandPolicy(CFG, {"w": SWARM}, {}))
    # browsers alone make the crowd: 1 request/s for 30 s -> D ~ 28 >= 20 (swarm)
    modes = [ask(core, i * 1.0, webrtc=True).mode for i in range(30)]
    assert modes[0] is DeliveryMode.ORIGIN and modes[-1] is DeliveryMode.SWARM
    d = ask(core, 30.0, webrtc=True)
    doc = encode_directive(d)
    assert doc["mode"] == "swarm" and doc["fallbacks"] == ["origin"]
    assert doc["swarm"] == {
        "torrent_url": f"{A}/content/w/w.torrent",
        "tracker_url": "http://127.0.0.1:6969/announce",
        "info_hash": "ab" * 20,
        "webtorrent_url": "ws://127.0.0.1:6969/webtorrent",
        "web_seeds": [f"{o['url']}/content/w/w.pdf" for o in doc["origins"]],
    }
    assert {o["url"] for o in doc["origins"]} == {A, B}
    # a desktop client's directive at the same moment is the same as before
    desktop = encode_directive(ask(core, 30.1, webrtc=False))
    assert desktop["mode"] == "swarm"
    assert desktop["swarm"] == {
        "torrent_url": f"{A}/content/w/w.torrent",
        "tracker_url": "http://127.0.0.1:6969/announce",
        "info_hash": "ab" * 20,
    }


def test_at_multicast_demand_a_browser_goes_to_the_swarm_desktops_to_the_carousel() -> None:
    policy = DemandPolicy(CFG, {"w": SWARM}, {"w": CAROUSEL})
    core = core_with(policy)
    # half browsers, half desktop clients: 4 requests/s for 40 s -> D ~ 110 >= 60
    for i in range(160):
        ask(core, i * 0.25, webrtc=i % 2 == 0)
    assert policy.carousels_wanted() == {"w"}
    desktop = ask(core, 40.0, webrtc=False)
    assert desktop.mode is DeliveryMode.MULTICAST and desktop.multicast == CAROUSEL
    browser = ask(core, 40.1, webrtc=True)
    assert browser.mode is DeliveryMode.SWARM and browser.multicast is None
    assert browser.swarm is not None
    assert browser.swarm.webtorrent_url == "ws://127.0.0.1:6969/webtorrent"
    assert browser.fallbacks == (DeliveryMode.ORIGIN,)


def test_browsers_count_in_the_demand_like_desktop_clients() -> None:
    mixed = DemandPolicy(CFG, {"w": SWARM}, {})
    desktops = DemandPolicy(CFG, {"w": SWARM}, {})
    c1, c2 = core_with(mixed), core_with(desktops)
    for i in range(30):
        ask(c1, float(i), webrtc=i % 3 == 0)
        ask(c2, float(i), webrtc=False)
    assert mixed.estimate("w", now=30.0).downloaders == pytest.approx(
        desktops.estimate("w", now=30.0).downloaders
    )
    assert mixed.estimate("w", now=30.0).downloaders > 20


def test_a_tracker_without_a_websocket_route_keeps_a_browser_on_the_origins() -> None:
    udp = swarm_info_for(A, "udp://127.0.0.1:6969/announce", "w", "ab" * 20, "w.pdf")
    core = core_with(DemandPolicy(CFG, {"w": udp}, {}))
    for i in range(30):
        ask(core, float(i), webrtc=False)
    assert ask(core, 30.0, webrtc=False).mode is DeliveryMode.SWARM
    assert ask(core, 30.1, webrtc=True).mode is DeliveryMode.ORIGIN


def test_full_origins_send_swarm_bound_readers_to_the_swarm_not_away() -> None:
    """`headroom` refuses a download no origin has room for; at swarm-level demand the
    reader does not need that room (the origins are its web seeds and last fallback),
    so it is sent to the swarm. Before, the core ranked origins first and refused all 30
    (ALL_FULL) while `alg2`, which ranks full origins too, sent all 30 to the swarm.
    At origin-level demand the refusal stands."""
    origins = (OriginSpec("a", A), OriginSpec("b", B))
    core = BalancerCore(
        BalancerConfig(),
        origins,
        make_algorithm("headroom", origins, random.Random(1), None),
        DemandPolicy(CFG, {"w": SWARM}, {}),
        now=0.0,
    )
    for name in ("a", "b"):  # both links full
        status = OriginStatus(
            name, 0.5, 0.5, 1.25e8, 1.25e8, active_transfers=200, issues=frozenset({"w"})
        )
        core.handle_status_received(StatusReceived(status), now=0.0)
    first = core.handle_directive_requested(DirectiveRequested("w", webrtc=True), now=0.0)
    assert not isinstance(first, Directive)  # demand still at the origin level: full
    answers = [
        core.handle_directive_requested(
            DirectiveRequested("w", webrtc=i % 2 == 0), now=1.0 + i * 0.5
        )
        for i in range(60)
    ]
    late = answers[30:]  # demand at the swarm level by then
    assert all(isinstance(d, Directive) and d.mode is DeliveryMode.SWARM for d in late), late
    browser = late[0]
    assert isinstance(browser, Directive)
    assert browser.swarm is not None and browser.swarm.webtorrent_url is not None
    assert [o.name for o in browser.origins] == ["a", "b"]  # its web seeds
    assert browser.swarm.web_seeds == tuple(f"{u}/content/w/w.pdf" for u in (A, B))
    assert browser.fallbacks == (DeliveryMode.ORIGIN,)
