"""Linking a second device to a subscription: the reader service's one-time mailboxes.

A subscriber's browser that is already subscribed (the "old" device) shows a short
code; the new device's reader takes it and joins the same subscription with its OWN
key pair (docs/subscriptions.md, "Devices"; docs/reader.md, "One subscription on
several devices"). No private key travels: what the box carries is a link grant of
the subscription service (an HMAC over the old device's public key, an expiry and a
nonce, spendable once) and that service's URL, sealed:

- the old device gets the grant (``POST /v1/device-grants`` with a token of its own
  key), draws the code (12 characters of a 31-letter alphabet, 59 bits) and derives
  48 bytes from it with PBKDF2-HMAC-SHA-256 (600,000 rounds, the browser's WebCrypto;
  libsodium.js's standard build has no Argon2): 32 are a secretbox key, 16 name the
  mailbox;
- it puts ``crypto_secretbox({grant, service}, nonce, key)`` (libsodium.js) into that
  mailbox (``PUT /v1/link/<mailbox>``); the new device, given the code, derives the
  same two, takes the box (``GET /v1/link/<mailbox>``), which is forgotten as it is
  taken, and registers its own public key with the grant (``POST /v1/devices``).

What this service holds is a mailbox name and a ciphertext. Both come out of the KDF,
so guessing the code from them costs 600,000 HMAC-SHA-256 rounds per guess among
2^59 (3.5 x 10^13 s, a million years, for a GPU doing 10^10 rounds/s); the box
lives `MAILBOX_TTL_S` and is taken once. Whoever holds the code in that time can add
one device to the subscription (within the publisher's limit, and the publisher's
device list shows it): it is shown only on the old device's screen, and given to the
new one by the subscriber (typed, or in a link whose ``#link=`` fragment never
reaches a server).

This module is the pure core of the mailboxes (bounded, forgotten when stale, driven
with ``now``); `pressrun.reader.aio` is its adapter.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

#: how long a mailbox waits for its device (s): long enough to pick up the other phone
MAILBOX_TTL_S = 600.0
#: mailboxes held at once (the oldest unexpired one goes first past this)
MAX_MAILBOXES = 1000
#: the most a sealed box may weigh (a grant and a URL in JSON, sealed: about 400 bytes)
MAX_BOX_BYTES = 2048
#: a mailbox's name: 16 bytes in hex, from the code's Argon2id output
MAILBOX_NAME = re.compile(r"^[0-9a-f]{32}$")


class LinkError(ValueError):
    """A mailbox request that cannot be taken (a bad name or box); its text is for
    the HTTP answer."""


@dataclass
class _Box:
    sealed: bytes
    expires_at: float


class LinkMailboxes:
    """One-time mailboxes: `put` a sealed box under a name, `take` it once.

    Bounded (`max_boxes`; the oldest is dropped to make room) and forgotten after
    `ttl_s`, so a stranger filling it costs memory of at most
    ``max_boxes * MAX_BOX_BYTES`` and only delays links made in the same minutes.
    """

    def __init__(self, *, ttl_s: float = MAILBOX_TTL_S, max_boxes: int = MAX_MAILBOXES) -> None:
        self.ttl_s = ttl_s
        self.max_boxes = max_boxes
        self._boxes: OrderedDict[str, _Box] = OrderedDict()
        #: boxes dropped to make room before their time (a sign of someone filling it)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._boxes)

    @staticmethod
    def check(name: str, sealed: bytes | None = None) -> None:
        """LinkError unless `name` is a mailbox name and `sealed` (if given) a box."""
        if not MAILBOX_NAME.match(name):
            raise LinkError("a mailbox name is 32 lowercase hex digits")
        if sealed is not None and not 0 < len(sealed) <= MAX_BOX_BYTES:
            raise LinkError(f"a sealed box is 1 to {MAX_BOX_BYTES} bytes")

    def expire(self, *, now: float) -> None:
        """Forget the boxes whose time is over."""
        while self._boxes:
            name, box = next(iter(self._boxes.items()))
            if box.expires_at > now:
                break
            del self._boxes[name]

    def put(self, name: str, sealed: bytes, *, now: float) -> float:
        """Keep `sealed` under `name` until taken or `ttl_s` from `now`; returns its
        expiry. A name already in use is replaced (the same code made again)."""
        self.check(name, sealed)
        self.expire(now=now)
        self._boxes.pop(name, None)
        while len(self._boxes) >= self.max_boxes:
            self._boxes.popitem(last=False)
            self.evicted += 1
        box = _Box(sealed, now + self.ttl_s)
        self._boxes[name] = box
        return box.expires_at

    def take(self, name: str, *, now: float) -> bytes | None:
        """The box under `name`, forgotten as it is given; None if there is none (never
        put, taken already, or expired)."""
        self.check(name)
        self.expire(now=now)
        box = self._boxes.pop(name, None)
        return None if box is None else box.sealed
