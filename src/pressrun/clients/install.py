"""The download's last step: the verified copy into the library, before any seeding.

`install_copy` decrypts an encrypted issue (every piece authenticated) beside its
ciphertext and swaps the file, with its manifest, into ``LIBRARY/<id>/``
(`Library.install`). A swarm peer seeds after its download and a carousel reader may
seed its copy afterwards, by the fair-exit rules, for up to the profile's seeding
time (30 min on a desktop): `InstallFirst` puts the copy in the library as soon as it
is verified, so the reader opens the issue while the peer seeds. The seeded file
stays in the partial folder (the library gets a hard link to it; an encrypted issue's
plaintext is moved, its ciphertext is what the swarm carries) until the seeding ends.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from pressrun.clients.library import LibraryError
from pressrun.clients.session import FetchError, FetchState
from pressrun.clients.subscription import NotReadable, decrypt_partial
from pressrun.content.manifest import Manifest, check_file

__all__ = ["InstallFirst", "install_copy"]


async def install_copy(
    f: FetchState,
    m: Manifest,
    manifest_json: bytes,
    content_key: bytes | None,
    path: Path,
    *,
    seeding: bool = False,
) -> Path:
    """Install the verified file at ``path`` (an encrypted issue decrypted first) and
    return its path in the library; ``seeding``: the peer still seeds ``path``, which
    stays (`Library.install`). FetchError (one line) when it cannot."""
    file_name = m.file_name
    if m.encryption is not None and content_key is not None:
        try:
            plain = await asyncio.to_thread(decrypt_partial, m, content_key, path)
        except NotReadable as err:
            raise FetchError(str(err)) from None
        file_name = plain.name
    try:
        return await asyncio.to_thread(
            f.library.install,
            m.issue_id,
            file_name,
            manifest_json,
            # the seeded file is the ciphertext; a plaintext decrypted beside it moves,
            # and the ciphertext stays in the partial folder while it is seeded
            seeding=seeding and file_name == m.file_name,
            keep_partial=seeding,
        )
    except (OSError, LibraryError) as err:
        raise FetchError(f"cannot move {file_name} into the library: {err}") from None


class InstallFirst:
    """The copy into the library once it is verified, before the seeding that follows.

    `on_verified` is the swarm peer's hook (`fetch_via_swarm`: its final check read
    the file against the manifest); `now` installs a carousel's complete copy (checked
    when the carousel's object became the file, else checked here). Either way the
    seeding goes on while the copy is installed; `installed` gives the library path,
    or None when nothing was installed early (the client then installs after the
    seeding, as before, and says why)."""

    def __init__(
        self,
        f: FetchState,
        m: Manifest,
        manifest_json: bytes,
        content_key: bytes | None,
        path: Path,
        started_at: float,
    ) -> None:
        self._f = f
        self._m = m
        self._manifest_json = manifest_json
        self._content_key = content_key
        self._path = path
        self._started_at = started_at
        self._task: asyncio.Task[Path | None] | None = None
        #: seconds from the download's start until the copy was in the library
        self.ready_s: float | None = None

    def on_verified(self, verified: Path) -> None:
        """The swarm peer's copy at ``verified`` passed its final check."""
        if self._task is None and verified == self._path:
            self._task = asyncio.get_running_loop().create_task(self._install(checked=True))

    async def now(self) -> Path | None:
        """Install the complete copy now (the carousel's, before it seeds)."""
        if self._task is None:
            checked = self._f.checked_sha256 == self._m.sha256
            self._task = asyncio.get_running_loop().create_task(self._install(checked=checked))
        return await self._task

    async def installed(self) -> Path | None:
        """The copy's path in the library, or None: not installed early."""
        return None if self._task is None else await self._task

    async def _install(self, *, checked: bool) -> Path | None:
        f, m = self._f, self._m
        try:
            if not checked and not (await asyncio.to_thread(check_file, m, self._path)).matches(m):
                return None  # the final check after the seeding finds and mends it
            final = await install_copy(
                f, m, self._manifest_json, self._content_key, self._path, seeding=True
            )
        except FetchError as err:
            f.notice(f"{err}; trying again once the seeding ends")
            return None
        self.ready_s = f.now() - self._started_at
        f.notice(
            f"{m.issue_id} is in your library: {final} (seeding it to other readers "
            "meanwhile; stopping pressrun now keeps the copy)",
            level=logging.INFO,
        )
        return final
