"""Messages between Chord nodes and the effects of the core (frozen dataclasses).

A request travels as `Request(rpc_id, sender, body)` and its answer as
`Reply(rpc_id, sender, body)`; the rpc id is the asker's, unique among its open
requests. docs/protocols.md has their JSON form (`pressrun.chord.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pressrun.chord.ids import NodeRef

# --- request bodies ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindSuccessor:
    """Who is the successor of ``key``? Answered with `Found` or `Closer`."""

    key: int


@dataclass(frozen=True, slots=True)
class GetState:
    """Your predecessor and successor list (stabilize). Answered with `State`."""


@dataclass(frozen=True, slots=True)
class Notify:
    """The sender thinks it might be your predecessor. Answered with `Ack`."""


@dataclass(frozen=True, slots=True)
class Ping:
    """Are you alive? Answered with `Ack`."""


@dataclass(frozen=True, slots=True)
class Leaving:
    """The sender leaves the ring gracefully; its predecessor and successors, and what it
    answered for (``handoff``, opaque to the ring, for its successor). Answered with `Ack`."""

    predecessor: NodeRef | None
    successors: tuple[NodeRef, ...]
    handoff: object = None


RequestBody = FindSuccessor | GetState | Notify | Ping | Leaving

# --- reply bodies -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """``key`` is in (answerer, successors[0]]: its successor list, nearest first."""

    key: int
    successors: tuple[NodeRef, ...]


@dataclass(frozen=True, slots=True)
class Closer:
    """Not mine: nodes that precede ``key`` and are closer to it, best first, and the
    answerer's successor list (when the successors that precede the key are all dead,
    the asker takes the first one after it: routing around a failed predecessor)."""

    key: int
    candidates: tuple[NodeRef, ...]
    successors: tuple[NodeRef, ...] = ()


@dataclass(frozen=True, slots=True)
class State:
    """The answerer's predecessor (None if unknown) and successor list."""

    predecessor: NodeRef | None
    successors: tuple[NodeRef, ...]


@dataclass(frozen=True, slots=True)
class Ack:
    """Done."""


ReplyBody = Found | Closer | State | Ack


@dataclass(frozen=True, slots=True)
class Request:
    rpc_id: int
    sender: NodeRef
    body: RequestBody


@dataclass(frozen=True, slots=True)
class Reply:
    rpc_id: int
    sender: NodeRef
    body: ReplyBody


Message = Request | Reply

# --- effects --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver ``message`` to ``to``."""

    to: NodeRef
    message: Message


@dataclass(frozen=True, slots=True)
class LookupDone:
    """Lookup ``lookup_id`` found the live successor of ``key``.

    hops: nodes that answered on the way (each `FindSuccessor`, and the successor itself,
    the last node reached; 0 when this node is the successor); timeouts: requests of
    this lookup that went unanswered (routed around).
    """

    lookup_id: int
    key: int
    successor: NodeRef
    hops: int
    timeouts: int


@dataclass(frozen=True, slots=True)
class LookupFailed:
    """Lookup ``lookup_id`` ran out of nodes to ask (or of hops)."""

    lookup_id: int
    key: int
    hops: int
    timeouts: int
    reason: str


@dataclass(frozen=True, slots=True)
class Joined:
    """This node found its successor and is on the ring."""

    successor: NodeRef


@dataclass(frozen=True, slots=True)
class PredecessorChanged:
    """The keys this node answers for changed: it now holds (predecessor, self]."""

    predecessor: NodeRef | None


@dataclass(frozen=True, slots=True)
class NodeFailed:
    """``node`` did not answer after the retries and was dropped from the tables."""

    node: NodeRef


@dataclass(frozen=True, slots=True)
class HandoffReceived:
    """A leaving predecessor handed over what it answered for."""

    sender: NodeRef
    handoff: object


class DropReason(Enum):
    NOT_A_MEMBER = "not_a_member"
    NOT_ON_RING = "not_on_ring"
    UNKNOWN_RPC = "unknown_rpc"


@dataclass(frozen=True, slots=True)
class MessageDropped:
    """A message the core would not act on (counted, never raised)."""

    sender: NodeRef
    reason: DropReason


Effect = (
    Send
    | LookupDone
    | LookupFailed
    | Joined
    | PredecessorChanged
    | NodeFailed
    | HandoffReceived
    | MessageDropped
)
