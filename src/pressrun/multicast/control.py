"""Signing and checking control-channel announcements (Ed25519 through PyNaCl).

The sender signs each announcement with the publisher's key (the key whose public
half the issues' manifests name); a receiver checks the signature here, then lets
`pressrun.multicast.core.AnnouncementGate` judge trust, expiry and replay.
"""

from __future__ import annotations

import nacl.exceptions
import nacl.signing

from pressrun.multicast.codec import (
    AnnouncementFormatError,
    decode_announcement,
    encode_announcement,
    signed_bytes,
)
from pressrun.multicast.core import AnnouncementGate
from pressrun.multicast.events import Announcement, AnnouncementVerdict


def sign_announcement(ann: Announcement, key: nacl.signing.SigningKey) -> bytes:
    """The control datagram of ``ann`` signed with ``key`` (its public half must be
    the announcement's ``publisher_key``)."""
    public = bytes(key.verify_key).hex()
    if ann.publisher_key != public:
        raise ValueError(f"announcement names key {ann.publisher_key} but is signed with {public}")
    return encode_announcement(ann, key.sign(signed_bytes(ann)).signature)


def check_datagram(
    data: bytes, gate: AnnouncementGate, *, now_unix: float
) -> tuple[Announcement | None, AnnouncementVerdict, str]:
    """Parse, verify and judge one control datagram: the announcement (None when it
    did not parse), the gate's verdict, and a detail for the log."""
    try:
        ann, body, signature = decode_announcement(data)
    except AnnouncementFormatError as err:
        return None, gate.handle(None, signature_ok=False, now_unix=now_unix), str(err)
    try:
        nacl.signing.VerifyKey(bytes.fromhex(ann.publisher_key)).verify(body, signature)
        signature_ok = True
    except (nacl.exceptions.CryptoError, ValueError):
        signature_ok = False
    verdict = gate.handle(ann, signature_ok=signature_ok, now_unix=now_unix)
    detail = f"seq {ann.seq} from {ann.publisher_key[:16]}..."
    return ann, verdict, detail
