"""What the balancer reads from an issue's manifest on the origins: its file name
(for ``GET /issues/{issue_id}``'s 302) and, with a tracker, its swarm.

Each issue's ``<origin>/content/<issue_id>/manifest.json`` is read once: the first
origin (in the directive's order) that answers a usable manifest wins, and however many
clients ask at once there is one fetch per issue. A body over
`pressrun.content.bundle.MAX_MANIFEST_BYTES` or a manifest without a valid
``file_name`` counts as no answer from that origin.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from pressrun.balancer.codec import ISSUE_ID_RE
from pressrun.balancer.demand import swarm_info_for
from pressrun.balancer.events import SwarmInfo
from pressrun.content.bundle import MAX_MANIFEST_BYTES
from pressrun.security import BodyTooLarge, read_body_limited

log = logging.getLogger(__name__)


class ManifestUnavailable(Exception):
    """No origin answered a usable manifest for an issue."""


class ManifestReader:
    """Issue id -> file name (cached), and the issue's swarm learnt on the way.

    http: the client session (owned by the caller).
    timeout_s: timeout of one manifest fetch.
    tracker_url: the tracker's announce URL; given, an issue whose manifest names an
        info-hash gets its `SwarmInfo` in ``swarms``.
    swarms: issue id -> swarm, filled here and read by the demand policy.
    spawn: starts a background task the caller tracks (and cancels when it closes).
    track: called with each fetch task, which the caller cancels when it closes.
    """

    def __init__(
        self,
        http: aiohttp.ClientSession,
        *,
        timeout_s: float,
        tracker_url: str | None,
        swarms: dict[str, SwarmInfo],
        spawn: Callable[[Any], None],
        track: Callable[[asyncio.Task[str]], None],
    ) -> None:
        self._http = http
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tracker_url = tracker_url
        self.swarms = swarms
        self._spawn = spawn
        self._track = track
        self._file_names: dict[str, str] = {}
        self._fetches: dict[str, asyncio.Task[str]] = {}
        self.closed = False

    def learn_swarm(self, issue_id: str, urls: Sequence[str]) -> None:
        """Read the issue's manifest in the background (once) to learn its swarm."""
        if issue_id in self._fetches or issue_id in self._file_names or self.closed:
            return

        async def learn() -> None:
            try:
                await self.file_name(issue_id, urls)
            except ManifestUnavailable as err:
                log.warning("no swarm for %s yet: %s", issue_id, err)

        self._spawn(learn())

    async def file_name(self, issue_id: str, urls: Sequence[str]) -> str:
        """The issue's file name, read from the first of ``urls`` that answers."""
        cached = self._file_names.get(issue_id)
        if cached is not None:
            return cached
        task = self._fetches.get(issue_id)
        if task is None:
            # One fetch per issue however many clients ask at once.
            task = asyncio.get_running_loop().create_task(self.fetch_file_name(issue_id, urls))
            self._fetches[issue_id] = task
            self._track(task)

            def done(t: asyncio.Task[str]) -> None:
                self._fetches.pop(issue_id, None)
                if not t.cancelled():
                    t.exception()  # retrieved here, so never "never retrieved"

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def fetch_file_name(self, issue_id: str, urls: Sequence[str]) -> str:
        """Fetch the manifest (no cache lookup); `ManifestUnavailable` naming every
        origin's problem if none answers a usable one."""
        timeout = self._timeout
        problems: list[str] = []
        for url in urls:
            manifest_url = f"{url}/content/{issue_id}/manifest.json"
            try:
                async with self._http.get(manifest_url, timeout=timeout) as resp:
                    if resp.status != 200:
                        problems.append(f"{manifest_url}: HTTP {resp.status}")
                        continue
                    body = await read_body_limited(resp, MAX_MANIFEST_BYTES, manifest_url)
                doc = json.loads(body)
                manifest = doc["manifest"]
                file_name = manifest["file_name"]
                info_hash = manifest.get("info_hash")
            except TimeoutError:
                problems.append(f"{manifest_url}: no answer within {timeout.total:g} s")
                continue
            except (aiohttp.ClientError, OSError, BodyTooLarge) as err:
                problems.append(f"{manifest_url}: {err}")
                continue
            except (ValueError, KeyError, TypeError) as err:
                problems.append(f"{manifest_url}: not a manifest ({err!r})")
                continue
            if not isinstance(file_name, str) or ISSUE_ID_RE.match(file_name) is None:
                problems.append(f"{manifest_url}: invalid file_name {file_name!r}")
                continue
            self._file_names[issue_id] = file_name
            tracker = self._tracker_url
            if (
                tracker is not None
                and isinstance(info_hash, str)
                and re.fullmatch(r"[0-9a-f]{40}", info_hash) is not None
            ):
                self.swarms[issue_id] = swarm_info_for(url, tracker, issue_id, info_hash, file_name)
            return file_name
        raise ManifestUnavailable(
            f"could not read the manifest of {issue_id!r}: " + "; ".join(problems)
        )
