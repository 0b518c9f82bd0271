"""The WebTorrent tracker's asyncio adapter: ``GET /webtorrent`` (a WebSocket).

Each text frame is parsed (`pressrun.tracker.websocket_codec`) and goes to the pure
relay (`pressrun.tracker.websocket_relay`): the socket's rate bucket, the frame's
bounds, then for an announce the same allowlist as
``/announce`` (``TrackerCore.refusal``), the same accounting (the announce becomes a
tracker-core announce through the service, so the store and ``/v1/swarms`` have the
browser's bytes; an upload the swarm's totals cannot support is refused whole) and
the relay's forwarding of its offers; an answer is routed to the peer whose offer it
answers. No token: announces never needed one; TLS (``wss://``) is the service's.

Several instances on one Redis (``RedisStore``): each keeps its sockets; a swarm's
WebRTC peers are listed in the hash ``<prefix>ws:peers:<info_hash hex>`` (peer_id hex
-> ``instance|seed|wall time``), and an offer or answer for a peer on another instance
is published on that instance's channel ``<prefix>ws:to:<instance>``, which it
subscribes to and delivers from. One sender task a socket with a bounded queue: a
slow browser loses frames (it re-announces), it never holds up the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from pressrun.tracker.accounting import family_of
from pressrun.tracker.core import effective_address
from pressrun.tracker.events import AddressFamily, AnnounceEvent
from pressrun.tracker.redis_store import RedisStore
from pressrun.tracker.websocket_codec import (
    FrameError,
    WsAnnounce,
    WsAnswer,
    failure,
    parse_frame,
)
from pressrun.tracker.websocket_relay import (
    Effect,
    Fault,
    Forward,
    RelayConfig,
    Send,
    WebTorrentRelay,
    announce_request,
    upload_claim_supported,
)

if TYPE_CHECKING:
    from pressrun.tracker.aio import TrackerService

log = logging.getLogger(__name__)

#: the WebSocket tracker's path (torrents name ``ws://host:port/webtorrent``)
WEBTORRENT_PATH = "/webtorrent"
#: frames waiting for one socket beyond this are dropped
SEND_QUEUE = 64
# how long a closing socket's queued frames (the failure reasons that closed it among
# them) may take to go out before the socket is closed without them
CLOSE_DRAIN_S = 2.0


class _Peer:
    """One open socket: its queue and sender task."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(SEND_QUEUE)
        self.task: asyncio.Task[None] | None = None

    def put(self, payload: dict[str, Any] | None) -> bool:
        try:
            self.queue.put_nowait(payload)
        except asyncio.QueueFull:
            return False
        return True

    async def pump(self) -> None:
        while True:
            payload = await self.queue.get()
            if payload is None or self.ws.closed:
                return
            try:
                await self.ws.send_str(json.dumps(payload))
            except (ConnectionError, RuntimeError):
                return


