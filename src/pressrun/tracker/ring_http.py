"""HTTP routes of the ring's central administration (docs/protocols.md, "Ring admin").

GET  /v1/ring/{info_hash}             -> 200 {info_hash, num_pieces, piece_keys,
                                          supernodes: [{id, address}]} | 404
                                      | 400: not 40 hex digits
POST /v1/ring/{info_hash}/supernodes  {address, num_pieces[, leaving]}
                                      -> 200 {id, supernodes} | 400 {error}
                                      | 403 {error}: the request does not come from
                                      the address it registers or unregisters
                                      | 429 {error}: a limit (`RingFull`), Retry-After

Nothing a GET names is kept unless it is a ring: which issues were read from the store
already is an LRU of at most `LOADED_MAX` (reading again is harmless: every change is
written through), and a name that is no info-hash is answered 400 before anything.
The rows of a ring the administration forgot leave the store too.

Clocks: the administration's deadlines (a supernode's TTL, the ids kept) run on the
process's monotonic clock when one is given (``monotonic``), so a step of the wall
clock neither expires every supernode at once nor keeps dead ones listed; the store
keeps wall-clock times (``clock``: another instance, or a restarted one, reads them),
converted as ages both ways. Instances sharing a store (Redis) read its times on every
answer: there a step of one host's wall clock still moves the ages it reads.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pressrun.chord.codec import id_hex, node_json
from pressrun.tracker.ring import RingAdmin, RingError, RingFull, RingView
from pressrun.tracker.ring_store import STORE_ERRORS, RingStore

log = logging.getLogger(__name__)

#: issues whose ring list was read from a store only this process writes (an LRU)
LOADED_MAX = 1024


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


def _speaks_for_itself(address: str, remote: str | None) -> bool | None:
    """Whether a request from ``remote`` may speak for the supernode at ``address``
    (``IP:port``): only the host itself may register or unregister it, so a stranger
    can neither put a victim's address on the ring nor take a supernode off it. None:
    the address's host is not an IP literal."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    try:
        return remote is not None and ip == ipaddress.ip_address(remote)
    except ValueError:
        return False


def view_json(view: RingView) -> dict[str, Any]:
    return {
        "info_hash": view.info_hash,
        "num_pieces": view.num_pieces,
        "piece_keys": list(view.piece_keys_hex) or [id_hex(k) for k in view.piece_keys],
        "supernodes": [node_json(n) for n in view.supernodes],
    }


