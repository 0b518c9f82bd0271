"""Reading an encrypted issue: the subscriber's wrap, the content key, decrypting.

``pressrun get`` of an issue whose manifest has ``encryption`` (docs/protocols.md,
"Encrypted issues") downloads and verifies the ciphertext exactly like a plain issue;
this module adds the two steps around it:

- before any byte is downloaded, :func:`content_key_for` asks the subscription
  service for this subscriber's wrap (challenge, then the wrap) and opens it: a reader
  who is not subscribed learns it at once and downloads nothing;
- after the ciphertext passed its final check, :func:`decrypt_partial` decrypts it
  piece by piece, every piece authenticated and the whole plaintext checked against
  ``plain_sha256``, into the partial folder; only a complete, verified plaintext is
  then moved into the library (``Library.install``), never a half-decrypted file.

Errors are :class:`NotReadable` with one line for a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import aiohttp
import nacl.public

from pressrun.content.encryption import DecryptError, WrapError, decrypt_file, open_wrap
from pressrun.content.manifest import Manifest
from pressrun.subscriptions.client import (
    Embargoed,
    NotSubscribed,
    NoWrap,
    Revoked,
    ServiceUnavailable,
    SubscriptionError,
    SubscriptionsClient,
)

__all__ = [
    "NotReadable",
    "content_key_for",
    "content_key_or_embargo",
    "decrypt_partial",
    "fetch_wrap_patiently",
]

log = logging.getLogger("pressrun.clients.subscription")

#: how long a reader keeps asking a subscription service that is down or answers 5xx
#: (a restart takes seconds; the balancer and the origins are retried the same way)
WRAP_RETRY_S = 60.0
#: the first pause between two asks, doubled each time up to the last
WRAP_RETRY_FIRST_S = 0.5
WRAP_RETRY_MAX_S = 5.0


async def fetch_wrap_patiently(
    client: SubscriptionsClient,
    issue_id: str,
    version: int,
    subscriber_key: nacl.public.PrivateKey,
    *,
    retry_s: float = WRAP_RETRY_S,
) -> bytes:
    """``client.fetch_wrap``, asked again while the service is unreachable or answers
    5xx (a restart, an overload) for up to ``retry_s`` seconds (monotonic), with
    pauses of 0.5 s doubling to 5 s. A refusal (not subscribed, no wrap) is final at
    once; the last ServiceUnavailable is raised when the time is up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_s
    pause = WRAP_RETRY_FIRST_S
    while True:
        try:
            return await client.fetch_wrap(issue_id, version, subscriber_key)
        except ServiceUnavailable as err:
            left = deadline - loop.time()
            if left <= 0:
                raise
            log.warning("%s; asking again in %.1f s", err, min(pause, left))
            await asyncio.sleep(min(pause, left))
            pause = min(2 * pause, WRAP_RETRY_MAX_S)


class NotReadable(Exception):
    """This reader cannot read this encrypted issue (one line for a person)."""


async def content_key_for(
    manifest: Manifest,
    *,
    subscriber_key: nacl.public.PrivateKey | None,
    subscriptions_url: str | None,
    session: aiohttp.ClientSession,
) -> bytes:
    """The content key of an encrypted issue version, from this subscriber's wrap.

    ``subscriptions_url`` overrides the manifest's. NotReadable when there is no
    subscriber key, the key is not subscribed, there is no wrap for this version,
    the service cannot be reached for WRAP_RETRY_S (asked again meanwhile: a restart
    passes), or the wrap does not open (another subscriber's); and when the issue is
    under an embargo still (the message gives the release time and ``--prefetch``).
    """
    got = await content_key_or_embargo(
        manifest,
        subscriber_key=subscriber_key,
        subscriptions_url=subscriptions_url,
        session=session,
    )
    if isinstance(got, Embargoed):
        raise NotReadable(
            f"{manifest.issue_id} is released at {got.release_at}: its key is handed out "
            f"from then on ({got.retry_after_s:.0f} s from now by the subscription "
            "service's clock); run `pressrun get --prefetch` to download it now and open "
            "it at the release; nothing was downloaded"
        )
    return got


async def content_key_or_embargo(
    manifest: Manifest,
    *,
    subscriber_key: nacl.public.PrivateKey | None,
    subscriptions_url: str | None,
    session: aiohttp.ClientSession,
) -> bytes | Embargoed:
    """:func:`content_key_for`, but an embargo (the release is still to come) is
    answered, not raised: the caller may pre-position the ciphertext meanwhile
    (``pressrun get --prefetch``). A withdrawn issue (revoked) is NotReadable."""
    enc = manifest.encryption
    if enc is None:
        raise ValueError(f"issue {manifest.issue_id} is not encrypted")
    what = f"{manifest.issue_id} (version {enc.version})"
    if subscriber_key is None:
        raise NotReadable(
            f"{what} is for subscribers only and no subscriber key was given: pass "
            "--subscriber-key FILE (made with `pressrun keys new --subscriber`); nothing "
            "was downloaded"
        )
    url = subscriptions_url or enc.subscriptions_url
    client = SubscriptionsClient(url, session, timeout_s=30.0)
    who = bytes(subscriber_key.public_key).hex()[:16]
    try:
        wrap = await fetch_wrap_patiently(client, manifest.issue_id, enc.version, subscriber_key)
    except NotSubscribed:
        raise NotReadable(
            f"not subscribed: subscriber key {who}... is not a subscriber at {url}, so it "
            f"cannot read {what}; nothing was downloaded"
        ) from None
    except NoWrap as err:
        raise NotReadable(f"{what}: {err}; nothing was downloaded") from None
    except Embargoed as err:
        return err
    except Revoked as err:
        raise NotReadable(f"{what}: {err}") from None
    except SubscriptionError as err:
        raise NotReadable(f"cannot get the key of {what}: {err}; nothing was downloaded") from None
    try:
        return open_wrap(wrap, subscriber_key, enc.key_check)
    except WrapError as err:
        raise NotReadable(
            f"the wrap of {what} from {url} cannot be used: {err}; nothing was downloaded"
        ) from None


def decrypt_partial(manifest: Manifest, key: bytes, ciphertext: Path) -> Path:
    """Decrypt the verified ciphertext beside it, as ``<plain_file_name>``; its path.

    A leftover plaintext of an interrupted earlier run is removed first; on failure
    nothing is left (NotReadable). Blocking: run it in a thread.
    """
    enc = manifest.encryption
    if enc is None:
        raise ValueError(f"issue {manifest.issue_id} is not encrypted")
    plain = ciphertext.with_name(enc.plain_file_name)
    with contextlib.suppress(FileNotFoundError):
        plain.unlink()
    try:
        decrypt_file(manifest, key, ciphertext, plain)
    except DecryptError as err:
        raise NotReadable(
            f"{manifest.issue_id} does not decrypt: {err}; nothing was saved"
        ) from None
    except OSError as err:
        raise NotReadable(
            f"cannot write the decrypted {enc.plain_file_name}: {err.strerror or err}"
        ) from None
    return plain
