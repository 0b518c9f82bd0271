"""The subscription service's subscriber routes (CORS, from the reader's origin;
docs/protocols.md "Subscription service HTTP"), the handlers
`pressrun.subscriptions.aio.SubscriptionService` serves (its ``make_app`` is the route
table):

- ``POST /v1/challenge``: a token sealed to the X25519 key in the body;
- ``GET /v1/issues/<id>/versions/<v>/wrap``: the subscriber's own wrap (the release
  minute's hot path: the service's read-only connection, the embargo by its clock);
- ``POST /v1/device-grants`` and ``POST /v1/devices``: linking a device (issue 31).
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import nacl.public
from aiohttp import hdrs, web

from pressrun.content.codec import is_hex
from pressrun.subscriptions.codec import (
    GRANT_NONCE_BYTES,
    RequestError,
    bearer,
    check_grant,
    check_token,
    make_grant,
    make_token,
    parse_issue_version,
    parse_name,
    parse_public_key,
)
from pressrun.subscriptions.embargo import embargo_refusal
from pressrun.subscriptions.store import DeviceRefused, device_limit_message

if TYPE_CHECKING:
    from pressrun.subscriptions.aio import SubscriptionService

log = logging.getLogger("pressrun.subscriptions")

#: how long a link grant can be spent: the reader's link code's 10 minutes
GRANT_TTL_S = 600


class SubscriberRoutes:
    """The subscriber routes' handlers for one ``SubscriptionService``."""

    def __init__(self, service: SubscriptionService) -> None:
        self.service = service

    async def challenge(self, request: web.Request) -> web.Response:
        """``POST /v1/challenge``: a token sealed to the key in the body, for any key."""
        doc = await self.service._small_body(request)
        public_key = parse_public_key(doc.get("subscriber"))
        expires_at = int(self.service.clock()) + self.service.token_ttl_s
        token = make_token(self.service.secret, public_key, expires_at)
        try:
            sealed = nacl.public.SealedBox(nacl.public.PublicKey(public_key)).encrypt(token)
        except Exception:  # libsodium refuses some degenerate points
            raise RequestError(400, "bad_request", "that is not a usable X25519 key") from None
        self.service.challenges.inc()
        return web.json_response(
            {
                "subscriber": public_key.hex(),
                "sealed_token": bytes(sealed).hex(),
                "expires_in_s": self.service.token_ttl_s,
            }
        )

    async def get_wrap(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/<id>/versions/<v>/wrap``: this subscriber's own wrap."""
        began = time.perf_counter()
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        raw = bearer(request.headers.get(hdrs.AUTHORIZATION), "token from /v1/challenge")
        try:
            token = bytes.fromhex(raw)
        except ValueError:
            raise RequestError(401, "bad_token", "the token must be hex") from None
        now_unix = self.service.clock()
        public_key = check_token(self.service.secret, token, now_unix=now_unix)
        # one lookup on the loop's read-only connection: a wrap is deleted with its
        # subscriber, so a wrap found is a current subscriber's
        try:
            wrap = self.service.reader.wrap(issue_id, version, public_key)
            subscribed = wrap is not None or self.service.reader.is_subscriber(public_key)
            release = self.service._fresh_releases().get((issue_id, version))
        except sqlite3.Error as err:  # the database busy or failing: ask again
            log.warning("wrap of %s version %d: the database: %s", issue_id, version, err)
            raise RequestError(
                503,
                "unavailable",
                "the subscription service cannot read its database now; ask again",
                headers={"Retry-After": "1"},
            ) from None
        if not subscribed:
            raise RequestError(
                403,
                "not_subscribed",
                f"key {public_key.hex()[:16]}... is not a subscriber; subscribe to read {issue_id}",
            )
        if wrap is None:
            raise RequestError(
                404,
                "no_wrap",
                f"there is no wrap of {issue_id} version {version} for this subscriber (it "
                "was published before the subscription began, or no such version exists)",
            )
        refusal = embargo_refusal(release, now_unix=now_unix)
        if refusal is not None:
            if refusal.code == "embargoed":
                self.service.embargo_refusals.inc()
            raise refusal
        self.service.wraps_served.inc()
        self.service.wrap_seconds.observe(time.perf_counter() - began)
        return web.json_response(
            {
                "issue_id": issue_id,
                "version": version,
                "subscriber": public_key.hex(),
                "wrap": wrap.hex(),
            }
        )

    def _token_key(self, request: web.Request) -> bytes:
        """The public key of the request's good challenge token; RequestError 401."""
        raw = bearer(request.headers.get(hdrs.AUTHORIZATION), "token from /v1/challenge")
        try:
            token = bytes.fromhex(raw)
        except ValueError:
            raise RequestError(401, "bad_token", "the token must be hex") from None
        return check_token(self.service.secret, token, now_unix=self.service.clock())

    async def grant(self, request: web.Request) -> web.Response:
        """``POST /v1/device-grants``: a subscribed device (its token) gets a grant that
        lets one new device register under its subscriber (docs/subscriptions.md)."""
        device_key = self._token_key(request)
        found = await self.service._db(self.service.store.device_count, device_key)
        if found is None:
            raise RequestError(
                403, "not_subscribed", "this device is not subscribed, so it cannot link another"
            )
        if found[1] >= self.service.max_devices:  # said early; add_device decides
            raise RequestError(
                409,
                "device_limit",
                device_limit_message(self.service.max_devices),
                extra={"max_devices": self.service.max_devices},
            )
        expires_at = int(self.service.clock()) + GRANT_TTL_S
        grant = make_grant(
            self.service.secret, device_key, expires_at, os.urandom(GRANT_NONCE_BYTES)
        )
        return web.json_response(
            {
                "grant": grant.hex(),
                "expires_in_s": GRANT_TTL_S,
                "devices": found[1],
                "max_devices": self.service.max_devices,
            }
        )

    async def add_device(self, request: web.Request) -> web.Response:
        """``POST /v1/devices`` with ``{"grant": hex, "name": ...}`` and the new
        device's own token: its public key joins the grant's subscriber."""
        public_key = self._token_key(request)  # the new device holds its secret key
        doc = await self.service._small_body(request)
        raw = doc.get("grant")
        if not isinstance(raw, str) or not is_hex(raw, len(raw)) or len(raw) % 2:
            raise RequestError(400, "bad_request", 'the body must be {"grant": hex, ...}')
        now_unix = self.service.clock()
        linked_by, expires_at, nonce = check_grant(
            self.service.secret, bytes.fromhex(raw), now_unix=now_unix
        )
        name = parse_name(doc) or "linked device"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            device, created = await self.service._db(
                functools.partial(
                    self.service.store.register_device,
                    public_key,
                    linked_by=linked_by,
                    name=name,
                    added_at=now,
                    grant_nonce=nonce,
                    grant_expires_at=expires_at,
                    now_unix=now_unix,
                    max_devices=self.service.max_devices,
                )
            )
        except DeviceRefused as err:
            raise RequestError(
                err.status, err.code, err.message, extra={"max_devices": self.service.max_devices}
            ) from None
        log.info(
            "device %s linked to subscriber %s by %s",
            public_key.hex()[:16],
            device.subscriber.hex()[:16],
            linked_by.hex()[:16],
        )
        return web.json_response(device.to_json(), status=201 if created else 200)
