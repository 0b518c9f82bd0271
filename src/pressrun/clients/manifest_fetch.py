"""The issue's signed manifest: from the first origin that serves it, verified.

The balancer's directive names the origins; the manifest comes from the first one not
yet failed (a bad or truncated one fails that origin, and another is asked), and is
checked against the trusted publisher keys (given, else the library's
``trusted-publishers``; with neither, an error, unless trust on first use was asked
for: then the key is recorded there and a warning printed).

The directive asked for here is the download's own (a ``crowd`` request, no
``class=small``): it is the one the balancer's demand counts, it sends the reader to
the swarm or the carousel (past full origins too), and the download follows its mode
(docs/balancer.md, "Request classes"). A download that resumes tells it, in that first
request, the bytes its partial copy lists as verified (``have=``, ``size=``): the
balancer counts what it lacks, not a whole transfer (before, only its later section
requests said so: where the origins had room for what it lacked but not for a whole
transfer, its first request was refused like a new reader's).
"""

from __future__ import annotations

import asyncio

from pressrun.clients.library import LibraryError
from pressrun.clients.session import DirectiveUnavailable, FetchError, FetchState
from pressrun.content.manifest import Manifest, ManifestError, SignedManifest

__all__ = ["MAX_MANIFEST_BYTES", "fetch_manifest"]

#: a manifest is about 70 bytes per piece; 32 MiB is far beyond any real one
MAX_MANIFEST_BYTES = 32 * 1024 * 1024


async def fetch_manifest(f: FetchState) -> tuple[Manifest, bytes]:
    """The verified manifest and its bytes, from the first origin that serves a good
    one. An unreachable or slow balancer, an origin that fails, and a bad or truncated
    manifest are all retried (another origin first, with a jittered backoff, a
    Retry-After honoured) until the client's give-up rule (:meth:`ClientConfig.gives_up`)."""
    failed: dict[str, str] = {}
    failures = 0
    started = f.now()
    rejected: str | None = None  # the last manifest an origin served that was refused
    have, size = _resumed(f)
    while True:
        retry_after: float | None = None
        try:
            directive = await f.directive(frozenset(failed), have=have, size=size)
        except DirectiveUnavailable as err:
            last = err.reason
            retry_after = err.retry_after_s
            failed.clear()  # the balancer may have nothing else: try them again
        else:
            origin = next((o for o in directive.origins if o.name not in failed), None)
            if origin is None:
                origin = directive.origins[0]
            url = f"{origin.url}/content/{f.issue_id}/manifest.json"
            try:
                data = await f.get_small(url, MAX_MANIFEST_BYTES)
                return _verified_manifest(f, data, origin.name), data
            except (DirectiveUnavailable, _BadManifest) as err:
                last = f"{origin.name}: {err}"
                if isinstance(err, _BadManifest):
                    rejected = last
                failed[origin.name] = str(err)
                f.notice(f"origin {origin.name}: {err}; asking for another")
        failures += 1
        if f.config.gives_up(failures, f.now() - started):
            # a manifest that was rejected says more than the balancer's "none left"
            raise FetchError(
                f"could not get a good manifest of {f.issue_id} after {failures} "
                f"attempts; the last: {rejected or last}"
            ) from None
        await asyncio.sleep(f.retry_wait_s(failures, retry_after))


def _resumed(f: FetchState) -> tuple[int | None, int | None]:
    """``(have, size)`` of the partial download the library holds for this issue (its
    state file's verified pieces, not checked again yet: a hint), ``(None, None)``
    without one. The manifest fetched may be a newer version; the next request then
    tells what the plan holds."""
    state = f.library.load_state(f.issue_id)
    if state is None or state.issue_id != f.issue_id:
        return None, None
    size, piece = state.size_bytes, state.piece_size_bytes
    if size <= 0 or piece <= 0:
        return None, None
    pieces = -(-size // piece)
    have = sum(min(piece, size - i * piece) for i in state.verified if 0 <= i < pieces)
    return have, size


class _BadManifest(Exception):
    """This origin's manifest is unusable (not JSON, cut short, not signed by a trusted
    key, another issue's): another origin may serve a good one."""


def _verified_manifest(f: FetchState, data: bytes, origin: str) -> Manifest:
    where = f"the manifest of {f.issue_id} from origin {origin}"
    first_use = False
    try:
        signed = SignedManifest.from_json_bytes(data)
        if f.trusted_keys is not None:
            manifest = signed.verify(f.trusted_keys)
        else:
            keys = f.library.trusted_keys()
            if not keys and not f.trust_on_first_use:
                raise FetchError(
                    f"no trusted publisher key to check {where} against: pass "
                    "--publisher-key KEY, or add it to the library with `pressrun trust "
                    f"add KEY --library {f.library.root}`; nothing was saved"
                )
            # no trusted-publishers yet: only self-consistency (trust on first use,
            # asked for explicitly)
            manifest = signed.verify(keys or None)
            first_use = not keys
    except ManifestError as err:
        raise _BadManifest(f"{where} is rejected: {err}; nothing was saved") from None
    except LibraryError as err:
        raise FetchError(str(err)) from None
    if manifest.issue_id != f.issue_id:
        raise _BadManifest(
            f"{where} is for issue {manifest.issue_id!r}, not {f.issue_id!r}; nothing was saved"
        )
    if first_use:
        try:
            f.library.trust(
                manifest.publisher_key_bytes, f"trusted on first use, issue {f.issue_id}"
            )
        except OSError as err:
            raise FetchError(
                f"cannot record the publisher key in {f.library.trusted_path}: "
                f"{err.strerror or err}"
            ) from None
        f.notice(
            f"warning: trusting publisher key {manifest.publisher_key} on first use "
            f"(recorded in {f.library.trusted_path}); pass --publisher-key to pin "
            "the key you expect"
        )
    return manifest
