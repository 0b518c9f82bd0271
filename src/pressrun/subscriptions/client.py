"""Calls to the subscription service: the operator's and a subscriber's (docs/protocols.md).

Used by ``pressrun publish --encrypt`` (list subscribers, upload wraps), ``pressrun
subscribers`` (add, remove, list) and ``pressrun get`` (challenge, then its own wrap).
Every failure is a :class:`SubscriptionError` with one line for a person; a subscriber
that is not (or no longer) subscribed gets :class:`NotSubscribed`, one without a wrap
for that issue version :class:`NoWrap`, one asking before an embargoed issue's
release :class:`Embargoed` (with the release time and the seconds left by the
service's clock), one asking for a withdrawn issue :class:`Revoked`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp
import nacl.exceptions
import nacl.public

from pressrun.content.codec import is_hex
from pressrun.content.release import ReleaseError, SignedRelease
from pressrun.security import BodyTooLarge, read_body_limited
from pressrun.subscriptions.codec import TOKEN_BYTES, WRAP_BYTES

__all__ = [
    "TOKEN_ENV",
    "DeviceLimit",
    "Embargoed",
    "HttpSubscriberDirectory",
    "NoWrap",
    "NotSubscribed",
    "Revoked",
    "ServiceUnavailable",
    "SubscriptionError",
    "SubscriptionsClient",
]

#: the environment variable that holds the operator token (for the service and clients)
TOKEN_ENV = "PRESSRUN_SUBSCRIPTIONS_TOKEN"
MAX_ANSWER_BYTES = 64 << 20
T = TypeVar("T")


class SubscriptionError(Exception):
    """The subscription service could not be used (one line for a person)."""


class ServiceUnavailable(SubscriptionError):
    """The service could not be reached, timed out or answered 5xx: a restart or an
    overload that may pass, unlike a refusal (a caller may ask again)."""


class NotSubscribed(SubscriptionError):
    """The service says this key is not a subscriber."""


class DeviceLimit(SubscriptionError):
    """The subscription has as many devices as the publisher allows."""


class NoWrap(SubscriptionError):
    """A subscriber, but there is no wrap for that issue version."""


class Embargoed(SubscriptionError):
    """A subscriber with a wrap, asking before the release (docs/protocols.md, "Embargo").

    ``release_at`` is the UTC text; ``retry_after_s`` the seconds left by the service's
    clock when it answered (what to wait, whatever this host's clock says);
    ``release`` the signed notice when the answer carried a well-formed one.
    """

    def __init__(
        self, message: str, release_at: str, retry_after_s: float, release: SignedRelease | None
    ) -> None:
        super().__init__(message)
        self.release_at = release_at
        self.retry_after_s = retry_after_s
        self.release = release


class Revoked(SubscriptionError):
    """The publisher withdrew that issue version before its release: no wrap."""


class SubscriptionsClient:
    """One subscription service at ``base_url``, over an aiohttp session."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        operator_token: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.operator_token = operator_token
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        authorization: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        url = f"{self.base_url}{path}"
        headers = {"Authorization": f"Bearer {authorization}"} if authorization else {}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self.session.request(
                method, url, data=data, headers=headers, timeout=self.timeout
            ) as resp:
                # the whole body: content.read(n) answers the first buffered chunk
                # only (a list of 1,000 subscribers came back cut at 64 KiB)
                raw = await read_body_limited(resp, MAX_ANSWER_BYTES, f"the answer to {path}")
                status = resp.status
        except BodyTooLarge as err:
            raise SubscriptionError(
                f"the subscription service at {self.base_url} answered {method} {path} "
                f"with too much: {err}"
            ) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            what = str(err) or type(err).__name__
            raise ServiceUnavailable(
                f"the subscription service at {self.base_url} is unreachable ({what})"
            ) from None
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            # a 502/503 of a proxy in front of a restarting service passes; a 200 of a
            # page that is not the service does not
            raise (ServiceUnavailable if status >= 500 else SubscriptionError)(
                f"the subscription service at {self.base_url} answered {method} {path} with "
                f"HTTP {status} and no JSON object (is that URL a pressrun subscription service?)"
            )
        return status, doc

    def _need_operator(self) -> str:
        if not self.operator_token:
            raise SubscriptionError(
                f"no operator token: set {TOKEN_ENV} (or pass --token) to the token the "
                "subscription service was started with"
            )
        return self.operator_token

    def _fail(self, status: int, doc: Mapping[str, Any], what: str) -> SubscriptionError:
        message = doc.get("error") or f"HTTP {status}"
        if status >= 500:
            return ServiceUnavailable(f"could not {what} at {self.base_url}: {message}")
        if doc.get("code") == "bad_token" and status == 401 and what != "fetch the wrap":
            message = f"{message} (check {TOKEN_ENV} or --token)"
        return SubscriptionError(f"could not {what} at {self.base_url}: {message}")

    # -- operator

    async def subscribers(self) -> list[dict[str, Any]]:
        """Every subscriber (``public_key``, ``name``, ``added_at``, ``devices``: their
        devices' public keys in hex, their own key first)."""
        status, doc = await self._call(
            "GET", "/v1/subscribers", authorization=self._need_operator()
        )
        if status != 200 or not isinstance(doc.get("subscribers"), list):
            raise self._fail(status, doc, "list the subscribers")
        subs: list[dict[str, Any]] = doc["subscribers"]
        return subs

    async def devices(self, subscriber: bytes) -> tuple[list[dict[str, Any]], int]:
        """A subscriber's devices (``public_key``, ``name``, ``added_at``,
        ``linked_by``), oldest first, and the service's limit on devices."""
        status, doc = await self._call(
            "GET",
            f"/v1/subscribers/{subscriber.hex()}/devices",
            authorization=self._need_operator(),
        )
        if status != 200 or not isinstance(doc.get("devices"), list):
            raise self._fail(status, doc, "list the devices")
        return list(doc["devices"]), int(doc.get("max_devices", 0))

    async def remove_device(self, device: bytes) -> tuple[dict[str, Any], int]:
        """Remove one device and its wraps; ``(device record, wraps deleted)``."""
        status, doc = await self._call(
            "DELETE", f"/v1/devices/{device.hex()}", authorization=self._need_operator()
        )
        if status != 200:
            raise self._fail(status, doc, "remove the device")
        return doc, int(doc.get("wraps_deleted", 0))

    async def add_subscriber(self, public_key: bytes, name: str) -> tuple[dict[str, str], bool]:
        """Add (or rename) a subscriber; ``(record, created)``."""
        status, doc = await self._call(
            "PUT",
            f"/v1/subscribers/{public_key.hex()}",
            body={"name": name},
            authorization=self._need_operator(),
        )
        if status not in (200, 201):
            raise self._fail(status, doc, "add the subscriber")
        return doc, status == 201

    async def remove_subscriber(self, public_key: bytes) -> int:
        """Remove a subscriber and their wraps; how many wraps went with them."""
        status, doc = await self._call(
            "DELETE", f"/v1/subscribers/{public_key.hex()}", authorization=self._need_operator()
        )
        if status != 200:
            raise self._fail(status, doc, "remove the subscriber")
        return int(doc.get("wraps_deleted", 0))

    async def put_wraps(
        self,
        issue_id: str,
        version: int,
        wraps: Mapping[bytes, bytes],
        release: SignedRelease | None = None,
    ) -> tuple[int, list[str]]:
        """Upload one issue version's wraps (with its embargo's signed release notice,
        stored in the same transaction); ``(stored, skipped keys as hex)``."""
        body: dict[str, object] = {"wraps": {k.hex(): w.hex() for k, w in wraps.items()}}
        if release is not None:
            body["release"] = release.to_json()
        status, doc = await self._call(
            "PUT",
            f"/v1/issues/{issue_id}/versions/{version}/wraps",
            body=body,
            authorization=self._need_operator(),
        )
        if status != 200:
            raise self._fail(status, doc, f"store the wraps of {issue_id} version {version}")
        return int(doc.get("stored", 0)), [str(k) for k in doc.get("skipped", [])]

    async def put_release(self, release: SignedRelease) -> None:
        """Replace an issue version's release notice (move or revoke the release)."""
        n = release.notice
        status, doc = await self._call(
            "PUT",
            f"/v1/issues/{n.issue_id}/versions/{n.version}/release",
            body=release.to_json(),
            authorization=self._need_operator(),
        )
        if status != 200:
            raise self._fail(status, doc, f"set the release of {n.issue_id} version {n.version}")

    async def release(self, issue_id: str, version: int) -> dict[str, Any] | None:
        """The service's release notice of an issue version with ``released`` and
        ``retry_after_s`` (by the service's clock); None when it has no embargo."""
        status, doc = await self._call(
            "GET",
            f"/v1/issues/{issue_id}/versions/{version}/release",
            authorization=self._need_operator(),
        )
        if status == 404 and doc.get("code") == "no_release":
            return None
        if status != 200 or not isinstance(doc.get("release"), dict):
            raise self._fail(status, doc, f"read the release of {issue_id} version {version}")
        return doc

    # -- subscriber

    async def token(self, subscriber_key: nacl.public.PrivateKey) -> str:
        """A challenge token for this key (hex): ask, open with the secret key."""
        public = bytes(subscriber_key.public_key)
        status, doc = await self._call("POST", "/v1/challenge", body={"subscriber": public.hex()})
        sealed = doc.get("sealed_token")
        if status != 200 or not isinstance(sealed, str) or not is_hex(sealed, len(sealed)):
            raise self._fail(status, doc, "get a challenge")
        try:
            token = nacl.public.SealedBox(subscriber_key).decrypt(bytes.fromhex(sealed))
        except (nacl.exceptions.CryptoError, ValueError):
            raise SubscriptionError(
                f"the challenge from {self.base_url} does not open with this subscriber key"
            ) from None
        if len(token) != TOKEN_BYTES:
            raise SubscriptionError(f"the challenge from {self.base_url} holds no valid token")
        return token.hex()

    async def device_grant(self, device_key: nacl.public.PrivateKey) -> str:
        """On a subscribed device: a grant (hex) that lets one new device register
        under this subscriber (docs/subscriptions.md, "Devices"); DeviceLimit when
        the subscription has as many devices as the publisher allows."""
        token = await self.token(device_key)
        status, doc = await self._call("POST", "/v1/device-grants", authorization=token)
        if status == 409 and doc.get("code") == "device_limit":
            raise DeviceLimit(str(doc.get("error")))
        grant = doc.get("grant")
        if status != 200 or not isinstance(grant, str):
            raise self._fail(status, doc, "get a link grant")
        return grant

    async def register_device(
        self, device_key: nacl.public.PrivateKey, grant: str, name: str = ""
    ) -> dict[str, Any]:
        """On the new device: register its own public key with a grant; the device's
        record. DeviceLimit as :meth:`device_grant`."""
        token = await self.token(device_key)
        status, doc = await self._call(
            "POST", "/v1/devices", body={"grant": grant, "name": name}, authorization=token
        )
        if status == 409 and doc.get("code") == "device_limit":
            raise DeviceLimit(str(doc.get("error")))
        if status not in (200, 201):
            raise self._fail(status, doc, "register the device")
        return doc

    async def fetch_wrap(
        self, issue_id: str, version: int, subscriber_key: nacl.public.PrivateKey
    ) -> bytes:
        """This subscriber's wrap of one issue version: challenge, open it, ask.

        NotSubscribed when the service says the key is not a subscriber, NoWrap when
        it has no wrap for that version, SubscriptionError for anything else.
        """
        token = await self.token(subscriber_key)
        status, doc = await self._call(
            "GET", f"/v1/issues/{issue_id}/versions/{version}/wrap", authorization=token
        )
        code = doc.get("code")
        message = doc.get("error") or f"HTTP {status}"
        if status == 403 and code == "not_subscribed":
            raise NotSubscribed(f"not subscribed: {message}")
        if status == 404 and code == "no_wrap":
            raise NoWrap(f"not subscribed to this issue: {message}")
        if status == 403 and code == "embargoed":
            raise _embargoed(doc, message)
        if status == 410 and code == "revoked":
            raise Revoked(f"withdrawn: {message}")
        wrap = doc.get("wrap")
        if status != 200 or not isinstance(wrap, str) or not is_hex(wrap, 2 * WRAP_BYTES):
            raise self._fail(status, doc, "fetch the wrap")
        return bytes.fromhex(wrap)


def _embargoed(doc: Mapping[str, Any], message: str) -> SubscriptionError:
    """Embargoed from a ``403 embargoed`` answer; a plain SubscriptionError if the answer
    lacks its fields (a wrong release time is worse than none)."""
    at, left = doc.get("release_at"), doc.get("retry_after_s")
    if not isinstance(at, str) or isinstance(left, bool) or not isinstance(left, int | float):
        return SubscriptionError(f"embargoed, but the answer has no release time: {message}")
    try:
        release = SignedRelease.from_json(doc.get("release"))
    except ReleaseError:
        release = None
    return Embargoed(f"embargoed: {message}", at, max(0.0, float(left)), release)


class HttpSubscriberDirectory:
    """The subscription service as ``pressrun publish --encrypt`` sees it (synchronous).

    Implements ``pressrun.content.publish.SubscriberDirectory``. Each call runs its own
    event loop on a worker thread, so it works from plain code and from a thread of
    an asyncio program alike (not from the thread of the loop that serves the
    service itself: that loop would be blocked).
    """

    def __init__(self, url: str, operator_token: str | None, *, timeout_s: float = 120.0) -> None:
        self._url = url.rstrip("/")
        self.operator_token = operator_token
        self.timeout_s = timeout_s

    @property
    def url(self) -> str:
        """The service's base URL."""
        return self._url

    def _run(self, call: Callable[[SubscriptionsClient], Awaitable[T]]) -> T:
        async def go() -> T:
            async with aiohttp.ClientSession() as session:
                client = SubscriptionsClient(
                    self._url,
                    session,
                    operator_token=self.operator_token,
                    timeout_s=self.timeout_s,
                )
                return await call(client)

        with ThreadPoolExecutor(1, thread_name_prefix="subscriptions-client") as pool:
            return pool.submit(asyncio.run, go()).result()

    def subscriber_keys(self) -> list[bytes]:
        """The public key of every current subscriber's every device: the keys wraps
        are made to (issue 31; a service from before devices lists none, and the
        subscriber's own key is then their one device)."""
        subs = self._run(lambda c: c.subscribers())
        keys: list[bytes] = []
        for s in subs:
            devices = s.get("devices")
            if isinstance(devices, list):
                keys.extend(bytes.fromhex(d) for d in devices)
            else:
                keys.append(bytes.fromhex(s["public_key"]))
        return keys

    def store_wraps(
        self,
        issue_id: str,
        version: int,
        wraps: Mapping[bytes, bytes],
        release: SignedRelease | None = None,
    ) -> list[bytes]:
        """Upload one issue version's wraps (and its embargo); the keys the service skipped."""
        _, skipped = self._run(lambda c: c.put_wraps(issue_id, version, wraps, release))
        return [bytes.fromhex(k) for k in skipped]
