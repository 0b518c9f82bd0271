"""Chord messages <-> JSON objects (docs/protocols.md, "Chord ring messages"). Pure.

Identifiers travel as 40 lowercase hex digits; a node as ``{"id": ..., "address":
"host:port"}``. Anything malformed raises `CodecError` with what was wrong; the adapter
answers it with HTTP 400 and the core never sees it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pressrun.chord.events import (
    Ack,
    Closer,
    FindSuccessor,
    Found,
    GetState,
    Leaving,
    Notify,
    Ping,
    Reply,
    ReplyBody,
    Request,
    RequestBody,
    State,
)
from pressrun.chord.ids import NodeRef

VERSION = 1
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_MAX_LIST = 64
#: peer ids a report's ``unchoked`` may name: a peer with an upload slot free names
#: every connected downloading peer, up to libtorrent's connections_limit (200 by
#: default). It was 64: a report naming more got 400, which the peer's ring client
#: takes for a silent supernode; at N = 80 on the loopback bench (79 others) the
#: clients counted 30.9-73 unanswered requests a peer (not yet checked to be these)
MAX_SERVED_IDS = 256


class CodecError(ValueError):
    """A message that is not a valid Chord message."""


def id_hex(value: int) -> str:
    return f"{value:040x}"


def parse_id(value: object, what: str) -> int:
    if not isinstance(value, str) or not _HEX40.match(value):
        raise CodecError(f"{what} must be 40 lowercase hex digits")
    return int(value, 16)


def node_json(node: NodeRef) -> dict[str, str]:
    return {"id": id_hex(node.id), "address": node.address}


def parse_node(value: object, what: str = "node") -> NodeRef:
    if not isinstance(value, dict):
        raise CodecError(f"{what} must be an object with id and address")
    addr = value.get("address")
    if not isinstance(addr, str) or not 0 < len(addr) <= 255:
        raise CodecError(f"{what}.address must be a non-empty string")
    return NodeRef(parse_id(value.get("id"), f"{what}.id"), addr)


def _nodes(value: object, what: str) -> tuple[NodeRef, ...]:
    if not isinstance(value, list) or len(value) > _MAX_LIST:
        raise CodecError(f"{what} must be a list of at most {_MAX_LIST} nodes")
    return tuple(parse_node(v, f"{what}[{i}]") for i, v in enumerate(value))


def _opt_node(value: object, what: str) -> NodeRef | None:
    return None if value is None else parse_node(value, what)


def request_json(req: Request) -> dict[str, Any]:
    out: dict[str, Any] = {"v": VERSION, "rpc": req.rpc_id, "sender": node_json(req.sender)}
    b = req.body
    if isinstance(b, FindSuccessor):
        out.update(type="find_successor", key=id_hex(b.key))
    elif isinstance(b, GetState):
        out["type"] = "get_state"
    elif isinstance(b, Notify):
        out["type"] = "notify"
    elif isinstance(b, Ping):
        out["type"] = "ping"
    else:
        out.update(
            type="leaving",
            predecessor=None if b.predecessor is None else node_json(b.predecessor),
            successors=[node_json(n) for n in b.successors],
            handoff=b.handoff,
        )
    return out


def reply_json(rep: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {"v": VERSION, "rpc": rep.rpc_id, "sender": node_json(rep.sender)}
    b = rep.body
    if isinstance(b, Found):
        out.update(type="found", key=id_hex(b.key), successors=[node_json(n) for n in b.successors])
    elif isinstance(b, Closer):
        out.update(
            type="closer",
            key=id_hex(b.key),
            candidates=[node_json(n) for n in b.candidates],
            successors=[node_json(n) for n in b.successors],
        )
    elif isinstance(b, State):
        out.update(
            type="state",
            predecessor=None if b.predecessor is None else node_json(b.predecessor),
            successors=[node_json(n) for n in b.successors],
        )
    else:
        out["type"] = "ack"
    return out


def _envelope(doc: object) -> tuple[dict[str, Any], int, NodeRef, str]:
    if not isinstance(doc, dict):
        raise CodecError("a message is a JSON object")
    if doc.get("v") != VERSION:
        raise CodecError(f"unsupported message version {doc.get('v')!r} (expected {VERSION})")
    rpc = doc.get("rpc")
    if not isinstance(rpc, int) or isinstance(rpc, bool) or not 0 <= rpc < 1 << 63:
        raise CodecError("rpc must be a non-negative integer")
    kind = doc.get("type")
    if not isinstance(kind, str):
        raise CodecError("type must be a string")
    return doc, rpc, parse_node(doc.get("sender"), "sender"), kind


def parse_request(doc: object) -> Request:
    d, rpc, sender, kind = _envelope(doc)
    body: RequestBody
    if kind == "find_successor":
        body = FindSuccessor(parse_id(d.get("key"), "key"))
    elif kind == "get_state":
        body = GetState()
    elif kind == "notify":
        body = Notify()
    elif kind == "ping":
        body = Ping()
    elif kind == "leaving":
        body = Leaving(
            _opt_node(d.get("predecessor"), "predecessor"),
            _nodes(d.get("successors", []), "successors"),
            d.get("handoff"),
        )
    else:
        raise CodecError(f"unknown request type {kind!r}")
    return Request(rpc, sender, body)


def parse_reply(doc: object) -> Reply:
    d, rpc, sender, kind = _envelope(doc)
    body: ReplyBody
    if kind == "found":
        body = Found(parse_id(d.get("key"), "key"), _nodes(d.get("successors"), "successors"))
    elif kind == "closer":
        body = Closer(
            parse_id(d.get("key"), "key"),
            _nodes(d.get("candidates"), "candidates"),
            _nodes(d.get("successors", []), "successors"),
        )
    elif kind == "state":
        body = State(
            _opt_node(d.get("predecessor"), "predecessor"),
            _nodes(d.get("successors"), "successors"),
        )
    elif kind == "ack":
        body = Ack()
    else:
        raise CodecError(f"unknown reply type {kind!r}")
    return Reply(rpc, sender, body)


# --- POST /chord/v1/pieces: a node's report and its questions ----------------------

#: the bound on every rate a report carries, bytes/s (80 Gbit/s): beyond it, 400
MAX_RATE_BPS = 10**10


@dataclass(frozen=True, slots=True)
class PiecesQuery:
    """One report of a node to a supernode, with its questions (docs/protocols.md)."""

    peer_id: str
    address: str
    have: tuple[int, ...]
    want: tuple[int, ...]
    uploaded: int
    downloaded: int
    left: bool
    bringing: int = 0
    brought: int = 0
    upload_bps: int = 0
    #: None: not said (the supernode keeps what the node said before)
    unchoked: tuple[str, ...] | None = None
    unused_upload_bps: int | None = None
    download_bps: int = 0
    missing: int | None = None
    #: how fast its last piece came from the origins, bytes/s (0: not said)
    bring_bps: int = 0


def parse_pieces_query(body: object, num_pieces: int) -> PiecesQuery:
    """A report and its questions, checked (`CodecError` with what was wrong)."""
    if not isinstance(body, dict):
        raise CodecError("body must be a JSON object")
    peer_id, address = body.get("peer_id"), body.get("address")
    if not isinstance(peer_id, str) or not 0 < len(peer_id) <= 64:
        raise CodecError("peer_id must be a short string")
    if not isinstance(address, str) or not 0 < len(address) <= 255:
        raise CodecError("address must be host:port")

    def pieces(name: str) -> tuple[int, ...]:
        v = body.get(name, [])
        if not isinstance(v, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < num_pieces for p in v
        ):
            raise CodecError(f"{name} must be a list of piece indices below {num_pieces}")
        return tuple(dict.fromkeys(v))

    def count(name: str, most: int | None = None) -> int:
        v = body.get(name, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise CodecError(f"{name} must be a non-negative integer")
        if most is not None and v > most:
            raise CodecError(f"{name} must be at most {most}")
        return v

    def said(name: str, most: int) -> int | None:
        return count(name, most) if name in body else None

    return PiecesQuery(
        peer_id,
        address,
        pieces("have"),
        pieces("want"),
        count("uploaded"),
        count("downloaded"),
        body.get("left") is True,
        count("bringing"),
        count("brought"),
        count("upload_bps", MAX_RATE_BPS),
        _peer_ids(body["unchoked"]) if "unchoked" in body else None,
        said("unused_upload_bps", MAX_RATE_BPS),
        count("download_bps", MAX_RATE_BPS),
        said("missing", num_pieces),
        count("bring_bps", MAX_RATE_BPS),
    )


def _peer_ids(v: object) -> tuple[str, ...]:
    # the peers a reporter would serve: at most `MAX_SERVED_IDS` short strings
    if not isinstance(v, list) or len(v) > MAX_SERVED_IDS:
        raise CodecError(f"unchoked must be a list of at most {MAX_SERVED_IDS} peer ids")
    if not all(isinstance(p, str) and 0 < len(p) <= 64 for p in v):
        raise CodecError("unchoked must be a list of short peer id strings")
    return tuple(v)
