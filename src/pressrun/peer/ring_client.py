"""A peer's side of the Chord ring: report pieces, ask who uploads, connect to them.

Every ``interval_s`` (docs/chord.md):

1. the ring's view from the tracker (``GET /v1/ring/{info_hash}``): piece keys and the
   issue's supernodes (404: no ring yet, the policy stays `stripes`);
2. which supernode answers for each piece key, asked of a supernode
   (``POST /chord/v1/lookup``; the ring routes the lookups), cached until that
   supernode fails or says ``not_mine``;
3. to each of those supernodes (``POST /chord/v1/pieces``): the pieces of its keys
   this peer holds, its upload/download totals, and the ones it wants (each asked again
   at most every ``reask_s``). The answers: an uploader for a piece (libtorrent
   ``connect_peer`` to it) or ``bring_in`` (this peer fetches it from the origins:
   `ChordPolicy.set_ring_answers`).

A supernode that does not answer within ``timeout_s`` (``lookup_timeout_s`` for a
batch of lookups) is dropped from the cache; the
next round asks another supernode to look the keys up again (the ring has routed around
the dead one, and its successor rebuilds what it answered for from these reports).
On leaving, one last report says ``left`` so no supernode picks this peer again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pressrun.chord.codec import CodecError, id_hex, parse_id, parse_node
from pressrun.peer.chord_policy import ChordPolicy

log = logging.getLogger(__name__)

#: supernodes asked to look keys up in one round
_RESOLVE_TRIES = 2


@dataclass(slots=True)
class RingClientStats:
    rounds: int = 0
    uploaders: int = 0
    bring_in: int = 0
    connects: int = 0
    lookups: int = 0
    supernode_failures: int = 0
    failed_supernodes: set[str] = field(default_factory=set)


class RingClient:
    def __init__(
        self,
        *,
        tracker_base: str,
        info_hash: str,
        num_pieces: int,
        peer_id: str,
        address: str,
        policy: ChordPolicy,
        have: Callable[[], Sequence[bool] | None],
        totals: Callable[[], tuple[int, int]],
        connect: Callable[[str, int], None],
        interval_s: float = 1.0,
        reask_s: float = 4.0,
        timeout_s: float = 2.0,
        lookup_timeout_s: float = 5.0,
        seed: int | None = None,
    ) -> None:
        self.tracker_base = tracker_base.rstrip("/")
        self.info_hash = info_hash
        self.num_pieces = num_pieces
        self.peer_id = peer_id
        self.address = address
        self.policy = policy
        self._have = have
        self._totals = totals
        self._connect = connect
        self.interval_s = interval_s
        self.reask_s = reask_s
        self.timeout_s = timeout_s
        self.lookup_timeout_s = lookup_timeout_s
        self.rng = random.Random(seed)
        self.stats = RingClientStats()
        self._keys: list[int] = []
        self._supernodes: list[str] = []
        self._owner: dict[int, str] = {}  # piece -> supernode address
        self._asked: dict[int, float] = {}
        self._bring_in: set[int] = set()
        self._connected: set[str] = set()
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def leave(self) -> None:
        """Tell every supernode this peer knows that it left (best effort, short)."""
        if self._http is None:
            return
        owners = set(self._owner.values())
        up, down = self._totals()
        body = {
            "peer_id": self.peer_id,
            "address": self.address,
            "uploaded": up,
            "downloaded": down,
            "left": True,
        }
        await asyncio.gather(
            *(self._post(o, "pieces", body) for o in owners), return_exceptions=True
        )

    # --- the loop ----------------------------------------------------------------

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._http = aiohttp.ClientSession(timeout=timeout)
        while True:
            try:
                await self._round()
            except (aiohttp.ClientError, TimeoutError, CodecError, ValueError) as err:
                log.debug("ring round failed: %s", err)
            self.stats.rounds += 1
            await asyncio.sleep(self.interval_s)

    async def _round(self) -> None:
        if not await self._refresh_view():
            self.policy.ring_lost()
            return
        have = self._have()
        if have is None:
            return
        missing = [p for p in range(self.num_pieces) if not have[p] and p not in self._owner]
        held = [p for p in range(self.num_pieces) if have[p] and p not in self._owner]
        if missing or held:
            await self._resolve(missing + held)
        now = asyncio.get_running_loop().time()
        up, down = self._totals()
        by_owner: dict[str, tuple[list[int], list[int]]] = {}
        for p, owner in self._owner.items():
            haves, wants = by_owner.setdefault(owner, ([], []))
            if have[p]:
                haves.append(p)
            elif now - self._asked.get(p, -1e9) >= self.reask_s:
                wants.append(p)
        self._bring_in = {p for p in self._bring_in if not have[p]}
        results = await asyncio.gather(
            *(
                self._ask(owner, haves, wants, up, down, now)
                for owner, (haves, wants) in by_owner.items()
            )
        )
        if any(results):
            self.policy.set_ring_answers(self._bring_in)

    async def _refresh_view(self) -> bool:
        assert self._http is not None
        async with self._http.get(f"{self.tracker_base}/v1/ring/{self.info_hash}") as r:
            if r.status != 200:
                return False
            doc = await r.json(content_type=None)
        if not isinstance(doc, dict) or doc.get("num_pieces") != self.num_pieces:
            return False
        keys = doc.get("piece_keys")
        if not isinstance(keys, list) or len(keys) != self.num_pieces:
            return False
        self._keys = [parse_id(k, "piece key") for k in keys]
        self._supernodes = [parse_node(n).address for n in doc.get("supernodes", [])]
        # forget owners the tracker no longer lists
        listed = set(self._supernodes)
        self._owner = {p: o for p, o in self._owner.items() if o in listed}
        return bool(self._supernodes)

    async def _resolve(self, pieces: list[int]) -> None:
        # any listed supernode can look keys up; two of them, in random order, so a
        # round stays short while the ring routes around a dead one (next round: others)
        order = self._supernodes[:]
        self.rng.shuffle(order)
        order = order[:_RESOLVE_TRIES]
        body = {"keys": [id_hex(self._keys[p]) for p in pieces]}
        for sn in order:
            # (a batch of lookups through the ring takes longer than one answer)
            doc = await self._post(sn, "lookup", body, timeout_s=self.lookup_timeout_s)
            owners = doc.get("owners") if doc else None
            if not isinstance(owners, dict):
                continue
            self.stats.lookups += 1
            for p in pieces:
                node = owners.get(id_hex(self._keys[p]))
                if isinstance(node, dict):
                    self._owner[p] = parse_node(node).address
            return

    async def _ask(
        self, owner: str, haves: list[int], wants: list[int], up: int, down: int, now: float
    ) -> bool:
        body = {
            "peer_id": self.peer_id,
            "address": self.address,
            "have": haves,
            "want": wants,
            "uploaded": up,
            "downloaded": down,
        }
        doc = await self._post(owner, "pieces", body)
        if doc is None:
            # dead or unreachable: its pieces are looked up again next round
            self.stats.supernode_failures += 1
            self.stats.failed_supernodes.add(owner)
            self._owner = {p: o for p, o in self._owner.items() if o != owner}
            return False
        for p in doc.get("not_mine", []):
            if isinstance(p, int):
                self._owner.pop(p, None)
        for ans in doc.get("uploaders", []):
            if not isinstance(ans, dict):
                continue
            piece, addr = ans.get("piece"), ans.get("address")
            if not isinstance(piece, int) or not isinstance(addr, str) or ans.get("wait"):
                continue  # (wait: nobody to upload it yet, asked again next round)
            self._asked[piece] = now
            if ans.get("bring_in") is True:
                self._bring_in.add(piece)
                self.stats.bring_in += 1
                continue
            self._bring_in.discard(piece)
            self.stats.uploaders += 1
            if addr != self.address and addr not in self._connected:
                host, _, port = addr.rpartition(":")
                if port.isdigit():
                    self._connected.add(addr)
                    self.stats.connects += 1
                    self._connect(host, int(port))
        return True

    async def _post(
        self, sn: str, route: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any] | None:
        assert self._http is not None
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._http.post(
                f"http://{sn}/chord/v1/{route}", json=body, timeout=timeout
            ) as r:
                if r.status != 200:
                    return None
                doc = await r.json(content_type=None)
                return doc if isinstance(doc, dict) else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
