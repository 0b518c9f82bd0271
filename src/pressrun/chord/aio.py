"""A supernode over asyncio: the Chord core, its messages over HTTP, the piece directory.

One supernode serves one issue's ring (docs/chord.md). It registers with the tracker
(the central administration), which places its ring id and lists the issue's
supernodes; it creates the ring or joins it through those, and re-registers every
``heartbeat_s`` (the list it gets back is the only membership it trusts: `restrict_to`).

Its HTTP routes (``/chord/v1/rpc``, ``/lookup``, ``/pieces``, ``/state``) are
`pressrun.chord.routes.SupernodeRoutes`; this module keeps the supernode's life cycle,
its tracker registration and heartbeat, the core's effects and timer, the outgoing
requests and the lookups the routes ask for.

The tracker's list is the ring's membership, and the id it lists for this supernode is
the one it takes: a tracker that placed it elsewhere (it lost its list, or expired the
supernode and could not give its id back) is followed, the supernode rejoins at the new
id (`_move_to`).

Outgoing requests are HTTP POSTs with a ``rpc_timeout_s`` timeout; the core itself
sends again after a timeout and routes around a node that stays silent. One timer
(``loop.call_at``) follows the core's ``next_deadline()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from pressrun.chord.codec import (
    CodecError,
    id_hex,
    parse_id,
    parse_node,
    parse_reply,
    reply_json,
    request_json,
)
from pressrun.chord.config import ChordConfig
from pressrun.chord.core import ChordNode, LocalProtocolError, Phase
from pressrun.chord.directory import PieceDirectory
from pressrun.chord.events import (
    Effect,
    HandoffReceived,
    LookupDone,
    LookupFailed,
    MessageDropped,
    NodeFailed,
    PredecessorChanged,
    Reply,
    Request,
    Send,
)
from pressrun.chord.ids import NodeRef
from pressrun.chord.pieces import piece_keys
from pressrun.chord.post import post_json
from pressrun.chord.routes import SupernodeRoutes

log = logging.getLogger(__name__)

#: a tracker that does not answer at start is asked again (a busy host)
_REGISTER_ATTEMPTS = 5
_NODES_FAILED_KEPT = 64


class SupernodeError(Exception):
    """The supernode cannot start (tracker unreachable or refusing it)."""


@dataclass(slots=True)
class SupernodeStats:
    requests_in: int = 0
    dropped: int = 0
    lookups: int = 0
    lookups_failed: int = 0
    uploader_answers: int = 0
    #: reports, questions and lookups from clients (`SupernodeHost` retires a
    #: supernode whose count stays still for its ``idle_s``)
    client_requests: int = 0
    refused_reports: int = 0
    moved: int = 0  # times the tracker placed it at another id and it rejoined there
    #: the last `_NODES_FAILED_KEPT` supernodes found dead (a ring running for weeks
    #: routes around many)
    nodes_failed: deque[str] = field(default_factory=lambda: deque(maxlen=_NODES_FAILED_KEPT))


#: what a bringer brings in at a time: one piece of 128 KiB, the publisher's default
#: piece size (two of 64 KiB; one of any larger size). A peer that holds one piece
#: nobody else holds is an uploader; a second such piece at the same peer adds none,
#: so the origins' first pieces go to as many peers as ask (docs/chord.md "Benches":
#: at N = 40, 768 KiB a bringer and two bringers a supernode gave 1.32-1.36x the bound,
#: one piece each 1.27-1.29x)
BRINGING_BYTES = 128 * 1024

#: peers that bring this supernode's pieces in at once (each one piece at a time,
#: `BRINGING_BYTES`): bounded so that in a crowd much larger than the issue's pieces
#: the origins' egress is not split over every piece at once (every first piece would
#: then arrive F / u_s after the start); eight a supernode did not bind at N = 40 with
#: five supernodes, two and four did (docs/chord.md "Benches")
MAX_BRINGERS = 8


#: with it above 0, a piece brought in from the origins should be whole within about
#: this long: the origins' egress, where a supernode is told it (``origin_bps``; the
#: bench tells it, `SupernodeHost` does not), is split among at most that long's worth
#: of pieces at once (`fetches_at_once`). Off: on the loopback bench at N = 40 (twenty
#: at once at 1 s) the first pieces came 0.4-0.6 s sooner and the ramp lost 1.5 s of T
#: instead of 1.7-1.9 (1.16x-1.17x against 1.18x; its answers say ``origins_held`` and
#: the peers' feeds take none of the room it leaves, `pressrun.peer.status`), but at
#: N = 80 (ten at once at half the rates) the origins sent 1.31 and 1.00 copies in two
#: clean runs (1.15 in a refused one; 1.36-1.76 before ``origins_held``), against
#: 1.00-1.02 without it, and the cause of the 1.31 was not traced (docs/results/
#: 2026-11-28-swarm-limit.md, sections 17 and 18)
ORIGIN_FETCH_S = 0.0


def fetches_at_once(
    origin_bps: int, num_pieces: int, file_bytes: int, supernodes: int, *, fetch_s: float
) -> int | None:
    """Pieces one supernode hands out to be brought in at once: its share of the pieces
    the origins complete in ``fetch_s`` (``origin_bps`` over the piece size, over the
    supernodes: the tracker places each at an equal share of the keys), at least one;
    None (no limit) where the origins' rate or the piece size is unknown, or
    ``fetch_s`` is 0.

    The origins share their egress among every fetch at once and a piece is of use to
    the swarm only once whole: on the loopback bench at N = 40 (2 MB/s, 128 KiB pieces)
    forty fetches, one a peer, each completed 1.5 to 2.9 s after the start and the
    swarm had nothing to trade until then (docs/results/2026-11-28-swarm-limit.md,
    section 15)."""
    if origin_bps <= 0 or num_pieces < 1 or file_bytes < 1 or fetch_s <= 0:
        return None
    ring = origin_bps * fetch_s * num_pieces / file_bytes
    return max(1, math.ceil(ring / max(1, supernodes)))


def bringing_per_peer(num_pieces: int, file_bytes: int) -> int:
    """Pieces a bringer brings in at a time: `BRINGING_BYTES` worth, at least one (one
    when the piece size is unknown)."""
    if num_pieces < 1 or file_bytes < 1:
        return 1
    return max(1, BRINGING_BYTES * num_pieces // file_bytes)


class Supernode:
    """One supernode of one issue (module docstring)."""

    def __init__(
        self,
        *,
        tracker_base: str,
        info_hash: str,
        num_pieces: int,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ChordConfig | None = None,
        heartbeat_s: float = 5.0,
        owner_cache_s: float = 5.0,
        failed_recheck_s: float = 1.0,
        bring_in_s: float = 30.0,
        max_bringers: int | None = MAX_BRINGERS,
        max_bringing_per_peer: int | None = None,
        fair_bringing: bool = False,
        first_receivers: int | None = 2,
        order_askers: bool = True,
        file_bytes: int = 0,
        origin_bps: int = 0,
        bring_ahead_s: float = 2.0,
        origin_fetch_s: float = ORIGIN_FETCH_S,
        seed: int | None = None,
    ) -> None:
        self.tracker_base = tracker_base.rstrip("/")
        self.info_hash = info_hash
        self.num_pieces = num_pieces
        self.host = host
        self.port = port
        self.config = config or ChordConfig()
        self.heartbeat_s = heartbeat_s
        self.rng = random.Random(seed)
        self.keys = piece_keys(info_hash, num_pieces)
        self._key_set = frozenset(self.keys)
        # bring_in_s: a piece handed out to be brought in is not handed out again for
        # this long. All of an issue's pieces go out in the first round of a flash
        # crowd, and a bringer fetches its share one after the other while the origins'
        # egress is shared by everyone: its last one arrives about F / u_s after the
        # start (10.5 s for 20 MiB at 16 Mbit/s). 10 s handed pieces out twice.
        # max_bringers, max_bringing_per_peer: at most that many peers at a time fetch
        # this supernode's pieces from the origins (None: any number), each
        # `BRINGING_BYTES` worth at a time unless told (PieceDirectory)
        # first_receivers: a piece with one source goes to this many askers first, the
        # others wait for a second holder (a tree, not a star; None: no naming)
        # order_askers: critical askers first, those that leave when done last, the
        # most upload to spare first (`PieceDirectory.asker_pass`); file_bytes (0:
        # unknown, no "leaves when done") and origin_bps (the origins' upload, 0:
        # unknown) for it; bring_ahead_s: a bringer may bring in as many pieces as it
        # fetched in that long at its last piece's origin rate (PieceDirectory);
        # origin_fetch_s: with origin_bps, the pieces handed out to be brought in at
        # once are what the origins complete in that long (`fetches_at_once`; 0: no
        # such limit)
        self.file_bytes = file_bytes
        self.origin_bps = origin_bps
        self.origin_fetch_s = origin_fetch_s
        self.directory = PieceDirectory(
            rng=random.Random(self.rng.getrandbits(64)),
            bring_in_s=bring_in_s,
            max_bringers=max_bringers,
            max_bringing_per_peer=(
                max_bringing_per_peer
                if max_bringing_per_peer is not None
                else bringing_per_peer(num_pieces, file_bytes)
            ),
            fair_bringing=fair_bringing,
            first_receivers=first_receivers,
            order_askers=order_askers,
            num_pieces=num_pieces,
            file_bytes=file_bytes,
            origin_bps=origin_bps,
            bring_ahead_s=bring_ahead_s,
        )
        self.stats = SupernodeStats()
        self.node: ChordNode | None = None
        self.members: dict[int, NodeRef] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lookups: dict[int, asyncio.Future[LookupDone | LookupFailed]] = {}
        #: key -> (owner found by a lookup, when): `lookup`'s cache
        self._owners: dict[int, tuple[NodeRef, float]] = {}
        #: supernode address -> when a lookup asked for by a client that found it
        #: silent named it again (`lookup`; ring members only, cleared with the cache)
        self._confirmed: dict[str, float] = {}
        self._pending: dict[int, asyncio.Task[NodeRef | None]] = {}
        self.owner_cache_s = owner_cache_s
        self.failed_recheck_s = failed_recheck_s
        self._heartbeat: asyncio.Task[None] | None = None
        self.routes = SupernodeRoutes(self)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # --- life cycle ------------------------------------------------------------

    async def start(self) -> NodeRef:
        """Listen, register with the tracker, create or join the ring; our node."""
        self._loop = asyncio.get_running_loop()
        self._http = aiohttp.ClientSession()
        app = web.Application(client_max_size=1 << 20)
        self.routes.add_to(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        for attempt in range(_REGISTER_ATTEMPTS):
            try:
                me, others = await self._register()
                break
            except SupernodeError:
                if attempt == _REGISTER_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(1.0)
        now = self._loop.time()
        self.node = ChordNode(me, self.config, now=now, rng=self.rng)
        self.node.restrict_to(self.members)
        boot = [n for n in others if n.id != me.id]
        if boot:
            self._apply(self.node.join(boot, now=now))
        else:
            self._apply(self.node.create(now=now))
        self._heartbeat = self._loop.create_task(self._heartbeats())
        log.info("supernode %s on the ring of %s (%d others)", me, self.info_hash[:10], len(boot))
        return me

    async def wait_on_ring(self, timeout_s: float = 20.0) -> None:
        """Until the join went through (a failed join is retried by the heartbeat)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.node is None or self.node.phase is not Phase.ON_RING:
            if asyncio.get_running_loop().time() > deadline:
                raise SupernodeError("did not get onto the ring in time")
            await asyncio.sleep(0.05)

    async def close(self, *, graceful: bool = True) -> None:
        """Leave the ring (handing our pieces to the successor) and stop."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if graceful and self.node is not None and self.node.phase is Phase.ON_RING:
            mine = [i for i, k in enumerate(self.keys) if self.node.answers_for(k)]
            handoff = self.directory.export(mine, now=self._now())
            effects = self.node.leave(now=self._now(), handoff=handoff)
            sends = [self._post(e.to, e.message) for e in effects if isinstance(e, Send)]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 3.0)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await self._tracker_post(
                    {"address": self.address, "num_pieces": self.num_pieces, "leaving": True}
                )
        if self._timer is not None:
            self._timer.cancel()
        for task in [*self._tasks, *self._pending.values()]:
            task.cancel()
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- the tracker --------------------------------------------------------------

    async def _tracker_post(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._http is not None
        url = f"{self.tracker_base}/v1/ring/{self.info_hash}/supernodes"
        async with self._http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=10)) as r:
            doc = await r.json(content_type=None)
            if r.status != 200 or not isinstance(doc, dict):
                raise SupernodeError(f"tracker refused the supernode: {doc}")
            return doc

    async def _register(self) -> tuple[NodeRef, list[NodeRef]]:
        try:
            doc = await self._tracker_post({"address": self.address, "num_pieces": self.num_pieces})
            me = NodeRef(parse_id(doc.get("id"), "id"), self.address)
            nodes = [parse_node(n) for n in doc.get("supernodes", [])]
        except (aiohttp.ClientError, TimeoutError, CodecError, ValueError) as err:
            raise SupernodeError(f"cannot register with the tracker: {err}") from err
        if set(self.members) != {n.id for n in nodes}:
            self._ring_changed()
        self.members = {n.id: n for n in nodes}
        self.directory.max_fetching = fetches_at_once(
            self.origin_bps,
            self.num_pieces,
            self.file_bytes,
            len(self.members),
            fetch_s=self.origin_fetch_s,
        )
        return me, nodes

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                me, nodes = await self._register()
            except SupernodeError as err:
                log.warning("supernode %s: %s", self.address, err)
                continue
            except Exception:  # (the heartbeat outlives any error: logged, next beat)
                log.exception("supernode %s: heartbeat failed", self.address)
                continue
            node = self.node
            if node is None:
                continue
            if node.me.id != me.id:
                self._move_to(me, nodes)
                continue
            node.restrict_to(self.members)
            boot = [n for n in nodes if n.id != node.me.id]
            if node.phase is Phase.NEW:  # a join that failed: try again
                self._enter(node, nodes)
            elif node.alone and boot:
                # every neighbour timed out at once while the tracker still lists
                # others: find our place again rather than stay a ring of one
                self._apply(node.rejoin(boot, now=self._now()))
            self._rearm()

    def _move_to(self, me: NodeRef, nodes: list[NodeRef]) -> None:
        # The tracker lists this supernode at another id than the one it runs at (it
        # lost its list, or expired the supernode and placed it anew): the others trust
        # only the listed id, so the old one would stay a ring of its own for ever
        # (issue 24, item 3). A new node at the listed id joins through the others;
        # lookups in flight at the old one fail (their askers look up again); the
        # piece directory stays (the holders' reports are as true at the new place).
        old = self.node
        log.warning(
            "supernode %s: the tracker lists it at %s, not %s; rejoining the ring there",
            self.address,
            id_hex(me.id)[:10],
            id_hex(old.me.id)[:10] if old is not None else "-",
        )
        self.stats.moved += 1
        for lid, fut in list(self._lookups.items()):
            if not fut.done():
                fut.set_result(LookupFailed(lid, 0, 0, 0, "the supernode moved on the ring"))
        self._lookups.clear()
        now = self._now()
        node = self.node = ChordNode(me, self.config, now=now, rng=self.rng)
        node.restrict_to(self.members)
        self._ring_changed()
        self._enter(node, nodes)

    def _enter(self, node: ChordNode, nodes: list[NodeRef]) -> None:
        # Join through the others, except the first the tracker lists (the longest
        # known), which creates the ring: when every supernode moved at once (a tracker
        # that lost its list) all would otherwise join through nodes that are joining
        # too, for ever. One that created while others were on a ring finds its place
        # at the next heartbeat (`ChordNode.rejoin`, alone with others listed).
        now = self._now()
        boot = [n for n in nodes if n.id != node.me.id]
        if boot and nodes[0].id != node.me.id:
            self._apply(node.join(boot, now=now))
        else:
            self._apply(node.create(now=now))

    # --- effects, timer, outgoing requests ---------------------------------------

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _apply(self, effects: list[Effect]) -> None:
        for eff in effects:
            if isinstance(eff, Send) and isinstance(eff.message, Request):
                self._spawn(self._send_request(eff.to, eff.message))
            elif isinstance(eff, LookupDone | LookupFailed):
                fut = self._lookups.pop(eff.lookup_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(eff)
            if isinstance(eff, HandoffReceived | NodeFailed | PredecessorChanged):
                self._ring_changed()
            if isinstance(eff, HandoffReceived):
                merged = self.directory.adopt(eff.handoff, now=self._now())
                log.info(
                    "supernode %s: %d pieces handed over by %s", self.address, merged, eff.sender
                )
            elif isinstance(eff, NodeFailed):
                self.stats.nodes_failed.append(eff.node.address)
                log.info("supernode %s: %s does not answer, routed around", self.address, eff.node)
            elif isinstance(eff, PredecessorChanged):
                log.debug("supernode %s: predecessor now %s", self.address, eff.predecessor)
            elif isinstance(eff, MessageDropped):
                self.stats.dropped += 1
                log.info(
                    "supernode %s: dropped a message from %s (%s)",
                    self.address,
                    eff.sender,
                    eff.reason.value,
                )
        self._rearm()

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, to: NodeRef, msg: Request | Reply) -> dict[str, Any] | None:
        assert self._http is not None
        body = request_json(msg) if isinstance(msg, Request) else reply_json(msg)
        # (None: the core's own timeout and retries take it from here)
        return await post_json(
            self._http,
            f"http://{to.address}/chord/v1/rpc",
            body,
            timeout_s=self.config.rpc_timeout_s,
        )

    async def _send_request(self, to: NodeRef, req: Request) -> None:
        doc = await self._post(to, req)
        if doc is None or self.node is None:
            return
        try:
            rep = parse_reply(doc)
        except CodecError as err:
            log.info("supernode %s: bad reply from %s: %s", self.address, to, err)
            return
        if rep.rpc_id != req.rpc_id or rep.sender.id != to.id:
            return
        self._apply(self.node.handle_reply(rep, now=self._now()))

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.node is None or self._loop is None:
            return
        deadline = self.node.next_deadline()
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.node is not None:
            self._apply(self.node.handle_timer(now=self._now()))

    # --- lookups for the HTTP routes (`pressrun.chord.routes`) ---------------------

    async def lookup(
        self, keys: list[int], *, failed: Collection[str] = ()
    ) -> dict[int, NodeRef | None]:
        """The supernode that answers for each of ``keys``, piece keys of this issue
        (None: the lookup failed).

        Cheap per question: keys this supernode answers for are answered at once, an
        answer found by a lookup is kept for ``owner_cache_s`` (until the ring changes
        under it: a failed node, a new predecessor, a new member list, a handoff), and a
        key already being looked up waits for that lookup instead of starting another.
        A flash crowd's peers all ask for the same keys: one lookup per key serves them.
        ``failed``: addresses the asker found silent; a kept answer naming one is looked
        up again (the ring routes around it before this supernode noticed): one of its
        keys first, and if the ring still names it, the other answers naming it stand,
        for every asker, for ``failed_recheck_s``; if not, every key it was kept for is
        looked up. A client names a supernode it found silent until it answers again
        or for 30 s (``peer.ring_pacing.FAILED_FORGET_S``), so many questions name it:
        before this check, on a starved host at N = 80 (answers late, 5 unanswered
        requests a peer), 1,792 lookups through the ring for 1,018 client requests.
        """
        node = self.node
        if node is None or node.phase is not Phase.ON_RING:
            raise LocalProtocolError("not on the ring")
        now = self._now()
        out: dict[int, NodeRef | None] = {}
        waiting: dict[int, asyncio.Future[NodeRef | None]] = {}
        #: kept answers naming a supernode the asker found silent: its address -> them
        suspects: dict[str, list[tuple[int, NodeRef]]] = {}
        effects: list[Effect] = []
        for key in dict.fromkeys(keys):
            if node.answers_for(key):
                out[key] = node.me
                continue
            cached = self._owners.get(key)
            if cached is not None and now - cached[1] <= self.owner_cache_s:
                owner = cached[0]
                confirmed = self._confirmed.get(owner.address, float("-inf"))
                if owner.address not in failed or now - confirmed <= self.failed_recheck_s:
                    out[key] = owner
                    continue
                suspects.setdefault(owner.address, []).append((key, owner))
                continue
            waiting[key] = self._look_up(node, key, now, effects)
        # one key of each suspect first
        for kept in suspects.values():
            waiting[kept[0][0]] = self._look_up(node, kept[0][0], now, effects)
        self._apply(effects)
        out.update(await self._gather(waiting))
        again: dict[int, asyncio.Future[NodeRef | None]] = {}
        effects = []
        for address, kept in suspects.items():
            probe = out.get(kept[0][0])
            if probe is not None and probe.address == address:
                # the ring, asked after the claim, still names it
                self._confirmed[address] = self._now()
                out.update((key, owner) for key, owner in kept[1:])
            else:
                for key, _ in kept[1:]:
                    again[key] = self._look_up(node, key, self._now(), effects)
        if again:
            self._apply(effects)
            out.update(await self._gather(again))
        return out

    def _look_up(
        self, node: ChordNode, key: int, now: float, effects: list[Effect]
    ) -> asyncio.Future[NodeRef | None]:
        # the lookup of ``key`` under way, or a new one (its effects added to ``effects``)
        assert self._loop is not None
        pending = self._pending.get(key)
        if pending is None:
            lid, eff = node.lookup(key, now=now)
            fut: asyncio.Future[LookupDone | LookupFailed] = self._loop.create_future()
            self._lookups[lid] = fut
            pending = self._pending[key] = self._loop.create_task(self._one_lookup(key, fut))
            effects.extend(eff)
            self.stats.lookups += 1
        return asyncio.shield(pending)

    @staticmethod
    async def _gather(
        waiting: dict[int, asyncio.Future[NodeRef | None]],
    ) -> dict[int, NodeRef | None]:
        results = await asyncio.gather(*waiting.values())
        return dict(zip(waiting, results, strict=True))

    async def _one_lookup(
        self, key: int, fut: asyncio.Future[LookupDone | LookupFailed]
    ) -> NodeRef | None:
        try:
            res = await fut
        finally:
            self._pending.pop(key, None)
        if isinstance(res, LookupDone):
            self._owners[key] = (res.successor, self._now())
            return res.successor
        self.stats.lookups_failed += 1
        return None

    def _ring_changed(self) -> None:
        # owners found before may no longer answer for their keys
        self._owners.clear()
        self._confirmed.clear()
