"""The AMT gateway's pure core against the relay's pure core (no socket): discovery,
handshake, joins and leaves through Membership Updates, keep-alive Requests at the
relay's query interval, retries, a relay that restarted, and a loaded relay."""

from __future__ import annotations

import itertools

from pressrun.multicast import amt
from pressrun.multicast.gateway import GatewayCore, RelayRefused, Send
from pressrun.multicast.relay import Join, Leave, RelayConfig, RelayCore, Reply

GW = ("198.51.100.7", 40000)
RELAY = ("203.0.113.9", amt.AMT_PORT)
CH1, CH2 = ("192.0.2.1", "232.1.1.1"), ("192.0.2.1", "232.1.1.2")


def _exchange(
    gateway: GatewayCore, relay: RelayCore, effects: list, now: float
) -> tuple[list[object], list[object]]:
    """Deliver the gateway's sends to the relay and the relay's replies back, until
    quiet; (relay effects other than replies, gateway effects other than sends)."""
    relay_out: list[object] = []
    gateway_out: list[object] = []
    pending = list(effects)
    while pending:
        effect = pending.pop(0)
        if isinstance(effect, Send):
            for r in relay.handle(effect.data, GW, now=now):
                if isinstance(r, Reply):
                    assert r.to == GW
                    pending += gateway.handle(r.data, now=now)
                else:
                    relay_out.append(r)
        else:
            gateway_out.append(effect)
    return relay_out, gateway_out


def test_discovery_handshake_joins_leaves_and_keepalives() -> None:
    relay = RelayCore(RelayConfig(relay_address=RELAY[0], query_interval_s=15), b"k")
    nonces = itertools.count(100)
    gw = GatewayCore(nonces=lambda: next(nonces), discovery=RELAY, keepalive_s=20.0)
    assert gw.join(CH1) == []  # before the handshake: kept for the state report
    joined, _ = _exchange(gw, relay, gw.start(now=0.0), 0.0)
    assert gw.relay == RELAY and gw.ready and joined == [Join(CH1)]
    assert gw.interval_s == 15  # the relay's QQIC, under our 20 s
    assert _exchange(gw, relay, gw.join(CH2), 1.0)[0] == [Join(CH2)]
    assert _exchange(gw, relay, gw.leave(CH1), 2.0)[0] == [Leave(CH1)]
    # the keep-alive: a Request at the query interval, the whole state again
    assert gw.next_deadline() == 15.0 and gw.handle_timer(now=14.0) == []
    out, _ = _exchange(gw, relay, gw.handle_timer(now=15.0), 15.0)
    assert out == [] and list(relay.destinations(*CH2)) == [GW]
    # the tunnel outlives the relay's timeout only through the keep-alives
    for t in (30.0, 45.0, 60.0, 75.0):
        _exchange(gw, relay, gw.handle_timer(now=t), t)
        assert relay.handle_timer(now=t) == []
    # a relay that restarted (no tunnel, another secret) gets the state back
    relay2 = RelayCore(RelayConfig(relay_address=RELAY[0], query_interval_s=15), b"other")
    assert _exchange(gw, relay2, gw.handle_timer(now=90.0), 90.0)[0] == [Join(CH2)]


def test_unanswered_requests_back_off_and_stale_answers_are_ignored() -> None:
    nonces = itertools.count(1)
    gw = GatewayCore(nonces=lambda: next(nonces), relay=RELAY)
    (first,) = gw.start(now=0.0)
    assert isinstance(first, Send) and amt.decode(first.data) == amt.Request(1)
    times = []
    now = 0.0
    for _ in range(7):
        now = gw.next_deadline() or now
        times.append(now)
        gw.handle_timer(now=now)
    assert times == [1.0, 3.0, 7.0, 15.0, 31.0, 61.0, 91.0]  # 1, 2, 4 ... 30 s
    # a query for an older nonce (1) is not ours any more
    relay = RelayCore(RelayConfig(), b"k")
    (reply,) = relay.handle(amt.encode(amt.Request(1)), GW, now=0.0)
    assert isinstance(reply, Reply) and gw.handle(reply.data, now=now) == [] and not gw.ready
    assert gw.handle(b"junk", now=now) == []


