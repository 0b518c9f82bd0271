"""The tracker scrape (BEP 48) a peer sends when its core asks for the swarm's counts.

Over our own HTTP client: libtorrent's ``scrape_tracker()`` fails against this tracker
with an empty error in 2.1.1, and a plain scrape works with any tracker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from urllib.parse import quote_from_bytes

import aiohttp
import yarl

from pressrun.bencode import bdecode
from pressrun.peer.events import SwarmCounts
from pressrun.security import BodyTooLarge, client_connector, read_body_limited

log = logging.getLogger(__name__)

#: one swarm's scrape answer is about 100 bytes; a tracker answering more is cut off
MAX_SCRAPE_BYTES = 64 * 1024


def scrape_url(announce_url: str) -> str | None:
    """The BEP 48 scrape URL of an announce URL (``.../announce`` -> ``.../scrape``)."""
    head, sep, tail = announce_url.rpartition("/")
    if not sep or not tail.startswith("announce"):
        return None
    return f"{head}/scrape{tail[len('announce') :]}"


def parse_scrape(body: bytes, info_hash: bytes) -> SwarmCounts | None:
    """Seeds and leechers of one swarm from a bencoded scrape answer (None if absent)."""
    decoded = bdecode(body)
    if not isinstance(decoded, dict):
        raise ValueError("scrape answer is not a dictionary")
    files = decoded.get(b"files")
    if not isinstance(files, dict):
        return None
    entry = files.get(info_hash)
    if not isinstance(entry, dict):
        return None
    seeds, leechers = entry.get(b"complete"), entry.get(b"incomplete")
    if not isinstance(seeds, int) or not isinstance(leechers, int):
        raise ValueError("scrape answer without complete/incomplete")
    return SwarmCounts(seeds=seeds, leechers=leechers)


class TrackerScrape:
    """At most one scrape in flight; each answer goes to ``on_counts``."""

    def __init__(self, info_hash_hex: str, on_counts: Callable[[SwarmCounts], None]) -> None:
        self._info_hash = bytes.fromhex(info_hash_hex)
        self._on_counts = on_counts
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closed = False

    def ask(self, announce_urls: Sequence[str]) -> None:
        """Scrape the first tracker that has a scrape URL (unless one is in flight)."""
        if self._closed or (self._task is not None and not self._task.done()):
            return
        usable = [u for u in (scrape_url(a) for a in announce_urls) if u is not None]
        if usable:
            self._task = asyncio.get_running_loop().create_task(self._scrape(usable[0]))

    async def _scrape(self, url: str) -> None:
        ih = quote_from_bytes(self._info_hash, safe="")
        target = f"{url}{'&' if '?' in url else '?'}info_hash={ih}"
        try:
            if self._http is None:
                self._http = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=5), connector=client_connector()
                )
            async with self._http.get(yarl.URL(target, encoded=True)) as resp:
                body = await read_body_limited(resp, MAX_SCRAPE_BYTES, f"the scrape at {url}")
            counts = parse_scrape(body, self._info_hash)
        except BodyTooLarge as err:
            log.warning("%s", err)
            return
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            log.debug("scrape %s failed: %s", url, err)
            return
        if counts is not None:
            self._on_counts(counts)

    async def close(self) -> None:
        """No scrape after this one: the one in flight is cancelled, later asks are
        ignored (the peer's status polls go on while it closes: a scrape asked then
        found the session closing, "Session is closed", an error nobody retrieved)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        http, self._http = self._http, None
        if http is not None:
            await http.close()
