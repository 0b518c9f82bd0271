"""The subscription service's operator routes (the publisher, ``pressrun
subscribers``; guarded by the operator token, ``OPERATOR_ROUTES``), the handlers
`pressrun.subscriptions.aio.SubscriptionService` serves (its ``make_app`` is the route
table): subscribers and their devices listed, added and removed, an issue version's
wraps uploaded (with its signed release notice, if embargoed), and the release notice
read and replaced (``.../release``; its signature checked once, when it arrives).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from aiohttp import web

from pressrun.content.release import ReleaseError, SignedRelease
from pressrun.subscriptions.codec import (
    RequestError,
    decode_object,
    parse_issue_version,
    parse_name,
    parse_public_key,
    parse_wraps,
)
from pressrun.subscriptions.store import DeviceRefused, ReleaseRefused

if TYPE_CHECKING:
    from pressrun.subscriptions.aio import SubscriptionService

log = logging.getLogger("pressrun.subscriptions")

#: the operator routes (resource patterns): the operator token guards every method
OPERATOR_ROUTES = frozenset(
    {
        "/v1/subscribers",
        "/v1/subscribers/{public_key}",
        "/v1/issues/{issue_id}/versions/{version}/wraps",
        "/v1/issues/{issue_id}/versions/{version}/release",
        "/v1/subscribers/{public_key}/devices",
        "/v1/devices/{public_key}",
    }
)
MAX_WRAPS_BODY_BYTES = 64 << 20


class OperatorRoutes:
    """The operator routes' handlers for one ``SubscriptionService``."""

    def __init__(self, service: SubscriptionService) -> None:
        self.service = service

    def _verified_release(self, doc: object, issue_id: str, version: int) -> SignedRelease:
        """A signed release notice from a request body, for this issue version, with a
        good signature of a trusted publisher key; RequestError 400 if not."""
        try:
            release = SignedRelease.from_json(doc)
            notice = release.verify(self.service.publisher_keys)
        except ReleaseError as err:
            raise RequestError(400, "bad_release", str(err)) from None
        if (notice.issue_id, notice.version) != (issue_id, version):
            raise RequestError(
                400,
                "bad_release",
                f"the release notice is for {notice.issue_id} version {notice.version}, "
                f"not {issue_id} version {version}",
            )
        return release

    async def list_devices(self, request: web.Request) -> web.Response:
        """``GET /v1/subscribers/<key>/devices``."""
        public_key = parse_public_key(request.match_info["public_key"])
        devices = await self.service._db(self.service.store.devices, public_key)
        if devices is None:
            raise RequestError(404, "unknown_subscriber", f"{public_key.hex()} is not a subscriber")
        return web.json_response(
            {"devices": [d.to_json() for d in devices], "max_devices": self.service.max_devices}
        )

    async def remove_device(self, request: web.Request) -> web.Response:
        """``DELETE /v1/devices/<key>``: the device and its wraps; the next issue is
        not wrapped for it."""
        public_key = parse_public_key(request.match_info["public_key"])
        removed = await self.service._db(self.service.store.remove_device, public_key)
        if removed is None:
            raise RequestError(404, "unknown_device", f"{public_key.hex()} is not a device")
        device, wraps = removed
        log.info(
            "device %s of %s removed with %d wraps",
            public_key.hex()[:16],
            device.subscriber.hex()[:16],
            wraps,
        )
        return web.json_response({**device.to_json(), "wraps_deleted": wraps})

    async def list_subscribers(self, request: web.Request) -> web.Response:
        """``GET /v1/subscribers``."""
        subs = await self.service._db(self.service.store.subscribers)
        return web.json_response({"subscribers": [s.to_json() for s in subs]})

    async def add_subscriber(self, request: web.Request) -> web.Response:
        """``PUT /v1/subscribers/<key>`` with ``{"name": ...}``."""
        public_key = parse_public_key(request.match_info["public_key"])
        name = parse_name(await self.service._small_body(request))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            sub, created = await self.service._db(
                self.service.store.add_subscriber, public_key, name, now
            )
        except DeviceRefused as err:
            raise RequestError(err.status, err.code, err.message) from None
        log.info(
            "subscriber %s %s (%s)", public_key.hex()[:16], "added" if created else "renamed", name
        )
        return web.json_response(sub.to_json(), status=201 if created else 200)

    async def remove_subscriber(self, request: web.Request) -> web.Response:
        """``DELETE /v1/subscribers/<key>``: the subscriber and their wraps."""
        public_key = parse_public_key(request.match_info["public_key"])
        deleted = await self.service._db(self.service.store.remove_subscriber, public_key)
        if deleted is None:
            raise RequestError(404, "unknown_subscriber", f"{public_key.hex()} is not a subscriber")
        log.info("subscriber %s removed with %d wraps", public_key.hex()[:16], deleted)
        return web.json_response({"public_key": public_key.hex(), "wraps_deleted": deleted})

    async def put_wraps(self, request: web.Request) -> web.Response:
        """``PUT /v1/issues/<id>/versions/<v>/wraps``: replace one version's wraps."""
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(
                413, "too_large", f"the wraps body is over {MAX_WRAPS_BODY_BYTES} bytes"
            ) from None
        doc = decode_object(body)
        wraps = parse_wraps(doc)
        release = None
        if doc.get("release") is not None:
            release = self._verified_release(doc["release"], issue_id, version)
        try:
            stored, skipped = await self.service._db(
                self.service.store.put_wraps, issue_id, version, wraps, release
            )
        except ReleaseRefused as err:
            raise RequestError(409, "release_refused", str(err)) from None
        if release is not None:
            log.info(
                "%s version %d: embargoed until %s (release sequence %d)",
                issue_id,
                version,
                release.notice.release_at,
                release.notice.sequence,
            )
        log.info(
            "%s version %d: %d wraps stored, %d skipped (not subscribers)",
            issue_id,
            version,
            stored,
            len(skipped),
        )
        return web.json_response({"stored": stored, "skipped": [k.hex() for k in skipped]})

    async def get_release(self, request: web.Request) -> web.Response:
        """``GET /v1/issues/<id>/versions/<v>/release``: the signed notice, whether it is
        released by this service's clock, and the seconds left."""
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        release = self.service._fresh_releases().get((issue_id, version))
        if release is None:
            raise RequestError(
                404, "no_release", f"{issue_id} version {version} has no embargo here"
            )
        at = release.notice.release_at_unix
        now_unix = self.service.clock()
        return web.json_response(
            {
                **release.to_json(),
                "released": at is not None and now_unix >= at,
                "retry_after_s": None if at is None else round(max(0.0, at - now_unix), 3),
            }
        )

    async def put_release(self, request: web.Request) -> web.Response:
        """``PUT /v1/issues/<id>/versions/<v>/release``: a later signed notice (move the
        release, or revoke it)."""
        issue_id, version = parse_issue_version(
            request.match_info["issue_id"], request.match_info["version"]
        )
        release = self._verified_release(await self.service._small_body(request), issue_id, version)
        try:
            await self.service._db(self.service.store.put_release, release)
        except ReleaseRefused as err:
            raise RequestError(409, "release_refused", str(err)) from None
        n = release.notice
        log.info(
            "%s version %d: release %s (sequence %d)",
            issue_id,
            version,
            "revoked" if n.revoked else f"at {n.release_at}",
            n.sequence,
        )
        return web.json_response(release.to_json())