class WebTorrentTracker:
    """The WebSocket route of one tracker service (module docstring)."""

    def __init__(
        self,
        service: TrackerService,
        config: RelayConfig | None = None,
        *,
        rng: random.Random | None = None,
        instance: str | None = None,
    ) -> None:
        self.service = service
        self.config = config or RelayConfig()
        self.instance = instance or secrets.token_hex(8)
        self.relay = WebTorrentRelay(self.config, rng or random.Random(), self.instance)
        self._peers: dict[int, _Peer] = {}
        self._next_id = 0
        self._redis: Any = None
        self._listener: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        # socket -> (its address, the last announce of each peer it holds): an open
        # socket is a present peer, and libtorrent re-announces over a WebSocket only
        # once a minute, so the core hears it again from here (`_keep_alive`)
        self._present: dict[int, tuple[str, dict[tuple[bytes, bytes], WsAnnounce]]] = {}
        store = service.store
        self._prefix = store.prefix if isinstance(store, RedisStore) else ""
        self._redis_url = store.url if isinstance(store, RedisStore) else None

    def add_routes(self, app: web.Application) -> None:
        """The route, and the start/stop of the Redis channel with the app."""
        app.router.add_get(WEBTORRENT_PATH, self.handle)
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)

    # -- life cycle -------------------------------------------------------------------

    async def _startup(self, app: web.Application) -> None:
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())
        if self._redis_url is None:
            return
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(self._redis_url)
        pubsub = self._redis.pubsub()
        await pubsub.subscribe(self._channel(self.instance))
        self._listener = asyncio.get_running_loop().create_task(self._listen(pubsub))

    async def _shutdown(self, app: web.Application) -> None:
        for peer in list(self._peers.values()):
            await peer.ws.close(code=1001, message=b"tracker stopping")
        for task in (self._listener, self._keeper):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose()

    async def _keep_alive(self) -> None:
        """Every interval, each open socket's peers are heard again by the core with
        their last counters (which adds no byte: the same session's counters): a
        WebRTC peer is present while its socket is open, whatever its client's
        re-announce interval, and expires like any peer once the socket is gone."""
        while True:
            await asyncio.sleep(self.service.core.config.interval_s / 2)
            for remote, held in list(self._present.values()):
                for msg in list(held.values()):
                    try:
                        if self.service.core.refusal(msg.info_hash) is not None:
                            continue
                        prev = self.service.core.record(
                            msg.info_hash, (msg.peer_id, _family(remote))
                        )
                        if prev is None or not prev.active:
                            continue
                        again = replace(msg, event=AnnounceEvent.NONE, offers=())
                        await self.service._handle_announce(announce_request(again, prev), remote)
                    except Exception:
                        log.exception("keeping a WebRTC peer's record alive failed")

    def _channel(self, instance: str) -> str:
        return f"{self._prefix}ws:to:{instance}"

    def _directory(self, info_hash: bytes) -> str:
        return f"{self._prefix}ws:peers:{info_hash.hex()}"

    async def _listen(self, pubsub: Any) -> None:
        """Frames other instances forward to this one's sockets."""
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                body = json.loads(message["data"])
                send = self.relay.deliver(
                    bytes.fromhex(body["info_hash"]),
                    bytes.fromhex(body["to"]),
                    bytes.fromhex(body["from"]),
                    body["payload"],
                    now=self.service.monotonic(),
                )
                if send is not None:
                    self._apply([send])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("a frame forwarded by another tracker instance failed")
                await asyncio.sleep(0.5)

    # -- the socket -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET /webtorrent``: the WebSocket tracker."""
        ws = web.WebSocketResponse(
            max_msg_size=self.config.max_frame_bytes, heartbeat=30.0, compress=False
        )
        await ws.prepare(request)
        self._next_id += 1
        socket_id = self._next_id
        if not self.relay.open_socket(socket_id, now=self.service.monotonic()):
            await ws.close(code=1013, message=b"tracker full; retry later")
            return ws
        peer = _Peer(ws)
        peer.task = asyncio.get_running_loop().create_task(peer.pump())
        self._peers[socket_id] = peer
        try:
            async for message in ws:
                if message.type is not WSMsgType.TEXT:
                    if message.type is WSMsgType.BINARY and self._fault(socket_id, Fault.BAD_FRAME):
                        break
                    continue
                try:
                    closing = await self._frame(socket_id, message.data, request.remote or "")
                except Exception:
                    log.exception("a WebTorrent frame failed")
                    closing = False
                if closing:
                    break
        finally:
            self._present.pop(socket_id, None)
            left = self.relay.close_socket(socket_id)
            del self._peers[socket_id]
            # the queued frames go out first: a socket closed for its faults is told why
            if peer.put(None) and peer.task is not None:
                await asyncio.wait({peer.task}, timeout=CLOSE_DRAIN_S)
            if peer.task is not None:
                peer.task.cancel()
                await asyncio.gather(peer.task, return_exceptions=True)
            await ws.close()
            if left and self._redis is not None:
                await self._unlist(left)
        return ws

    def _fault(self, socket_id: int, kind: Fault) -> bool:
        closing = self.relay.fault(socket_id, kind)
        self.service.metrics.failures.labels(f"ws_{kind.value}").inc()
        return closing

    def _say(self, socket_id: int, payload: dict[str, Any]) -> None:
        peer = self._peers.get(socket_id)
        if peer is not None:
            peer.put(payload)

    async def _frame(self, socket_id: int, text: str, remote: str) -> bool:
        """One frame; True when the socket is to be closed."""
        now = self.service.monotonic()
        if not self.relay.admit(socket_id, now=now):
            return self._fault(socket_id, Fault.RATE)
        try:
            msg = parse_frame(text, self.config)
        except FrameError as err:
            self._say(socket_id, failure(err.reason, err.info_hash))
            return self._fault(socket_id, Fault.BAD_FRAME)
        if isinstance(msg, WsAnswer):
            await self._learn(msg.info_hash)
            outcome = self.relay.handle_answer(socket_id, msg, now=now)
            if isinstance(outcome, Fault):
                return self._fault(socket_id, outcome)
            await self._effects(outcome)
            return False
        return await self._announce(socket_id, msg, remote)

    async def _announce(self, socket_id: int, msg: WsAnnounce, remote: str) -> bool:
        service = self.service
        refused = service.core.refusal(msg.info_hash)
        if refused is not None:
            reason = (
                "this tracker serves only published issues; this info_hash is not one"
                if refused == "unpublished"
                else "the tracker holds as many swarms as it may; retry later"
            )
            service.metrics.failures.labels(f"ws_{refused}").inc()
            self._say(socket_id, failure(reason, msg.info_hash))
            return self._fault(socket_id, Fault.BAD_FRAME)
        if not remote:
            self._say(socket_id, failure("the tracker cannot tell your address", msg.info_hash))
            return True
        if service.store.shared:
            await service._load_swarm(msg.info_hash)
        family_key = (msg.peer_id, _family(remote))
        prev = service.core.record(msg.info_hash, family_key)
        req = announce_request(msg, prev)
        stats = service.core.stats(msg.info_hash)
        records = service.core.records(msg.info_hash)
        forgotten = 0
        if stats is not None:
            forgotten = max(0, stats.downloaded_bytes - sum(r.downloaded_total for r in records))
        if not upload_claim_supported(req, prev, records, forgotten):
            self._say(
                socket_id,
                failure(
                    "the swarm's peers cannot have downloaded what this announce says it "
                    "uploaded; nothing of it was counted",
                    msg.info_hash,
                ),
            )
            return self._fault(socket_id, Fault.UPLOAD_CLAIM)
        joined = self.relay.join(socket_id, msg, now=service.monotonic())
        if joined is not None:
            self._say(socket_id, failure(f"announce refused ({joined.value})", msg.info_hash))
            return self._fault(socket_id, joined)
        desktop = prev is not None and prev.port != 0
        if desktop and (msg.event is AnnounceEvent.STOPPED or (prev and not prev.active)):
            # A desktop peer on both trackers (its record has the port its HTTP announce
            # gave) leaves by its HTTP `stopped`, which names its leave rule: a
            # WebSocket `stopped` would replace that rule with "unspecified", and a
            # WebSocket announce after it (libtorrent re-announces to every tracker as
            # it leaves) would bring the record back with port 0. Its bytes are
            # accounted by the announces that keep it active.
            complete, incomplete, _ = service.core.counts(msg.info_hash)
        else:
            handled = await service._handle_announce(req, remote)
            complete, incomplete = handled.reply.complete, handled.reply.incomplete
        held = self._present.setdefault(socket_id, (remote, {}))[1]
        if msg.event is AnnounceEvent.STOPPED:
            held.pop((msg.info_hash, msg.peer_id), None)
        else:
            held[(msg.info_hash, msg.peer_id)] = msg  # (at most 8: the relay's bound)
        service.metrics.announces.labels(f"ws_{msg.event.value or 'none'}").inc()
        self._say(
            socket_id,
            {
                "action": "announce",
                "info_hash": msg.info_hash.decode("latin-1"),
                "interval": service.core.config.interval_s,
                "complete": complete,
                "incomplete": incomplete,
            },
        )
        if self._redis is not None:
            await self._list(msg)
            await self._learn(msg.info_hash)
        # A desktop peer (its record has the port its HTTP announce gave) reaches the
        # other desktop peers over TCP through /announce: its offers go only to
        # WebRTC-only peers (browsers), not into DTLS connections that duplicate those.
        not_to: frozenset[bytes] = frozenset()
        if desktop and prev is not None and prev.active:
            not_to = frozenset(r.peer_id for r in records if r.port != 0 and r.active)
        await self._effects(
            self.relay.handle_announce(socket_id, msg, now=service.monotonic(), not_to=not_to)
        )
        return False

    async def _effects(self, effects: list[Effect]) -> None:
        local: list[Effect] = []
        for effect in effects:
            if isinstance(effect, Forward):
                await self._forward(effect)
            else:
                local.append(effect)
        self._apply(local)

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self._say(effect.socket_id, effect.payload)

    # -- the shared directory (Redis) ----------------------------------------------------

    async def _list(self, msg: WsAnnounce) -> None:
        key = self._directory(msg.info_hash)
        value = f"{self.instance}|{int(msg.left == 0)}|{time.time():.3f}"  # noqa: TID251
        try:
            if msg.event.value == "stopped":
                await self._redis.hdel(key, msg.peer_id.hex())
            else:
                await self._redis.hset(key, msg.peer_id.hex(), value)
                await self._redis.expire(key, int(self.config.remote_peer_ttl_s * 2))
        except Exception:
            log.exception("listing a WebRTC peer in the shared directory failed")

    async def _unlist(self, left: list[tuple[bytes, bytes]]) -> None:
        try:
            for info_hash, peer_id in left:
                await self._redis.hdel(self._directory(info_hash), peer_id.hex())
        except Exception:
            log.exception("unlisting WebRTC peers in the shared directory failed")

    async def _learn(self, info_hash: bytes) -> None:
        """Read a swarm's peers on every instance into the relay."""
        if self._redis is None:
            return
        try:
            raw = await self._redis.hgetall(self._directory(info_hash))
        except Exception:
            log.exception("reading the shared directory failed")
            return
        wall = time.time()  # noqa: TID251
        peers: dict[bytes, tuple[str, bool, float]] = {}
        stale: list[str] = []
        for field_, value in raw.items():
            try:
                instance, seed, at = value.decode().split("|")
                age = max(0.0, wall - float(at))
                peer_id = bytes.fromhex(field_.decode())
            except ValueError:
                continue
            if age > self.config.remote_peer_ttl_s * 2:
                stale.append(field_.decode())
                continue
            peers[peer_id] = (instance, seed == "1", age)
        self.relay.learn_peers(info_hash, peers, now=self.service.monotonic())
        if stale:
            try:
                await self._redis.hdel(self._directory(info_hash), *stale)
            except Exception:
                log.exception("pruning the shared directory failed")

    async def _forward(self, effect: Forward) -> None:
        body = json.dumps(
            {
                "info_hash": effect.info_hash.hex(),
                "to": effect.to_peer_id.hex(),
                "from": effect.from_peer_id.hex(),
                "payload": effect.payload,
            }
        )
        try:
            await self._redis.publish(self._channel(effect.instance), body)
        except Exception:
            log.exception("forwarding a WebRTC frame to instance %s failed", effect.instance)


def _family(remote: str) -> AddressFamily:
    return family_of(effective_address(None, remote))


def add_webtorrent_routes(app: web.Application, service: TrackerService) -> WebTorrentTracker:
    """Add ``/webtorrent`` to the tracker's app (one line in ``make_app``)."""
    tracker = WebTorrentTracker(service)
    tracker.add_routes(app)
    service.webtorrent = tracker  # type: ignore[attr-defined]
    return tracker
