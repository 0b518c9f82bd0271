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

import contextlib
from pathlib import Path

import aiohttp
import nacl.public

from pressrun.content.encryption import DecryptError, WrapError, decrypt_file, open_wrap
from pressrun.content.manifest import Manifest
from pressrun.subscriptions.client import (
    NotSubscribed,
    NoWrap,
    SubscriptionError,
    SubscriptionsClient,
)

__all__ = ["NotReadable", "content_key_for", "decrypt_partial"]


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
    the service cannot be reached, or the wrap does not open (another subscriber's).
    """
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
        wrap = await client.fetch_wrap(manifest.issue_id, enc.version, subscriber_key)
    except NotSubscribed:
        raise NotReadable(
            f"not subscribed: subscriber key {who}... is not a subscriber at {url}, so it "
            f"cannot read {what}; nothing was downloaded"
        ) from None
    except NoWrap as err:
        raise NotReadable(f"{what}: {err}; nothing was downloaded") from None
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
