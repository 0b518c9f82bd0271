"""A supernode's HTTP routes (aiohttp; JSON bodies, docs/protocols.md), the handlers
`pressrun.chord.aio.Supernode` serves:

- ``POST /chord/v1/rpc``: one Chord request in, its reply out (`pressrun.chord.codec`).
  A sender that is not on the tracker's list, or whose address is not the one the
  request came from, gets 403 and the core never acts on it;
- ``POST /chord/v1/lookup``: ``{"keys": [hex, ...]}`` -> ``{"owners": {hex: node|null}}``
  (a client's way into the ring: which supernode answers for each key). Only the
  issue's piece keys are looked up (anything else is 400), so what the answers are
  kept in is bounded by the issue's pieces;
- ``POST /chord/v1/pieces``: a node reports the pieces it holds and its totals, and asks
  who uploads the pieces it wants, for the keys this supernode answers for
  (`PieceDirectory`); the others come back in ``not_mine`` (ask the ring again). **A
  report speaks for the peer it comes from**: the holder's address is the request's
  source address with the port the report names, and a peer id is bound to that host
  while its holder is fresh (another host reporting it gets 403; more holders than
  `pressrun.chord.directory.MAX_HOLDERS_PER_HOST` from one host, 429);
- ``GET /chord/v1/state``: the node, its neighbours and its counters.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from aiohttp import web

from pressrun.chord.codec import (
    CodecError,
    id_hex,
    node_json,
    parse_id,
    parse_pieces_query,
    parse_request,
    reply_json,
)
from pressrun.chord.core import LocalProtocolError, Phase
from pressrun.chord.events import DropReason, MessageDropped, Reply, Send
from pressrun.chord.ids import same_host, seen_address

if TYPE_CHECKING:
    from pressrun.chord.aio import Supernode

#: piece keys one lookup request may carry
MAX_KEYS = 4096


class SupernodeRoutes:
    """The handlers of one `Supernode`'s HTTP routes (module docstring)."""

    def __init__(self, supernode: Supernode) -> None:
        self.sn = supernode

    def add_to(self, app: web.Application) -> None:
        """Route the supernode's paths to these handlers."""
        app.router.add_post("/chord/v1/rpc", self.rpc)
        app.router.add_post("/chord/v1/lookup", self.lookup)
        app.router.add_post("/chord/v1/pieces", self.pieces)
        app.router.add_get("/chord/v1/state", self.state)

    async def rpc(self, request: web.Request) -> web.Response:
        """``POST /chord/v1/rpc``: one Chord request in, its reply out."""
        self.sn.stats.requests_in += 1
        try:
            req = parse_request(await request.json())
        except (CodecError, json.JSONDecodeError, UnicodeDecodeError, ValueError) as err:
            return web.json_response({"error": str(err)}, status=400)
        node = self.sn.node
        if node is None:
            return web.json_response({"error": "not on the ring yet"}, status=503)
        if not same_host(req.sender.address, request.remote):
            self.sn.stats.dropped += 1
            return web.json_response(
                {"error": "sender address is not where this came from"}, status=403
            )
        effects = node.handle_request(req, now=self.sn._now())
        replies = [e for e in effects if isinstance(e, Send) and isinstance(e.message, Reply)]
        self.sn._apply([e for e in effects if e not in replies])
        if any(
            isinstance(e, MessageDropped) and e.reason is DropReason.NOT_A_MEMBER for e in effects
        ):
            return web.json_response(
                {"error": "not on the tracker's list of supernodes"}, status=403
            )
        if not replies:
            return web.json_response({"error": "not on the ring"}, status=503)
        msg = replies[0].message
        assert isinstance(msg, Reply)
        return web.json_response(reply_json(msg))

    async def lookup(self, request: web.Request) -> web.Response:
        """``POST /chord/v1/lookup``: which supernode answers for each piece key."""
        try:
            body = await request.json()
            raw = body.get("keys") if isinstance(body, dict) else None
            if not isinstance(raw, list) or len(raw) > MAX_KEYS:
                raise CodecError(f"keys must be a list of at most {MAX_KEYS} ids")
            keys = [parse_id(k, "key") for k in raw]
            if not all(k in self.sn._key_set for k in keys):
                # (any other key would be looked up through the ring and its answer
                # kept: 4,096 random keys a request cost 29 MB and 5.4 s of CPU)
                raise CodecError("keys must be piece keys of this issue (GET /v1/ring)")
            failed = body.get("failed", [])
            if not isinstance(failed, list) or not all(isinstance(a, str) for a in failed):
                raise CodecError("failed must be a list of host:port strings")
        except (CodecError, json.JSONDecodeError, UnicodeDecodeError, ValueError) as err:
            return web.json_response({"error": str(err)}, status=400)
        self.sn.stats.client_requests += 1
        try:
            owners = await asyncio.wait_for(self.sn.lookup(keys, failed=failed[:64]), timeout=30.0)
        except LocalProtocolError:
            return web.json_response({"error": "not on the ring yet"}, status=503)
        return web.json_response(
            {"owners": {id_hex(k): (node_json(n) if n else None) for k, n in owners.items()}}
        )

    async def pieces(self, request: web.Request) -> web.Response:
        """``POST /chord/v1/pieces``: a holder's report, and who uploads what it wants."""
        try:
            body = await request.json()
            q = parse_pieces_query(body, self.sn.num_pieces)
        except (CodecError, json.JSONDecodeError, UnicodeDecodeError, ValueError) as err:
            return web.json_response({"error": str(err)}, status=400)
        node = self.sn.node
        if node is None or node.phase is not Phase.ON_RING:
            return web.json_response({"error": "not on the ring yet"}, status=503)
        self.sn.stats.client_requests += 1
        now = self.sn._now()
        # the holder is where the report comes from (module docstring): its own host,
        # the port it listens on
        address = seen_address(request.remote, q.address)
        if address is None:
            return web.json_response(
                {"error": "address must be host:port, reported from an IP address"}, status=400
            )
        refusal = self.sn.directory.admit(q.peer_id, address, now)
        if refusal is not None:
            self.sn.stats.refused_reports += 1
            bound = "reports from" in refusal
            return web.json_response(
                {"error": refusal},
                status=403 if bound else 429,
                headers=None if bound else {"Retry-After": "30"},
            )
        mine = {p for p in (*q.have, *q.want) if node.answers_for(self.sn.keys[p])}
        self.sn.directory.handle_report(
            peer_id=q.peer_id,
            address=address,
            have=[p for p in q.have if p in mine],
            uploaded_bytes=q.uploaded,
            downloaded_bytes=q.downloaded,
            now=now,
            left=q.left,
            upload_bps=q.upload_bps,
            unchoked=q.unchoked,
            unused_upload_bps=q.unused_upload_bps,
            download_bps=q.download_bps,
            missing=q.missing,
            bring_bps=q.bring_bps,
        )
        answers = []
        for p in q.want:
            if p in mine:
                up = self.sn.directory.choose_uploader(
                    p,
                    peer_id=q.peer_id,
                    address=address,
                    now=now,
                    bringing=q.bringing,
                    brought=q.brought,
                )
                answers.append(
                    {
                        "piece": p,
                        "peer_id": up.peer_id,
                        "address": up.address,
                        "bring_in": up.bring_in,
                        "wait": up.wait,
                        "first": up.first,
                    }
                )
        self.sn.stats.uploader_answers += len(answers)
        not_mine = sorted({*q.have, *q.want} - mine)
        # (the origins' egress is the ring's while its fetch limit binds: a peer told
        # so fetches nothing from them on its own, `PieceDirectory.origins_held`)
        held = self.sn.directory.origins_held(now)
        return web.json_response({"uploaders": answers, "not_mine": not_mine, "origins_held": held})

    async def state(self, request: web.Request) -> web.Response:
        """``GET /chord/v1/state``: the node, its neighbours and the counters."""
        node = self.sn.node
        if node is None:  # the counters exist from the start: a reader never misses a key
            return web.json_response(
                {
                    "phase": "starting",
                    "uploader_answers": self.sn.stats.uploader_answers,
                    "dropped": self.sn.stats.dropped,
                    "nodes_failed": list(self.sn.stats.nodes_failed),
                }
            )
        return web.json_response(
            {
                "node": node_json(node.me),
                "phase": node.phase.value,
                "predecessor": node_json(node.predecessor) if node.predecessor else None,
                "successors": [node_json(s) for s in node.successors],
                "pieces": sum(1 for k in self.sn.keys if node.answers_for(k)),
                "holders": len(self.sn.directory.holders),
                "uploader_answers": self.sn.stats.uploader_answers,
                "dropped": self.sn.stats.dropped,
                "nodes_failed": list(self.sn.stats.nodes_failed),
            }
        )
