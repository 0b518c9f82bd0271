"""The WebTorrent tracker's relay decisions: which offer goes to which peer. Pure.

Browsers cannot reach a peer by address: they find each other through the tracker,
which relays WebRTC offers and answers (SDP) between the peers of a swarm over
WebSockets (the protocol of the npm ``bittorrent-tracker`` server,
``lib/server/parse-websocket.js``, and of aquatic's ``ws_protocol``; FIELD-NOTES.md,
"WebTorrent"). libtorrent 2.1 speaks it too, so desktop peers and readers meet in one
swarm.

The frames and their parsing are `pressrun.tracker.websocket_codec`. Out: the
announce reply ``{action, info_hash, interval, complete, incomplete}`` (the
adapter gets the counts from the tracker core, which accounts a browser's bytes like
a desktop peer's: `announce_request`, `upload_claim_supported`), each offer forwarded
to one other peer of the swarm as ``{action, info_hash, peer_id, offer_id, offer}``,
each answer routed to the peer that made the offer, failures as
``{"failure reason", info_hash}``.

What a socket may hold (every key comes from the network, so every table is bounded):

- a socket joins at most ``max_swarms_per_socket`` swarms, and a (swarm, peer_id) is
  bound to the first open socket that announced it: another socket cannot take over a
  peer's answers;
- a swarm's directory holds at most ``max_peers_per_swarm`` peers (local and on other
  instances, `learn_peers`);
- a socket is sent at most ``max_pending_offers`` offers it has not answered, and an
  answer is relayed only for an offer this relay delivered to that socket (an answer
  for a peer or offer that does not exist is dropped and counted);
- every frame spends a token of the socket's bucket (``rate_burst``, refilled at
  ``rate_per_s``); an SDP longer than ``max_sdp_bytes`` or more than
  ``max_offers_per_announce`` offers is refused; ``max_misbehaviour`` counted faults
  close the socket.

Several tracker instances: each peer in the directory carries the instance that holds
its socket. An offer or answer for a peer on another instance is a `Forward` effect
(the adapter publishes it on that instance's Redis channel) and arrives there through
`deliver`.

Time: ``now`` is monotonic seconds; nothing here reads a clock or opens a socket.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pressrun.tracker.accounting import continues_session
from pressrun.tracker.events import AnnounceEvent, AnnounceRequest, PeerRecord
from pressrun.tracker.websocket_codec import WsAnnounce, WsAnswer


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """Bounds of the relay (module docstring). Defaults: what browsers (5 offers an
    announce, SDP of 0.5-3 KB) and libtorrent (10 offers) send, with room to spare."""

    max_offers_per_announce: int = 10
    max_sdp_bytes: int = 8 * 1024
    max_frame_bytes: int = 128 * 1024
    max_swarms_per_socket: int = 8
    max_peers_per_swarm: int = 2_000
    max_swarms: int = 10_000
    max_sockets: int = 20_000
    max_pending_offers: int = 64
    pending_offer_ttl_s: float = 60.0
    rate_burst: float = 40.0
    rate_per_s: float = 10.0
    max_misbehaviour: int = 20
    #: a peer on another instance not heard of for this long is not offered to
    remote_peer_ttl_s: float = 180.0


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``payload`` (a JSON object) on the local socket ``socket_id``."""

    socket_id: int
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Forward:
    """Hand ``payload`` to ``instance``, which holds the socket of ``to_peer_id``."""

    instance: str
    info_hash: bytes
    to_peer_id: bytes
    from_peer_id: bytes
    payload: dict[str, Any]


class Fault(Enum):
    """What a peer did wrong (counted; enough of them close its socket)."""

    BAD_FRAME = "bad_frame"
    RATE = "rate"
    ANSWER_UNKNOWN = "answer_unknown"
    PEER_ID_TAKEN = "peer_id_taken"
    TOO_MANY_SWARMS = "too_many_swarms"
    UPLOAD_CLAIM = "upload_claim"


Effect = Send | Forward