def test_a_loaded_relay_is_refused_and_not_asked_again() -> None:
    relay = RelayCore(RelayConfig(max_tunnels=1), b"k")
    other = GatewayCore(nonces=iter(range(50, 99)).__next__, relay=RELAY)
    other.join(CH1)
    pending = other.start(now=0.0)
    for effect in pending:  # the other gateway takes the only tunnel
        assert isinstance(effect, Send)
        for r in relay.handle(effect.data, ("198.51.100.8", 1), now=0.0):
            if isinstance(r, Reply):
                for e in other.handle(r.data, now=0.0):
                    assert isinstance(e, Send)
                    relay.handle(e.data, ("198.51.100.8", 1), now=0.0)
    assert len(relay.tunnels) == 1
    gw = GatewayCore(nonces=iter(range(1, 49)).__next__, relay=RELAY)
    _, refused = _exchange(gw, relay, gw.start(now=0.0), 0.0)
    assert refused == [RelayRefused(RELAY)] and gw.next_deadline() is None
    assert gw.join(CH1) == []  # nothing goes to a loaded relay


def test_the_gateway_socket_moves_to_the_next_relay_when_one_stays_silent() -> None:
    """`AmtGateway` (the adapter, real UDP on 127.0.0.1, explicit ``now``): a relay
    that never answers is given up after RELAY_ANSWER_S and the next one is asked,
    with the channels wanted so far; when none is left the gateway says why."""
    import socket

    from pressrun.multicast.gateway import RELAY_ANSWER_S, AmtGateway

    silent = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for s in silent:
        s.bind(("127.0.0.1", 0))
        s.settimeout(1.0)
    first, second = (s.getsockname() for s in silent)
    gw = AmtGateway([first, second], bind=("127.0.0.1", 0))
    try:
        gw.listen("192.0.2.1", "232.1.1.1", 5000)
        gw.start(now=0.0)
        assert isinstance(amt.decode(silent[0].recv(100)), amt.Request)
        assert gw.next_deadline() == 1.0  # the first retry
        gw.poll(now=1.0)
        assert isinstance(amt.decode(silent[0].recv(100)), amt.Request)
        gw.poll(now=RELAY_ANSWER_S)  # silent too long: the next relay
        assert gw.relay == second and gw.failed is None
        assert gw.next_deadline() == 0.0
        gw.poll(now=RELAY_ANSWER_S)
        assert isinstance(amt.decode(silent[1].recv(100)), amt.Request)
        assert gw.core.channels == {("192.0.2.1", "232.1.1.1")}
        gw.poll(now=3 * RELAY_ANSWER_S)
        assert gw.failed is not None and "did not answer" in gw.failed
        assert gw.next_deadline() is None
    finally:
        gw.close()
        for s in silent:
            s.close()


def test_the_gateway_socket_takes_datagrams_from_its_relay_only() -> None:
    """A stranger who learns the gateway's port and sends it Multicast Data of the
    control channel gets nothing in: the socket is connected to the relay it talks
    to (the kernel drops other senders' datagrams), the relay's own get through."""
    import socket

    from pressrun.multicast.gateway import AmtGateway

    relay, stranger = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
    for s in (relay, stranger):
        s.bind(("127.0.0.1", 0))
        s.settimeout(1.0)
    gw = AmtGateway([relay.getsockname()], bind=("127.0.0.1", 0))
    try:
        gw.listen("192.0.2.1", "232.1.1.1", 5000)
        gw.start(now=0.0)
        _, gateway_address = relay.recvfrom(100)
        datagram = amt.udp_datagram(("192.0.2.1", 4000), ("232.1.1.1", 5000), b"announcement")
        data = amt.encode(amt.MulticastData(datagram))
        stranger.sendto(data, gateway_address)
        relay.sendto(data, gateway_address)
        import time

        time.sleep(0.1)
        assert gw.read(now=0.1) == [b"announcement"]  # the relay's, once
    finally:
        gw.close()
        relay.close()
        stranger.close()
