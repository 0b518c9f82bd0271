"""The WebTorrent relay's decisions, driven synchronously with an explicit ``now``."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from pressrun.tracker.events import AddressFamily, AnnounceEvent, PeerRecord
from pressrun.tracker.websocket_codec import FrameError, WsAnnounce, WsAnswer, parse_frame
from pressrun.tracker.websocket_relay import (
    Fault,
    Forward,
    RelayConfig,
    Send,
    WebTorrentRelay,
    announce_request,
    upload_claim_supported,
)

IH = bytes(range(20))
A, B, C = b"A" * 20, b"B" * 20, b"C" * 20
CONFIG = RelayConfig()


def latin(raw: bytes) -> str:
    return raw.decode("latin-1")


def announce_text(peer: bytes, *, offers: int = 0, left: int = 100, **extra: Any) -> str:
    body: dict[str, Any] = {
        "action": "announce",
        "info_hash": latin(IH),
        "peer_id": latin(peer),
        "uploaded": 0,
        "downloaded": 0,
        "left": left,
        "numwant": offers,
        "offers": [
            {"offer_id": latin(bytes([i]) * 20), "offer": {"type": "offer", "sdp": "v=0"}}
            for i in range(offers)
        ],
    }
    body.update(extra)
    return json.dumps(body)


def announce(relay: WebTorrentRelay, sock: int, peer: bytes, now: float, **kw: Any) -> Any:
    msg = parse_frame(announce_text(peer, **kw), CONFIG)
    assert isinstance(msg, WsAnnounce)
    assert relay.join(sock, msg, now=now) is None
    return relay.handle_announce(sock, msg, now=now)


def test_binary_ids_are_latin1_strings_of_twenty_bytes() -> None:
    msg = parse_frame(announce_text(bytes([0xFF]) * 20, offers=2), CONFIG)
    assert isinstance(msg, WsAnnounce)
    assert msg.peer_id == b"\xff" * 20 and len(msg.offers) == 2
    with pytest.raises(FrameError, match="20 bytes"):
        parse_frame(announce_text(b"short"), CONFIG)
    with pytest.raises(FrameError, match="latin-1"):
        parse_frame(announce_text(A).replace(latin(A), "\u0100" * 20), CONFIG)
    with pytest.raises(FrameError, match="JSON"):
        parse_frame("not json", CONFIG)
    with pytest.raises(FrameError, match="at most 10 offers"):
        parse_frame(announce_text(A, offers=11), CONFIG)
    with pytest.raises(FrameError, match="longer than"):
        parse_frame(announce_text(A, offers=1).replace('"v=0"', json.dumps("x" * 9000)), CONFIG)
    with pytest.raises(FrameError, match="between 0"):
        parse_frame(announce_text(A, uploaded=-5), CONFIG)


def test_each_offer_goes_to_a_different_peer_and_only_its_answer_comes_back() -> None:
    relay = WebTorrentRelay(CONFIG, random.Random(1), "one")
    for sock in (1, 2, 3):
        assert relay.open_socket(sock, now=0.0)
    assert announce(relay, 1, A, 0.0) == []  # alone: nothing to offer to
    announce(relay, 2, B, 1.0)
    effects = announce(relay, 3, C, 2.0, offers=5)
    assert sorted(e.socket_id for e in effects) == [1, 2]  # two others, one offer each
    assert all(isinstance(e, Send) and e.payload["peer_id"] == latin(C) for e in effects)
    to_a = next(e for e in effects if e.socket_id == 1)
    offer_id = to_a.payload["offer_id"].encode("latin-1")
    answer = WsAnswer(IH, A, C, offer_id, parse_sdp())
    # B was not given this offer: its answer is a fault and goes nowhere
    assert relay.handle_answer(2, WsAnswer(IH, B, C, offer_id, parse_sdp()), now=3.0) is (
        Fault.ANSWER_UNKNOWN
    )
    routed = relay.handle_answer(1, answer, now=3.0)
    assert isinstance(routed, list) and routed[0].socket_id == 3  # type: ignore[union-attr]
    # once: a second answer to the same offer is unknown
    assert relay.handle_answer(1, answer, now=3.1) is Fault.ANSWER_UNKNOWN


def parse_sdp() -> Any:
    from pressrun.tracker.websocket_codec import Sdp

    return Sdp("answer", "v=0")


def test_a_seed_offers_only_to_leechers_and_a_peer_id_is_bound_to_its_socket() -> None:
    relay = WebTorrentRelay(CONFIG, random.Random(2), "one")
    for sock in (1, 2, 3):
        relay.open_socket(sock, now=0.0)
    announce(relay, 1, A, 0.0, left=0)
    announce(relay, 2, B, 0.0, left=10)
    effects = announce(relay, 3, C, 0.0, left=0, offers=3)
    assert [e.socket_id for e in effects] == [2]
    hijack = parse_frame(announce_text(A), CONFIG)
    assert isinstance(hijack, WsAnnounce)
    assert relay.join(3, hijack, now=1.0) is Fault.PEER_ID_TAKEN
    assert relay.close_socket(1) == [(IH, A)]
    assert relay.join(3, hijack, now=2.0) is None  # free again once its socket closed


def test_rate_bucket_and_misbehaviour_close() -> None:
    config = RelayConfig(rate_burst=5, rate_per_s=1, max_misbehaviour=3)
    relay = WebTorrentRelay(config, random.Random(3), "one")
    relay.open_socket(1, now=0.0)
    assert [relay.admit(1, now=0.0) for _ in range(6)] == [True] * 5 + [False]
    assert relay.admit(1, now=1.0)  # one token a second
    assert not relay.fault(1, Fault.RATE) and not relay.fault(1, Fault.RATE)
    assert relay.fault(1, Fault.BAD_FRAME)


def test_state_is_bounded_per_socket_and_per_swarm() -> None:
    config = RelayConfig(max_swarms_per_socket=2, max_peers_per_swarm=3, max_pending_offers=4)
    relay = WebTorrentRelay(config, random.Random(4), "one")
    relay.open_socket(1, now=0.0)
    for i in range(3):
        other = WsAnnounce(bytes([i]) * 20, A, AnnounceEvent.NONE, 0, 0, 1, 0, None, ())
        expected = None if i < 2 else Fault.TOO_MANY_SWARMS
        assert relay.join(1, other, now=0.0) is expected
    for sock in range(2, 7):
        relay.open_socket(sock, now=0.0)
        msg = WsAnnounce(IH, bytes([sock]) * 20, AnnounceEvent.NONE, 0, 0, 1, 0, None, ())
        assert relay.join(sock, msg, now=0.0) is (None if sock < 5 else Fault.TOO_MANY_SWARMS)
    assert relay.swarm_size(IH) == 3
    for i in range(100):  # offers to one socket: only the newest few are remembered
        relay.deliver(
            IH,
            bytes([2]) * 20,
            B,
            {"offer_id": latin(bytes([i % 250]) * 20), "offer": {}},
            now=float(i),
        )
    assert relay.pending_offers() == 4


def test_a_peer_on_another_instance_is_a_forward_and_stale_ones_are_left_out() -> None:
    relay = WebTorrentRelay(CONFIG, random.Random(5), "one")
    relay.open_socket(1, now=100.0)
    relay.learn_peers(IH, {B: ("two", False, 1.0), C: ("three", False, 999.0)}, now=100.0)
    effects = announce(relay, 1, A, 100.0, offers=3)
    assert len(effects) == 1 and isinstance(effects[0], Forward)
    assert effects[0].instance == "two" and effects[0].to_peer_id == B
    # the other instance delivers it to its socket: a Send, and the offer is expected
    other = WebTorrentRelay(CONFIG, random.Random(6), "two")
    other.open_socket(7, now=0.0)
    msg = WsAnnounce(IH, B, AnnounceEvent.NONE, 0, 0, 1, 0, None, ())
    other.join(7, msg, now=0.0)
    sent = other.deliver(IH, B, A, effects[0].payload, now=1.0)
    assert sent is not None and sent.socket_id == 7
    offer_id = effects[0].payload["offer_id"].encode("latin-1")
    other.learn_peers(IH, {A: ("one", False, 0.0)}, now=1.0)
    back = other.handle_answer(7, WsAnswer(IH, B, A, offer_id, parse_sdp()), now=2.0)
    assert isinstance(back, list) and isinstance(back[0], Forward) and back[0].instance == "one"


def record(peer: bytes, *, down: int, up: int = 0, left: int = 0) -> PeerRecord:
    return PeerRecord(
        IH,
        peer,
        AddressFamily.IPV4,
        "10.0.0.1",
        0,
        left,
        up,
        down,
        up,
        down,
        None,
        True,
        False,
        0,
        0.0,
        0.0,
    )


def test_an_upload_the_swarm_cannot_have_downloaded_is_refused() -> None:
    others = [record(B, down=1000), record(C, down=0, left=500)]
    honest = WsAnnounce(IH, A, AnnounceEvent.NONE, 1500, 0, 0, 0, None, ())
    forged = WsAnnounce(IH, A, AnnounceEvent.NONE, 10**12, 0, 0, 0, None, ())
    assert upload_claim_supported(announce_request(honest, None), None, others, 0)
    assert not upload_claim_supported(announce_request(forged, None), None, others, 0)
    # the same claim again (same session counters) adds nothing, so it is supported
    prev = record(A, down=0, up=1500)
    assert upload_claim_supported(announce_request(honest, prev), prev, others, 0)


def test_a_desktop_peer_keeps_its_http_port_and_a_browser_gets_port_zero() -> None:
    msg = WsAnnounce(IH, A, AnnounceEvent.STARTED, 0, 0, 5, 0, None, ())
    assert announce_request(msg, None).port == 0
    desktop = PeerRecord(
        IH, A, AddressFamily.IPV4, "10.0.0.1", 6881, 5, 0, 0, 0, 0, None, True, False, 0, 0.0, 0.0
    )
    assert announce_request(msg, desktop).port == 6881


def test_the_http_announce_hands_out_no_webrtc_only_peer() -> None:
    from pressrun.tracker.config import TrackerConfig
    from pressrun.tracker.core import TrackerCore
    from pressrun.tracker.events import AnnounceRequest

    core = TrackerCore(TrackerConfig(), random.Random(7))
    browser = announce_request(WsAnnounce(IH, A, AnnounceEvent.STARTED, 0, 0, 9, 0, None, ()), None)
    core.handle_announce(browser, remote="10.0.0.2", now=0.0)
    desktop = AnnounceRequest(IH, B, 6881, 0, 0, 9, AnnounceEvent.STARTED)
    handled = core.handle_announce(desktop, remote="10.0.0.3", now=1.0)
    assert handled.reply.peers == ()  # the browser is in the swarm, not in the list
    assert handled.reply.incomplete == 2