def announce_request(msg: WsAnnounce, prev: PeerRecord | None) -> AnnounceRequest:
    """The tracker core's announce for a WebSocket one, so its bytes are accounted
    like an HTTP announce's. A WebRTC peer has no address to hand out: port 0 (the
    core hands out no port-0 peer), except that a desktop peer announcing on both
    trackers keeps the port its HTTP announce gave (one record, one set of totals)."""
    port = prev.port if prev is not None and prev.active else 0
    return AnnounceRequest(
        info_hash=msg.info_hash,
        peer_id=msg.peer_id,
        port=port,
        uploaded=msg.uploaded,
        downloaded=msg.downloaded,
        left=msg.left,
        event=msg.event,
        numwant=0,
        key=msg.key,
    )


def upload_claim_supported(
    req: AnnounceRequest,
    prev: PeerRecord | None,
    records: Iterable[PeerRecord],
    forgotten_downloaded: int,
) -> bool:
    """Whether the swarm's totals can support what ``req`` says was uploaded: the
    peer's total after it may not exceed what every other peer can have downloaded
    (their totals, an active leecher's ``left``, what forgotten records downloaded;
    `pressrun.tracker.swarm.others_download_bound`). A claim that cannot be true is
    refused whole, so nothing of it is counted."""
    if prev is not None and continues_session(prev, req):
        grown = req.uploaded - prev.session_uploaded
    else:
        grown = req.uploaded
    if grown <= 0:
        return True
    before = prev.uploaded_total if prev is not None else 0
    bound = forgotten_downloaded
    for record in records:
        if record.peer_id == req.peer_id:
            continue
        bound += record.downloaded_total
        if record.active and record.left > 0:
            bound += record.left
    return before + grown <= bound


@dataclass(slots=True)
class _Socket:
    """What the relay keeps about one open WebSocket."""

    opened: float
    tokens: float
    refilled: float
    faults: int = 0
    joined: set[tuple[bytes, bytes]] = field(default_factory=set)
    # (info_hash, offer_id, answerer peer_id) -> (offerer peer_id, delivered at), oldest first
    pending: OrderedDict[tuple[bytes, bytes, bytes], tuple[bytes, float]] = field(
        default_factory=OrderedDict
    )


@dataclass(slots=True)
class _Entry:
    """A peer in a swarm's directory."""

    instance: str
    seed: bool
    heard: float