def add_ring_routes(
    app: web.Application,
    admin: RingAdmin,
    clock: Callable[[], float],
    allowed: Callable[[bytes], bool] = lambda info_hash: True,
    store: RingStore | None = None,
    monotonic: Callable[[], float] | None = None,
) -> None:
    """Add the two routes to the tracker's application. ``allowed`` is the tracker's
    allowlist: a ring is kept only for a published issue, so a stranger registering
    supernodes for made-up info-hashes creates nothing (docs/security.md). ``store``
    keeps the lists (`pressrun.tracker.ring_store`): read before every answer when
    other instances share it, once per issue otherwise; every change written at once."""
    loaded: OrderedDict[str, None] = OrderedDict()
    now_of = monotonic or clock

    def to_wall(seen: float) -> float:
        # a time of the administration's clock as wall-clock seconds (for the store)
        return seen if monotonic is None else clock() - max(0.0, monotonic() - seen)

    def from_wall(members: dict[str, tuple[int, float]]) -> dict[str, tuple[int, float]]:
        if monotonic is None:
            return members
        wall, mono = clock(), monotonic()
        return {a: (i, mono - max(0.0, wall - seen)) for a, (i, seen) in members.items()}

    async def sync_in(info_hash: str) -> None:
        if store is None or (not store.shared and info_hash in loaded):
            if info_hash in loaded:
                loaded.move_to_end(info_hash)
            return
        got = await store.load(info_hash)
        if not store.shared:
            loaded[info_hash] = None
            while len(loaded) > LOADED_MAX:
                loaded.popitem(last=False)
        if got is not None:
            admin.restore(info_hash, got[0], from_wall(got[1]))

    async def sync_out(info_hash: str, before: dict[str, tuple[int, float]]) -> None:
        if store is None:
            return
        for forgotten in admin.take_forgotten():
            loaded.pop(forgotten, None)
            await store.forget(forgotten)
        after = admin.members(info_hash)
        if after is None:
            return
        num_pieces, now_members = after
        gone = [a for a in before if a not in now_members]
        await store.drop(info_hash, gone)
        for address, (node_id, seen) in now_members.items():
            if before.get(address) != (node_id, seen):
                await store.put(info_hash, num_pieces, address, node_id, to_wall(seen))

    def store_failed(err: Exception) -> web.Response:
        log.error("the tracker's store did not answer for the ring: %s", err)
        return web.json_response(
            {"error": f"the tracker's store did not answer ({err}); retry"},
            status=503,
            headers={"Retry-After": "5"},
        )

    def members(info_hash: str) -> dict[str, tuple[int, float]]:
        got = admin.members(info_hash)
        return {} if got is None else got[1]

    def refused(info_hash: str) -> web.Response | None:
        try:
            raw = bytes.fromhex(info_hash)
        except ValueError:
            raw = b""
        if len(raw) != 20:
            return _json(400, {"error": "info_hash must be 40 hex digits"})
        if not allowed(raw):
            return _json(404, {"error": "this tracker serves only published issues"})
        return None

    async def get_ring(request: web.Request) -> web.Response:
        info_hash = request.match_info["info_hash"].lower()
        refusal = refused(info_hash)
        if refusal is not None:
            return refusal
        try:
            await sync_in(info_hash)
            before = members(info_hash)
            view = admin.view(info_hash, now=now_of())
            await sync_out(info_hash, before)  # (expired supernodes leave the store too)
        except STORE_ERRORS as err:
            return store_failed(err)
        if view is None:
            return _json(404, {"error": "no ring for this issue (no supernode registered)"})
        return _json(200, view_json(view))

    async def register(request: web.Request) -> web.Response:
        info_hash = request.match_info["info_hash"].lower()
        refusal = refused(info_hash)
        if refusal is not None:
            return refusal
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _json(400, {"error": "body must be JSON"})
        if not isinstance(body, dict):
            return _json(400, {"error": "body must be a JSON object"})
        address, pieces = body.get("address"), body.get("num_pieces")
        if not isinstance(address, str) or not isinstance(pieces, int) or isinstance(pieces, bool):
            return _json(400, {"error": "address (host:port) and num_pieces (int) are required"})
        own = _speaks_for_itself(address, request.remote)
        if own is None:
            return _json(400, {"error": f"address {address!r} is not IP:port"})
        if not own:
            return _json(
                403,
                {
                    "error": f"a supernode registers and leaves from its own address: "
                    f"{address} is not {request.remote}"
                },
            )
        try:
            await sync_in(info_hash)
            before = members(info_hash)
            if body.get("leaving") is True:
                admin.leave(info_hash, address)
                await sync_out(info_hash, before)
                return _json(200, {"left": True})
            try:
                me = admin.register(info_hash, address, pieces, now=now_of())
            except RingFull as err:
                return web.json_response(
                    {"error": str(err)}, status=429, headers={"Retry-After": "30"}
                )
            except RingError as err:
                return _json(400, {"error": str(err)})
            view = admin.view(info_hash, now=now_of())
            await sync_out(info_hash, before)
        except STORE_ERRORS as err:
            return store_failed(err)
        nodes = [node_json(n) for n in view.supernodes] if view else []
        return _json(200, {"id": id_hex(me.id), "supernodes": nodes})

    app.router.add_get("/v1/ring/{info_hash}", get_ring)
    app.router.add_post("/v1/ring/{info_hash}/supernodes", register)
