"""The WebTorrent tracker's frames: JSON text <-> messages. Pure.

The WebSocket tracker protocol is the npm ``bittorrent-tracker`` server's
(``lib/server/parse-websocket.js``) and aquatic's ``ws_protocol`` (FIELD-NOTES.md,
"WebTorrent"); the relay that acts on these messages is
`pressrun.tracker.websocket_relay`.

Frames are JSON text. ``info_hash``, ``peer_id``, ``offer_id`` and ``to_peer_id`` are
the raw 20 bytes as a latin-1 string. In:

    announce  {action, info_hash, peer_id, event?, uploaded, downloaded, left?,
               numwant?, key?, offers?: [{offer_id, offer: {type, sdp}}]}
    answer    {action: "announce", info_hash, peer_id, to_peer_id, offer_id,
               answer: {type, sdp}}

A frame longer than ``max_frame_bytes``, an SDP longer than ``max_sdp_bytes`` or more
than ``max_offers_per_announce`` offers (`RelayConfig`) is refused with a
`FrameError`, whose reason goes back to the peer in the failure frame (`failure`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pressrun.tracker.events import AnnounceEvent

if TYPE_CHECKING:
    from pressrun.tracker.websocket_relay import RelayConfig


class FrameError(Exception):
    """A frame a peer sent that the relay refuses (``reason`` is said to the peer)."""

    def __init__(self, reason: str, *, info_hash: bytes | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.info_hash = info_hash


@dataclass(frozen=True, slots=True)
class Sdp:
    """An offer or answer as sent (``type`` and ``sdp``), size-checked."""

    type: str
    sdp: str

    def as_json(self) -> dict[str, str]:
        """The object as the other peer expects it."""
        return {"type": self.type, "sdp": self.sdp}


@dataclass(frozen=True, slots=True)
class Offer:
    """One offer of an announce."""

    offer_id: bytes
    offer: Sdp


@dataclass(frozen=True, slots=True)
class WsAnnounce:
    """An announce over the WebSocket (with its offers)."""

    info_hash: bytes
    peer_id: bytes
    event: AnnounceEvent
    uploaded: int
    downloaded: int
    left: int
    numwant: int
    key: str | None
    offers: tuple[Offer, ...]


@dataclass(frozen=True, slots=True)
class WsAnswer:
    """An answer to an offer, for ``to_peer_id``."""

    info_hash: bytes
    peer_id: bytes
    to_peer_id: bytes
    offer_id: bytes
    answer: Sdp


def _raw20(value: Any, name: str) -> bytes:
    """A 20-byte id sent as a latin-1 string (or refused)."""
    if not isinstance(value, str):
        raise FrameError(f"{name} must be a string of 20 bytes")
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        raise FrameError(f"{name} must be 20 bytes as latin-1 characters") from None
    if len(raw) != 20:
        raise FrameError(f"{name} must be 20 bytes, not {len(raw)}")
    return raw


def _count(value: Any, name: str, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    # (bool is an int in Python; JSON true is not a byte count)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FrameError(f"{name} must be a number of bytes")
    if value != value or value < 0 or value > 2**62:  # NaN, negative, absurd
        raise FrameError(f"{name} must be between 0 and 2^62")
    return int(value)


def _sdp(value: Any, name: str, config: RelayConfig) -> Sdp:
    if not isinstance(value, dict):
        raise FrameError(f"{name} must be an object with type and sdp")
    kind, sdp = value.get("type"), value.get("sdp")
    if kind not in ("offer", "answer") or not isinstance(sdp, str):
        raise FrameError(f"{name} must be an object with type offer/answer and an sdp string")
    if len(sdp.encode("utf-8", "replace")) > config.max_sdp_bytes:
        raise FrameError(f"{name} is longer than {config.max_sdp_bytes} bytes")
    return Sdp(kind, sdp)


_EVENTS = {
    None: AnnounceEvent.NONE,
    "": AnnounceEvent.NONE,
    "update": AnnounceEvent.NONE,
    "started": AnnounceEvent.STARTED,
    "completed": AnnounceEvent.COMPLETED,
    "stopped": AnnounceEvent.STOPPED,
}


def parse_frame(text: str, config: RelayConfig) -> WsAnnounce | WsAnswer:
    """One text frame as an announce or an answer, or `FrameError` saying why not."""
    if len(text) > config.max_frame_bytes:
        raise FrameError(f"a frame may be at most {config.max_frame_bytes} bytes")
    try:
        msg = json.loads(text)
    except ValueError:
        raise FrameError("a frame must be a JSON object") from None
    if not isinstance(msg, dict):
        raise FrameError("a frame must be a JSON object")
    if msg.get("action") != "announce":
        raise FrameError("this tracker answers the announce action only")
    info_hash = _raw20(msg.get("info_hash"), "info_hash")
    try:
        peer_id = _raw20(msg.get("peer_id"), "peer_id")
        if "answer" in msg:
            return WsAnswer(
                info_hash=info_hash,
                peer_id=peer_id,
                to_peer_id=_raw20(msg.get("to_peer_id"), "to_peer_id"),
                offer_id=_raw20(msg.get("offer_id"), "offer_id"),
                answer=_sdp(msg["answer"], "answer", config),
            )
        event = msg.get("event")
        if event not in _EVENTS:
            raise FrameError("event must be started, completed, stopped or update")
        offers_in = msg.get("offers") or []
        if not isinstance(offers_in, list):
            raise FrameError("offers must be a list")
        if len(offers_in) > config.max_offers_per_announce:
            raise FrameError(f"at most {config.max_offers_per_announce} offers an announce")
        offers = []
        for item in offers_in:
            if not isinstance(item, dict):
                raise FrameError("each offer must be an object with offer_id and offer")
            offers.append(
                Offer(
                    _raw20(item.get("offer_id"), "offer_id"),
                    _sdp(item.get("offer"), "offer", config),
                )
            )
        key = msg.get("key")
        numwant = msg.get("numwant")
        return WsAnnounce(
            info_hash=info_hash,
            peer_id=peer_id,
            event=_EVENTS[event],
            uploaded=_count(msg.get("uploaded"), "uploaded", 0),
            downloaded=_count(msg.get("downloaded"), "downloaded", 0),
            # a browser that does not know the size yet sends no left: a leecher
            left=_count(msg.get("left"), "left", 1),
            numwant=min(_count(numwant, "numwant", len(offers)), config.max_offers_per_announce),
            key=_key(key),
            offers=tuple(offers),
        )
    except FrameError as err:
        err.info_hash = info_hash
        raise


def _key(key: object) -> str | None:
    """BEP 7's key as the HTTP codec keeps it (`pressrun.tracker.codec`: the hex of its
    bytes), so a desktop peer announcing on both trackers with the same key (libtorrent
    sends the same hex digits on both) is one client session to the accounting. Kept as
    the string, it never matched the HTTP one, and every announce on the other channel
    counted the session's whole totals again (a desktop that sent about 21 MB had
    252.7 MB uploaded in its record: bench/reader_swarm.py, 28 Nov, session 19). None
    for no key, another type or more than 64 bytes (the HTTP codec refuses those)."""
    if isinstance(key, bool) or not isinstance(key, str | int):
        return None
    raw = str(key).encode()
    return raw.hex() if 0 < len(raw) <= 64 else None


def failure(reason: str, info_hash: bytes | None) -> dict[str, Any]:
    """The failure frame (bittorrent-tracker clients show ``failure reason``)."""
    body: dict[str, Any] = {"action": "announce", "failure reason": reason}
    if info_hash is not None:
        body["info_hash"] = info_hash.decode("latin-1")
    return body