class WebTorrentRelay:
    """Relay state of one tracker instance (module docstring)."""

    def __init__(self, config: RelayConfig, rng: random.Random, instance: str) -> None:
        self.config = config
        self.rng = rng
        self.instance = instance
        self._sockets: dict[int, _Socket] = {}
        # (info_hash, peer_id) -> local socket id
        self._local: dict[tuple[bytes, bytes], int] = {}
        # info_hash -> peer_id -> entry (local and remote peers)
        self._swarms: dict[bytes, dict[bytes, _Entry]] = {}
        self.faults: dict[Fault, int] = dict.fromkeys(Fault, 0)

    # -- sockets ------------------------------------------------------------------

    def open_socket(self, socket_id: int, *, now: float) -> bool:
        """A new WebSocket; False when the relay holds as many as it may."""
        if len(self._sockets) >= self.config.max_sockets:
            return False
        self._sockets[socket_id] = _Socket(opened=now, tokens=self.config.rate_burst, refilled=now)
        return True

    def close_socket(self, socket_id: int) -> list[tuple[bytes, bytes]]:
        """Forget a closed socket; answers the (info_hash, peer_id) it held, for the
        shared directory."""
        state = self._sockets.pop(socket_id, None)
        if state is None:
            return []
        for key in state.joined:
            self._leave(key)
        return sorted(state.joined)

    def _leave(self, key: tuple[bytes, bytes]) -> None:
        info_hash, peer_id = key
        self._local.pop(key, None)
        swarm = self._swarms.get(info_hash)
        if swarm is not None:
            swarm.pop(peer_id, None)
            if not swarm:
                del self._swarms[info_hash]

    @property
    def sockets(self) -> int:
        """Open sockets."""
        return len(self._sockets)

    def swarm_size(self, info_hash: bytes) -> int:
        """Peers in one swarm's directory (local and remote)."""
        return len(self._swarms.get(info_hash, {}))

    def pending_offers(self) -> int:
        """Offers delivered and not answered yet, over every socket."""
        return sum(len(s.pending) for s in self._sockets.values())

    def fault(self, socket_id: int, kind: Fault) -> bool:
        """Count a fault; True when the socket has now done enough to be closed."""
        self.faults[kind] += 1
        state = self._sockets.get(socket_id)
        if state is None:
            return True
        state.faults += 1
        return state.faults >= self.config.max_misbehaviour

    def admit(self, socket_id: int, *, now: float) -> bool:
        """Spend a token of the socket's bucket for one frame; False: over its rate."""
        state = self._sockets.get(socket_id)
        if state is None:
            return False
        elapsed = max(0.0, now - state.refilled)
        state.tokens = min(self.config.rate_burst, state.tokens + elapsed * self.config.rate_per_s)
        state.refilled = now
        if state.tokens < 1.0:
            return False
        state.tokens -= 1.0
        return True

    def owner(self, info_hash: bytes, peer_id: bytes) -> int | None:
        """The local socket bound to a peer of a swarm."""
        return self._local.get((info_hash, peer_id))

    # -- the directory of peers (other instances' too) ------------------------------

    def learn_peers(
        self, info_hash: bytes, peers: Mapping[bytes, tuple[str, bool, float]], *, now: float
    ) -> None:
        """What the shared directory says of a swarm: peer_id -> (instance, seed,
        age_s). Other instances' peers replace this relay's view of them; its own
        sockets' peers stay as this relay knows them. Older than ``remote_peer_ttl_s``:
        left out. At most ``max_peers_per_swarm`` kept."""
        swarm = self._swarms.get(info_hash)
        mine = {p: e for p, e in (swarm or {}).items() if e.instance == self.instance}
        fresh: dict[bytes, _Entry] = dict(mine)
        for peer_id, (instance, seed, age_s) in peers.items():
            if len(fresh) >= self.config.max_peers_per_swarm:
                break
            if instance == self.instance or peer_id in fresh:
                continue
            if age_s > self.config.remote_peer_ttl_s:
                continue
            fresh[peer_id] = _Entry(instance, seed, now - max(0.0, age_s))
        if fresh:
            if swarm is None and len(self._swarms) >= self.config.max_swarms:
                return
            self._swarms[info_hash] = fresh
        else:
            self._swarms.pop(info_hash, None)

    # -- frames -----------------------------------------------------------------------

    def join(self, socket_id: int, msg: WsAnnounce, *, now: float) -> Fault | None:
        """Bind the announcing peer to this socket (or say why not). A ``stopped``
        announce unbinds it."""
        state = self._sockets.get(socket_id)
        if state is None:
            raise KeyError(socket_id)
        key = (msg.info_hash, msg.peer_id)
        holder = self._local.get(key)
        if holder is not None and holder != socket_id:
            return Fault.PEER_ID_TAKEN
        if msg.event is AnnounceEvent.STOPPED:
            if holder == socket_id:
                state.joined.discard(key)
                self._leave(key)
            return None
        if key not in state.joined:
            if len(state.joined) >= self.config.max_swarms_per_socket:
                return Fault.TOO_MANY_SWARMS
            swarm = self._swarms.get(msg.info_hash)
            if swarm is None and len(self._swarms) >= self.config.max_swarms:
                return Fault.TOO_MANY_SWARMS
            if (
                swarm is not None
                and msg.peer_id not in swarm
                and len(swarm) >= self.config.max_peers_per_swarm
            ):
                return Fault.TOO_MANY_SWARMS
            state.joined.add(key)
            self._local[key] = socket_id
        self._swarms.setdefault(msg.info_hash, {})[msg.peer_id] = _Entry(
            self.instance, msg.left == 0, now
        )
        return None

    def handle_announce(
        self,
        socket_id: int,
        msg: WsAnnounce,
        *,
        now: float,
        not_to: Collection[bytes] = (),
    ) -> list[Effect]:
        """Forward each offer of a joined peer's announce to a different other peer
        of the swarm (a seed's only to leechers), none to a peer in ``not_to``. The
        reply itself is the adapter's (it carries the tracker core's counts)."""
        if msg.event is AnnounceEvent.STOPPED or not msg.offers:
            return []
        swarm = self._swarms.get(msg.info_hash, {})
        seed = msg.left == 0
        horizon = now - self.config.remote_peer_ttl_s
        candidates = sorted(
            peer_id
            for peer_id, entry in swarm.items()
            if peer_id != msg.peer_id
            and not (seed and entry.seed)
            and (entry.instance == self.instance or entry.heard >= horizon)
            and peer_id not in not_to
        )
        wanted = min(len(msg.offers), msg.numwant or len(msg.offers), len(candidates))
        targets = self.rng.sample(candidates, wanted)
        effects: list[Effect] = []
        for offer, target in zip(msg.offers, targets, strict=False):
            payload = {
                "action": "announce",
                "info_hash": msg.info_hash.decode("latin-1"),
                "peer_id": msg.peer_id.decode("latin-1"),
                "offer_id": offer.offer_id.decode("latin-1"),
                "offer": offer.offer.as_json(),
            }
            effect = self._route(msg.info_hash, target, msg.peer_id, payload, now=now)
            if effect is not None:
                effects.append(effect)
        return effects

    def handle_answer(self, socket_id: int, msg: WsAnswer, *, now: float) -> list[Effect] | Fault:
        """Route an answer back to the peer whose offer this socket was given; any
        other answer is a fault and goes nowhere."""
        state = self._sockets.get(socket_id)
        if state is None or self._local.get((msg.info_hash, msg.peer_id)) != socket_id:
            return Fault.ANSWER_UNKNOWN
        self._expire_pending(state, now)
        pending = state.pending.pop((msg.info_hash, msg.offer_id, msg.peer_id), None)
        if pending is None or pending[0] != msg.to_peer_id:
            return Fault.ANSWER_UNKNOWN
        payload = {
            "action": "announce",
            "info_hash": msg.info_hash.decode("latin-1"),
            "peer_id": msg.peer_id.decode("latin-1"),
            "offer_id": msg.offer_id.decode("latin-1"),
            "answer": msg.answer.as_json(),
        }
        effect = self._route(msg.info_hash, msg.to_peer_id, msg.peer_id, payload, now=now)
        return [] if effect is None else [effect]

    def _route(
        self,
        info_hash: bytes,
        to_peer_id: bytes,
        from_peer_id: bytes,
        payload: dict[str, Any],
        *,
        now: float,
    ) -> Effect | None:
        local = self._local.get((info_hash, to_peer_id))
        if local is not None:
            return self.deliver(info_hash, to_peer_id, from_peer_id, payload, now=now)
        entry = self._swarms.get(info_hash, {}).get(to_peer_id)
        if entry is None or entry.instance == self.instance:
            return None
        return Forward(entry.instance, info_hash, to_peer_id, from_peer_id, payload)

    def deliver(
        self,
        info_hash: bytes,
        to_peer_id: bytes,
        from_peer_id: bytes,
        payload: dict[str, Any],
        *,
        now: float,
    ) -> Send | None:
        """An offer or answer for a peer whose socket is here (from this instance or
        forwarded by another): the frame to send, or None when the peer is gone. An
        offer is remembered so that only its answer comes back; the socket's oldest
        unanswered offer makes room for a new one."""
        socket_id = self._local.get((info_hash, to_peer_id))
        if socket_id is None:
            return None
        state = self._sockets[socket_id]
        if "offer" in payload:
            offer_id = payload.get("offer_id")
            if not isinstance(offer_id, str):
                return None
            self._expire_pending(state, now)
            key = (info_hash, offer_id.encode("latin-1", "replace"), to_peer_id)
            state.pending[key] = (from_peer_id, now)
            state.pending.move_to_end(key)
            while len(state.pending) > self.config.max_pending_offers:
                state.pending.popitem(last=False)
        return Send(socket_id, payload)

    def _expire_pending(self, state: _Socket, now: float) -> None:
        horizon = now - self.config.pending_offer_ttl_s
        while state.pending:
            _, (_, at) = next(iter(state.pending.items()))
            if at >= horizon:
                break
            state.pending.popitem(last=False)
